/* _host_dispatch_c.c: the native host function of main-thread dispatch (python_host_dispatch="main").
 *
 * A Python host call is run by its stream's worker thread, which the driver wakes with a native host
 * function, sem_post(ready) (streamrt/_hostcall.py). With main-thread dispatch that host function is
 * streamrt_host_dispatch(dispatch) instead. It counts the call, asks CPython to run the server on the
 * main thread (Py_AddPendingCall: the main thread runs it at its next bytecode boundary, with the GIL
 * it already holds), then posts ready as before. Whichever of the main thread and the worker gets to
 * the call first runs it; the other finds it served. The host function itself takes no GIL and runs
 * no Python, so the driver's callback thread never waits for the interpreter.
 *
 * A dispatch lives in calloc'ed memory, like the semaphore it posts: a driver thread may reach it
 * late, so it is freed only when no enqueued host function can name it (the caller's rule).
 *
 * Exports:
 *   DISPATCH_ADDRESS          the address of void streamrt_host_dispatch(void *dispatch)
 *   new(ready, key) -> int    a dispatch that posts the sem_t at address ready; the server gets key
 *   free(dispatch)
 *   dispatched(dispatch) -> int   how many times a driver ran it
 *   refused(dispatch) -> int      how many of those Py_AddPendingCall refused (its queue was full)
 *   set_server(fn | None)     fn(key) runs on the main thread once per dispatch; None: ask no more
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    uint64_t dispatched; /* written by driver threads only */
    uint64_t refused;
    sem_t *ready;
    uint64_t key;
} dispatch_t;

static PyObject *server; /* read and written with the GIL */
static int armed;        /* server != NULL, for driver threads (atomic) */

/* Runs on the main thread, with the GIL, between two bytecodes of whatever it was running: it must
 * never leave an exception behind (that would surface in the interrupted code). */
static int on_main(void *key) {
    PyObject *fn = server;
    if (fn == NULL) return 0;
    Py_INCREF(fn);
    PyObject *result = PyObject_CallFunction(fn, "K", (unsigned long long)(uintptr_t)key);
    if (result == NULL)
        PyErr_WriteUnraisable(fn);
    else
        Py_DECREF(result);
    Py_DECREF(fn);
    return 0;
}

/* Runs on a driver thread: no Python, no GIL, no lock of Python's but the pending-call queue's. */
static void streamrt_host_dispatch(void *data) {
    dispatch_t *d = (dispatch_t *)data;
    __atomic_add_fetch(&d->dispatched, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&armed, __ATOMIC_ACQUIRE) && Py_AddPendingCall(on_main, (void *)(uintptr_t)d->key) != 0)
        __atomic_add_fetch(&d->refused, 1, __ATOMIC_RELAXED);
    sem_post(d->ready);
}

static dispatch_t *as_dispatch(PyObject *arg) {
    void *d = PyLong_AsVoidPtr(arg);
    if (d == NULL && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "dispatch is NULL");
    return (dispatch_t *)d;
}

static PyObject *dispatch_new(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "new(ready, key) takes 2 arguments");
        return NULL;
    }
    void *ready = PyLong_AsVoidPtr(args[0]);
    if (ready == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "ready is NULL");
        return NULL;
    }
    unsigned long long key = PyLong_AsUnsignedLongLong(args[1]);
    if (key == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    dispatch_t *d = (dispatch_t *)calloc(1, sizeof *d);
    if (d == NULL) return PyErr_NoMemory();
    d->ready = (sem_t *)ready;
    d->key = key;
    return PyLong_FromVoidPtr(d);
}

static PyObject *dispatch_free(PyObject *self, PyObject *arg) {
    dispatch_t *d = as_dispatch(arg);
    if (d == NULL) return NULL;
    free(d);
    Py_RETURN_NONE;
}

static PyObject *dispatch_dispatched(PyObject *self, PyObject *arg) {
    dispatch_t *d = as_dispatch(arg);
    if (d == NULL) return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&d->dispatched, __ATOMIC_SEQ_CST));
}

static PyObject *dispatch_refused(PyObject *self, PyObject *arg) {
    dispatch_t *d = as_dispatch(arg);
    if (d == NULL) return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&d->refused, __ATOMIC_RELAXED));
}

static PyObject *set_server(PyObject *self, PyObject *fn) {
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "the server must be callable or None");
        return NULL;
    }
    PyObject *old = server;
    if (fn == Py_None) {
        __atomic_store_n(&armed, 0, __ATOMIC_RELEASE);
        server = NULL;
    } else {
        Py_INCREF(fn);
        server = fn;
        __atomic_store_n(&armed, 1, __ATOMIC_RELEASE);
    }
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static PyMethodDef dispatch_methods[] = {
    {"new", (PyCFunction)(void (*)(void))dispatch_new, METH_FASTCALL, "new(ready, key) -> int: a dispatch (calloc)."},
    {"free", dispatch_free, METH_O, "free(dispatch): free one no host function names any more."},
    {"dispatched", dispatch_dispatched, METH_O, "dispatched(dispatch) -> int: how many times a driver ran it."},
    {"refused", dispatch_refused, METH_O, "refused(dispatch) -> int: pending calls CPython refused (queue full)."},
    {"set_server", set_server, METH_O, "set_server(fn | None): fn(key) runs on the main thread per dispatch."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef dispatch_module = {
    PyModuleDef_HEAD_INIT, "_host_dispatch_c",
    "The native host function that offers a Python host call to the main thread and wakes its worker.", -1,
    dispatch_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__host_dispatch_c(void) {
    PyObject *m = PyModule_Create(&dispatch_module);
    if (m == NULL) return NULL;
    if (PyModule_AddObject(m, "DISPATCH_ADDRESS", PyLong_FromVoidPtr((void *)&streamrt_host_dispatch)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
