"""The completion engine: one per runtime; lanes, the event pool, drain and close.

Its host-call side (Python and native host functions, host slots, channels
and their signals) is the :class:`~streamrt._completion._hosts._HostCalls`
mixin; the helpers of shutdown and the ``atexit`` hook are in
:mod:`streamrt._completion._shutdown`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .._errors import ClosedError
from .._event_pool import EventPool
from .._host_work import HostWorkEstimates
from .._hostcall import HostChannel, HostSlot
from .._submitter import Submitter, make_submitter
from .._switch_interval import DEFAULT_SWITCH_INTERVAL, switch_interval_guard
from .._watchdog import Watchdog
from ._future import DEFAULT_AWAIT_POLL_US, Completion, PostBatch, _LoopNotifier, _polling
from ._hosts import _HostCalls
from ._lane import _Entry, _Lane
from ._shutdown import _abandon_lane, _busy, _default_exit_timeout, _lane_join_timeout, _live_engines
from ._statistics import CompletionStatistics

if TYPE_CHECKING:
    from .._backends.protocol import Backend

__all__ = ["CompletionEngine"]

_log = logging.getLogger("streamrt")


class CompletionEngine(_HostCalls):
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
        events: the pool its events come from (a runtime passes its own, shared with
            the stream pool and the allocators, and closes it); ``None``: a pool of
            its own, closed with the engine.
        max_pooled_events: idle events kept by a pool of its own; more are destroyed.
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
        events: EventPool | None = None,
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
        self._owns_events = events is None
        self._events = EventPool(backend, device, limit=max_pooled_events) if events is None else events
        self.exit_timeout = _default_exit_timeout() if exit_timeout is None else exit_timeout
        self._lock = threading.Lock()
        self._lanes: dict[int, _Lane] = {}
        self._retiring: set[_Lane] = set()  # lanes of forgotten streams, still retiring their work
        self._channels: dict[int, HostChannel] = {}
        self._uses_signals = bool(stream_signals and backend.capabilities(device).supports_stream_signals)
        # idle signals for new channels; None: channels hold their stream with sem_wait(done)
        self._signals: list[int] | None = [] if self._uses_signals else None
        self._slots: set[HostSlot] = set()
        self._workers: dict[int, Any] = {}  # host-call workers by their `ready` semaphore's address (tracing)
        self._pool = self._events.idle  # popped inline on every launch (see EventPool)
        native = getattr(backend, "native_ops", None)
        self._record: Callable[[int, int], None] = backend.event_record if native is None else native.record_held  # tails
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
        self._submitter: Submitter | None = None  # started by the first deferred launch
        self._deferred_on: dict[int, int] = {}  # stream handle -> the last ticket that enqueues on it
        self._closing = False
        self._closed = False
        _live_engines.add(self)

    # -- lanes -------------------------------------------------------------------
    def lane(self, key: int) -> _Lane:
        """The lane of stream handle ``key`` (made on first use; its thread starts with its first push).

        Its :attr:`~_Lane.lock` is the stream's enqueue lock. Raises
        ``ClosedError`` once the engine is closing.
        """
        lane = self._lanes.get(key)
        if lane is not None:
            return lane
        with self._lock:
            self._check_open()
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = _Lane(self, key)
        return lane

    _lane = lane

    def _start_watchdog_locked(self) -> None:
        """With the first lane thread: the watchdog. Engine lock held."""
        if self._watchdog is None and self._watchdog_interval is not None:
            watchdog = Watchdog(self, self._watchdog_interval, self._watchdog_threshold)
            self._register_thread(watchdog.thread)
            watchdog.thread.start()
            self._watchdog = watchdog

    def _all_lanes(self) -> list[_Lane]:
        """Every lane that may hold work: live ones and those of forgotten streams."""
        with self._lock:
            return [*self._lanes.values(), *self._retiring]

    def retire_ready(self) -> None:
        """Retire, on the calling thread, the queued work of every lane that has completed. Never blocks.

        One event query per lane with work queued: keepalives are dropped and
        Completions resolve (done callbacks may run here), as a polling
        :attr:`Completion.is_done` does for its own lanes. Any thread.
        """
        for lane in self._all_lanes():
            lane.poll()

    def _fail_entries(self, entries: list[_Entry], error: BaseException) -> None:
        """Resolve entries taken from a failed lane with ``error`` (watchdog or pushing thread).

        Like a failed wait on the lane: keepalives dropped, callbacks called
        with the error, Completions and Runs resolved, host calls that did
        not run abandoned. Their events are leaked, not pooled or destroyed: a
        lane thread may still be blocked in the driver on one of them.
        """
        posts: PostBatch = {}
        for entry in entries:
            try:
                entry._retire(error, posts)
            except Exception:  # noqa: BLE001
                _log.exception("could not fail %r of a failed lane", entry)
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

    def record_and_watch(
        self, event: int, stream: int, callback: Callable[[BaseException | None], None],
        enqueue: Callable[..., None] | None = None, args: tuple[Any, ...] = (),
    ) -> None:
        """Record ``event`` on ``stream`` and call ``callback(None)`` on its lane's thread once it completes.

        ``event`` must be blocking-sync; the caller keeps it alive, and does
        not record it again, until the callback ran. ``callback(error)`` gets
        the exception if waiting for the event raised. Callbacks of one lane
        run in the order they were watched. ``enqueue(*args)``, if given, makes
        the record instead, with whatever it enqueues before it (a copy and its
        record in one native call, say), under the stream's enqueue lock. Raises
        the backend's error (or ``enqueue``'s) if the event could not be
        recorded: nothing is then watched.
        """
        lane = self._lanes.get(stream)  # (lane()'s fast path, inline: every fetch and logged value)
        if lane is None:
            lane = self._lane(stream)
        if self._deferred_on:
            self.settle(stream)  # its record must follow the deferred work's (see _Lane, "Order")
        with lane.lock:
            lane._depth += 1  # a record-and-push section (see _Lane, "Order")
            try:
                if self._closing:
                    self._check_open()
                if enqueue is None:
                    self._backend.event_record(event, stream)
                else:
                    enqueue(*args)
                lane.push(_Entry(event, callback, None, None, False, unordered=lane._depth > 1))
            finally:
                lane._depth -= 1

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
        target.push(_Entry(event, None, completion, None, False, unordered=True))
        return completion

    def completion_for_stream(self, stream: int, *, keepalive: object = None) -> Completion:
        """Record a pooled event on ``stream``; the Completion resolves when all work before it is done.

        ``keepalive`` (buffers, callables, anything) is referenced until then
        and dropped on the lane thread, before the Completion resolves. Must
        not be called while ``stream`` is capturing (the caller checks).
        Raises the backend's error if the event could not be recorded (nothing
        is then watched).
        """
        lane = self._lane(stream)
        if self._deferred_on:
            self.settle(stream)  # its record must follow the deferred work's (see _Lane, "Order")
        with lane.lock:
            lane._depth += 1  # a record-and-push section (see _Lane, "Order")
            try:
                self._check_open()
                event = self._acquire_event()
                try:
                    self._record(event, stream)
                except BaseException:
                    self._pool.append(event)
                    raise
                completion = Completion()
                completion._notifier = self._notifier
                completion._lanes = (lane,)
                lane.push(_Entry(event, None, completion, keepalive, True, unordered=lane._depth > 1))
            finally:
                lane._depth -= 1
        return completion

    # -- deferred submissions ----------------------------------------------------------
    def submitter(self) -> Submitter:
        """The runtime's submission thread (see :mod:`streamrt._submitter`), started on first use."""
        submitter = self._submitter
        if submitter is None:
            with self._lock:
                self._check_open()
                submitter = self._submitter
                if submitter is None:
                    submitter = self._submitter = make_submitter(self._backend, self._device)
        return submitter

    def submitted(self) -> int:
        """The last ticket the submitter has run (a gate at or below it is open); never blocks."""
        submitter = self._submitter
        return submitter.done() if submitter is not None else 0

    def defer_on(self, streams: Iterable[int], ticket: int) -> None:
        """Ticket ``ticket`` enqueues on ``streams``: :meth:`settle` runs it before another record there."""
        deferred = self._deferred_on
        for handle in streams:
            deferred[handle] = ticket

    def settle(self, stream: int) -> None:
        """Block until the submissions that enqueue on ``stream`` were made (at once if none is pending)."""
        ticket = self._deferred_on.get(stream)
        if ticket is not None and self._submitter is not None and self._submitter.done() < ticket:
            self._submitter.wait(ticket)

    # -- event pool ----------------------------------------------------------------
    def _acquire_event(self) -> int:
        try:
            return self._pool.pop()
        except IndexError:
            return self._events.take()

    def _recycle_event(self, event: int, ok: bool) -> None:
        """On a lane thread: the event completed; pool it (or destroy it if its wait failed)."""
        if ok and not self._closing:
            self._events.give(event)
            return
        try:
            self._backend.event_destroy(event)
        except Exception:  # noqa: BLE001 - a failed context; the handle is gone with it
            _log.debug("event_destroy failed for a retired event", exc_info=True)

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
            self._wait_for_enqueues(None if timeout is None else time.monotonic() + timeout)
            if self._submitter is not None:
                self._submitter.close(timeout)  # the calls submitted so far are made first
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
            lane.join(_lane_join_timeout(lane, join_timeout))  # it stops its own channel on the way out
            if lane.is_running and lane.dead is not None:
                # Failed by the watchdog and still blocked in the driver: never exits by itself.
                channel, lane.channel = lane.channel, None
                if channel is not None:
                    channel.stop(forced=True, join_timeout=join_timeout)
                with self._lock:
                    if lane in self._retiring:
                        self._retiring.discard(lane)
                        self._absorb_lane_stats_locked(lane)
        for lane in lanes:
            lane.join(_lane_join_timeout(lane, join_timeout))
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
        if self._owns_events:
            self._events.close()
        with self._lock:
            if self._holds_guard:
                self._holds_guard = False
                switch_interval_guard.release()
            self._closed = True
        _live_engines.discard(self)

    def _wait_for_enqueues(self, deadline: float | None) -> None:
        """Let every enqueue in progress finish: each holds its lane's lock, and later ones see ``_closing``."""
        for lane in self._all_lanes():
            remaining = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            if not lane.lock.acquire(timeout=remaining):
                raise TimeoutError("an enqueue is still in progress on another thread")
            lane.lock.release()

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
            lanes=sum(1 for lane in lanes if lane.is_running),
            workers=len(workers),
            host_calls=self._host_calls,
            host_calls_pending=sum(w.in_flight for w in [*channels, *slots]),
            host_slots=len(slots),
            pooled_events=len(self._pool),
            events_created=self._events.created,
            switch_interval_lowered=self._holds_guard and switch_interval_guard.is_lowered,
            loop_closed_warned=self._notifier.warned,
            closed=self._closing,
            watchdog_wakeups=0 if self._watchdog is None else self._watchdog.wakeups,
            watchdog_failed_lanes=0 if self._watchdog is None else self._watchdog.failed_lanes,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closing else "open"
        return f"<CompletionEngine {getattr(self._backend, 'name', '?')}:{self._device} {state}>"
