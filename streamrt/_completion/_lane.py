"""Lanes: runtime threads that retire one stream's watched events in order, GIL-free while they wait.

See :mod:`streamrt._completion` for the whole picture; :class:`_Lane` for the
wake-up, polling and failure protocols.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from time import perf_counter_ns as _perf_counter_ns
from typing import TYPE_CHECKING, Any

from .._errors import ClosedError
from .._native import tighten_timer_slack
from ._future import Completion, PostBatch, _get_running_loop, _polling

if TYPE_CHECKING:
    from .._hostcall import HostChannel, HostRequest
    from ._engine import CompletionEngine

__all__ = ["_Entry", "_Lane"]

_log = logging.getLogger("streamrt")

_POLL_GAP_NS = 2_000
# Lazy wake-ups (see _Lane, "Lazy wake-ups"): a push wakes a lane nobody waits on only once this
# many entries are queued; the lane then waits for them until fewer than _BACKLOG_LOW are left.
_BACKLOG_HIGH = 64
_BACKLOG_LOW = 32


class _Entry:
    """One watched event on a lane, and what to do when it completes.

    Lane items. A lane holds objects with ``event`` (the watched event),
    ``pooled`` (the lane gives the event back to the engine's pool when it
    retires), ``unordered`` (see below), ``keepalive``, ``gate`` (0, or the
    ticket of the deferred submission that records the event, see "Order"),
    and ``_retire(error, posts)``: called once, on the retiring thread, when
    the event completed (``error``: waiting for it failed, or the lane failed or
    was given up). ``_Entry`` is the general item; a pipeline's
    :class:`~streamrt._pipeline._run.Run` is its own tail's item.
    """

    __slots__ = ("callback", "channel", "completion", "event", "gate", "keepalive", "pooled", "request", "unordered")

    def __init__(
        self,
        event: int,
        callback: Callable[[BaseException | None], None] | None,
        completion: Completion | None,
        keepalive: object,
        pooled: bool,
        request: HostRequest | None = None,
        channel: HostChannel | None = None,
        unordered: bool = False,
    ) -> None:
        self.event = event
        self.callback = callback
        self.completion = completion
        self.keepalive = keepalive
        self.pooled = pooled
        self.request = request  # a host call this event guards: resolved from its stored outcome
        self.channel = channel
        # Its event may complete out of queue order: a user's event (re-recorded, maybe on
        # another stream, while watched), or one pushed by a nested push (see _Lane, "Order").
        # Its state then says nothing about the entries before it: it is queried itself.
        self.unordered = unordered
        self.gate = 0  # a submission ticket: the event is recorded once the submitter has run it (see "Order")

    def _retire(self, error: BaseException | None, posts: PostBatch | None) -> None:
        self.keepalive = None  # dropped here, on the retiring thread, after the event
        callback = self.callback
        if callback is not None:
            self.callback = None
            try:
                callback(error)
            except Exception:  # noqa: BLE001 - never let a callback kill the lane
                _log.exception("exception in completion-engine callback %r", callback)
        completion = self.completion
        if completion is not None:
            self.completion = None
            completion._resolve(None, error, posts)
        request = self.request
        if request is not None:
            self.request = None
            self.channel.retire(request, error, posts)  # type: ignore[union-attr]


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

    Lazy wake-ups. A lane with a watchdog (its backstop) is *lazy*: a push
    wakes it only when someone waits for the lane's work (a
    :meth:`Completion.wait`, an ``await`` past its polling, a done callback,
    a drain: each is a *holder* in :attr:`holders` while it waits) or once
    ``_BACKLOG_HIGH`` entries are queued. With no holder and a short queue
    the lane thread retires what is already complete (one query) and sleeps
    again instead of waiting in the driver: work nobody waits for costs the
    GIL no wake-ups, and is retired by the next waiter, a
    :attr:`Completion.is_done` that polls, the backlog, or the watchdog's
    next check (its interval bounds how long keepalives outlive their work).

    Order. :attr:`lock` is the stream's enqueue lock (``Stream`` holds it for
    every enqueue, and so does the engine): an event is recorded and its entry
    pushed under it, so entries sit in the order their events were recorded,
    which lets one query of the newest event retire a whole batch. A push
    nested inside another one on the same thread (a garbage-collector
    finalizer that releases a buffer) comes between a record and its push:
    each record-and-push section counts itself in :attr:`_depth` (under the
    lock), and one that finds another open marks its entry ``unordered``.
    A deferred launch pushes entries whose events the submission thread
    records later, in push order (``gate``: their ticket); they are neither
    waited for nor queried before the submitter has run that ticket, and the
    engine runs a stream's pending submissions before recording on it itself.
    The thread starts with the first push.
    """

    def __init__(self, engine: CompletionEngine, key: int) -> None:
        self._engine = engine
        self.key = key
        self.lock = threading.RLock()  # the stream's enqueue lock (see "Order" above)
        self._depth = 0  # record-and-push sections entered on the thread holding `lock`
        self._started = False
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
        self.lazy = engine._watchdog_interval is not None  # see "Lazy wake-ups"
        self.holders: set[object] = set()  # waiters that keep the lane waiting in the driver
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
        if not self._started:
            self._start()
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
            if self.lazy and not self.holders and not self._drainers and len(self._queue) < _BACKLOG_HIGH:
                # Nobody waits: the watchdog's next check retires it at the latest. Its kick()
                # inline (every launch's path; the watchdog reads `idle` under its condition).
                watchdog = self._engine._watchdog
                if watchdog is not None and watchdog.idle:
                    with watchdog._cond:
                        watchdog.idle = False
                        watchdog._cond.notify()
                return
            loop = _get_running_loop()
            if loop is None:
                self._sleeping = False  # as _signal(), inline: this is every launch's path
                try:
                    self._wake.release()
                except RuntimeError:  # already released by another producer
                    pass
            elif not self._wake_scheduled:
                # Pushed on an event loop's thread: the work is likely awaited next, and the
                # awaiting task polls and retires it there. Wake the lane thread on the loop's next
                # iteration only if no await took the lane by then (waking it now would have
                # it contend for the GIL with the polling loop). A loop that stops before
                # that iteration leaves the wake to Completion.wait, drain and the watchdog.
                self._wake_scheduled = True
                loop.call_soon(self._wake_unless_polled)
                self._kick_watchdog()  # it wakes the lane should the loop stop before that iteration

    def _kick_watchdog(self) -> None:
        """Have the watchdog check on this lane's work (it sleeps without wake-ups while none is queued)."""
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
            outer = getattr(_polling, "engine", None)
            _polling.engine = self._engine  # callbacks run here count as the engine's (owns_thread)
            try:
                self._retire_ready()
            finally:
                _polling.engine = outer
        finally:
            self._retire_lock.release()

    def _retire_ready(self) -> None:
        """Retire the queued entries that are complete, without waiting (``_retire_lock`` held)."""
        queue = self._queue
        batch: list[_Entry] = []
        with self._take:
            if self.dead is not None or not queue or queue[0] is self._waiting:
                return
            self._take_done(queue, self._engine._backend.event_query, batch, polled=True)
        if batch:
            self._retire(batch, None)

    def hold(self, key: object) -> None:
        """``key`` waits for this lane's work: keep the thread waiting in the driver until :meth:`release`. Any thread."""
        self.holders.add(key)
        self.nudge()

    def release(self, key: object) -> None:
        """``key`` no longer waits (a no-op if it did not hold the lane). Any thread."""
        self.holders.discard(key)

    def _idle_for_now(self) -> bool:
        """Lazy and nobody waits for what is queued: the thread need not wait in the driver."""
        return self.lazy and not self.holders and not self._drainers and not self._stopping and len(self._queue) < _BACKLOG_LOW

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

    def _start(self) -> None:
        engine = self._engine
        with engine._lock:
            if self._started:
                return
            engine._check_open()
            engine._start_watchdog_locked()
            engine._register_thread(self.thread)
            self.thread.start()
            self._started = True

    @property
    def started(self) -> bool:
        """The lane's thread was started (by the first push)."""
        return self._started

    def join(self, timeout: float | None) -> None:
        """Join the lane's thread once :meth:`stop` was called (nothing to join if it never started)."""
        if self._started:
            self.thread.join(timeout)

    @property
    def is_running(self) -> bool:
        return self._started and self.thread.is_alive()

    def stop(self) -> None:
        with self._engine._lock:
            self._stopping = True
            started = self._started
        if started:
            self._signal()
        else:  # never started: nothing to retire, nothing to join
            self._exited = True
            self._engine._lane_exited(self)

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
            if self._idle_for_now():  # nobody waits: retire what is done, then sleep (see "Lazy wake-ups")
                with retire_lock:
                    self._retire_ready()
                self._sleeping = True
                if queue and self._idle_for_now() and self.dead is None:
                    wake.acquire()  # a holder, the backlog, stop or the watchdog's nudge
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
                self._kick_watchdog()  # from here, not from every push: off the launching thread's path
                try:
                    if head.gate:
                        engine.submitter().wait(head.gate)  # its event is recorded by then (GIL released)
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

    def _take_done(
        self, queue: collections.deque[_Entry], query: Callable[[int], bool], batch: list[_Entry], *, polled: bool = False
    ) -> None:
        """Move the queued entries whose events are complete to ``batch`` (the retiring thread, ``_take`` held).

        Every event of a lane was recorded on the lane's stream in queue order
        (see "Order"), so one that is complete means every event watched before
        it is: the newest is queried first, and when it is done (the usual
        case after a wait under load) the whole queue is taken with that one
        query, but for ``unordered`` entries, queried each. Otherwise (or when
        the newest is unordered) they are queried from the oldest, up to the
        first not done. ``polled``: a poll, which most often finds nothing new
        done: the oldest is queried first, so that takes one query.
        A query that raises stops the batch (the next blocking wait reports
        the error).
        """
        done = self._engine.submitted()  # gated entries past it are not recorded yet: not done
        if polled:
            try:
                if queue[0].gate > done or not query(queue[0].event):
                    return
            except BaseException:  # noqa: BLE001 - the blocking wait reports it next
                return
            self._busy += 1
            batch.append(queue.popleft())
            if not queue:
                return
        n = len(queue)  # producers only append: the first n entries stay put
        newest = queue[n - 1]
        if not newest.unordered:
            try:
                newest_done = newest.gate <= done and query(newest.event)
            except BaseException:  # noqa: BLE001 - the blocking wait reports it next
                return
            if newest_done:
                for _ in range(n):
                    entry = queue[0]
                    if (entry.unordered or entry.gate) and entry is not newest:
                        try:
                            if entry.gate > done or not query(entry.event):
                                return
                        except BaseException:  # noqa: BLE001 - the blocking wait reports it next
                            return
                    self._busy += 1
                    batch.append(queue.popleft())
                return
            n -= 1  # the newest is not done
        for _ in range(n):
            nxt = queue[0]
            try:
                if nxt.gate > done or not query(nxt.event):
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
            if entry.pooled:
                engine._recycle_event(entry.event, err is None)
            try:
                entry._retire(err, posts)
            except Exception:  # noqa: BLE001 - never let one item kill the lane
                _log.exception("exception while retiring %r", entry)
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

