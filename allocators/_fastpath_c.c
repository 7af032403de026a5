/* The caching allocators' hot path in C: a cache hit and the release of a block no stream used.
 *
 * allocators/_fastpath.py is the same thing in Python (the fallback when this module is not
 * built) and documents the contract; the tests run both. A FastPath belongs to one allocator:
 *
 *   take(nbytes)  -> a new buffer of `buffer_type` over a cached block of the request size, or
 *                    None (not an exact int, a size not memoized in `fast`, no free block).
 *   hand_out(ptr, nbytes, entry) -> a new buffer over `ptr` (the slow path's; no counter changes).
 *   give(buffer)  -> 0: the block is back in its free list; 1: `buffer` needs the slow path
 *                    (a stream used it; only `_released` was set); 2: back in its free list,
 *                    and `post_release` asks the allocator to look (closed, a cache limit).
 *                    Raises ValueError if `buffer` was released already.
 *
 * `fast` maps a request size to (size class, free list of block addresses); the allocator owns
 * it and fills it. The counters (hits, in_use, peak, requested; bytes) are members that the
 * allocator's slow paths update under its lock. Everything here runs under the GIL and calls no
 * Python code, so each call is atomic with respect to other threads, as the slow paths rely on.
 * Buffer fields are Python __slots__: their offsets are read once from the slot descriptors.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *fast;         /* dict: request size -> (size class, free list) */
    PyTypeObject *buffer_type;
    Py_ssize_t off_ptr, off_nbytes, off_released, off_streams, off_entry;
    Py_ssize_t hits, in_use, peak, requested;
    char post_release;
} FastPath;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

static int
check_initialized(FastPath *self)
{
    if (self->buffer_type == NULL || self->fast == NULL) {
        PyErr_SetString(PyExc_TypeError, "FastPath.__init__ was not called");
        return -1;
    }
    return 0;
}

static int
slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *offset)
{
    PyObject *descr = PyObject_GetAttrString((PyObject *)type, name);
    if (descr == NULL)
        return -1;
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        Py_DECREF(descr);
        PyErr_Format(PyExc_TypeError, "%s.%s is not a __slots__ field", type->tp_name, name);
        return -1;
    }
    *offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_DECREF(descr);
    return 0;
}

static int
FastPath_init(FastPath *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer_type", "fast", NULL};
    PyObject *type, *fast;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!", kwlist, &PyType_Type, &type, &PyDict_Type, &fast))
        return -1;
    PyTypeObject *t = (PyTypeObject *)type;
    if (slot_offset(t, "_ptr", &self->off_ptr) || slot_offset(t, "_nbytes", &self->off_nbytes)
        || slot_offset(t, "_released", &self->off_released) || slot_offset(t, "_streams", &self->off_streams)
        || slot_offset(t, "_entry", &self->off_entry))
        return -1;
    Py_INCREF(type);
    Py_XSETREF(self->buffer_type, t);
    Py_INCREF(fast);
    Py_XSETREF(self->fast, fast);
    return 0;
}

static int
FastPath_traverse(FastPath *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fast);
    Py_VISIT(self->buffer_type);
    return 0;
}

static int
FastPath_clear(FastPath *self)
{
    Py_CLEAR(self->fast);
    Py_CLEAR(self->buffer_type);
    return 0;
}

static void
FastPath_dealloc(FastPath *self)
{
    PyObject_GC_UnTrack(self);
    FastPath_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Sets the fields of a new `buf`; steals the references to `ptr` and `entry`. */
static void
fill_buffer(FastPath *self, PyObject *buf, PyObject *ptr, PyObject *nbytes, PyObject *entry)
{
    SLOT(buf, self->off_ptr) = ptr;
    SLOT(buf, self->off_nbytes) = Py_NewRef(nbytes);
    SLOT(buf, self->off_released) = Py_NewRef(Py_False);
    SLOT(buf, self->off_streams) = Py_NewRef(Py_None);
    SLOT(buf, self->off_entry) = entry;
}

static PyObject *
FastPath_hand_out(FastPath *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_initialized(self) < 0)
        return NULL;
    if (nargs != 3 || !PyTuple_Check(args[2]) || PyTuple_GET_SIZE(args[2]) != 2) {
        PyErr_SetString(PyExc_TypeError, "hand_out(ptr, nbytes, (size class, free list))");
        return NULL;
    }
    PyObject *buf = self->buffer_type->tp_alloc(self->buffer_type, 0);
    if (buf == NULL)
        return NULL;
    fill_buffer(self, buf, Py_NewRef(args[0]), args[1], Py_NewRef(args[2]));
    return buf;
}

static PyObject *
FastPath_take(FastPath *self, PyObject *nbytes)
{
    if (!PyLong_CheckExact(nbytes) || self->fast == NULL)
        Py_RETURN_NONE;
    PyObject *entry = PyDict_GetItemWithError(self->fast, nbytes); /* borrowed */
    if (entry == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *free = PyTuple_GET_ITEM(entry, 1);
    if (PyList_GET_SIZE(free) == 0)
        Py_RETURN_NONE;
    Py_ssize_t cls = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 0));
    Py_ssize_t requested = PyLong_AsSsize_t(nbytes);
    if ((cls == -1 || requested == -1) && PyErr_Occurred())
        return NULL;
    /* The allocation may run a garbage collection, and with it Python code: hold the entry. */
    Py_INCREF(entry);
    PyObject *buf = self->buffer_type->tp_alloc(self->buffer_type, 0);
    if (buf == NULL) {
        Py_DECREF(entry);
        return NULL;
    }
    /* Only now read the list: another thread may have emptied it meanwhile. */
    Py_ssize_t n = PyList_GET_SIZE(free);
    if (n == 0) {
        Py_DECREF(buf);
        Py_DECREF(entry);
        Py_RETURN_NONE;
    }
    /* The pop: the list's reference to the address moves to the buffer. */
    PyObject *ptr = PyList_GET_ITEM(free, n - 1);
    Py_SET_SIZE(free, n - 1);
    fill_buffer(self, buf, ptr, nbytes, entry);
    self->hits += 1;
    self->in_use += cls;
    if (self->in_use > self->peak)
        self->peak = self->in_use;
    self->requested += requested;
    return buf;
}

static PyObject *
FastPath_give(FastPath *self, PyObject *buf)
{
    if (check_initialized(self) < 0)
        return NULL;
    if (!PyObject_TypeCheck(buf, self->buffer_type)) {
        PyErr_Format(PyExc_TypeError, "not a buffer of this allocator: %R", buf);
        return NULL;
    }
    PyObject *released = SLOT(buf, self->off_released);
    if (released == Py_True) {
        PyErr_SetString(PyExc_ValueError, "buffer released twice");
        return NULL;
    }
    PyObject *entry = SLOT(buf, self->off_entry);
    PyObject *ptr = SLOT(buf, self->off_ptr);
    PyObject *nbytes = SLOT(buf, self->off_nbytes);
    PyObject *streams = SLOT(buf, self->off_streams);
    if (released == NULL || entry == NULL || ptr == NULL || nbytes == NULL) {
        PyErr_SetString(PyExc_AttributeError, "buffer fields not set");
        return NULL;
    }
    SLOT(buf, self->off_released) = Py_NewRef(Py_True);
    Py_DECREF(released);
    if (streams != NULL && streams != Py_None) {
        /* A set of streams; empty when none used the buffer. Sets call no Python code. */
        int used = PyObject_IsTrue(streams);
        if (used < 0)
            return NULL;
        if (used)
            return PyLong_FromLong(1);
    }
    Py_ssize_t cls = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 0));
    Py_ssize_t requested = PyLong_AsSsize_t(nbytes);
    if ((cls == -1 || requested == -1) && PyErr_Occurred())
        return NULL;
    /* Counters first, then the append: a block in a free list is always counted as cached. */
    self->in_use -= cls;
    self->requested -= requested;
    if (PyList_Append(PyTuple_GET_ITEM(entry, 1), ptr) < 0) {
        self->in_use += cls;
        self->requested += requested;
        return NULL;
    }
    return PyLong_FromLong(self->post_release ? 2 : 0);
}

static PyMethodDef FastPath_methods[] = {
    {"take", (PyCFunction)FastPath_take, METH_O, "A buffer over a cached block of the request size, or None."},
    {"hand_out", (PyCFunction)(void (*)(void))FastPath_hand_out, METH_FASTCALL, "A new buffer over ptr (no counter changes)."},
    {"give", (PyCFunction)FastPath_give, METH_O, "Put a released buffer's block back: 0 done, 1 slow path, 2 done, look."},
    {NULL},
};

static PyMemberDef FastPath_members[] = {
    {"hits", T_PYSSIZET, offsetof(FastPath, hits), 0, "allocations served from the cache"},
    {"in_use", T_PYSSIZET, offsetof(FastPath, in_use), 0, "bytes of blocks handed out"},
    {"peak", T_PYSSIZET, offsetof(FastPath, peak), 0, "most bytes in use at once"},
    {"requested", T_PYSSIZET, offsetof(FastPath, requested), 0, "bytes requested by blocks in use"},
    {"post_release", T_BOOL, offsetof(FastPath, post_release), 0, "give() returns 2: the allocator must look"},
    {NULL},
};

static PyTypeObject FastPathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "allocators._fastpath_c.FastPath",
    .tp_doc = PyDoc_STR("A caching allocator's hot path (see allocators/_fastpath.py)."),
    .tp_basicsize = sizeof(FastPath),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)FastPath_init,
    .tp_dealloc = (destructor)FastPath_dealloc,
    .tp_traverse = (traverseproc)FastPath_traverse,
    .tp_clear = (inquiry)FastPath_clear,
    .tp_methods = FastPath_methods,
    .tp_members = FastPath_members,
};

static struct PyModuleDef fastpath_c_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "allocators._fastpath_c",
    .m_doc = "The caching allocators' hot path in C (see allocators/_fastpath.py).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__fastpath_c(void)
{
    if (PyType_Ready(&FastPathType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&fastpath_c_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "FastPath", (PyObject *)&FastPathType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
