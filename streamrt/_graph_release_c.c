/* _graph_release_c.c: native functions the driver runs on its own threads for streamrt.
 *
 * The destructor of the user objects that tie streamrt's keepalives to a graph another library owns
 * (torch.cuda.graph, CuPy, cuda.core, raw begin-capture), and the wait that holds a stream for a
 * Python host call (streamrt/_native.py).
 *
 * The driver calls a user object's destructor on one of its own threads once the graph and every
 * executable graph instantiated from it are destroyed (and their launches have finished). That
 * thread must run no Python, take no lock Python code holds, and call no CUDA/HIP. The destructor
 * here only pushes its token (a node this module allocated) onto a lock-free stack and posts one
 * semaphore; a runtime thread blocked in take() (GIL released) pops every token and hands the
 * releases to the runtime's releaser thread (streamrt/_graph_release.py).
 *
 * The hold. A Python host call holds its stream with a host function that waits on a semaphore until
 * the worker has run the Python function. A signal delivered to the driver's thread interrupts
 * sem_wait (EINTR, whatever SA_RESTART says), and libc's sem_wait as the host function would then let
 * the stream go on before the Python function ran. streamrt_sem_hold waits again instead.
 *
 * Exports:
 *   DESTRUCTOR_ADDRESS  the address of void streamrt_graph_release(void *token)
 *   HOLD_ADDRESS        the address of void streamrt_sem_hold(void *sem_t_pointer)
 *   token(id) -> int    a new token carrying the 64-bit id (malloc; freed by take or discard)
 *   discard(token)      free a token that was never handed to a driver
 *   take(timeout)       wait up to timeout seconds (None: forever) for released tokens; their ids
 *   wake()              post the semaphore without a token (take then returns [])
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef struct release_token {
    struct release_token *next;
    unsigned long long id;
} release_token;

static release_token *released_head; /* pushed by driver threads, popped whole by take() */
static sem_t released_sem;

/* Runs on a driver thread: no Python, no allocation, no lock. */
static void streamrt_graph_release(void *token) {
    release_token *node = (release_token *)token;
    release_token *head = __atomic_load_n(&released_head, __ATOMIC_RELAXED);
    do {
        node->next = head;
    } while (!__atomic_compare_exchange_n(&released_head, &head, node, 1, __ATOMIC_RELEASE, __ATOMIC_RELAXED));
    sem_post(&released_sem);
}

/* Runs on a driver thread: waits on the semaphore, through signals. */
static void streamrt_sem_hold(void *sem) {
    while (sem_wait((sem_t *)sem) != 0 && errno == EINTR) {
    }
}

static PyObject *token_new(PyObject *self, PyObject *arg) {
    unsigned long long id = PyLong_AsUnsignedLongLong(arg);
    if (id == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    release_token *node = (release_token *)calloc(1, sizeof *node);
    if (node == NULL) return PyErr_NoMemory();
    node->id = id;
    return PyLong_FromVoidPtr(node);
}

static PyObject *token_discard(PyObject *self, PyObject *arg) {
    void *node = PyLong_AsVoidPtr(arg);
    if (node == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "token is NULL");
        return NULL;
    }
    free(node);
    Py_RETURN_NONE;
}

static PyObject *take(PyObject *self, PyObject *arg) {
    int rc;
    if (arg == Py_None) {
        Py_BEGIN_ALLOW_THREADS
        do {
            rc = sem_wait(&released_sem);
        } while (rc != 0 && errno == EINTR);
        Py_END_ALLOW_THREADS
    } else {
        double timeout = PyFloat_AsDouble(arg);
        if (timeout == -1.0 && PyErr_Occurred()) return NULL;
        if (!(timeout >= 0)) {
            PyErr_SetString(PyExc_ValueError, "timeout must be >= 0 or None");
            return NULL;
        }
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        double whole = (double)(long long)timeout;
        deadline.tv_sec += (time_t)whole;
        deadline.tv_nsec += (long)((timeout - whole) * 1e9);
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec += 1;
            deadline.tv_nsec -= 1000000000L;
        }
        Py_BEGIN_ALLOW_THREADS
        do {
            rc = sem_timedwait(&released_sem, &deadline);
        } while (rc != 0 && errno == EINTR);
        Py_END_ALLOW_THREADS
    }
    PyObject *ids = PyList_New(0);
    if (ids == NULL) return NULL;
    if (rc != 0) return ids; /* timed out */
    release_token *node = __atomic_exchange_n(&released_head, NULL, __ATOMIC_ACQUIRE);
    int failed = 0;
    while (node != NULL) {
        release_token *next = node->next;
        if (!failed) {
            PyObject *id = PyLong_FromUnsignedLongLong(node->id);
            if (id == NULL || PyList_Append(ids, id) < 0) failed = 1;
            Py_XDECREF(id);
        }
        free(node);
        node = next;
    }
    if (failed) {
        Py_DECREF(ids);
        return NULL;
    }
    return ids;
}

static PyObject *wake(PyObject *self, PyObject *unused) {
    sem_post(&released_sem);
    Py_RETURN_NONE;
}

static PyMethodDef release_methods[] = {
    {"token", token_new, METH_O, "token(id) -> int: a new token carrying id, for the destructor's user data."},
    {"discard", token_discard, METH_O, "discard(token): free a token no driver was given."},
    {"take", take, METH_O, "take(timeout) -> list[int]: ids of released tokens (GIL released while waiting)."},
    {"wake", wake, METH_NOARGS, "wake(): make a waiting take() return (with no ids)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef release_module = {
    PyModuleDef_HEAD_INIT, "_graph_release_c",
    "Native functions driver threads run: the user-object destructor (and the queue it feeds), the stream hold.", -1,
    release_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__graph_release_c(void) {
    if (sem_init(&released_sem, 0, 0) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return NULL;
    }
    PyObject *m = PyModule_Create(&release_module);
    if (m == NULL) return NULL;
    if (PyModule_AddObject(m, "DESTRUCTOR_ADDRESS", PyLong_FromVoidPtr((void *)&streamrt_graph_release)) < 0 ||
        PyModule_AddObject(m, "HOLD_ADDRESS", PyLong_FromVoidPtr((void *)&streamrt_sem_hold)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
