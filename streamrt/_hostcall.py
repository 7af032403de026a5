"""Python host functions in stream order, run on runtime worker threads.

How one Python host call runs (see :meth:`CompletionEngine.host_call`)::

    stream:  ... | sem_post(ready) | sem_wait(done) | guard event | ...later work...
                       |                  ^                  |
    worker:   sem_wait(ready) -> pop head -> fn(*args) -> store outcome -> sem_post(done)
    lane:                                                    +-> resolve the Completion

The driver (or simulator) callback thread only ever runs native functions; it
never takes the GIL. The stream is held until the worker has run ``fn``, so
later work on the stream still waits for ``fn``, exactly as with a host
function run by the driver itself. (The ``sem_wait(done)`` host function is
:data:`~streamrt._native.HOLD_ADDRESS`: a wait that a signal delivered to the
driver's thread does not end.)

Signal holds (opt-in: ``stream_signals=True``, on a backend with
``Capabilities.supports_stream_signals``). The second host function is
replaced by a wait on the device for a 64-bit word the worker stores after
``fn`` (``cuStreamWaitValue64`` / ``hipStreamWaitValue64``, tickets counting up
per stream)::

    stream:  ... | sem_post(ready) | wait signal >= t | guard event | ...later work...
    worker:   sem_wait(ready) -> pop head -> fn(*args) -> store outcome -> signal = t

The driver's callback thread, which runs the host functions of every stream
of the context one at a time, then returns at once instead of being blocked
for as long as ``fn`` runs. It is not the default because a wait on memory is
invisible to the driver's scheduler: a stream that shares a hardware queue
with the waiting one can be held behind the wait (the CUDA documentation
warns of exactly this), so a thread that blocks on such a stream while
holding the GIL (torch's ``.item()`` does) would deadlock with the worker
that needs the GIL to let the wait go. On the H200 both holds cost about the
same without the GIL (154 and 158 µs with native threads, against 94 µs for
one no-op host function; docs/performance.md, run 32).

Rules for ``fn`` (documented for users in the asyncio guide):

* It must not call HIP/CUDA (or any streamrt call that does): the stream it
  runs in is blocked in the middle of a driver callback.
* A long ``fn`` blocks its stream, and every stream waiting on it, for as long
  as it runs.
* Its exception is captured and delivered to whoever awaits the returned
  :class:`~streamrt.Completion` (or the pipeline's Run); the stream goes on.
  If nobody ever retrieves it, it is logged (logger ``"streamrt"``).
* Its Completion is resolved (and its done callbacks run) by the stream's
  completion lane, in stream order with the stream's other Completions; the
  worker only runs ``fn`` and stores the outcome, so the stream is held for
  ``fn`` alone.

Faults. If the stream fails before the driver reaches the call, the lane's
wait for the guard event raises; the call is then *abandoned*: its Completion
gets the error and ``fn`` never runs, so no waiter hangs on a host function a
failed context will never reach. Semaphores (and signals) that a failed or
abandoned call may still name are leaked (never freed) rather than risk a late
write.

GIL latency. A worker needs the GIL to run ``fn``. While the main thread runs
Python, CPython hands the GIL over only every *switch interval* (5 ms by
default): measured on the H200, a Python host function then stalls its stream
~5.4 ms against ~0.2 ms for a native one. So while at least one Python host
call is in flight, the runtime lowers the interpreter-wide switch interval
(:class:`~streamrt._switch_interval.SwitchIntervalGuard`, to
:data:`~streamrt._switch_interval.DEFAULT_SWITCH_INTERVAL`, 10 µs) and
restores the previous value when none is; the interval only matters while a
thread waits for the GIL, so nothing switches more often when none does. This
is a global interpreter setting that streamrt touches; pass
``python_host_switch_interval=None`` to the runtime to leave it alone. A value
the user sets meanwhile is never overwritten. The worker (and lane) threads
also set their own timer slack to 1 µs
(:func:`~streamrt._native.tighten_timer_slack`): Linux would otherwise let
their timed wait for the GIL end up to 50 µs late.

Simulated time. On the simulator (a backend with ``expect_host_work``) the
worker also times each run of ``fn`` into a
:class:`~streamrt._host_work.HostWorkEstimate` per function, and the signal
wait (or ``sem_wait(done)`` host function) is announced to the simulator with
it, so the simulated stream is held for about as long as the function really
takes (a GPU stream simply waits for it).

Graph capture. A captured host node must re-run the Python function on every
replay, so it cannot use the per-stream FIFO of eager calls (a replay does not
go through :meth:`~CompletionEngine.host_call`). :class:`HostSlot` is one
captured Python host node: its own two semaphores, function, arguments and
worker, owned by the Graph and alive as long as it. Slots always hold their
stream with ``sem_wait(done)``: a captured signal wait would need a fixed value.
"""

from __future__ import annotations

import collections
import ctypes
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._native import HOLD_ADDRESS, SEM_POST_ADDRESS, Semaphore, tighten_timer_slack
from ._switch_interval import switch_interval_guard

if TYPE_CHECKING:
    from ._completion import Completion, CompletionEngine

__all__ = ["HostChannel", "HostSlot"]

_log = logging.getLogger("streamrt")
_slot_ids = itertools.count(1)


class HostRequest:
    """One pending Python host call: the function, its arguments, its Completion and outcome.

    The worker runs ``fn`` and stores the outcome (``ran``, ``value``,
    ``exc``); for eager calls the lane resolves the Completion when it retires
    the guard event that follows the call, so host-call Completions retire in
    stream order with every other Completion of the stream. ``abandoned``
    means the stream failed before the driver reached the call: the
    Completion already holds the error and the worker, should it ever be
    woken for this request, skips ``fn``. ``post_done`` is ``False`` when the
    half that holds the stream could not be enqueued (nothing waits to be let
    go). ``ticket``: the signal value the stream waits for (0: it waits on
    ``done``). ``committed``: everything the call enqueues is enqueued; until
    then (or until it is abandoned) the worker does not run ``fn``, even if
    the driver already woke it for the call.


    ``completion``: the call's own Completion (an eager ``launch_host_func``),
    resolved by the lane; ``None`` for a host node of a pipeline launch or a
    graph replay, whose ``owner`` (the Run) reads the outcome when its tail
    retires.
    """

    __slots__ = (
        "abandoned", "args", "committed", "completion", "exc", "finished", "fn", "owner", "post_done", "ran", "ticket", "trace",
        "value", "worker",
    )

    def __init__(
        self, fn: Callable[..., Any] | None, args: tuple[Any, ...], completion: Completion | None = None, *, committed: bool = True
    ) -> None:
        self.fn = fn
        self.args = args
        self.completion = completion
        self.owner: Any = None  # the Run that collects the outcome (pipeline and graph host nodes)
        self.worker: _Worker | None = None  # the channel or slot that runs it (set when pushed)
        self.trace: Callable[[Callable[..., Any], tuple[Any, ...]], tuple[Any, BaseException | None]] | None = None
        self.committed = committed
        self.abandoned = False
        self.finished = False
        self.post_done = True
        self.ran = False
        self.ticket = 0
        self.value: Any = None
        self.exc: BaseException | None = None

    @property
    def is_done(self) -> bool:
        """Its outcome is final: its Completion, or its owner, resolved."""
        done = self.completion if self.completion is not None else self.owner
        return done is not None and done._done

    @property
    def _resolved_ns(self) -> int:
        done = self.completion if self.completion is not None else self.owner
        return 0 if done is None else done._resolved_ns

    def wait(self, timeout: float | None = None) -> None:
        """Wait for :attr:`is_done` (the tracer reads outcomes this way)."""
        done = self.completion if self.completion is not None else self.owner
        if done is not None:
            done.wait(timeout)

    def outcome(self, error: BaseException | None) -> tuple[Any, BaseException | None]:
        """``(value, exception)`` once the stream passed the call (``error``: the stream failed first)."""
        if self.ran:
            value, exc = self.value, self.exc
            self.value = self.exc = None
            return value, exc
        if error is None:
            error = RuntimeError("the stream passed a Python host call that never ran")
        return None, error


def _call(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, BaseException | None]:
    try:
        return fn(*args), None
    except BaseException as exc:  # noqa: BLE001 - delivered to the awaiter, the stream goes on
        return None, exc


class _Worker:
    """Shared machinery of a channel and a slot: two semaphores, a FIFO, a thread."""

    def __init__(self, engine: CompletionEngine, thread_name: str) -> None:
        self._engine = engine
        self.ready = Semaphore(0)
        self.done = Semaphore(0)
        self._ready_address = self.ready.address  # what the enqueued host functions name
        self._done_address = self.done.address
        engine._workers[self._ready_address] = self  # a tracer finds the worker of a sem_post by its semaphore
        self._queue: collections.deque[HostRequest] = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._in_flight = 0  # requests not finished (guarded by _cond)
        self._stopping = False
        self._broken = False  # some request was abandoned: the semaphores may still be named
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._started = False

    # -- driver side -----------------------------------------------------------
    def _start(self) -> None:
        if self._started:
            return
        with self._cond:  # two submitting threads, or a submit racing stop(): one start, before any join
            if self._started or self._stopping:
                return
            self._engine._register_thread(self._thread)
            self._thread.start()
            self._started = True

    def _enqueue_native(self, stream: int, fn: Callable[..., Any], backend: Any) -> None:
        engine = self._engine
        backend.launch_host_func(stream, SEM_POST_ADDRESS, self._ready_address)
        engine._announce_host_work(fn)
        backend.launch_host_func(stream, HOLD_ADDRESS, self._done_address)

    # -- bookkeeping -----------------------------------------------------------
    def _push(self, req: HostRequest) -> None:
        """Queue ``req`` for the worker (started on first use); count it in flight."""
        if not self._started:
            self._start()
        req.worker = self
        with self._cond:
            self._queue.append(req)
            self._in_flight += 1
        engine = self._engine
        with engine._lock:  # as engine._python_call_started(), inline: a launch's path
            engine._python_in_flight += 1
            interval = engine._switch_interval
            if engine._python_in_flight == 1 and interval is not None and not engine._holds_guard:
                engine._holds_guard = True
                switch_interval_guard.acquire(interval)

    def _finish(self, req: HostRequest) -> None:
        with self._cond:
            if req.finished:
                return
            req.finished = True
            self._in_flight -= 1
            # Before waking drainers: once drain() returns, the switch interval is restored.
            self._engine._python_call_finished()
            if self._in_flight == 0:
                self._cond.notify_all()

    def abandon(self, req: HostRequest, exc: BaseException, *, resolve: bool = True) -> None:
        """The stream failed before ``req`` ran (or the call could not be enqueued): never run it, and
        resolve its Completion (if any, and ``resolve``) with ``exc``."""
        if req.finished:
            return
        with self._cond:
            req.abandoned = True  # under the lock: a worker waiting for the commit sees it
            self._cond.notify_all()
        self._broken = True
        req.fn = None
        req.args = ()
        self._finish(req)  # bookkeeping first: a woken waiter sees it done
        if resolve and req.completion is not None:
            req.completion._resolve(None, exc, None)

    def settle(self, req: HostRequest, error: BaseException | None) -> tuple[Any, BaseException | None]:
        """The stream passed ``req`` (``error``: it failed first): ``fn``'s outcome; a call that never
        ran is abandoned (it never will) and its outcome is that error."""
        if req.ran:
            return req.outcome(None)
        value, exc = req.outcome(error)
        assert exc is not None
        self.abandon(req, exc, resolve=False)  # the caller resolves with the outcome
        return value, exc

    def _commit(self, req: HostRequest) -> None:
        """Submitting thread: everything ``req`` enqueues is enqueued; the worker may run it."""
        with self._cond:
            req.committed = True
            self._cond.notify_all()

    def _await_commit(self, req: HostRequest) -> None:
        """Worker: the driver reached ``req`` while its submit was still enqueueing: wait for the outcome."""
        with self._cond:
            self._cond.wait_for(lambda: req.committed or req.abandoned)

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet run or abandoned."""
        return self._in_flight

    def wait_idle(self, timeout: float | None) -> bool:
        """Block until no request is in flight; ``False`` on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._in_flight == 0, timeout)

    def stop(self, *, forced: bool, join_timeout: float | None) -> None:
        """Stop the worker thread and free (or, when still referenced, leak) the semaphores.

        Call only after :meth:`wait_idle` (or with ``forced``): what is left in
        the queue then belongs to failed streams and will never be reached.
        Idempotent: a slot closed by its graph and again by the engine is stopped once.
        """
        self._engine._workers.pop(self._ready_address, None)
        leftovers = []
        with self._cond:
            if self._stopping:
                return
            self._stopping = True
            leftovers = list(self._queue)
            self._queue.clear()
        exc: BaseException | None = None
        for req in leftovers:
            if not req.finished:
                if exc is None:
                    from ._errors import ClosedError

                    exc = ClosedError("the runtime closed before this host function ran")
                self.abandon(req, exc)
        if leftovers:
            self._broken = True
            # The driver may still reach these calls (a forced close, or a stream that
            # "recovers"): let the stream go past each so it cannot hang.
            for req in leftovers:
                if req.post_done and not req.ran:
                    self._let_stream_go(req)
        thread_alive = False
        with self._cond:
            started = self._started
        if started:
            self.ready.post()
            self._thread.join(join_timeout)
            thread_alive = self._thread.is_alive()
        if self._broken or forced or thread_alive:
            # A driver thread may still post `ready` or wait on `done` later.
            self.ready.leak()
            self.done.leak()
        else:
            self.ready.destroy()
            self.done.destroy()
        self._stopped(reusable=not (self._broken or forced or thread_alive))

    def _let_stream_go(self, req: HostRequest) -> None:
        """The worker is done with ``req``: release the stream waiting behind it."""
        self.done.post()

    def _stopped(self, *, reusable: bool) -> None:
        """After :meth:`stop`; ``reusable``: nothing enqueued can still name this worker's memory."""

    # -- worker thread ---------------------------------------------------------
    def _run(self) -> None:
        tighten_timer_slack()  # it waits for the GIL after each wake-up, while the stream is held
        ready_wait = self.ready.wait
        queue = self._queue
        while True:
            ready_wait()
            try:
                req = queue.popleft()
            except IndexError:
                if self._stopping:
                    return
                if not self._serve_unarmed():
                    continue
                self.done.post()
                continue
            if not req.committed:
                self._await_commit(req)  # committed, or abandoned: fn then never runs
            if not req.abandoned:
                fn, args = self._call_of(req)
                req.fn = None
                req.args = ()
                if fn is not None:
                    estimates = self._engine._host_work
                    call = _call if req.trace is None else req.trace  # a traced call times its run
                    if estimates is None:
                        req.value, req.exc = call(fn, args)
                    else:
                        t0 = time.thread_time()  # CPU time: waiting for the GIL is not the function's run time
                        req.value, req.exc = call(fn, args)
                        estimates.for_function(fn).add((time.thread_time() - t0) * 1e6)
                    req.ran = True
                del fn, args  # dropped here, on the worker thread
            if req.post_done:
                self._let_stream_go(req)
            self._finish(req)
            if self._stopping and not queue:
                return

    def _call_of(self, req: HostRequest) -> tuple[Callable[..., Any] | None, tuple[Any, ...]]:
        return req.fn, req.args

    def _serve_unarmed(self) -> bool:
        """A wake with no request queued; ``True`` if it was served and needs ``done``."""
        return False


class HostChannel(_Worker):
    """The per-stream FIFO of eager Python host calls (one worker thread per stream).

    Stream FIFO order makes the queue's head the request the driver just
    reached, so one ``ready`` post means "run the head". Submission (append +
    ``sem_post(ready)`` + the hold) happens under the stream's enqueue lock
    (the engine holds its lane's lock), so two threads enqueueing on the same
    stream cannot interleave.

    The hold is a wait on the channel's ``signal`` for the request's ticket
    when the engine gives the channel one (tickets count up from the signal's
    value at creation; the worker stores each ticket once ``fn`` has run, and
    stores only ever raise the value), else ``sem_wait(done)``.
    """

    def __init__(self, engine: CompletionEngine, stream: int, signal: int | None = None) -> None:
        super().__init__(engine, f"streamrt-host-{stream:#x}")
        self.stream = stream
        self.signal = signal
        self._word = None if signal is None else ctypes.c_uint64.from_address(signal)
        self._ticket = 0 if self._word is None else self._word.value  # the last ticket handed out
        self._opened = self._ticket  # the highest ticket stored (guarded by _cond)

    def submit(self, req: HostRequest, backend: Any = None) -> HostRequest:
        """Enqueue ``req`` (made with ``committed=False``) on the stream; raises the backend's error if
        nothing was enqueued.

        Call with the stream's enqueue lock held. ``backend``: the stream's
        (a tracing wrapper while a trace is open), else the engine's. If
        ``sem_post(ready)`` was enqueued but the hold was not, the request is
        abandoned with that error (``fn`` will not run) and the error is raised.
        """
        fn = req.fn
        engine = self._engine
        if backend is None:
            backend = engine._backend
        self._push(req)
        try:
            backend.launch_host_func(self.stream, SEM_POST_ADDRESS, self._ready_address)
        except BaseException as exc:
            with self._cond:
                if self._queue and self._queue[-1] is req:
                    self._queue.pop()
            req.fn = None
            req.args = ()
            if req.completion is not None:
                req.completion._resolve(None, exc, None)
            self._finish(req)
            raise
        try:
            if engine._host_work is not None:
                engine._announce_host_work(fn)  # type: ignore[arg-type]
            if self.signal is None:
                backend.launch_host_func(self.stream, HOLD_ADDRESS, self._done_address)
            else:
                # Spent even if the wait fails to enqueue: the worker may already have
                # stored it, and a later wait for the same value would pass too early.
                self._ticket += 1
                req.ticket = self._ticket
                backend.stream_wait_signal(self.stream, self.signal, req.ticket)
        except BaseException as exc:
            req.post_done = False  # `ready` will still be posted: the worker skips fn, releases nothing
            self.abandon(req, exc)
            raise
        with self._cond:  # as _commit(req), inline: a launch's path
            req.committed = True
            self._cond.notify_all()
        return req

    def _let_stream_go(self, req: HostRequest) -> None:
        if self._word is None:
            self.done.post()
            return
        with self._cond:
            if req.ticket > self._opened:
                self._opened = req.ticket
                self._word.value = req.ticket

    def _stopped(self, *, reusable: bool) -> None:
        signal, self.signal, self._word = self.signal, None, None
        if signal is not None:
            self._engine._return_signal(signal, reusable=reusable)

    def retire(self, req: HostRequest, error: BaseException | None, posts: Any) -> None:
        """On the lane, once the guard event after ``req`` retired (``error`` if its wait failed):
        resolve its Completion with the outcome (see :meth:`_Worker.settle`)."""
        value, exc = self.settle(req, error)
        if req.completion is not None:
            req.completion._resolve(value, exc, posts)


class HostSlot(_Worker):
    """One captured Python host node of a graph; re-runs ``fn(*args)`` on every replay.

    Lifecycle (what a Graph does with it):

    1. ``slot = engine.host_slot(fn, args)`` while building the capture;
    2. ``slot.capture(stream)`` while ``stream`` is capturing: enqueues the
       two native host functions (``sem_post(ready)``, ``sem_wait(done)``),
       which become host nodes of the graph;
    3. per replay: ``req = slot.arm()`` *before* ``graph_launch`` (replays
       of one graph exec run in launch order, so armed requests match
       replays FIFO); the replay's Run reads ``fn``'s outcome from ``req``
       when its tail retires, and abandons it if the stream failed first, so
       no awaiter hangs;
    4. ``slot.close()`` after the graph exec is destroyed and its last replay
       completed.

    ``fn`` and ``args`` are read at each run, so a replay sees the current
    contents of the buffers it was given. A replay that nobody armed (a raw
    ``graph_launch``) still runs ``fn``; its exception is logged.
    The rules of :mod:`streamrt._hostcall` for ``fn`` apply.

    ``foreign``: the slot was captured into a graph another library owns
    (see :mod:`streamrt._graph_release`). Nobody arms its replays; it lives
    until that graph is destroyed, which may be after its engine closed (the
    engine does not stop it), and it keeps the switch interval lowered for
    as long (every replay runs Python while the stream waits).
    """

    def __init__(self, engine: CompletionEngine, fn: Callable[..., Any], args: tuple[Any, ...], *, foreign: bool = False) -> None:
        super().__init__(engine, f"streamrt-slot-{next(_slot_ids)}")
        if not callable(fn):
            raise TypeError(f"host slot function must be callable, got {type(fn).__name__}")
        self._fn = fn
        self._args = tuple(args)
        self.closed = False
        self.foreign = foreign
        if foreign:
            engine._python_call_started()

    @property
    def fn(self) -> Callable[..., Any]:
        """The Python function run on every replay."""
        return self._fn

    @property
    def args(self) -> tuple[Any, ...]:
        """Its positional arguments (kept alive as long as the slot)."""
        return self._args

    def capture(self, stream: int, backend: Any = None) -> None:
        """Enqueue the slot's two native host functions on ``stream`` (normally capturing), through
        ``backend`` (the stream's; default: the engine's)."""
        self._check_open()
        self._start()
        self._enqueue_native(stream, self._fn, self._engine._backend if backend is None else backend)

    def arm(self) -> HostRequest:
        """Expect one more run; returns its request, whose outcome the replay's Run reads. Call before each launch."""
        self._check_open()
        req = HostRequest(None, ())
        self._push(req)
        return req

    def disarm(self, req: HostRequest) -> bool:
        """Withdraw the armed run ``req`` (its launch failed, nothing was enqueued), so later
        replays stay matched FIFO. ``False`` if it is not armed (already ran or withdrawn)."""
        with self._cond:
            armed = not req.finished and req in self._queue
            if armed:
                self._queue.remove(req)
        if armed:
            self._finish(req)
        return armed

    def close(self) -> None:
        """Stop the worker and free the semaphores (leaked if a failed run may still name them).

        Blocks until armed runs have finished. Idempotent. Call after the
        graph exec that names this slot is destroyed.
        """
        if self.closed:
            return
        self.closed = True
        self.wait_idle(None)
        self.stop(forced=False, join_timeout=None)
        self._engine._forget_slot(self)
        if self.foreign:
            self._engine._python_call_finished()

    def _check_open(self) -> None:
        if self.closed:
            from ._errors import ClosedError

            raise ClosedError("this host slot was closed with its graph")

    def _call_of(self, req: HostRequest) -> tuple[Callable[..., Any] | None, tuple[Any, ...]]:
        return self._fn, self._args

    def _serve_unarmed(self) -> bool:
        try:
            self._fn(*self._args)
        except BaseException:  # noqa: BLE001 - nobody armed this replay to receive it
            _log.exception("exception in captured host function %r (replay nobody armed)", self._fn)
        return True
