"""Completions and the completion engine: GPU work retired without Python on driver threads.

:class:`Completion` is the one awaitable result type of streamrt (events,
``Stream.wait_idle``, host calls; pipelines' ``Run`` subclasses it). It can be
waited on from any thread (:meth:`Completion.wait`, GIL released) or awaited
from any asyncio or uvloop event loop (the loop is never blocked).

:class:`CompletionEngine` (one per runtime) turns stream progress into
resolved Completions:

* **Lanes.** A lane is a runtime-owned thread (one per lane key, normally the
  stream handle, created lazily) that waits GIL-free on blocking-sync events
  with ``event_synchronize``, in the order they were watched (= stream order),
  and then does the Python-side work: it drops keepalives, runs callbacks and
  resolves Completions. After one blocking wait returns it retires every
  following event that ``event_query`` reports done, as one batch (all of
  them after one query when the newest is done: a lane's events are recorded
  on its stream and complete in order), and wakes each asyncio loop once per
  batch (``loop.call_soon_threadsafe``). An idle lane sleeps on a lock: no
  polling.
* **Polling awaits.** For ``await_poll_us`` after an ``await`` of pending
  work begins, the awaiting task polls the work's lanes itself, once per
  turn of its loop (:meth:`Completion._poll_lanes`, :meth:`_Lane.poll`), and
  retires what is complete, as a lane would; the lane thread naps
  meanwhile. This saves the lane's and the loop's cross-thread wake-ups for
  short work.
* **Host calls.** Python host functions run on worker threads (see
  :mod:`streamrt._hostcall`); driver threads only run libc ``sem_post`` /
  ``sem_wait``.
* **Faults.** If ``event_synchronize`` raises (a sticky device error), the
  lane resolves that waiter with the error, and every later one that fails the
  same way. Each Python host call is followed by a guard event on its lane;
  when that wait fails before the worker ran the call, the call is abandoned
  and its Completion gets the error, so no waiter hangs on a host function the
  failed stream will never reach. If a driver's wait hangs on a failed context
  instead of raising, the engine's watchdog thread (:mod:`streamrt._watchdog`)
  queries the lane's stuck event after a while; when the query raises, every
  waiter of that lane (host calls included) gets that error and the blocked
  lane thread is abandoned.
* **Shutdown.** :meth:`CompletionEngine.close` drains deterministically and
  joins its threads. All threads are daemons and an ``atexit`` hook closes
  every live engine with a timeout, so interpreter exit with work in flight
  neither hangs nor crashes.

Thread rules: ``CompletionEngine`` methods may be called from any thread
except :meth:`~CompletionEngine.drain` and :meth:`~CompletionEngine.close`,
which must not be called from the engine's own threads (they would wait for
themselves; they raise ``RuntimeError``). Callbacks given to the engine run on
lane or worker threads (or the watchdog thread, or the thread of an event
loop whose awaiting task polls the work, or at once on the pushing thread for
work watched on a lane the watchdog failed) and must be short and must not
block on GPU work; ``drain`` and ``close`` from a callback run by a polling
task raise ``RuntimeError`` as on the engine's threads.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import logging
import os
import threading
import time
import warnings
import weakref
from time import perf_counter_ns as _perf_counter_ns
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._errors import CaptureError, ClosedError
from ._hostcall import (
    DEFAULT_SWITCH_INTERVAL,
    HostChannel,
    HostRequest,
    HostSlot,
    HostWorkEstimates,
    switch_interval_guard,
)
from ._native import tighten_timer_slack
from ._watchdog import Watchdog

if TYPE_CHECKING:
    from ._backends.protocol import Backend

__all__ = ["Completion", "CompletionEngine", "CompletionStatistics"]

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
# .lanes: while a launch runs on this thread (DeferredWakes), the lanes its pushes would have woken
_deferred = threading.local()


class DeferredWakes:
    """``with DeferredWakes():`` lanes that work pushed on this thread would wake are woken once, on exit.

    For the multi-op launches (``Pipeline.launch``, ``Graph.launch``): a lane
    woken in the middle takes the GIL (to begin its driver wait) as soon as the
    launching thread releases it in its next backend call, so every later call
    of the launch would wait for it. Woken at the end instead, the lane runs
    once the launching thread has returned (or blocks). Nested scopes join the
    outermost. Pushes from an event loop's thread keep their own deferral (see
    :meth:`_Lane.push`); blocking waits (``Completion.wait``, drain) wake lanes
    directly, so nothing waits on a deferred wake inside the scope.
    """

    __slots__ = ("_outer",)

    def __enter__(self) -> None:
        self._outer = getattr(_deferred, "lanes", None)
        if self._outer is None:
            _deferred.lanes = []

    def __exit__(self, *exc: object) -> None:
        if self._outer is None:
            lanes: list[_Lane] = _deferred.lanes
            _deferred.lanes = None
            for lane in lanes:
                if lane._sleeping and not lane._napping:
                    lane._signal()


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
        """``True`` once resolved (the work completed or failed). Never blocks."""
        return self._done

    def wait(self, timeout: float | None = None) -> None:
        """Block the calling thread until resolved; the GIL is released while blocked.

        Does not raise the work's exception (see :meth:`result`). Raises
        ``TimeoutError`` if ``timeout`` seconds pass first. Calling it on an
        event loop's thread blocks that loop: use ``await`` there.
        """
        if self._done:
            return
        with _state_lock:
            if self._done:
                return
            event = self._event
            if event is None:
                event = self._event = threading.Event()
        for lane in self._lanes:  # a push from a loop's thread may have left its lane asleep
            lane.nudge()
        if not event.wait(timeout):
            raise TimeoutError(f"work not completed within {timeout} s")

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


@dataclass(frozen=True)
class CompletionStatistics:
    """A snapshot of one engine.

    Attributes:
        pending: watched events not yet retired (includes host-call guards).
        retired: watched events retired since the engine was created.
        failed: of those, retired with an error (a wait that raised).
        batches: blocking waits that retired at least one event; ``retired /
            batches`` is the mean batch size.
        max_batch: the most events retired after one blocking wait.
        lanes: live lane threads.
        workers: live host-call and host-slot worker threads.
        host_calls: Python host calls submitted since creation (eager).
        host_calls_pending: Python host calls (eager and armed slot runs) not
            yet run or abandoned.
        host_slots: live graph host slots.
        pooled_events: idle events in the event pool.
        events_created: events the pool ever created.
        switch_interval_lowered: the engine currently holds the switch
            interval lowered (a Python host call is in flight).
        loop_closed_warned: a completion arrived for an already closed event
            loop (the one warning was issued).
        closed: the engine is closed.
        watchdog_wakeups: timed wake-ups of the watchdog thread (it has none
            while nothing is queued).
        watchdog_failed_lanes: lanes the watchdog failed (a wait that made no
            progress while ``event_query`` raised).
    """

    pending: int
    retired: int
    failed: int
    batches: int
    max_batch: int
    lanes: int
    workers: int
    host_calls: int
    host_calls_pending: int
    host_slots: int
    pooled_events: int
    events_created: int
    switch_interval_lowered: bool
    loop_closed_warned: bool
    closed: bool
    watchdog_wakeups: int = 0
    watchdog_failed_lanes: int = 0


class _Entry:
    """One watched event on a lane, and what to do when it completes."""

    __slots__ = ("callback", "channel", "completion", "event", "keepalive", "pooled", "request", "user_event")

    def __init__(
        self,
        event: int,
        callback: Callable[[BaseException | None], None] | None,
        completion: Completion | None,
        keepalive: object,
        pooled: bool,
        request: HostRequest | None = None,
        channel: HostChannel | None = None,
        user_event: bool = False,
    ) -> None:
        self.event = event
        self.callback = callback
        self.completion = completion
        self.keepalive = keepalive
        self.pooled = pooled
        self.request = request  # a host call this event guards: resolved from its stored outcome
        self.channel = channel
        # A user's event may be re-recorded (on another stream) while watched: its state
        # then says nothing about the work before it on the lane's stream.
        self.user_event = user_event


class _Lane:
    """A thread retiring one lane's watched events in order. See the module docstring.

    Wake-up protocol (no lock on the producer's path): the queue is a deque
    (atomic appends/pops); an idle lane announces ``_sleeping``, re-checks
    the queue and blocks on ``_wake``, a plain lock kept acquired, which a
    producer that sees ``_sleeping`` releases (a producer on an event loop's
    thread defers that to the loop's next iteration, see :meth:`push`).
    ``_cond`` is only for :meth:`wait_idle` (drain), notified when drainers
    exist.

    Polling. While an awaiting task is registered in :attr:`pollers` with a
    deadline ahead, the lane thread naps (a timed sleep, ``_napping``)
    instead of choosing an entry to wait on, and the task retires entries
    with :meth:`poll`. Whoever retires holds
    ``_retire_lock`` from taking entries until they are retired, so batches
    retire in order; the lane thread also holds it to choose its
    ``_waiting`` entry, which :meth:`poll` then leaves to it: an event is
    never retired (and its event reused) while a driver wait is on it.

    Failed lanes. Entries leave the queue only under ``_take`` (the lane
    thread holds it, once per batch, to pop what it retires; never while it
    waits). The watchdog (:mod:`streamrt._watchdog`) may mark the lane
    *failed* with :meth:`fail_stuck` when its head's wait hangs on a failed
    context: it sets ``dead`` and pops and fails every queued entry under
    ``_take``, so an entry is resolved exactly once, by whoever popped it.
    The lane thread, should its wait ever return, finds ``dead`` set and
    resolves nothing; it then only sleeps until stopped. Entries pushed onto a
    failed lane are failed at once, on the pushing thread, with the same error.
    """

    def __init__(self, engine: CompletionEngine, key: int) -> None:
        self._engine = engine
        self.key = key
        self._queue: collections.deque[_Entry] = collections.deque()
        self._wake = threading.Lock()
        self._wake.acquire()
        # Held to pop entries (lane thread per batch; fail_stuck). Re-entrant, as is _cond: a
        # garbage-collector finalizer (a Buffer's release) may push onto a failed lane from
        # inside a section that holds them, and that push takes both.
        self._take = threading.RLock()
        self.dead: BaseException | None = None  # set by fail_stuck: the lane's waits are abandoned
        self._sleeping = False
        self._napping = False  # asleep because pollers retire its work: a push need not wake it
        self._wake_scheduled = False  # a push from a loop's thread asked that loop to wake it (push)
        self._stopping = False
        self._exited = False
        self._busy = 0  # entries popped and not yet retired (by the one thread retiring)
        # Held by whoever retires (the lane thread, or an awaiting task polling) from taking
        # entries until they are retired, so batches retire in order; and by the lane thread to
        # choose the entry it waits on (_waiting), which a polling task then leaves to it.
        self._retire_lock = threading.Lock()
        self._waiting: _Entry | None = None
        # Awaits polling this lane (Completion._poll_lanes), with their deadlines (perf counter
        # ns): until the last deadline the lane thread naps instead of starting a driver wait.
        # Only the deadline is trusted: a loop may stop with an await still registered.
        self.pollers: dict[object, int] = {}
        self._polled_ns = 0  # when poll() last queried (awaits of one lane share the queries)
        self._cond = threading.Condition(threading.RLock())
        self._drainers = 0
        self.retired = 0
        self.failed = 0
        self.batches = 0
        self.max_batch = 0
        self.channel: HostChannel | None = None  # set by forget_stream: stopped by this thread on exit
        self.thread = threading.Thread(target=self._main, name=f"streamrt-lane-{key:#x}", daemon=True)

    @property
    def outstanding(self) -> int:
        """Entries watched and not yet retired."""
        return len(self._queue) + self._busy

    def push(self, entry: _Entry) -> None:
        if self._stopping:
            raise ClosedError("this completion lane was released")
        self._queue.append(entry)
        if self.dead is not None:  # checked after the append: fail_stuck sets it before popping
            self._fail_queued()
            return
        if self._exited:  # lost a race with the lane's exit: take the entry back
            try:
                self._queue.remove(entry)
            except ValueError:
                pass  # the lane took it after all and retires it
            else:
                raise ClosedError("this completion lane was released")
        if self._sleeping and not self._napping:
            loop = _get_running_loop()
            if loop is None:
                deferred = getattr(_deferred, "lanes", None)
                if deferred is None:
                    self._signal()
                elif self not in deferred:
                    deferred.append(self)  # woken when the launch ends (DeferredWakes)
            elif not self._wake_scheduled:
                # Pushed on an event loop's thread: the work is likely awaited next, and the
                # awaiting task polls and retires it there. Wake the lane thread on the loop's next
                # iteration only if no await took the lane by then (waking it now would have
                # it contend for the GIL with the polling loop). A loop that stops before
                # that iteration leaves the wake to Completion.wait, drain and the watchdog.
                self._wake_scheduled = True
                loop.call_soon(self._wake_unless_polled)
        watchdog = self._engine._watchdog
        if watchdog is not None and watchdog.idle:
            watchdog.kick()

    def _signal(self) -> None:
        self._sleeping = False
        try:
            self._wake.release()
        except RuntimeError:  # already released by another producer
            pass

    def poll(self) -> None:
        """Retire, on the calling thread, the queued entries whose events are complete. Never blocks.

        For an awaiting task (registered in :attr:`pollers` first). Retires
        nothing if another thread is retiring, if the oldest entry is the one
        the lane thread is waiting on in the driver (it retires it when the
        wait returns), or if the lane was queried less than 2 µs ago (many
        tasks awaiting one lane share its queries).
        """
        queue = self._queue
        if not queue or self.dead is not None:
            return
        now = _perf_counter_ns()
        if now - self._polled_ns < _POLL_GAP_NS:
            return
        self._polled_ns = now
        if not self._retire_lock.acquire(blocking=False):
            return
        try:
            batch: list[_Entry] = []
            with self._take:
                if self.dead is not None or not queue or queue[0] is self._waiting:
                    return
                self._take_done(queue, self._engine._backend.event_query, batch)
            if batch:
                outer = getattr(_polling, "engine", None)
                _polling.engine = self._engine  # callbacks run here count as the engine's (owns_thread)
                try:
                    self._retire(batch, None)
                finally:
                    _polling.engine = outer
        finally:
            self._retire_lock.release()

    def end_poll(self, key: object) -> None:
        """The await registered as ``key`` stops polling: the lane thread resumes its waits if it was the last."""
        self.pollers.pop(key, None)
        self.nudge()

    def nudge(self) -> None:
        """Wake the lane thread if it sleeps while work is queued and no poller's deadline is ahead. Any thread."""
        if self._sleeping and self._queue and max(self.pollers.values(), default=0) <= _perf_counter_ns():
            self._signal()

    def _wake_unless_polled(self) -> None:
        self._wake_scheduled = False
        self.nudge()

    def wait_idle(self, timeout: float | None) -> bool:
        self.nudge()
        with self._cond:
            self._drainers += 1
            try:
                return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)
            finally:
                self._drainers -= 1

    def stop(self) -> None:
        self._stopping = True
        self._signal()

    def head(self) -> _Entry | None:
        """The oldest entry not yet taken for retirement (``None`` if none, or the lane failed)."""
        if self.dead is not None:
            return None
        try:
            return self._queue[0]
        except IndexError:
            return None

    def fail_stuck(self, head: _Entry, error: BaseException) -> int | None:
        """Mark the lane failed with ``error`` and fail every queued entry; for the watchdog.

        Acts only if ``head`` is still the oldest queued entry (so a lane that
        made progress meanwhile is left alone) and the lane is not failed yet.
        Returns how many entries it failed, or ``None`` if it did not act.
        The lane thread may stay blocked in its wait for ``head``: it is
        abandoned (a daemon); if the wait ever returns, it resolves nothing.
        """
        if not self._take.acquire(timeout=1.0):  # the lane thread is retiring: it is not stuck
            return None
        try:
            if self.dead is not None:
                return None
            queue = self._queue
            try:
                if queue[0] is not head:
                    return None
            except IndexError:
                return None
            self.dead = error
            entries = _pop_all(queue)
        finally:
            self._take.release()
        self._engine._fail_entries(entries, error)
        self._notify_drainers()
        return len(entries)

    def _fail_queued(self) -> None:
        """On a pushing thread: the lane failed; fail what is queued (at least the new entry)."""
        with self._take:
            entries = _pop_all(self._queue)
        if entries:
            assert self.dead is not None
            self._engine._fail_entries(entries, self.dead)
        self._notify_drainers()

    def _notify_drainers(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _main(self) -> None:
        tighten_timer_slack()  # it waits for the GIL after each wake-up
        try:
            self._run()
        finally:
            if self._stopping:
                self._engine._lane_exited(self)

    def _run(self) -> None:
        engine = self._engine
        backend = engine._backend
        try:
            backend.ensure_device(engine._device)
        except BaseException as exc:  # noqa: BLE001 - every waiter gets the error below
            setup_error: BaseException | None = exc
        else:
            setup_error = None
        synchronize = backend.event_synchronize
        query = backend.event_query
        queue = self._queue
        wake = self._wake
        take = self._take
        retire_lock = self._retire_lock
        pollers = self.pollers
        while True:
            if not queue or self.dead is not None:  # a failed lane has nothing left to wait for
                if self._stopping:
                    self._exited = True
                    if not queue or self.dead is not None:
                        return
                    self._exited = False
                    continue
                self._sleeping = True
                if (not queue or self.dead is not None) and not self._stopping:
                    wake.acquire()  # GIL released while blocked
                self._sleeping = False
                continue
            if pollers and not self._stopping:  # an awaiting task retires this lane's work meanwhile
                left = max(pollers.values(), default=0) - _perf_counter_ns()
                if left > 0:
                    self._napping = self._sleeping = True
                    if pollers and not self._stopping:
                        wake.acquire(timeout=left / 1e9)  # end_poll, stop or the deadline
                    self._napping = self._sleeping = False
                    continue
            with retire_lock:
                if pollers and not self._stopping and max(pollers.values(), default=0) > _perf_counter_ns():
                    continue
                try:
                    head = queue[0]
                except IndexError:  # retired by an awaiting task, or failed and emptied by the watchdog
                    continue
                self._waiting = head
            error: BaseException | None = setup_error
            if error is None:
                try:
                    synchronize(head.event)
                except BaseException as exc:  # noqa: BLE001 - a sticky error resolves the waiter
                    error = exc
            with retire_lock:
                self._waiting = None
                with take:
                    if self.dead is not None:  # the watchdog failed this lane's work meanwhile
                        continue
                    self._busy = 1
                    try:
                        if queue[0] is not head:  # taken by a forced close meanwhile
                            self._busy = 0
                            continue
                        queue.popleft()
                    except IndexError:
                        self._busy = 0
                        continue
                    batch = [head]
                    if error is None and queue:
                        self._take_done(queue, query, batch)
                self._retire(batch, error)

    def _take_done(self, queue: collections.deque[_Entry], query: Callable[[int], bool], batch: list[_Entry]) -> None:
        """Move the queued entries whose events are complete to ``batch`` (the retiring thread, ``_take`` held).

        Every event of a lane was recorded on the lane's stream, so one that
        is complete means every event watched before it is: the newest is
        queried first, and when it is done (the usual case after a wait under
        load) the whole queue is taken with that one query. Otherwise (or when
        the newest is a user's event, which may have been re-recorded
        elsewhere) they are queried from the oldest, up to the first not done.
        A query that raises stops the batch (the next blocking wait reports
        the error).
        """
        n = len(queue)  # producers only append: the first n entries stay put
        newest = queue[n - 1]
        if not newest.user_event:
            try:
                newest_done = query(newest.event)
            except BaseException:  # noqa: BLE001 - the blocking wait reports it next
                return
            if newest_done:
                self._busy += n
                for _ in range(n):
                    batch.append(queue.popleft())
                return
            n -= 1  # the newest is not done
        for _ in range(n):
            nxt = queue[0]
            try:
                if not query(nxt.event):
                    return
            except BaseException:  # noqa: BLE001 - the blocking wait reports it next
                return
            self._busy += 1
            queue.popleft()
            batch.append(nxt)

    def _retire(self, batch: list[_Entry], error: BaseException | None) -> None:
        engine = self._engine
        posts: PostBatch = {}
        first = True
        for entry in batch:
            err = error if first else None
            first = False
            # Keepalives are dropped here, on the lane thread, after the event.
            entry.keepalive = None
            if entry.pooled:
                engine._recycle_event(entry.event, err is None)
            callback = entry.callback
            if callback is not None:
                entry.callback = None
                try:
                    callback(err)
                except Exception:  # noqa: BLE001 - never let a callback kill the lane
                    _log.exception("exception in completion-engine callback %r", callback)
            completion = entry.completion
            if completion is not None:
                entry.completion = None
                completion._resolve(None, err, posts)
            request = entry.request
            if request is not None:
                entry.request = None
                entry.channel.retire(request, err, posts)  # type: ignore[union-attr]
        if posts:
            notifier = engine._notifier
            for loop, futures in posts.items():
                try:
                    notifier.post(loop, futures)
                except Exception:  # noqa: BLE001
                    _log.exception("could not wake an event loop")
        n = len(batch)
        self.retired += n
        self.batches += 1
        if error is not None:
            self.failed += 1
        self.max_batch = max(self.max_batch, n)
        self._busy = 0
        if self._drainers:
            with self._cond:
                self._cond.notify_all()


def _pop_all(queue: collections.deque[_Entry]) -> list[_Entry]:
    """Pop every entry (one atomic ``popleft`` at a time: producers may append meanwhile)."""
    entries = []
    while True:
        try:
            entries.append(queue.popleft())
        except IndexError:
            return entries


_live_engines: weakref.WeakSet[CompletionEngine] = weakref.WeakSet()


def _default_exit_timeout() -> float:
    try:
        return float(os.environ.get("STREAMRT_EXIT_TIMEOUT", "5"))
    except ValueError:
        return 5.0


class CompletionEngine:
    """Retires GPU work and runs Python host functions on runtime threads. One per runtime.

    Args:
        backend: the runtime's backend.
        device: the device the runtime uses; lane threads make it current.
        python_host_switch_interval: while a Python host call is in flight,
            lower ``sys.setswitchinterval`` to this many seconds (default
            10 µs) so its worker gets the GIL promptly; ``None`` never touches
            the interpreter setting. See :mod:`streamrt._hostcall`.
        stream_signals: ``True`` holds a stream for a Python host call with a
            device-side wait on a signal (one host function per call) where the
            backend supports it; by default a second host function,
            ``sem_wait(done)``, holds it. See :mod:`streamrt._hostcall` for
            why the signal hold is opt-in (a deadlock it can cause).
        max_pooled_events: idle events kept for reuse; more are destroyed.
        exit_timeout: how long the ``atexit`` hook waits for in-flight work
            before giving up on it (default ``$STREAMRT_EXIT_TIMEOUT`` or 5 s).
        watchdog_interval: seconds between the watchdog's checks while work is
            queued (see :mod:`streamrt._watchdog`); ``None`` runs no watchdog.
        watchdog_threshold: a lane's oldest entry must have been waited for
            this long before the watchdog queries its event.
        await_poll_us: how long an ``await`` of a pending Completion polls
            its lanes from the awaiting task (see ``Completion._poll_lanes``);
            0 leaves every await to the lane threads.
    """

    def __init__(
        self,
        backend: Backend,
        device: int,
        *,
        python_host_switch_interval: float | None = DEFAULT_SWITCH_INTERVAL,
        stream_signals: bool = False,
        max_pooled_events: int = 1024,
        exit_timeout: float | None = None,
        watchdog_interval: float | None = 0.5,
        watchdog_threshold: float = 1.0,
        await_poll_us: float = DEFAULT_AWAIT_POLL_US,
    ) -> None:
        if python_host_switch_interval is not None and not python_host_switch_interval > 0:
            raise ValueError(f"python_host_switch_interval must be > 0 or None, got {python_host_switch_interval!r}")
        if watchdog_interval is not None and not watchdog_interval > 0:
            raise ValueError(f"watchdog_interval must be > 0 or None, got {watchdog_interval!r}")
        if not watchdog_threshold >= 0:
            raise ValueError(f"watchdog_threshold must be >= 0, got {watchdog_threshold!r}")
        if isinstance(await_poll_us, bool) or not isinstance(await_poll_us, (int, float)) or not 0 <= await_poll_us <= 1e6:
            raise ValueError(f"await_poll_us must be a number of microseconds from 0 to 1e6, got {await_poll_us!r}")
        self._await_poll_ns = int(await_poll_us * 1000)
        self._backend = backend
        self._device = device
        self._switch_interval = python_host_switch_interval
        self._max_pooled = max_pooled_events
        self.exit_timeout = _default_exit_timeout() if exit_timeout is None else exit_timeout
        self._lock = threading.Lock()
        self._lanes: dict[int, _Lane] = {}
        self._retiring: set[_Lane] = set()  # lanes of forgotten streams, still retiring their work
        self._channels: dict[int, HostChannel] = {}
        self._uses_signals = bool(stream_signals and backend.capabilities(device).supports_stream_signals)
        # idle signals for new channels; None: channels hold their stream with sem_wait(done)
        self._signals: list[int] | None = [] if self._uses_signals else None
        self._slots: set[HostSlot] = set()
        self._pool: list[int] = []
        self._events_created = 0
        self._host_calls = 0
        self._python_in_flight = 0
        self._holds_guard = False
        self._retired_gone = [0, 0, 0]  # retired, failed, batches of released lanes
        self._max_batch_gone = 0
        self._notifier = _LoopNotifier()
        # On a simulator, Python host functions are timed so that simulated streams wait as long.
        self._expect_host_work: Callable[[Any], None] | None = getattr(backend, "expect_host_work", None)
        self._host_work = HostWorkEstimates() if callable(self._expect_host_work) else None
        self._watchdog_interval = watchdog_interval
        self._watchdog_threshold = watchdog_threshold
        self._watchdog: Watchdog | None = None  # started with the first lane
        self._closing = False
        self._closed = False
        _live_engines.add(self)

    # -- lanes -------------------------------------------------------------------
    def _lane(self, key: int) -> _Lane:
        lane = self._lanes.get(key)
        if lane is not None:
            return lane
        with self._lock:
            self._check_open()
            lane = self._lanes.get(key)
            if lane is None:
                if self._watchdog is None and self._watchdog_interval is not None:
                    watchdog = Watchdog(self, self._watchdog_interval, self._watchdog_threshold)
                    self._register_thread(watchdog.thread)
                    watchdog.thread.start()
                    self._watchdog = watchdog
                lane = _Lane(self, key)
                self._register_thread(lane.thread)
                lane.thread.start()
                self._lanes[key] = lane
        return lane

    def _all_lanes(self) -> list[_Lane]:
        """Every lane that may hold work: live ones and those of forgotten streams."""
        with self._lock:
            return [*self._lanes.values(), *self._retiring]

    def _fail_entries(self, entries: list[_Entry], error: BaseException) -> None:
        """Resolve entries taken from a failed lane with ``error`` (watchdog or pushing thread).

        Like a failed wait on the lane: keepalives dropped, callbacks called
        with the error, Completions resolved, host calls that did not run
        abandoned. Their events are leaked, not pooled or destroyed: a lane
        thread may still be blocked in the driver on one of them.
        """
        posts: PostBatch = {}
        for entry in entries:
            entry.keepalive = None
            callback, entry.callback = entry.callback, None
            if callback is not None:
                try:
                    callback(error)
                except Exception:  # noqa: BLE001
                    _log.exception("exception in completion-engine callback %r", callback)
            completion, entry.completion = entry.completion, None
            if completion is not None:
                completion._resolve(None, error, posts)
            request, entry.request = entry.request, None
            if request is not None and entry.channel is not None:
                try:
                    entry.channel.retire(request, error, posts)
                except Exception:  # noqa: BLE001
                    _log.exception("could not abandon a Python host call of a failed lane")
        for loop, futures in posts.items():
            try:
                self._notifier.post(loop, futures)
            except Exception:  # noqa: BLE001
                _log.exception("could not wake an event loop")
        with self._lock:
            self._retired_gone[0] += len(entries)
            self._retired_gone[1] += len(entries)

    def _register_thread(self, thread: threading.Thread) -> None:
        """Mark ``thread`` (before it starts) as one of this engine's own."""
        thread._streamrt_engine = self  # type: ignore[attr-defined]

    def owns_thread(self, thread: threading.Thread | None = None) -> bool:
        """``True`` if ``thread`` (default: the calling thread) is one of this engine's lanes or workers.

        The calling thread also counts while it retires this engine's work for
        an await that polls (its done callbacks run there).
        """
        if thread is None and getattr(_polling, "engine", None) is self:
            return True
        t = threading.current_thread() if thread is None else thread
        return getattr(t, "_streamrt_engine", None) is self

    def _check_open(self) -> None:
        if self._closing:
            raise ClosedError("the completion engine (runtime) is closed")

    def watch_event(self, event: int, lane: int, callback: Callable[[BaseException | None], None]) -> None:
        """Call ``callback(None)`` on lane ``lane``'s thread once the recorded ``event`` completes.

        ``lane``: the handle of the stream ``event`` was recorded on (a lane
        relies on its events completing in the order they were watched).
        ``event`` must already be recorded and must be blocking-sync; the
        caller keeps it alive, and does not record it again, until the
        callback ran. ``callback(error)`` gets the exception if waiting for
        the event raised. Callbacks of one lane run in the order they were
        watched.
        """
        self._check_open()
        self._lane(lane).push(_Entry(event, callback, None, None, False))

    def lanes_of(self, lane: int) -> tuple[_Lane, ...]:
        """What a Completion resolved on lane ``lane`` polls when awaited (see ``Completion._lanes``)."""
        return (self._lane(lane),)

    def event_completion(self, event: int, lane: int) -> Completion:
        """A Completion resolved once the user-owned, already recorded ``event`` completes.

        Watched on lane ``lane`` (the stream it was recorded on). The caller
        keeps ``event`` alive until then; if it is re-recorded meanwhile, the
        Completion may resolve at the later record, or once work watched after
        it on ``lane`` has completed. An event never recorded is complete at
        once (as in HIP/CUDA).
        """
        self._check_open()
        completion = Completion()
        completion._notifier = self._notifier
        target = self._lane(lane)
        completion._lanes = (target,)
        target.push(_Entry(event, None, completion, None, False, user_event=True))
        return completion

    def completion_for_stream(self, stream: int, *, keepalive: object = None) -> Completion:
        """Record a pooled event on ``stream``; the Completion resolves when all work before it is done.

        ``keepalive`` (buffers, callables, anything) is referenced until then
        and dropped on the lane thread, before the Completion resolves. Must
        not be called while ``stream`` is capturing (the caller checks).
        Raises the backend's error if the event could not be recorded (nothing
        is then watched).
        """
        self._check_open()
        event = self._acquire_event()
        try:
            self._backend.event_record(event, stream)
        except BaseException:
            self._pool.append(event)
            raise
        completion = Completion()
        completion._notifier = self._notifier
        lane = self._lane(stream)
        completion._lanes = (lane,)
        lane.push(_Entry(event, None, completion, keepalive, True))
        return completion

    # -- event pool ----------------------------------------------------------------
    def _acquire_event(self) -> int:
        try:
            return self._pool.pop()
        except IndexError:
            event = self._backend.event_create(timing=False, blocking_sync=True)
            self._events_created += 1
            return event

    def _recycle_event(self, event: int, ok: bool) -> None:
        """On a lane thread: the event completed; pool it (or destroy it if its wait failed)."""
        if ok and len(self._pool) < self._max_pooled and not self._closing:
            self._pool.append(event)
            return
        try:
            self._backend.event_destroy(event)
        except Exception:  # noqa: BLE001 - a failed context; the handle is gone with it
            _log.debug("event_destroy failed for a retired event", exc_info=True)

    # -- host functions ------------------------------------------------------------
    def _new_completion(self) -> Completion:
        completion = Completion()
        completion._notifier = self._notifier
        return completion

    def host_call(self, stream: int, fn: Callable[..., Any], args: tuple[Any, ...] = (), *, capture_checked: bool = False) -> Completion:
        """Run the Python ``fn(*args)`` in stream order on a runtime worker thread.

        Enqueues two native host functions on ``stream``: ``sem_post(ready)``
        wakes the stream's worker, ``sem_wait(done)`` holds the stream
        (GIL-free on the driver thread) until the worker has run ``fn``. The
        returned Completion resolves with ``fn``'s return value or exception
        (the stream goes on either way), on the stream's lane, in stream order
        with the stream's other Completions; if the stream fails before
        reaching the call, ``fn`` never runs and the Completion gets the
        error. ``fn`` must not call HIP/CUDA, and a long ``fn`` blocks its
        stream. Raises ``CaptureError`` if ``stream`` is capturing (use
        :meth:`host_slot` for graphs). ``capture_checked``: the caller has just
        checked that ``stream`` is not capturing (a pipeline launch), so the
        check is not repeated.
        """
        self._check_open()
        if not callable(fn):
            raise TypeError(f"host function must be callable, got {type(fn).__name__}")
        backend = self._backend
        if not capture_checked and backend.stream_is_capturing(stream):
            raise CaptureError(
                "host_call cannot be captured: a captured host node must re-run on every replay; "
                "use CompletionEngine.host_slot (pipelines do this in Pipeline.capture)"
            )
        channel = self._channel(stream)
        completion = self._new_completion()
        completion._log_unretrieved = True
        req = channel.submit(fn, tuple(args), completion)
        self._host_calls += 1
        # The guard event after the call: its lane resolves the Completion in stream
        # order, and fails the call instead if the stream dies before reaching it.
        event = self._acquire_event()
        try:
            backend.event_record(event, stream)
        except BaseException as exc:
            self._pool.append(event)
            channel.abandon(req, exc)  # no guard, no watchdog: fn will not run
            raise
        lane = self._lane(stream)
        completion._lanes = (lane,)
        lane.push(_Entry(event, None, None, None, True, req, channel))
        return completion

    def host_call_native(self, stream: int, fn_ptr: int, user_data: int, *, keepalive: object = None) -> None:
        """Enqueue the native ``void fn(void*)`` at ``fn_ptr``; it runs directly on the driver thread.

        Pass the ctypes/numba object owning ``fn_ptr`` (and whatever
        ``user_data`` points into) as ``keepalive``: it is held until the
        function has run and dropped on a lane thread after.
        """
        self._check_open()
        if not fn_ptr:
            raise ValueError("fn_ptr is NULL")
        self._backend.launch_host_func(stream, fn_ptr, user_data)
        if keepalive is not None:
            self.completion_for_stream(stream, keepalive=keepalive)

    def host_slot(self, fn: Callable[..., Any], args: tuple[Any, ...] = ()) -> HostSlot:
        """A captured Python host node for a graph; see :class:`~streamrt._hostcall.HostSlot`.

        The slot is owned by the Graph and lives as long as it; each replay
        runs ``fn(*args)`` on the slot's worker thread.
        """
        self._check_open()
        slot = HostSlot(self, fn, tuple(args))
        with self._lock:
            self._check_open()
            self._slots.add(slot)
        return slot

    def _forget_slot(self, slot: HostSlot) -> None:
        with self._lock:
            self._slots.discard(slot)

    def _channel(self, stream: int) -> HostChannel:
        channel = self._channels.get(stream)
        if channel is not None:
            return channel
        with self._lock:
            self._check_open()
            channel = self._channels.get(stream)
            if channel is None:
                channel = self._channels[stream] = HostChannel(self, stream, self._take_signal_locked())
        return channel

    @property
    def stream_signals(self) -> bool:
        """``True`` when Python host calls hold their stream with a signal wait (one host function each)."""
        return self._uses_signals

    def _take_signal_locked(self) -> int | None:
        """A signal for a new channel (an idle one, else a new one); ``None`` without signals. Lock held."""
        if self._signals is None:
            return None
        if self._signals:
            return self._signals.pop()
        return self._backend.signal_alloc()

    def _return_signal(self, signal: int, *, reusable: bool) -> None:
        """A stopped channel's signal: kept for the next channel, else leaked.

        Leaked when a failed stream may still reach a wait on it, and when the
        engine has already freed its pool (a lane that outlived a forced
        close): a real free never runs on a lane thread.
        """
        with self._lock:
            if reusable and self._signals is not None:
                self._signals.append(signal)

    def _announce_host_work(self, fn: Callable[..., Any]) -> None:
        """Before what holds the stream for a Python host call: tell a simulator how long ``fn`` runs."""
        if self._host_work is not None and self._expect_host_work is not None:
            self._expect_host_work(self._host_work.for_function(fn))

    def _python_call_started(self) -> None:
        with self._lock:
            self._python_in_flight += 1
            if self._python_in_flight == 1 and self._switch_interval is not None and not self._holds_guard:
                self._holds_guard = True
                switch_interval_guard.acquire(self._switch_interval)

    def _python_call_finished(self) -> None:
        with self._lock:
            self._python_in_flight -= 1
            if self._python_in_flight == 0 and self._holds_guard:
                self._holds_guard = False
                switch_interval_guard.release()

    # -- lifetime ----------------------------------------------------------------------
    def forget_stream(self, stream: int) -> None:
        """Forget ``stream`` before it is destroyed. Never blocks.

        Its lane thread keeps retiring what was already watched (destroying a
        stream with work in flight is legal: the work still runs) and then
        exits; its host-call worker is stopped and its semaphores freed by the
        lane thread once the last host call on it has provably returned.
        :meth:`drain` and :meth:`close` still wait for that work. A later call
        for the same handle value (drivers reuse them) starts a fresh lane.
        """
        with self._lock:
            lane = self._lanes.pop(stream, None)
            channel = self._channels.pop(stream, None)
            if lane is not None:
                self._retiring.add(lane)
                lane.channel = channel
        if lane is not None:
            lane.stop()
        elif channel is not None:  # a channel always has a lane (its guard events); be safe anyway
            channel.wait_idle(None)
            channel.stop(forced=False, join_timeout=None)

    def _lane_exited(self, lane: _Lane) -> None:
        """On a lane thread that stopped after :meth:`forget_stream`: free what the stream used."""
        channel, lane.channel = lane.channel, None
        if channel is not None:
            # Every guard event retired, so the driver returned from each sem_wait(done);
            # the worker may still be finishing its last bookkeeping.
            channel.wait_idle(None)
            channel.stop(forced=False, join_timeout=None)
        with self._lock:
            if lane in self._retiring:
                self._retiring.discard(lane)
                self._absorb_lane_stats_locked(lane)

    def _absorb_lane_stats_locked(self, lane: _Lane) -> None:
        self._retired_gone[0] += lane.retired
        self._retired_gone[1] += lane.failed
        self._retired_gone[2] += lane.batches
        self._max_batch_gone = max(self._max_batch_gone, lane.max_batch)

    def _refuse_own_thread(self, what: str) -> None:
        if self.owns_thread():
            raise RuntimeError(f"{what}() called from a streamrt completion thread would wait for itself")

    def _waitables(self) -> list[Any]:
        with self._lock:
            return [*self._lanes.values(), *self._retiring, *self._channels.values(), *self._slots]

    def drain(self, timeout: float | None = None) -> None:
        """Block until every watched event and every Python host call has retired.

        Raises ``TimeoutError`` if ``timeout`` seconds pass first, and
        ``RuntimeError`` if called from one of the engine's own threads.
        Work submitted concurrently by other threads is waited for too.
        """
        self._refuse_own_thread("drain")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            busy = [w for w in self._waitables() if _busy(w)]
            if not busy:
                return
            for w in busy:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not w.wait_idle(remaining):
                    raise TimeoutError(f"streamrt work still in flight after {timeout} s")

    def close(self, timeout: float | None = None) -> None:
        """Drain, stop and join every thread, free the event pool, restore the switch interval.

        Deterministic: when it returns, every Completion the engine made is
        resolved and no engine thread runs. With ``timeout``, work still in
        flight after that long is given up: its Completions are resolved with
        ``ClosedError``, its events and semaphores are leaked rather than
        freed, and threads that cannot be stopped are left (daemons).
        Idempotent. After it, submitting work raises ``ClosedError``.
        """
        self._refuse_own_thread("close")
        with self._lock:
            if self._closing:
                already = True
            else:
                already = False
                self._closing = True
        if already:
            return
        forced = False
        try:
            self.drain(timeout)
        except TimeoutError:
            forced = True
            _log.warning("closing the completion engine with GPU work still in flight after %s s", timeout)
        join_timeout = 0.1 if forced else None
        with self._lock:
            lanes = list(self._lanes.values())
            retiring = list(self._retiring)
            channels = list(self._channels.values())
            slots = list(self._slots)
            self._lanes.clear()
            self._channels.clear()
            self._slots.clear()
        for lane in [*lanes, *retiring]:
            if forced:
                _abandon_lane(lane)
            lane.stop()
        for lane in retiring:
            lane.thread.join(_lane_join_timeout(lane, join_timeout))  # it stops its own channel on the way out
            if lane.thread.is_alive() and lane.dead is not None:
                # Failed by the watchdog and still blocked in the driver: never exits by itself.
                channel, lane.channel = lane.channel, None
                if channel is not None:
                    channel.stop(forced=True, join_timeout=join_timeout)
                with self._lock:
                    if lane in self._retiring:
                        self._retiring.discard(lane)
                        self._absorb_lane_stats_locked(lane)
        for lane in lanes:
            lane.thread.join(_lane_join_timeout(lane, join_timeout))
            with self._lock:
                self._absorb_lane_stats_locked(lane)
        watchdog = self._watchdog
        if watchdog is not None:
            watchdog.stop()
            watchdog.thread.join(join_timeout)
        for worker in [*channels, *slots]:
            worker.stop(forced=forced, join_timeout=join_timeout)
            if isinstance(worker, HostSlot):
                worker.closed = True
        with self._lock:
            signals, self._signals = self._signals or [], None
        for signal in signals:
            try:
                self._backend.signal_free(signal)
            except Exception:  # noqa: BLE001 - a failed context; the memory is gone with it
                _log.debug("signal_free failed while closing", exc_info=True)
        pool, self._pool = self._pool, []
        for event in pool:
            try:
                self._backend.event_destroy(event)
            except Exception:  # noqa: BLE001 - backend already gone at exit
                _log.debug("event_destroy failed while closing", exc_info=True)
        with self._lock:
            if self._holds_guard:
                self._holds_guard = False
                switch_interval_guard.release()
            self._closed = True
        _live_engines.discard(self)

    @property
    def is_closed(self) -> bool:
        """``True`` once :meth:`close` has started."""
        return self._closing

    def statistics(self) -> CompletionStatistics:
        """A consistent-enough snapshot (counters read without stopping the threads)."""
        with self._lock:
            lanes = [*self._lanes.values(), *self._retiring]
            channels = list(self._channels.values())
            slots = list(self._slots)
            retired, failed, batches = self._retired_gone
            max_batch = self._max_batch_gone
        workers = [w for w in [*channels, *slots] if w._thread.is_alive()]
        return CompletionStatistics(
            pending=sum(lane.outstanding for lane in lanes),
            retired=retired + sum(lane.retired for lane in lanes),
            failed=failed + sum(lane.failed for lane in lanes),
            batches=batches + sum(lane.batches for lane in lanes),
            max_batch=max([max_batch, *(lane.max_batch for lane in lanes)]),
            lanes=sum(1 for lane in lanes if lane.thread.is_alive()),
            workers=len(workers),
            host_calls=self._host_calls,
            host_calls_pending=sum(w.in_flight for w in [*channels, *slots]),
            host_slots=len(slots),
            pooled_events=len(self._pool),
            events_created=self._events_created,
            switch_interval_lowered=self._holds_guard and switch_interval_guard.is_lowered,
            loop_closed_warned=self._notifier.warned,
            closed=self._closing,
            watchdog_wakeups=0 if self._watchdog is None else self._watchdog.wakeups,
            watchdog_failed_lanes=0 if self._watchdog is None else self._watchdog.failed_lanes,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closing else "open"
        return f"<CompletionEngine {getattr(self._backend, 'name', '?')}:{self._device} {state}>"


def _lane_join_timeout(lane: _Lane, join_timeout: float | None) -> float | None:
    """How long close() joins a stopped lane: briefly if it was failed (its thread may never return)."""
    if lane.dead is not None:
        return 0.1 if join_timeout is None else min(join_timeout, 0.1)
    return join_timeout


def _busy(waitable: Any) -> bool:
    if isinstance(waitable, _Lane):
        return waitable.outstanding > 0
    return bool(waitable.in_flight > 0)


def _abandon_lane(lane: _Lane) -> None:
    """Forced close: resolve everything still queued on ``lane`` with ClosedError.

    The queue is left to the (daemon) lane thread, which may still retire it
    if the device ever gets there. Keepalives are *leaked*, not dropped: the
    GPU may still be using what they hold.
    """
    exc = ClosedError("the runtime closed before this work completed")
    entries = list(lane._queue)
    for entry in entries:
        if entry.keepalive is not None:
            _leaked_keepalives.append(entry.keepalive)
        callback, entry.callback = entry.callback, None
        if callback is not None:
            try:
                callback(exc)
            except Exception:  # noqa: BLE001
                _log.exception("exception in completion-engine callback %r", callback)
        if entry.completion is not None:
            entry.completion._resolve(None, exc, None)
        if entry.request is not None and entry.channel is not None:
            entry.channel.abandon(entry.request, exc)


# Keepalives of work given up by a forced close: never released (the device may still use them).
_leaked_keepalives: list[object] = []


def _close_all_at_exit(engines: Iterable[CompletionEngine] | None = None) -> None:
    """``atexit``: close every live engine, giving in-flight work ``exit_timeout`` seconds."""
    for engine in list(_live_engines if engines is None else engines):
        try:
            engine.close(timeout=engine.exit_timeout)
        except Exception:  # noqa: BLE001 - never fail interpreter exit
            _log.debug("closing a completion engine at exit failed", exc_info=True)


atexit.register(_close_all_at_exit)
