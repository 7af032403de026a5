"""Completion: the one awaitable result type of streamrt, and the posting of wake-ups to event loops.

A :class:`Completion` can be waited on from any thread (:meth:`Completion.wait`,
GIL released) or awaited from any asyncio or uvloop event loop (the loop is
never blocked). The completion engine (:mod:`._engine`) resolves it on a
runtime thread, or on the thread of an event loop whose await polled the work.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import warnings
from collections.abc import Callable, Generator
from time import perf_counter_ns as _perf_counter_ns
from typing import TYPE_CHECKING, Any

from .._errors import ClosedError

if TYPE_CHECKING:
    from ._lane import _Lane

__all__ = ["DEFAULT_AWAIT_POLL_US", "Completion", "PostBatch", "on_runtime_thread", "refuse_blocking_wait"]

_log = logging.getLogger("streamrt")

# One lock for the state of every Completion: held only for a few attribute
# updates, never while running callbacks or user code.
_state_lock = threading.Lock()

_get_running_loop = asyncio._get_running_loop  # the public low-level accessor; None off-loop


def _set_futures(futures: list[asyncio.Future[None]]) -> None:
    """Runs on the loop thread: wake every awaiter of one batch (cancelled ones are skipped)."""
    for fut in futures:
        if not fut.done():
            fut.set_result(None)


class _LoopNotifier:
    """Posts wake-ups to event loops, coalesced per loop; warns once (per engine) when a loop is closed.

    While one post to a loop has not run yet, later batches for that loop join
    it: one ``call_soon_threadsafe`` (one self-pipe write, one loop callback)
    wakes every awaiter retired meanwhile, by any lane, each lane's in order.
    A loop closed before its wake-up ran is dropped (with the one warning) at
    the next post to it, or once a few such loops have gathered.
    """

    __slots__ = ("_lock", "_queued", "warned")

    def __init__(self) -> None:
        self.warned = False
        self._lock = threading.Lock()
        # loop -> futures posted and not yet set (their wake-up is scheduled on the loop)
        self._queued: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}

    def post(self, loop: asyncio.AbstractEventLoop, futures: list[asyncio.Future[None]]) -> None:
        """Have ``loop`` set ``futures`` (a list the notifier may extend) soon; any thread.

        On ``loop``'s own thread (an awaiting task retired the work) they are
        set at once, unless an earlier post to the loop is still pending: they
        then join it, so awaiters resume in the order their work retired.
        """
        with self._lock:
            queued = self._queued.get(loop)
            if queued is not None and not loop.is_closed():
                queued.extend(futures)
                return
            if _get_running_loop() is loop:  # on the loop's thread with nothing pending: set them now
                queued = None
            else:
                queued = self._queued[loop] = futures  # (a closed loop's stale entry is replaced)
            stale: list[asyncio.AbstractEventLoop] = []
            if len(self._queued) > 4:  # loops closed before their wake-up ran: nothing else drops them
                stale = [other for other in self._queued if other is not loop and other.is_closed()]
                for other in stale:
                    del self._queued[other]
        if stale:
            self._loop_closed()
        if queued is None:
            _set_futures(futures)
            return
        try:
            loop.call_soon_threadsafe(self._flush, loop)
        except RuntimeError:
            with self._lock:
                if self._queued.get(loop) is futures:
                    del self._queued[loop]
            if not loop.is_closed():
                raise
            self._loop_closed()

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the loop's thread: set every future queued for it."""
        with self._lock:
            futures = self._queued.pop(loop)
        _set_futures(futures)

    def _loop_closed(self) -> None:
        with self._lock:
            if self.warned:
                return
            self.warned = True
        warnings.warn(
            "an asyncio event loop was closed while tasks on it still awaited streamrt work; "
            "the work completed, but those awaiters were dropped (further cases are not reported)",
            RuntimeWarning,
            stacklevel=2,
        )


_default_notifier = _LoopNotifier()

#: How long an await polls its lanes from the event loop by default (``open_runtime(await_poll_us=...)``).
DEFAULT_AWAIT_POLL_US = 50.0
#: A lane is queried at most once per this many ns however many tasks poll it.
_POLL_GAP_NS = 2_000
# .engine: the engine whose work the calling thread retires for a polling await (else absent/None)
_polling = threading.local()


def on_runtime_thread() -> bool:
    """``True`` on a thread of a completion engine (lane, host-call worker, watchdog), or while the
    calling thread retires an engine's work for a polling await (it runs done callbacks then)."""
    return getattr(_polling, "engine", None) is not None or getattr(threading.current_thread(), "_streamrt_engine", None) is not None


def refuse_blocking_wait(what: str) -> None:
    """Raise ``RuntimeError`` if the calling thread is a runtime thread: a blocking wait there waits for itself.

    A Python host function holds its stream until it returns, and a done
    callback runs on the thread that retires the stream's work, so work that
    such a thread waits for may be queued behind it; it would never finish.
    """
    if on_runtime_thread():
        raise RuntimeError(
            f"{what} called on a streamrt runtime thread (in a Python host function or a done callback): "
            "it would wait for work that may be queued behind this thread and never return. Host functions "
            "and callbacks must not block on GPU work: await it, or chain work with add_done_callback"
        )


def _check_timeout(timeout: object) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be None or a number of seconds, not {type(timeout).__name__}")
    if not timeout >= 0:  # NaN fails this too
        raise ValueError(f"timeout must be >= 0 seconds, got {timeout!r}")

PostBatch = dict[asyncio.AbstractEventLoop, list["asyncio.Future[None]"]]  # filled while one lane batch retires


class Completion:
    """The outcome of GPU work that completes later: waitable, awaitable, observable.

    A Completion is resolved exactly once, with a value or an exception, by
    the runtime (the first resolution wins). Resolution happens on a runtime
    thread (a lane or a host-call worker) or on the thread of an event loop
    whose await polled the work, never on a driver thread.

    * :meth:`wait` blocks the calling thread (GIL released) until resolved.
    * ``await completion`` suspends the task without blocking the loop and
      returns :meth:`result`; it works under asyncio and uvloop, from any
      number of loops and tasks at once.
    * **Cancellation** of an awaiting task cancels only that wait (it is
      unregistered from the Completion): the GPU work goes on, and keepalives
      (buffers, callables) held for the work are released only after the work
      has completed, whatever the awaiters do.
    * Callbacks added with :meth:`add_done_callback` run on the resolving
      thread: a runtime thread, or an event loop's thread that polled the
      work for an await (or at once, on the caller's thread, if already done).

    If an exception is stored and nothing ever retrieves it (``result``,
    ``exception``, ``await``), it is logged when the Completion is collected,
    for host calls (so errors of fire-and-forget host functions are not lost).
    """

    __slots__ = (
        "__weakref__",
        "_callbacks",
        "_done",
        "_event",
        "_exc",
        "_lanes",
        "_log_unretrieved",
        "_notifier",
        "_resolved_ns",
        "_value",
        "_waiters",
    )

    def __init__(self) -> None:
        self._done = False
        self._resolved_ns = 0  # time.perf_counter_ns() at resolution (the tracer reads it)
        self._value: Any = None
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[[Completion], None]] | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] | None = None
        self._event: threading.Event | None = None
        self._notifier: _LoopNotifier = _default_notifier
        self._lanes: tuple[_Lane, ...] = ()  # the lanes that resolve it: an await polls them (_poll_lanes)
        self._log_unretrieved = False

    # -- observing ---------------------------------------------------------------
    @property
    def is_done(self) -> bool:
        """``True`` once resolved (the work completed or failed). Never blocks.

        While pending it retires, on the calling thread, whatever of its lanes' work is complete
        (one event query; done callbacks may run here), so a loop that polls it needs no runtime
        thread to wake.
        """
        if not self._done:
            for lane in self._lanes:
                lane.poll()
        return self._done

    def wait(self, timeout: float | None = None) -> None:
        """Block the calling thread until resolved; the GIL is released while blocked.

        Does not raise the work's exception (see :meth:`result`). Raises
        ``TimeoutError`` if ``timeout`` seconds pass first. Calling it on an
        event loop's thread blocks that loop: use ``await`` there. On a
        runtime thread (a Python host function, a done callback) waiting for
        pending work raises ``RuntimeError``: that work may be queued behind
        the waiting thread.
        """
        if timeout is not None:
            _check_timeout(timeout)
        if self._done:
            return
        refuse_blocking_wait("Completion.wait()")
        with _state_lock:
            if self._done:
                return
            event = self._event
            if event is None:
                event = self._event = threading.Event()
        lanes = self._lanes
        key = object()  # this wait's hold (several threads may wait at once)
        for lane in lanes:  # keep them waiting in the driver meanwhile (see _Lane, "Lazy wake-ups")
            lane.hold(key)
        try:
            if not event.wait(timeout):
                raise TimeoutError(f"work not completed within {timeout} s")
        finally:
            for lane in lanes:
                lane.release(key)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait like :meth:`wait`, then return the work's exception or ``None``."""
        self.wait(timeout)
        self._log_unretrieved = False
        return self._exc

    def result(self, timeout: float | None = None) -> Any:
        """Wait like :meth:`wait`, then return the value or raise the work's exception."""
        self.wait(timeout)
        self._log_unretrieved = False
        if self._exc is not None:
            raise self._exc
        return self._value

    def add_done_callback(self, fn: Callable[[Completion], None]) -> None:
        """Call ``fn(self)`` once resolved.

        It runs on the runtime thread that resolves the Completion, or at once
        on the calling thread if already resolved. Exceptions from ``fn`` are
        logged, not propagated. ``fn`` must be short and must not call into
        the GPU runtime.
        """
        if not self._done:
            with _state_lock:
                if not self._done:
                    if self._callbacks is None:
                        self._callbacks = []
                    self._callbacks.append(fn)
                    registered = True
                else:
                    registered = False
            if registered:
                for lane in self._lanes:  # held until resolved (_resolve releases them)
                    lane.hold(self)
                if self._done:  # resolved meanwhile, maybe before the hold: release it here too
                    for lane in self._lanes:
                        lane.release(self)
                return
        _run_callback(fn, self)

    def __await__(self) -> Generator[Any, None, Any]:
        if not self._done and self._lanes:
            yield from self._poll_lanes()
        if not self._done:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            registered = False
            with _state_lock:
                if not self._done:
                    if self._waiters is None:
                        self._waiters = []
                    self._waiters.append((loop, fut))
                    registered = True
            if registered:
                lanes = self._lanes
                for lane in lanes:  # past its polling the await waits for the lane threads
                    lane.hold(fut)
                try:
                    yield from fut
                except asyncio.CancelledError:
                    # The task was cancelled before resolution: only this wait ends; unregister
                    # it so the resolution does not try to wake it (its loop may be closed by
                    # then). Thrown in by the loop, so never while this thread holds
                    # _state_lock. Not GeneratorExit: the garbage collector closes abandoned
                    # awaits at any allocation, possibly inside a _state_lock section.
                    self._forget_waiter(fut)
                    raise
                finally:
                    for lane in lanes:
                        lane.release(fut)
        return self.result()

    def _poll_lanes(self) -> Generator[None, None, None]:
        """The first ``await_poll_us`` of an await: the task polls the lanes that resolve this Completion.

        Each turn, each lane retires what ``event_query`` reports complete on
        this thread (:meth:`_Lane.poll`: in stream order, as its own thread
        would); then the task yields one iteration of its loop (a bare
        ``yield``, as ``asyncio.sleep(0)`` does: the loop's other callbacks and
        I/O run in between, and it never blocks). While registered in the
        lanes' ``pollers``, their threads nap instead of starting a driver
        wait. Returns once resolved or when the time is up.
        """
        lanes = self._lanes
        poll_ns = lanes[0]._engine._await_poll_ns
        if not poll_ns:
            return
        deadline = _perf_counter_ns() + poll_ns
        key = object()  # this await's registration
        for lane in lanes:
            lane.pollers[key] = deadline
        try:
            while True:
                for lane in lanes:
                    lane.poll()
                if self._done or _perf_counter_ns() > deadline:
                    return
                yield  # one turn of the event loop
        finally:  # resolved, out of time, cancelled or closed: the lane threads take over
            for lane in lanes:
                lane.end_poll(key)

    def _forget_waiter(self, fut: asyncio.Future[None]) -> None:
        """Unregister the loop future of an await that ended before resolution (no-op if resolved)."""
        with _state_lock:
            waiters = self._waiters
            if waiters is None:
                return
            for i, (_loop, registered) in enumerate(waiters):
                if registered is fut:
                    del waiters[i]
                    break
            if not waiters:
                self._waiters = None

    # -- resolving (runtime side) -------------------------------------------------
    def _set_result(self, value: Any) -> bool:
        """Resolve with ``value``; ``False`` if already resolved (the first call wins)."""
        return self._resolve(value, None, None)

    def _set_exception(self, exc: BaseException) -> bool:
        """Resolve with ``exc``; ``False`` if already resolved (the first call wins)."""
        return self._resolve(None, exc, None)

    def _resolve(self, value: Any, exc: BaseException | None, posts: PostBatch | None) -> bool:
        """Resolve; loop wake-ups go into ``posts`` (loop -> futures) when given, else out at once."""
        with _state_lock:
            if self._done:
                return False
            self._value = value
            self._exc = exc
            self._done = True
            self._resolved_ns = _perf_counter_ns()
            callbacks, self._callbacks = self._callbacks, None
            waiters, self._waiters = self._waiters, None
            event = self._event
        if event is not None:
            event.set()
        if waiters is not None:
            if posts is None:
                posts = {}
                for loop, fut in waiters:
                    posts.setdefault(loop, []).append(fut)
                for loop, futs in posts.items():
                    self._notifier.post(loop, futs)
            else:
                for loop, fut in waiters:
                    batch = posts.get(loop)
                    if batch is None:
                        posts[loop] = [fut]
                    else:
                        batch.append(fut)
        if callbacks is not None:
            for lane in self._lanes:  # the holds add_done_callback took
                lane.release(self)
            for fn in callbacks:
                _run_callback(fn, self)
        return True

    def __repr__(self) -> str:
        if not self._done:
            state = "pending"
        elif self._exc is not None:
            state = f"failed {type(self._exc).__name__}"
        else:
            state = "done"
        return f"<{type(self).__name__} {state}>"

    def __del__(self) -> None:
        if self._log_unretrieved and self._exc is not None and not isinstance(self._exc, ClosedError):
            try:
                _log.error("exception of a streamrt host function was never retrieved: %r", self._exc)
            except Exception:  # noqa: BLE001, S110 - interpreter teardown: nowhere left to report
                pass


def _run_callback(fn: Callable[[Completion], None], completion: Completion) -> None:
    try:
        fn(completion)
    except Exception:  # noqa: BLE001 - a callback must not break the lane
        _log.exception("exception in completion callback %r", fn)


