"""An asyncio-aware stream scheduler: placement, priorities, backpressure and fairness.

``sched = rt.scheduler(streams=4)`` owns up to ``streams`` streams per
priority level, created on first use with ``rt.create_stream(priority)``.

* ``async with sched.stream(priority=0) as s:`` leases a stream: while the
  block runs, no other lease and no :meth:`Scheduler.submit` uses ``s`` (so a
  capture or a multi-step sequence on it is never interleaved with other
  work). On exit the stream is handed back at once; the lease still counts as
  in flight until the work enqueued in the block has completed.
* ``c = await sched.submit(work)`` waits for room, then enqueues ``work`` on
  the least-loaded free stream of its priority and returns *without waiting
  for the work*: ``await c`` for that. ``work`` is a pipeline or graph (an
  object with ``.launch(stream)``) or a callable ``work(stream)`` that
  enqueues onto ``stream``. What is returned: the ``Run`` / Completion the
  work returned; for ``None``, a Completion of the stream passing the work;
  for another awaitable, an ``asyncio.Future`` of it; for any other value, a
  Completion that resolves with that value once the stream passed the work.

Priorities follow HIP/CUDA, as in ``rt.create_stream``: numerically lower runs
first, clamped into the device's range. They choose the stream priority and
the admission order: waiting callers are admitted lowest priority number
first; within one priority, round-robin over the asyncio tasks that are
waiting, and first come, first served within one task.

Backpressure. ``max_in_flight`` bounds submitted-or-leased work not yet
completed (count), ``max_pinned_bytes`` the sum of the ``pinned_bytes`` the
callers declare (staging buffers their work keeps alive). A caller over a
bound *waits* (asyncio; the loop is never blocked) instead of failing.
Admission is strictly in that order (no overtaking, so a large request is
never starved by small ones), and fair between tasks. The unit of fairness is
the calling task, or the ``group`` a caller names: a producer that fans out a
hundred concurrent ``submit`` calls (each in its own task, as
``asyncio.gather`` does) can pass one ``group`` so that together they get one
admission per round, like a task with one request. A single request larger than ``max_pinned_bytes`` can never fit and
raises ``ValueError``.

Cancellation. Cancelling a task waiting for admission withdraws its request;
cancelling after admission changes nothing for the work already enqueued.

Deadlock rule: a task holding leases on every stream of a priority must not
``submit`` to that priority of the same scheduler (it would wait for itself).

Thread rules: one scheduler may be used from several event loops and threads;
admission wake-ups go through ``loop.call_soon_threadsafe``; completions
release their slot on the runtime's completion lanes.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._backends.protocol import priority_clamp
from ._completion import Completion
from ._errors import ClosedError
from ._extensions import provide

if TYPE_CHECKING:
    from ._runtime import Runtime
    from ._stream import Stream

__all__ = ["Scheduler", "SchedulerStatistics"]

DEFAULT_MAX_IN_FLIGHT = 64


@dataclass(frozen=True)
class SchedulerStatistics:
    """A snapshot of one scheduler.

    Attributes:
        streams: streams created so far (all priorities).
        in_flight: submitted or leased work not yet completed.
        pinned_bytes_in_flight: sum of the declared ``pinned_bytes`` of that work.
        waiting: callers waiting for admission.
        leased: streams currently leased.
        submitted: work admitted since creation (submits and leases).
        completed: of those, completed (with or without an error).
        failed: of those, completed with an error.
        peak_in_flight: the most in flight at once.
        max_in_flight, max_pinned_bytes: the bounds (``None``: unbounded).
        per_stream_in_flight: ``(priority, in_flight)`` per stream, in creation order.
        closed: the scheduler is closed.
    """

    streams: int
    in_flight: int
    pinned_bytes_in_flight: int
    waiting: int
    leased: int
    submitted: int
    completed: int
    failed: int
    peak_in_flight: int
    max_in_flight: int | None
    max_pinned_bytes: int | None
    per_stream_in_flight: tuple[tuple[int, int], ...]
    closed: bool


class _Slot:
    """One scheduler stream and its load."""

    __slots__ = ("last_used", "leased", "load", "priority", "stream")

    def __init__(self, stream: Stream, priority: int) -> None:
        self.stream = stream
        self.priority = priority
        self.load = 0
        self.leased = False
        self.last_used = 0


class _Grant:
    """Admitted room for one piece of work: its stream, declared bytes, and whether it leases."""

    __slots__ = ("lease", "pinned", "released", "slot")

    def __init__(self, slot: _Slot, pinned: int, lease: bool) -> None:
        self.slot = slot
        self.pinned = pinned
        self.lease = lease
        self.released = False


class _Waiter:
    __slots__ = ("future", "lease", "loop", "owner", "pinned", "priority")

    def __init__(
        self,
        priority: int,
        owner: object,
        pinned: int,
        lease: bool,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[_Grant],
    ) -> None:
        self.priority = priority
        self.owner = owner  # the asyncio task that asked: the unit of fairness
        self.pinned = pinned
        self.lease = lease
        self.loop = loop
        self.future = future


class _WaitQueue:
    """Waiting requests: by priority (numerically lowest first), then round-robin over the
    tasks that asked, then first come, first served within one task."""

    def __init__(self) -> None:
        self._levels: dict[int, dict[object, collections.deque[_Waiter]]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def push(self, w: _Waiter) -> None:
        level = self._levels.setdefault(w.priority, {})
        q = level.get(w.owner)
        if q is None:
            q = level[w.owner] = collections.deque()  # a new task joins the end of the round
        q.append(w)
        self._count += 1

    def head(self) -> _Waiter | None:
        if not self._levels:
            return None
        level = self._levels[min(self._levels)]
        return next(iter(level.values()))[0]

    def pop_head(self) -> _Waiter:
        prio = min(self._levels)
        level = self._levels[prio]
        owner = next(iter(level))
        q = level.pop(owner)
        w = q.popleft()
        if q:
            level[owner] = q  # its next request goes to the end of the round
        if not level:
            del self._levels[prio]
        self._count -= 1
        return w

    def remove(self, w: _Waiter) -> bool:
        level = self._levels.get(w.priority)
        q = None if level is None else level.get(w.owner)
        if q is None or w not in q:
            return False
        q.remove(w)
        self._count -= 1
        if not q:
            del level[w.owner]  # type: ignore[union-attr]
            if not level:
                del self._levels[w.priority]
        return True

    def drain(self) -> list[_Waiter]:
        out = [w for level in self._levels.values() for q in level.values() for w in q]
        self._levels.clear()
        self._count = 0
        return out


def _deliver(future: asyncio.Future[_Grant], grant: _Grant, scheduler: Scheduler) -> None:
    """On the waiter's loop: hand over the grant, or give it back if the waiter was cancelled."""
    if future.cancelled():
        scheduler._release(grant, failed=False, counted=False)
    elif not future.done():
        future.set_result(grant)


def _fail_waiter(future: asyncio.Future[_Grant], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class Scheduler:
    """Places asyncio work on a small set of streams with priorities and bounded in-flight work.

    Create with ``rt.scheduler(...)``; see the module docstring for the behaviour.

    Args:
        runtime: the runtime whose streams it creates.
        streams: streams per priority level (created lazily), at least 1.
        max_in_flight: bound on work in flight (count); ``None`` for no bound.
        max_pinned_bytes: bound on declared pinned bytes in flight; ``None`` for no bound.
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        streams: int = 4,
        max_in_flight: int | None = DEFAULT_MAX_IN_FLIGHT,
        max_pinned_bytes: int | None = None,
    ) -> None:
        if isinstance(streams, bool) or not isinstance(streams, int) or streams < 1:
            raise ValueError(f"streams must be an int >= 1, got {streams!r}")
        if max_in_flight is not None and (
            isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1
        ):
            raise ValueError(f"max_in_flight must be an int >= 1 or None, got {max_in_flight!r}")
        if max_pinned_bytes is not None and (
            isinstance(max_pinned_bytes, bool) or not isinstance(max_pinned_bytes, int) or max_pinned_bytes < 0
        ):
            raise ValueError(f"max_pinned_bytes must be an int >= 0 or None, got {max_pinned_bytes!r}")
        self._runtime = runtime
        self._per_priority = streams
        self._max_in_flight = max_in_flight
        self._max_pinned = max_pinned_bytes
        self._lock = threading.Lock()
        self._levels: dict[int, list[_Slot]] = {}
        self._slots: list[_Slot] = []
        self._waiters = _WaitQueue()
        self._use = itertools.count(1)
        self._in_flight = 0
        self._pinned = 0
        self._submitted = 0
        self._completed = 0
        self._failed = 0
        self._peak = 0
        self._closed = False

    # -- public --------------------------------------------------------------------------
    @property
    def runtime(self) -> Runtime:
        return self._runtime

    @property
    def streams(self) -> tuple[Stream, ...]:
        """The streams created so far, in creation order."""
        with self._lock:
            return tuple(s.stream for s in self._slots)

    @property
    def is_closed(self) -> bool:
        return self._closed

    def stream(self, priority: int = 0, *, pinned_bytes: int = 0, group: object = None) -> _Lease:
        """``async with sched.stream(priority) as s:`` leases a stream exclusively for the block.

        ``pinned_bytes`` and ``group`` are as for :meth:`submit`.
        """
        return _Lease(self, self._priority(priority), self._check_bytes(pinned_bytes), group)

    async def submit(self, work: Any, *, priority: int = 0, pinned_bytes: int = 0, group: object = None) -> Any:
        """Wait for room, enqueue ``work`` on the least-loaded free stream, return its awaitable.

        Returns once the work is *enqueued*; see the module docstring for what
        is returned. ``pinned_bytes`` declares the pinned memory the work
        keeps alive until it completes (counted against ``max_pinned_bytes``).
        ``group`` (any hashable; default: the calling task) is the unit of
        fairness among waiting callers. If ``work`` raises while enqueueing,
        the exception propagates and the room is held only until what it did
        enqueue has completed.
        """
        launch = _launcher(work)
        grant = await self._admit(self._priority(priority), self._check_bytes(pinned_bytes), lease=False, group=group)
        stream = grant.slot.stream
        try:
            result = launch(stream)
        except BaseException:
            self._track_tail(grant, stream)  # whatever it enqueued before failing still holds the room
            raise
        return self._track(grant, stream, result)

    def statistics(self) -> SchedulerStatistics:
        with self._lock:
            return SchedulerStatistics(
                streams=len(self._slots),
                in_flight=self._in_flight,
                pinned_bytes_in_flight=self._pinned,
                waiting=len(self._waiters),
                leased=sum(1 for s in self._slots if s.leased),
                submitted=self._submitted,
                completed=self._completed,
                failed=self._failed,
                peak_in_flight=self._peak,
                max_in_flight=self._max_in_flight,
                max_pinned_bytes=self._max_pinned,
                per_stream_in_flight=tuple((s.priority, s.load) for s in self._slots),
                closed=self._closed,
            )

    def close(self) -> None:
        """Refuse new work, fail waiting callers with ``ClosedError``, close the streams. Idempotent.

        Non-blocking: work already enqueued still runs (and its Completions
        resolve); the streams are destroyed once it has completed.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waiters = self._waiters.drain()
            slots = list(self._slots)
        exc = ClosedError("the scheduler was closed while this caller waited for room")
        for w in waiters:
            _call_in_loop(w.loop, _fail_waiter, w.future, exc)
        for s in slots:
            s.stream.close()

    def __enter__(self) -> Scheduler:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Scheduler:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        st = self.statistics()
        return f"<Scheduler streams={st.streams} in_flight={st.in_flight} waiting={st.waiting}{' closed' if st.closed else ''}>"

    # -- admission ------------------------------------------------------------------------------
    def _priority(self, priority: int) -> int:
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an int, got {type(priority).__name__}")
        return priority_clamp(priority, self._runtime.capabilities.priority_range)

    def _check_bytes(self, pinned_bytes: int) -> int:
        if isinstance(pinned_bytes, bool) or not isinstance(pinned_bytes, int) or pinned_bytes < 0:
            raise ValueError(f"pinned_bytes must be an int >= 0, got {pinned_bytes!r}")
        if self._max_pinned is not None and pinned_bytes > self._max_pinned:
            raise ValueError(
                f"pinned_bytes={pinned_bytes} can never fit under max_pinned_bytes={self._max_pinned}; "
                "raise the bound or split the work"
            )
        return pinned_bytes

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the scheduler is closed")

    async def _admit(self, priority: int, pinned: int, *, lease: bool, group: object = None) -> _Grant:
        loop = asyncio.get_running_loop()
        with self._lock:
            self._check_open()
            if not self._waiters:
                grant = self._try_grant(priority, pinned, lease)
                if grant is not None:
                    return grant
            future: asyncio.Future[_Grant] = loop.create_future()
            owner = group if group is not None else (asyncio.current_task() or threading.current_thread())
            waiter = _Waiter(priority, owner, pinned, lease, loop, future)
            self._waiters.push(waiter)
        try:
            return await future
        except BaseException:
            with self._lock:
                if self._waiters.remove(waiter):
                    grants = self._admit_waiting()  # it may have been blocking the head
                else:
                    grants = []
            if future.done() and not future.cancelled() and future.exception() is None:
                self._release(future.result(), failed=False, counted=False)
            self._post(grants)
            raise

    def _try_grant(self, priority: int, pinned: int, lease: bool) -> _Grant | None:
        """Room and a free stream for one request, reserved; ``None`` if none now. Lock held."""
        if self._max_in_flight is not None and self._in_flight >= self._max_in_flight:
            return None
        if self._max_pinned is not None and self._pinned + pinned > self._max_pinned:
            return None
        slot = self._pick(priority)
        if slot is None:
            return None
        slot.load += 1
        slot.last_used = next(self._use)
        if lease:
            slot.leased = True
        self._in_flight += 1
        self._pinned += pinned
        self._submitted += 1
        self._peak = max(self._peak, self._in_flight)
        return _Grant(slot, pinned, lease)

    def _pick(self, priority: int) -> _Slot | None:
        """The least-loaded unleased stream of ``priority`` (creating one while fewer exist). Lock held."""
        level = self._levels.setdefault(priority, [])
        free = [s for s in level if not s.leased]
        idle = [s for s in free if s.load == 0]
        if not idle and len(level) < self._per_priority:
            stream = self._runtime.create_stream(priority=priority, name=f"sched-p{priority}-{len(level)}")
            slot = _Slot(stream, priority)
            level.append(slot)
            self._slots.append(slot)
            return slot
        if not free:
            return None
        return min(free, key=lambda s: (s.load, s.last_used))

    def _admit_waiting(self) -> list[tuple[_Waiter, _Grant]]:
        """Admit waiters from the head, in order, while they fit. Lock held."""
        grants = []
        while True:
            head = self._waiters.head()
            if head is None:
                break
            if head.future.cancelled():
                self._waiters.pop_head()
                continue
            grant = self._try_grant(head.priority, head.pinned, head.lease)
            if grant is None:
                break
            grants.append((self._waiters.pop_head(), grant))
        return grants

    def _post(self, grants: list[tuple[_Waiter, _Grant]]) -> None:
        for waiter, grant in grants:
            if not _call_in_loop(waiter.loop, _deliver, waiter.future, grant, self):
                self._release(grant, failed=False, counted=False)  # its loop is gone

    def _release(self, grant: _Grant, *, failed: bool, counted: bool = True) -> None:
        """Give back ``grant``'s room (its work completed, or it was never used)."""
        with self._lock:
            if grant.released:
                return
            grant.released = True
            slot = grant.slot
            slot.load -= 1
            if grant.lease:
                slot.leased = False
                grant.lease = False
            self._in_flight -= 1
            self._pinned -= grant.pinned
            if counted:
                self._completed += 1
                if failed:
                    self._failed += 1
            else:
                self._submitted -= 1
            grants = [] if self._closed else self._admit_waiting()
        self._post(grants)

    def _unlease(self, grant: _Grant) -> None:
        """The lease block ended: the stream is free again; the room is held until its work completes."""
        with self._lock:
            if grant.lease:
                grant.slot.leased = False
                grant.lease = False
            grants = [] if self._closed else self._admit_waiting()
        self._post(grants)

    # -- tracking -------------------------------------------------------------------------------------
    def _track_tail(self, grant: _Grant, stream: Stream) -> Completion:
        tail = stream.wait_idle()
        tail.add_done_callback(lambda c: self._release(grant, failed=c._exc is not None))
        return tail

    def _track(self, grant: _Grant, stream: Stream, result: Any) -> Any:
        if isinstance(result, Completion):
            result.add_done_callback(lambda c: self._release(grant, failed=c._exc is not None))
            return result
        if result is None:
            return self._track_tail(grant, stream)
        if inspect.isawaitable(result):
            future = asyncio.ensure_future(result)
            future.add_done_callback(lambda f: self._release(grant, failed=f.cancelled() or f.exception() is not None))
            return future
        value = result
        out = Completion()
        tail = self._track_tail(grant, stream)
        out._notifier = tail._notifier

        def resolve(c: Completion) -> None:
            out._resolve(value if c._exc is None else None, c._exc, None)

        tail.add_done_callback(resolve)
        return out


class _Lease:
    """The async context manager of :meth:`Scheduler.stream`."""

    __slots__ = ("_grant", "_group", "_pinned", "_priority", "_sched")

    def __init__(self, sched: Scheduler, priority: int, pinned: int, group: object) -> None:
        self._sched = sched
        self._priority = priority
        self._pinned = pinned
        self._group = group
        self._grant: _Grant | None = None

    async def __aenter__(self) -> Stream:
        if self._grant is not None:
            raise RuntimeError("this lease is already held; call sched.stream() again for another")
        self._grant = await self._sched._admit(self._priority, self._pinned, lease=True, group=self._group)
        return self._grant.slot.stream

    async def __aexit__(self, *exc: object) -> None:
        grant, self._grant = self._grant, None
        if grant is None:
            return
        stream = grant.slot.stream
        self._sched._unlease(grant)  # free for others now: later work simply queues behind the block's
        try:
            self._sched._track_tail(grant, stream)
        except ClosedError:
            self._sched._release(grant, failed=True)


def _launcher(work: Any) -> Callable[[Stream], Any]:
    launch = getattr(work, "launch", None)
    if callable(launch):
        return launch  # type: ignore[no-any-return]
    if callable(work):
        return work  # type: ignore[no-any-return]
    raise TypeError(
        f"submit needs a pipeline/graph (an object with .launch(stream)) or a callable(stream), not {type(work).__name__}"
    )


def _call_in_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> bool:
    """Run ``fn(*args)`` on ``loop``'s thread soon; ``False`` if the loop is closed."""
    try:
        if asyncio._get_running_loop() is loop:
            loop.call_soon(fn, *args)
        else:
            loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        if loop.is_closed():
            return False
        raise
    return True


provide("scheduler", Scheduler)  # Runtime.scheduler
