/* The caching allocators' hot path in C: a cache hit (on no stream, or on a stream's own free list)
 * and the release of a block that needs no fence.
 *
 * allocators/_fastpath.py is the same thing in Python (the fallback when this module is not
 * built) and documents the contract; the tests run both. A FastPath belongs to one allocator:
 *
 *   take(nbytes)  -> a new buffer of `buffer_type` over a block of the shared list of the request
 *                    size, or None (not an exact int, a size not memoized in `fast`, no free block).
 *   take_on(nbytes, stream) -> a new buffer over a block of `stream`'s own list, its streams
 *                    {stream}; or None (stream or size not memoized in `streams`, no free block,
 *                    the stream closed, a capture pool bound, `is_capturing(handle)` true).
 *   hand_out(ptr, nbytes, entry, stream) -> a new buffer over `ptr` (the slow path's; no counter
 *                    changes); its streams {stream}, or None when stream is None.
 *   give(buffer)  -> 0: the block is back in its entry's list; 1: `buffer` needs the slow path
 *                    (a stream other than its home used it; only the released flag was set);
 *                    2: back in its list, and `post_release` asks the allocator to look.
 *                    Raises ValueError if `buffer` was released already.
 *
 * An entry is (size class, free list, home): home None for the shared lists, or for a stream's
 * own list that stream's holder [stream] ([None] once retired: releases then take the slow path). `fast` maps a request size to its shared entry, `streams` maps a Stream to
 * (handle, {request size: entry}); the allocator owns and fills both. The counters (hits,
 * stream_hits, in_use, peak, requested; bytes) are members that the allocator's slow paths
 * update under its lock. Everything runs under the GIL. The steps that may run Python code (dict
 * lookups, the `is_closed` property, `is_capturing`, making the buffer) come first; the list is
 * then re-read, and from there on nothing calls Python code, so each call's list and counter
 * updates are atomic with respect to other threads, as the slow paths rely on.
 *
 * Buffer fields: the type's __slots__ named by `fields` (streamrt.Buffer.ALLOCATION_FIELDS, the
 * allocator seam's stable names, then "_entry"); their offsets are read once from the slot
 * descriptors.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *fast;         /* dict: request size -> (size class, shared free list, None) */
    PyObject *streams;      /* dict: Stream -> (handle, dict: request size -> (size class, free list, Stream)) */
    PyObject *bindings;     /* dict: the allocator's capture-pool bindings (non-empty: no take_on) */
    PyObject *is_capturing; /* callable(handle) -> bool, or None */
    PyTypeObject *buffer_type;
    Py_ssize_t off_ptr, off_nbytes, off_released, off_streams, off_entry;
    Py_ssize_t hits, stream_hits, in_use, peak, requested;
    char post_release;
} FastPath;

static PyObject *str_is_closed;

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
slot_offset(PyTypeObject *type, PyObject *name, Py_ssize_t *offset)
{
    if (!PyUnicode_Check(name)) {
        PyErr_SetString(PyExc_TypeError, "fields must be str");
        return -1;
    }
    PyObject *descr = PyObject_GetAttr((PyObject *)type, name);
    if (descr == NULL)
        return -1;
    if (!Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        Py_DECREF(descr);
        PyErr_Format(PyExc_TypeError, "%s.%U is not a __slots__ field", type->tp_name, name);
        return -1;
    }
    *offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_DECREF(descr);
    return 0;
}

static int
FastPath_init(FastPath *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer_type", "fields", "fast", "streams", "bindings", "is_capturing", NULL};
    PyObject *type, *fields, *fast, *streams, *bindings, *is_capturing;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!O!O!O", kwlist, &PyType_Type, &type, &PyTuple_Type, &fields,
                                     &PyDict_Type, &fast, &PyDict_Type, &streams, &PyDict_Type, &bindings, &is_capturing))
        return -1;
    if (is_capturing != Py_None && !PyCallable_Check(is_capturing)) {
        PyErr_SetString(PyExc_TypeError, "is_capturing must be callable or None");
        return -1;
    }
    if (PyTuple_GET_SIZE(fields) != 5) {
        PyErr_SetString(PyExc_TypeError, "fields: (ptr, nbytes, released, streams, entry) slot names");
        return -1;
    }
    PyTypeObject *t = (PyTypeObject *)type;
    Py_ssize_t *offsets[5] = {&self->off_ptr, &self->off_nbytes, &self->off_released, &self->off_streams, &self->off_entry};
    for (Py_ssize_t i = 0; i < 5; i++)
        if (slot_offset(t, PyTuple_GET_ITEM(fields, i), offsets[i]) < 0)
            return -1;
    Py_XSETREF(self->buffer_type, (PyTypeObject *)Py_NewRef(type));
    Py_XSETREF(self->fast, Py_NewRef(fast));
    Py_XSETREF(self->streams, Py_NewRef(streams));
    Py_XSETREF(self->bindings, Py_NewRef(bindings));
    Py_XSETREF(self->is_capturing, Py_NewRef(is_capturing));
    return 0;
}

static int
FastPath_traverse(FastPath *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fast);
    Py_VISIT(self->streams);
    Py_VISIT(self->bindings);
    Py_VISIT(self->is_capturing);
    Py_VISIT(self->buffer_type);
    return 0;
}

static int
FastPath_clear(FastPath *self)
{
    Py_CLEAR(self->fast);
    Py_CLEAR(self->streams);
    Py_CLEAR(self->bindings);
    Py_CLEAR(self->is_capturing);
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

/* Sets the fields of a new `buf`; steals the references to `ptr`, `streams` and `entry`. */
static void
fill_buffer(FastPath *self, PyObject *buf, PyObject *ptr, PyObject *nbytes, PyObject *streams, PyObject *entry)
{
    SLOT(buf, self->off_ptr) = ptr;
    SLOT(buf, self->off_nbytes) = Py_NewRef(nbytes);
    SLOT(buf, self->off_released) = Py_NewRef(Py_False);
    SLOT(buf, self->off_streams) = streams;
    SLOT(buf, self->off_entry) = entry;
}

static int
is_entry(PyObject *entry)
{
    return PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 3 && PyList_Check(PyTuple_GET_ITEM(entry, 1));
}

/* A new set {stream}, or NULL with an exception set. */
static PyObject *
stream_set(PyObject *stream)
{
    PyObject *set = PySet_New(NULL);
    if (set != NULL && PySet_Add(set, stream) < 0)
        Py_CLEAR(set);
    return set;
}

/* Pops the last block of `free` into a new buffer `buf` (stealing `buf` and `streams`) and counts it.
 * Returns the buffer, or None (both released) when the list is empty by now. */
static PyObject *
pop_into(FastPath *self, PyObject *buf, PyObject *streams, PyObject *nbytes, PyObject *entry, Py_ssize_t cls,
         Py_ssize_t requested, int on_stream)
{
    PyObject *free = PyTuple_GET_ITEM(entry, 1);
    Py_ssize_t n = PyList_GET_SIZE(free);
    if (n == 0) {
        Py_DECREF(buf);
        Py_XDECREF(streams);
        Py_DECREF(entry);
        Py_RETURN_NONE;
    }
    /* The pop: the list's reference to the address moves to the buffer. */
    PyObject *ptr = PyList_GET_ITEM(free, n - 1);
    Py_SET_SIZE(free, n - 1);
    fill_buffer(self, buf, ptr, nbytes, streams == NULL ? Py_NewRef(Py_None) : streams, entry);
    self->hits += 1;
    self->stream_hits += on_stream;
    self->in_use += cls;
    if (self->in_use > self->peak)
        self->peak = self->in_use;
    self->requested += requested;
    return buf;
}

static int
entry_sizes(PyObject *entry, PyObject *nbytes, Py_ssize_t *cls, Py_ssize_t *requested)
{
    *cls = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 0));
    *requested = PyLong_AsSsize_t(nbytes);
    return ((*cls == -1 || *requested == -1) && PyErr_Occurred()) ? -1 : 0;
}

static PyObject *
FastPath_hand_out(FastPath *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_initialized(self) < 0)
        return NULL;
    if (nargs != 4 || !is_entry(args[2])) {
        PyErr_SetString(PyExc_TypeError, "hand_out(ptr, nbytes, (size class, free list, home), stream)");
        return NULL;
    }
    PyObject *streams = NULL;
    if (args[3] != Py_None && (streams = stream_set(args[3])) == NULL)
        return NULL;
    PyObject *buf = self->buffer_type->tp_alloc(self->buffer_type, 0);
    if (buf == NULL) {
        Py_XDECREF(streams);
        return NULL;
    }
    fill_buffer(self, buf, Py_NewRef(args[0]), args[1], streams == NULL ? Py_NewRef(Py_None) : streams, Py_NewRef(args[2]));
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
    if (!is_entry(entry) || PyList_GET_SIZE(PyTuple_GET_ITEM(entry, 1)) == 0)
        Py_RETURN_NONE;
    Py_ssize_t cls, requested;
    if (entry_sizes(entry, nbytes, &cls, &requested) < 0)
        return NULL;
    /* The allocation may run a garbage collection, and with it Python code: hold the entry. */
    Py_INCREF(entry);
    PyObject *buf = self->buffer_type->tp_alloc(self->buffer_type, 0);
    if (buf == NULL) {
        Py_DECREF(entry);
        return NULL;
    }
    /* pop_into re-reads the list: another thread may have emptied it meanwhile. */
    return pop_into(self, buf, NULL, nbytes, entry, cls, requested, 0);
}

static PyObject *
FastPath_take_on(FastPath *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "take_on(nbytes, stream)");
        return NULL;
    }
    PyObject *nbytes = args[0], *stream = args[1];
    if (!PyLong_CheckExact(nbytes) || self->streams == NULL)
        Py_RETURN_NONE;
    PyObject *memo = PyDict_GetItemWithError(self->streams, stream); /* borrowed */
    if (memo == NULL) {
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError))
                return NULL;
            PyErr_Clear(); /* unhashable: not a Stream; the slow path says so */
        }
        Py_RETURN_NONE;
    }
    if (!PyTuple_Check(memo) || PyTuple_GET_SIZE(memo) != 2 || !PyDict_Check(PyTuple_GET_ITEM(memo, 1))) {
        PyErr_SetString(PyExc_TypeError, "streams: Stream -> (handle, {size: entry})");
        return NULL;
    }
    /* Hold what the calls below (which may run Python code) could drop from the tables. */
    Py_INCREF(memo);
    PyObject *entry = PyDict_GetItemWithError(PyTuple_GET_ITEM(memo, 1), nbytes);
    if (entry == NULL || !is_entry(entry) || PyList_GET_SIZE(PyTuple_GET_ITEM(entry, 1)) == 0 || PyDict_GET_SIZE(self->bindings)) {
        Py_DECREF(memo);
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    Py_INCREF(entry);
    Py_ssize_t cls, requested;
    int refuse;
    PyObject *closed = NULL, *capturing = NULL, *streams = NULL, *buf = NULL;
    if (entry_sizes(entry, nbytes, &cls, &requested) < 0)
        goto fail;
    closed = PyObject_GetAttr(stream, str_is_closed);
    if (closed == NULL)
        goto fail;
    refuse = PyObject_IsTrue(closed);
    if (refuse < 0)
        goto fail;
    if (!refuse && self->is_capturing != Py_None) {
        capturing = PyObject_CallOneArg(self->is_capturing, PyTuple_GET_ITEM(memo, 0));
        if (capturing == NULL || (refuse = PyObject_IsTrue(capturing)) < 0)
            goto fail;
    }
    Py_CLEAR(closed);
    Py_CLEAR(capturing);
    /* A capture pool bound meanwhile (by the calls above, or another thread): the slow path routes. */
    if (refuse || PyDict_GET_SIZE(self->bindings)) {
        Py_DECREF(entry);
        Py_DECREF(memo);
        Py_RETURN_NONE;
    }
    if ((streams = stream_set(stream)) == NULL)
        goto fail;
    if ((buf = self->buffer_type->tp_alloc(self->buffer_type, 0)) == NULL)
        goto fail;
    Py_DECREF(memo);
    return pop_into(self, buf, streams, nbytes, entry, cls, requested, 1);
fail:
    Py_XDECREF(closed);
    Py_XDECREF(capturing);
    Py_XDECREF(streams);
    Py_DECREF(entry);
    Py_DECREF(memo);
    return NULL;
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
    if (!is_entry(entry)) {
        PyErr_SetString(PyExc_TypeError, "buffer entry: (size class, free list, home)");
        return NULL;
    }
    if (streams != NULL && streams != Py_None && !PyAnySet_Check(streams)) {
        PyErr_SetString(PyExc_TypeError, "buffer streams: None or a set");
        return NULL;
    }
    PyObject *home = PyTuple_GET_ITEM(entry, 2);
    if (home != Py_None && (!PyList_Check(home) || PyList_GET_SIZE(home) != 1)) {
        PyErr_SetString(PyExc_TypeError, "entry home: None or a stream's holder [stream]");
        return NULL;
    }
    SLOT(buf, self->off_released) = Py_NewRef(Py_True);
    Py_DECREF(released);
    Py_ssize_t used = (streams == NULL || streams == Py_None) ? 0 : PySet_GET_SIZE(streams);
    if (home == Py_None) {
        if (used)
            return PyLong_FromLong(1);
    }
    else {
        /* A stream's own list: only if that stream, and no other, used the block (and it is not retired). */
        PyObject *stream = PyList_GET_ITEM(home, 0);
        if (stream == Py_None || used != 1)
            return PyLong_FromLong(1);
        int own = PySet_Contains(streams, stream); /* streams hash by identity: no Python code runs */
        if (own < 0)
            return NULL;
        if (!own)
            return PyLong_FromLong(1);
    }
    Py_ssize_t cls, requested;
    if (entry_sizes(entry, nbytes, &cls, &requested) < 0)
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
    {"take", (PyCFunction)FastPath_take, METH_O, "A buffer over a block of the shared list of the request size, or None."},
    {"take_on", (PyCFunction)(void (*)(void))FastPath_take_on, METH_FASTCALL, "A buffer over a block of the stream's own list, or None."},
    {"hand_out", (PyCFunction)(void (*)(void))FastPath_hand_out, METH_FASTCALL, "A new buffer over ptr (no counter changes)."},
    {"give", (PyCFunction)FastPath_give, METH_O, "Put a released buffer's block back: 0 done, 1 slow path, 2 done, look."},
    {NULL},
};

static PyMemberDef FastPath_members[] = {
    {"hits", T_PYSSIZET, offsetof(FastPath, hits), 0, "allocations served from the cache"},
    {"stream_hits", T_PYSSIZET, offsetof(FastPath, stream_hits), 0, "hits from a stream's own free list"},
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
    if (str_is_closed == NULL && (str_is_closed = PyUnicode_InternFromString("is_closed")) == NULL)
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
