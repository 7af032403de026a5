/* _submit_c.h: the Submitter of streamrt._backends._launch_c (see that file's comment), included by
 * _launch_c.c after the Executor, whose call() and make_current() it uses. One thread per Submitter
 * makes the calls of the programs submitted to it, in submission order, without the GIL. */

typedef struct Job {
    struct Job *next;
    uint64_t ticket;
    Py_ssize_t n, always; /* calls [always, n) are made even after a failure */
    uint64_t words[];
} Job;

typedef struct {
    uint64_t ticket;
    Py_ssize_t index;
    int code; /* 0: a capture check found its stream capturing */
} Failure;

typedef struct {
    PyObject_HEAD
    Executor *ex;
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    Job *head, *tail;
    uint64_t submitted;
    _Atomic uint64_t done;
    int sleeping, waiters, stopping, stopped, serving;
    Failure *failures;
    Py_ssize_t n_failures, cap_failures;
} Submitter;

static int Submitter_init(Submitter *sb, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"executor", NULL};
    PyObject *ex;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!", kwlist, &ExecutorType, &ex)) return -1;
    if (sb->ex != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Submitter is initialised once");
        return -1;
    }
    sb->ex = (Executor *)Py_NewRef(ex);
    pthread_mutex_init(&sb->mu, NULL);
    pthread_cond_init(&sb->work, NULL);
    pthread_cond_init(&sb->idle, NULL);
    return 0;
}

/* Runs one job's calls (no GIL); the first failure is kept under the lock before done() moves past it. */
static void run_job(Submitter *sb, Job *j) {
    Py_ssize_t failed = -1;
    int code = 0;
    for (Py_ssize_t i = 0; i < j->n; i++) {
        if (failed >= 0 && i < j->always) continue;
        int capturing = 0;
        int c = call(sb->ex, j->words + i * WORDS, &capturing);
        if ((c != 0 || capturing) && failed < 0) {
            failed = i;
            code = capturing ? 0 : c;
        }
    }
    pthread_mutex_lock(&sb->mu);
    if (failed >= 0) {
        if (sb->n_failures == sb->cap_failures) {
            Py_ssize_t cap = sb->cap_failures ? 2 * sb->cap_failures : 8;
            Failure *grown = realloc(sb->failures, (size_t)cap * sizeof(Failure));
            if (grown != NULL) {
                sb->failures = grown;
                sb->cap_failures = cap;
            }
        }
        if (sb->n_failures < sb->cap_failures) sb->failures[sb->n_failures++] = (Failure){j->ticket, failed, code};
    }
    atomic_store(&sb->done, j->ticket);
    if (sb->waiters) pthread_cond_broadcast(&sb->idle);
    pthread_mutex_unlock(&sb->mu);
}

/* serve(): the submitting thread's loop; returns once stop() was called and every program submitted ran. */
static PyObject *Submitter_serve(Submitter *sb, PyObject *unused) {
    (void)unused;
    if (sb->ex == NULL || sb->serving) {
        PyErr_SetString(PyExc_RuntimeError, sb->ex == NULL ? "an uninitialised Submitter" : "a Submitter is served by one thread");
        return NULL;
    }
    sb->serving = 1; /* (set with the GIL held: a second serve() sees it) */
    int ok = make_current(sb->ex) == 0; /* this thread's context, once (CUDA) */
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&sb->mu);
    for (;;) {
        while (ok && sb->head == NULL && !sb->stopping) {
            sb->sleeping = 1;
            pthread_cond_wait(&sb->work, &sb->mu);
            sb->sleeping = 0;
        }
        Job *j = sb->head;
        if (j == NULL || !ok) break;
        sb->head = j->next;
        if (sb->head == NULL) sb->tail = NULL;
        pthread_mutex_unlock(&sb->mu);
        run_job(sb, j);
        free(j);
        pthread_mutex_lock(&sb->mu);
    }
    sb->stopped = 1;
    pthread_cond_broadcast(&sb->idle);
    pthread_mutex_unlock(&sb->mu);
    Py_END_ALLOW_THREADS
    if (!ok) return NULL;
    Py_RETURN_NONE;
}

/* submit(program[, always]) -> ticket. The program is copied; its calls are made later, on serve()'s thread. */
static PyObject *Submitter_submit(Submitter *sb, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1 && nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "submit(program[, always])");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) != 0) return NULL;
    Py_ssize_t n = program_length(&view);
    Py_ssize_t always = nargs == 2 ? PyLong_AsSsize_t(args[1]) : n;
    if (n >= 0 && !PyErr_Occurred() && (always < 0 || always > n)) PyErr_SetString(PyExc_ValueError, "always must be in [0, len(program)]");
    Job *j = NULL;
    if (n >= 0 && !PyErr_Occurred()) {
        j = malloc(sizeof(Job) + (size_t)view.len);
        if (j == NULL) PyErr_NoMemory();
    }
    if (j == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    memcpy(j->words, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    j->next = NULL;
    j->n = n;
    j->always = always;
    pthread_mutex_lock(&sb->mu);
    if (sb->stopping || sb->ex == NULL) {
        pthread_mutex_unlock(&sb->mu);
        free(j);
        PyErr_SetString(PyExc_RuntimeError, "the submitter was stopped");
        return NULL;
    }
    uint64_t ticket = j->ticket = ++sb->submitted;
    if (sb->tail != NULL)
        sb->tail->next = j;
    else
        sb->head = j;
    sb->tail = j;
    int wake = sb->sleeping;
    pthread_mutex_unlock(&sb->mu);
    if (wake) pthread_cond_signal(&sb->work);
    return PyLong_FromUnsignedLongLong(ticket);
}

static PyObject *Submitter_done(Submitter *sb, PyObject *unused) {
    (void)unused;
    return PyLong_FromUnsignedLongLong(atomic_load(&sb->done));
}

/* wait(ticket): returns once done() >= ticket (GIL released while it waits); RuntimeError if serve() ended first. */
static PyObject *Submitter_wait(Submitter *sb, PyObject *arg) {
    uint64_t ticket = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    if (atomic_load(&sb->done) >= ticket) Py_RETURN_NONE;
    int reached;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&sb->mu);
    sb->waiters++;
    while (atomic_load(&sb->done) < ticket && !sb->stopped && ticket <= sb->submitted) pthread_cond_wait(&sb->idle, &sb->mu);
    sb->waiters--;
    reached = atomic_load(&sb->done) >= ticket;
    pthread_mutex_unlock(&sb->mu);
    Py_END_ALLOW_THREADS
    if (reached) Py_RETURN_NONE;
    PyErr_SetString(PyExc_RuntimeError, "the submitter stopped before that program ran (or it was never submitted)");
    return NULL;
}

/* failure(ticket) -> (index, code) of the ticket's first failed call, once (None: none, or not run yet). */
static PyObject *Submitter_failure(Submitter *sb, PyObject *arg) {
    uint64_t ticket = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    Failure found = {0, 0, 0};
    pthread_mutex_lock(&sb->mu);
    for (Py_ssize_t i = 0; i < sb->n_failures; i++) {
        if (sb->failures[i].ticket == ticket) {
            found = sb->failures[i];
            sb->failures[i] = sb->failures[--sb->n_failures];
            break;
        }
    }
    pthread_mutex_unlock(&sb->mu);
    if (found.ticket == 0) Py_RETURN_NONE;
    return Py_BuildValue("(ni)", found.index, found.code);
}

/* stop(): serve() returns once the programs submitted so far ran; later submits raise. */
static PyObject *Submitter_stop(Submitter *sb, PyObject *unused) {
    (void)unused;
    if (sb->ex == NULL) Py_RETURN_NONE;
    pthread_mutex_lock(&sb->mu);
    sb->stopping = 1;
    pthread_cond_signal(&sb->work);
    pthread_mutex_unlock(&sb->mu);
    Py_RETURN_NONE;
}

static void Submitter_dealloc(Submitter *sb) {
    if (sb->ex != NULL) {
        for (Job *j = sb->head; j != NULL;) {
            Job *next = j->next;
            free(j);
            j = next;
        }
        free(sb->failures);
        pthread_cond_destroy(&sb->work);
        pthread_cond_destroy(&sb->idle);
        pthread_mutex_destroy(&sb->mu);
        Py_DECREF(sb->ex);
    }
    Py_TYPE(sb)->tp_free((PyObject *)sb);
}

static PyMethodDef Submitter_methods[] = {
    {"serve", (PyCFunction)Submitter_serve, METH_NOARGS, "serve(): the submitting thread's loop, until stop()"},
    {"submit", (PyCFunction)(void (*)(void))Submitter_submit, METH_FASTCALL, "submit(program[, always]) -> ticket"},
    {"done", (PyCFunction)Submitter_done, METH_NOARGS, "done() -> the last ticket run"},
    {"wait", (PyCFunction)Submitter_wait, METH_O, "wait(ticket): until done() >= ticket (GIL released)"},
    {"failure", (PyCFunction)Submitter_failure, METH_O, "failure(ticket) -> (index, code) | None, once"},
    {"stop", (PyCFunction)Submitter_stop, METH_NOARGS, "stop(): serve() returns once the queue is empty"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SubmitterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "streamrt._backends._launch_c.Submitter",
    .tp_basicsize = sizeof(Submitter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Submitter_init,
    .tp_dealloc = (destructor)Submitter_dealloc,
    .tp_methods = Submitter_methods,
    .tp_doc = "Programs run in order on a thread of their own; see the module's comment.",
};
