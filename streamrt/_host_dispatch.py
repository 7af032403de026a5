"""Main-thread dispatch of Python host calls: ``open_runtime(..., python_host_dispatch="main")``.

By default a Python host function runs on its stream's worker thread
(:mod:`streamrt._hostcall`): the driver wakes the worker, which then waits for
the GIL. While the main thread runs Python, that costs the stream two thread
wake-ups and a GIL hand-over, about as long again as a native host function's
whole hold.

With main-thread dispatch the native host function that wakes the worker
(``streamrt_host_dispatch`` in ``_host_dispatch_c.c``) first asks CPython to run
the call on the main thread (``Py_AddPendingCall``). The main thread runs it at
its next bytecode boundary, with the GIL it already holds, and lets the
stream go. The worker is still woken: whichever thread gets to the call first
runs it, and the other finds it served. So a main thread blocked outside the
interpreter (waiting for this very stream, say) never holds the call up.

Served on the main thread, a call runs the function, stores its outcome and
posts ``done``: nothing there takes a lock. Its bookkeeping (the request's
end, the simulator's timing sample, dropping the function's references) is
left to the worker when it wakes for the same call.

Declined by the main thread, and left to the worker: a call whose submit has
not finished (the main thread may be inside it), a traced call, and a call
while another thread is taking one from the queue.

What it costs: the function may run on the main thread between any two
bytecodes of whatever that thread runs, as a signal handler does. It must not
take a lock the main thread may hold, nor rely on thread-local state. Only
eager host calls (``launch_host_func``, a pipeline's eager launch) are
dispatched; a captured graph's host nodes keep their worker.

Needs the C extension ``streamrt._host_dispatch_c`` (built with streamrt);
:func:`unavailable_reason` says why it cannot be used.
"""

from __future__ import annotations

import atexit
import collections
import importlib
import itertools
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from ._host_work import call_host_function
from ._native import Semaphore

if TYPE_CHECKING:
    from ._hostcall import HostRequest, _Worker

_c: Any
_IMPORT_ERROR: str | None
try:
    _c = importlib.import_module("streamrt._host_dispatch_c")
except ImportError as exc:  # built optionally (setup.py): no compiler, no main-thread dispatch
    _c = None
    _IMPORT_ERROR = f"the C extension streamrt._host_dispatch_c was not built ({exc}): reinstall streamrt with a C compiler"
else:
    _IMPORT_ERROR = None

__all__ = ["DISPATCH_MODES", "MainDispatch", "SERVED", "unavailable_reason"]

#: The values of ``python_host_dispatch``.
DISPATCH_MODES = ("worker", "main")

#: What :meth:`MainDispatch.take` returns for a call the main thread served.
SERVED: Any = object()

_log = logging.getLogger("streamrt")
_keys = itertools.count(1)
_dispatchers: dict[int, MainDispatch] = {}  # by key, while their worker runs
_server_set = False


def unavailable_reason() -> str | None:
    """``None`` when main-thread dispatch can be used here, else why not."""
    return _IMPORT_ERROR


def _serve(key: int) -> None:
    """The pending call, on the main thread: serve the call dispatched by ``key``'s host function."""
    dispatcher = _dispatchers.get(key)
    if dispatcher is not None:
        try:
            dispatcher.serve()
        except BaseException:  # noqa: BLE001 - never surface in the interrupted code
            _log.exception("main-thread dispatch of a Python host call failed; its worker runs it")


def _disarm() -> None:
    if _c is not None:
        _c.set_server(None)  # at exit: no pending calls into an interpreter being finalized


class MainDispatch:
    """One worker's dispatch: its native host function's data and the main thread's side of the race.

    ``dispatched`` counts the calls the driver reached, ``served`` those run (by
    either thread), ``woken`` the worker's wake-ups; all three only grow.
    ``_lock`` is held to take a call from the queue, so that the queue's head
    is always the next call not yet served.
    """

    def __init__(self, worker: _Worker) -> None:
        global _server_set
        if _c is None:
            raise RuntimeError(f"python_host_dispatch='main' is unavailable: {_IMPORT_ERROR}")
        if not _server_set:
            _c.set_server(_serve)
            atexit.register(_disarm)
            _server_set = True
        self._worker = worker
        self._key = next(_keys)
        self.address: int = _c.new(worker.ready.address, self._key)
        self.function: int = _c.DISPATCH_ADDRESS
        self._lock = threading.Lock()
        self._served = 0
        self._woken = 0
        self.on_main = 0  # calls the main thread ran
        # Calls the main thread ran and the worker has not yet finished: (request, fn, args, µs),
        # each posted once it is complete (a native semaphore: posting it takes no lock).
        self._ran: collections.deque[tuple[HostRequest, Any, tuple[Any, ...], float]] = collections.deque()
        self._ran_posted = Semaphore(0)
        _dispatchers[self._key] = self

    @property
    def dispatched(self) -> int:
        """How many times the driver reached this worker's host function."""
        return _c.dispatched(self.address)

    @property
    def refused(self) -> int:
        """How many of those CPython could not queue for the main thread (its queue was full)."""
        return _c.refused(self.address)

    def serve(self) -> None:
        """Main thread (a pending call): run the next dispatched call if nobody took it. Never blocks.

        Both locks are only tried: the main thread may have been interrupted
        while holding the worker's condition itself.
        """
        worker = self._worker
        if not self._lock.acquire(blocking=False):
            return  # the worker is taking a call: it serves this one too if it must
        try:
            if self._served >= _c.dispatched(self.address):
                return
            cond = worker._cond
            if not cond.acquire(blocking=False):
                return
            try:
                queue = worker._queue
                if worker._stopping or not queue:
                    return
                req = queue[0]
                if not req.committed or req.abandoned or req.trace is not None or req.fn is None:
                    return
                queue.popleft()
            finally:
                cond.release()
            self._served += 1
        finally:
            self._lock.release()
        fn, args = req.fn, req.args
        req.fn = None
        req.args = ()
        us = 0.0
        try:
            t0 = time.thread_time()
            req.value, req.exc = call_host_function(fn, args)
            us = (time.thread_time() - t0) * 1e6
            req.ran = True
            self.on_main += 1
        finally:  # whatever happened, the stream goes on and the worker finishes the call
            self._ran.append((req, fn, args, us))
            del fn, args
            if req.post_done:
                worker._let_stream_go(req)
            self._ran_posted.post()

    def take(self) -> Any:
        """Worker, woken: :data:`SERVED` if the main thread ran the call it was woken for (finished
        here), else the queue's head (``None`` if empty), taken."""
        with self._lock:
            self._woken += 1
            if self._served < self._woken:
                self._served += 1
                try:
                    return self._worker._queue.popleft()
                except IndexError:
                    return None
        self._ran_posted.wait()  # the main thread may still be running it
        req, fn, _args, us = self._ran.popleft()
        estimates = self._worker._engine._host_work
        if estimates is not None:
            estimates.for_function(fn).add(us)
        del fn, _args  # dropped here, on the worker thread
        self._worker._finish(req)
        return SERVED

    def close(self, *, free: bool) -> None:
        """The worker stopped; ``free``: no enqueued host function names the dispatch and the worker
        thread has ended (else both the dispatch and the semaphore leak)."""
        _dispatchers.pop(self._key, None)
        if free and self.address:
            _c.free(self.address)
            self._ran_posted.destroy()
        else:
            self._ran_posted.leak()
        self.address = 0
