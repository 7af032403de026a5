/* _launch_c.c: a launch's driver calls made in one call from Python (streamrt._backends._native_ops).
 *
 * An Executor holds the addresses of ten CUDA driver (or HIP runtime) entry points. run() executes a
 * program -- a buffer of 6-word records, each one backend call with its arguments -- with the GIL
 * released once for the whole program; replay() checks that a stream is not capturing, launches an
 * executable graph on it and, given an event, records it after the graph; copy_record() checks that a
 * stream is not capturing, enqueues a copy on it and records an event after it; record() records an
 * event (record_held() with the GIL kept); wait() makes a stream wait for one; query() asks whether an
 * event has completed; synchronize() waits for one (GIL released). A failing call stops the program:
 * run(), replay() and copy_record() return (index, code) of the failed call, or (index, 0) where a
 * capture check found the stream capturing, and None when every call succeeded. record(), wait(),
 * query() and synchronize() raise the error that make_error(code, call) returns.
 *
 * On CUDA a driver call made on a thread with no current context returns CUDA_ERROR_INVALID_CONTEXT:
 * the Executor then calls make_current() (with the GIL) once and retries the call (context_error = 0:
 * never). Nothing here keeps a pointer: the caller keeps what the calls point into alive.
 *
 * Ops (record words 1..5):
 *   OP_CHECK  stream                                 capturing? (nothing enqueued)
 *   OP_MEMSET dst, value, nbytes, stream
 *   OP_COPY   dst, src, nbytes, kind, stream         (kind: HIP's; CUDA infers it from the addresses)
 *   OP_HOST   stream, fn, data                       a native void fn(void *data)
 *   OP_RECORD event, stream
 *   OP_WAIT   stream, event
 *   OP_GRAPH  graph_exec, stream
 *   OP_KERNEL function, grid, block, stream, kernel_params
 *             grid: x | y << 32 | z << 48; block: x | y << 11 | z << 22 | shared_mem << 33
 *             (cuLaunchKernel / hipModuleLaunchKernel with kernelParams and no extra)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { OP_CHECK, OP_MEMSET, OP_COPY, OP_HOST, OP_RECORD, OP_WAIT, OP_GRAPH, OP_KERNEL, N_OPS };
#define FN_QUERY N_OPS      /* the event query and wait: entry points, not program ops */
#define FN_SYNC (N_OPS + 1)
#define N_FNS (N_OPS + 2)
#define WORDS 6
#define NOT_READY 600 /* CUDA_ERROR_NOT_READY and hipErrorNotReady */

typedef int (*is_capturing_fn)(void *stream, int *status);
typedef int (*cu_memset_fn)(uint64_t dst, unsigned char value, size_t nbytes, void *stream);
typedef int (*hip_memset_fn)(void *dst, int value, size_t nbytes, void *stream);
typedef int (*cu_copy_fn)(uint64_t dst, uint64_t src, size_t nbytes, void *stream);
typedef int (*hip_copy_fn)(void *dst, const void *src, size_t nbytes, int kind, void *stream);
typedef int (*host_fn)(void *stream, void (*fn)(void *), void *data);
typedef int (*record_fn)(void *event, void *stream);
typedef int (*wait_fn)(void *stream, void *event, unsigned int flags);
typedef int (*graph_fn)(void *exec, void *stream);
typedef int (*query_fn)(void *event); /* also the event wait's signature */
typedef int (*kernel_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                         void *stream, void **params, void **extra);

typedef struct {
    PyObject_HEAD
    void *fns[N_FNS]; /* is_capturing, memset, copy, host, record, wait, graph_launch, kernel launch, event query, event wait */
    int hip;
    int context_error;
    PyObject *make_error;   /* (code, call) -> exception */
    PyObject *make_current; /* () -> None, or None */
} Executor;

static const char *CUDA_NAMES[N_FNS] = {"cuStreamIsCapturing", "cuMemsetD8Async", "cuMemcpyAsync", "cuLaunchHostFunc",
                                        "cuEventRecord", "cuStreamWaitEvent", "cuGraphLaunch", "cuLaunchKernel", "cuEventQuery",
                                        "cuEventSynchronize"};
static const char *HIP_NAMES[N_FNS] = {"hipStreamIsCapturing", "hipMemsetAsync", "hipMemcpyAsync", "hipLaunchHostFunc",
                                       "hipEventRecord", "hipStreamWaitEvent", "hipGraphLaunch", "hipModuleLaunchKernel",
                                       "hipEventQuery", "hipEventSynchronize"};

/* One call; *capturing is set by OP_CHECK. No GIL needed. */
static int call(Executor *ex, const uint64_t *w, int *capturing) {
    void **f = ex->fns;
    switch (w[0]) {
    case OP_CHECK: {
        int status = 0;
        int code = ((is_capturing_fn)f[OP_CHECK])((void *)(uintptr_t)w[1], &status);
        *capturing = code == 0 && status != 0;
        return code;
    }
    case OP_MEMSET:
        if (ex->hip) return ((hip_memset_fn)f[OP_MEMSET])((void *)(uintptr_t)w[1], (int)w[2], (size_t)w[3], (void *)(uintptr_t)w[4]);
        return ((cu_memset_fn)f[OP_MEMSET])(w[1], (unsigned char)w[2], (size_t)w[3], (void *)(uintptr_t)w[4]);
    case OP_COPY:
        if (ex->hip)
            return ((hip_copy_fn)f[OP_COPY])((void *)(uintptr_t)w[1], (const void *)(uintptr_t)w[2], (size_t)w[3], (int)w[4],
                                             (void *)(uintptr_t)w[5]);
        return ((cu_copy_fn)f[OP_COPY])(w[1], w[2], (size_t)w[3], (void *)(uintptr_t)w[5]);
    case OP_HOST:
        return ((host_fn)f[OP_HOST])((void *)(uintptr_t)w[1], (void (*)(void *))(uintptr_t)w[2], (void *)(uintptr_t)w[3]);
    case OP_RECORD:
        return ((record_fn)f[OP_RECORD])((void *)(uintptr_t)w[1], (void *)(uintptr_t)w[2]);
    case OP_WAIT:
        return ((wait_fn)f[OP_WAIT])((void *)(uintptr_t)w[1], (void *)(uintptr_t)w[2], 0);
    case OP_GRAPH:
        return ((graph_fn)f[OP_GRAPH])((void *)(uintptr_t)w[1], (void *)(uintptr_t)w[2]);
    case OP_KERNEL: {
        uint64_t g = w[2], b = w[3];
        return ((kernel_fn)f[OP_KERNEL])((void *)(uintptr_t)w[1], (unsigned)(g & 0xFFFFFFFFu), (unsigned)((g >> 32) & 0xFFFF),
                                         (unsigned)(g >> 48), (unsigned)(b & 0x7FF), (unsigned)((b >> 11) & 0x7FF),
                                         (unsigned)((b >> 22) & 0x7FF), (unsigned)(b >> 33), (void *)(uintptr_t)w[4],
                                         (void **)(uintptr_t)w[5], NULL);
    }
    }
    return -1; /* validated when the program was read */
}

/* make_current() with the GIL held; 0 on success, -1 with a Python error set. */
static int make_current(Executor *ex) {
    if (ex->make_current == Py_None) return 0;
    PyObject *r = PyObject_CallNoArgs(ex->make_current);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* Runs records [0, n) with the GIL released; on return *failed is the failed record's index (n: none). */
static int execute(Executor *ex, const uint64_t *words, Py_ssize_t n, Py_ssize_t *failed, int *capturing, int *python_error) {
    int code = 0;
    Py_ssize_t i = 0;
    *capturing = 0;
    *python_error = 0;
    int retried = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; i < n; i++) {
        code = call(ex, words + i * WORDS, capturing);
        if (code != 0 && code == ex->context_error && !retried) {
            int ok;
            Py_BLOCK_THREADS
            ok = make_current(ex);
            Py_UNBLOCK_THREADS
            if (ok != 0) {
                *python_error = 1;
                break;
            }
            retried = 1;
            code = call(ex, words + i * WORDS, capturing);
        }
        if (code != 0 || *capturing) break;
    }
    Py_END_ALLOW_THREADS
    *failed = i;
    return code;
}

static PyObject *outcome(Py_ssize_t failed, Py_ssize_t n, int code, int capturing, int python_error) {
    if (python_error) return NULL;
    if (failed >= n) Py_RETURN_NONE;
    return Py_BuildValue("(ni)", failed, capturing ? 0 : code);
}

/* Validates a program buffer (a whole number of records, known ops); its record count, or -1 with an error. */
static Py_ssize_t program_length(const Py_buffer *view) {
    if (view->len % (WORDS * sizeof(uint64_t)) != 0) {
        PyErr_SetString(PyExc_ValueError, "a program is a whole number of 6-word records");
        return -1;
    }
    const uint64_t *words = (const uint64_t *)view->buf;
    Py_ssize_t n = view->len / (Py_ssize_t)(WORDS * sizeof(uint64_t));
    for (Py_ssize_t i = 0; i < n; i++) {
        if (words[i * WORDS] >= N_OPS) {
            PyErr_Format(PyExc_ValueError, "record %zd: unknown op %llu", i, (unsigned long long)words[i * WORDS]);
            return -1;
        }
    }
    return n;
}

static PyObject *Executor_run(Executor *ex, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0) return NULL;
    Py_ssize_t n = program_length(&view);
    if (n < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t failed;
    int capturing, python_error;
    int code = execute(ex, (const uint64_t *)view.buf, n, &failed, &capturing, &python_error);
    PyBuffer_Release(&view);
    return outcome(failed, n, code, capturing, python_error);
}

/* replay(graph_exec, stream[, event]): the check, the launch, and the event's record where one is given (not 0). */
static PyObject *Executor_replay(Executor *ex, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "replay(graph_exec, stream[, event])");
        return NULL;
    }
    uint64_t exec = PyLong_AsUnsignedLongLong(args[0]);
    uint64_t stream = PyLong_AsUnsignedLongLong(args[1]);
    uint64_t event = nargs == 3 ? PyLong_AsUnsignedLongLong(args[2]) : 0;
    if (PyErr_Occurred()) return NULL;
    uint64_t words[3 * WORDS] = {OP_CHECK, stream, 0, 0, 0, 0, OP_GRAPH, exec, stream, 0, 0, 0, OP_RECORD, event, stream, 0, 0, 0};
    Py_ssize_t n = event ? 3 : 2, failed;
    int capturing, python_error;
    int code = execute(ex, words, n, &failed, &capturing, &python_error);
    return outcome(failed, n, code, capturing, python_error);
}

static PyObject *Executor_copy_record(Executor *ex, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "copy_record(dst, src, nbytes, kind, stream, event)");
        return NULL;
    }
    uint64_t a[6];
    for (int i = 0; i < 6; i++) a[i] = PyLong_AsUnsignedLongLong(args[i]);
    if (PyErr_Occurred()) return NULL;
    uint64_t words[3 * WORDS] = {OP_CHECK, a[4], 0, 0, 0, 0, OP_COPY, a[0], a[1], a[2], a[3], a[4], OP_RECORD, a[5], a[4], 0, 0, 0};
    Py_ssize_t failed;
    int capturing, python_error;
    int code = execute(ex, words, 3, &failed, &capturing, &python_error);
    return outcome(failed, 3, code, capturing, python_error);
}

/* Raises make_error(code, the name of entry point fn); returns NULL. */
static PyObject *raise_code(Executor *ex, int code, int fn) {
    PyObject *exc = PyObject_CallFunction(ex->make_error, "is", code, (ex->hip ? HIP_NAMES : CUDA_NAMES)[fn]);
    if (exc == NULL) return NULL;
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return NULL;
}

/* One call (a record or a wait) outside a program. record(event, stream) and wait(stream, event) release
 * the GIL: an enqueue can block in the driver behind a stream whose queue is full, and what drains it (a
 * host call's worker) may need the GIL. record_held(event, stream) keeps it, saving the hand-over, for a
 * caller that accepts that risk (the completion engine's tail records). */
static PyObject *one_call(Executor *ex, int op, PyObject *const *args, Py_ssize_t nargs, int hold) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, op == OP_RECORD ? "record(event, stream)" : "wait(stream, event)");
        return NULL;
    }
    uint64_t words[WORDS] = {op, PyLong_AsUnsignedLongLong(args[0]), PyLong_AsUnsignedLongLong(args[1]), 0, 0, 0};
    if (PyErr_Occurred()) return NULL;
    int code;
    if (hold) {
        int capturing;
        code = call(ex, words, &capturing);
        if (code != 0 && code == ex->context_error) {
            if (make_current(ex) != 0) return NULL;
            code = call(ex, words, &capturing);
        }
    } else {
        Py_ssize_t failed;
        int capturing, python_error;
        code = execute(ex, words, 1, &failed, &capturing, &python_error);
        if (python_error) return NULL;
    }
    if (code == 0) Py_RETURN_NONE;
    return raise_code(ex, code, op);
}

static PyObject *Executor_record(Executor *ex, PyObject *const *args, Py_ssize_t nargs) { return one_call(ex, OP_RECORD, args, nargs, 0); }

static PyObject *Executor_record_held(Executor *ex, PyObject *const *args, Py_ssize_t nargs) {
    return one_call(ex, OP_RECORD, args, nargs, 1);
}

static PyObject *Executor_wait(Executor *ex, PyObject *const *args, Py_ssize_t nargs) { return one_call(ex, OP_WAIT, args, nargs, 0); }

/* Calls entry point fn (query or synchronize) on the event with the GIL released, made current and retried
 * once on a thread with no current context; the call's code, or -1 with a Python error set. */
static int event_call(Executor *ex, PyObject *arg, int fn) {
    void *event = (void *)(uintptr_t)PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return -1;
    int code;
    Py_BEGIN_ALLOW_THREADS
    code = ((query_fn)ex->fns[fn])(event);
    Py_END_ALLOW_THREADS
    if (code != 0 && code != NOT_READY && code == ex->context_error) {
        if (make_current(ex) != 0) return -1;
        Py_BEGIN_ALLOW_THREADS
        code = ((query_fn)ex->fns[fn])(event);
        Py_END_ALLOW_THREADS
    }
    return code;
}

/* query(event): True once the event completed, False while not ready (the GIL is released, as by every
 * driver call that may wait for a lock another enqueue holds). */
static PyObject *Executor_query(Executor *ex, PyObject *arg) {
    int code = event_call(ex, arg, FN_QUERY);
    if (code == -1) return NULL;
    if (code == 0) Py_RETURN_TRUE;
    if (code == NOT_READY) Py_RETURN_FALSE;
    return raise_code(ex, code, FN_QUERY);
}

/* synchronize(event): returns once the event completed (GIL released while it waits). */
static PyObject *Executor_synchronize(Executor *ex, PyObject *arg) {
    int code = event_call(ex, arg, FN_SYNC);
    if (code == -1) return NULL;
    if (code == 0) Py_RETURN_NONE;
    return raise_code(ex, code, FN_SYNC);
}

static PyObject *Executor_call_name(Executor *ex, PyObject *arg) {
    long op = PyLong_AsLong(arg);
    if (op == -1 && PyErr_Occurred()) return NULL;
    if (op < 0 || op >= N_FNS) {
        PyErr_Format(PyExc_ValueError, "unknown op %ld", op);
        return NULL;
    }
    return PyUnicode_FromString((ex->hip ? HIP_NAMES : CUDA_NAMES)[op]);
}

static int Executor_init(Executor *ex, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"addresses", "hip", "make_error", "make_current", "context_error", NULL};
    PyObject *addresses, *make_error, *make_current_fn;
    int hip, context_error;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!pOOi", kwlist, &PyTuple_Type, &addresses, &hip, &make_error, &make_current_fn,
                                     &context_error))
        return -1;
    if (PyTuple_GET_SIZE(addresses) != N_FNS) {
        PyErr_Format(PyExc_ValueError, "addresses: %d entry points", N_FNS);
        return -1;
    }
    for (int i = 0; i < N_FNS; i++) {
        void *p = PyLong_AsVoidPtr(PyTuple_GET_ITEM(addresses, i));
        if (p == NULL) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "addresses[%d] is NULL", i);
            return -1;
        }
        ex->fns[i] = p;
    }
    if (!PyCallable_Check(make_error) || (make_current_fn != Py_None && !PyCallable_Check(make_current_fn))) {
        PyErr_SetString(PyExc_TypeError, "make_error must be callable, make_current callable or None");
        return -1;
    }
    ex->hip = hip;
    ex->context_error = context_error;
    Py_XSETREF(ex->make_error, Py_NewRef(make_error));
    Py_XSETREF(ex->make_current, Py_NewRef(make_current_fn));
    return 0;
}

static void Executor_dealloc(Executor *ex) {
    Py_XDECREF(ex->make_error);
    Py_XDECREF(ex->make_current);
    Py_TYPE(ex)->tp_free((PyObject *)ex);
}

static PyMethodDef Executor_methods[] = {
    {"run", (PyCFunction)Executor_run, METH_O, "run(program) -> None | (index, code)"},
    {"replay", (PyCFunction)(void (*)(void))Executor_replay, METH_FASTCALL,
     "replay(graph_exec, stream[, event]) -> None | (index, code)"},
    {"copy_record", (PyCFunction)(void (*)(void))Executor_copy_record, METH_FASTCALL,
     "copy_record(dst, src, nbytes, kind, stream, event) -> None | (index, code)"},
    {"record", (PyCFunction)(void (*)(void))Executor_record, METH_FASTCALL, "record(event, stream); raises make_error(code, call)"},
    {"record_held", (PyCFunction)(void (*)(void))Executor_record_held, METH_FASTCALL, "record(event, stream), the GIL kept"},
    {"wait", (PyCFunction)(void (*)(void))Executor_wait, METH_FASTCALL, "wait(stream, event); raises make_error(code, call)"},
    {"query", (PyCFunction)Executor_query, METH_O, "query(event) -> whether it completed; raises make_error(code, call)"},
    {"synchronize", (PyCFunction)Executor_synchronize, METH_O, "synchronize(event): waits for it; raises make_error(code, call)"},
    {"call_name", (PyCFunction)Executor_call_name, METH_O, "call_name(op) -> the entry point's C name"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ExecutorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "streamrt._backends._launch_c.Executor",
    .tp_basicsize = sizeof(Executor),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Executor_init,
    .tp_dealloc = (destructor)Executor_dealloc,
    .tp_methods = Executor_methods,
    .tp_doc = "Driver entry points called in one go; see the module's comment.",
};

#include "_submit_c.h" /* the Submitter: it runs programs through an Executor */

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_launch_c", .m_doc = "A launch's driver calls in one call from Python.", .m_size = -1};

PyMODINIT_FUNC PyInit__launch_c(void) {
    if (PyType_Ready(&ExecutorType) < 0 || PyType_Ready(&SubmitterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Executor", (PyObject *)&ExecutorType) < 0 ||
        PyModule_AddObjectRef(m, "Submitter", (PyObject *)&SubmitterType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    const char *ops[N_OPS] = {"OP_CHECK", "OP_MEMSET", "OP_COPY", "OP_HOST", "OP_RECORD", "OP_WAIT", "OP_GRAPH", "OP_KERNEL"};
    for (int i = 0; i < N_OPS; i++) {
        if (PyModule_AddIntConstant(m, ops[i], i) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    if (PyModule_AddIntConstant(m, "FN_QUERY", FN_QUERY) < 0 || PyModule_AddIntConstant(m, "FN_SYNC", FN_SYNC) < 0 ||
        PyModule_AddIntConstant(m, "WORDS", WORDS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
