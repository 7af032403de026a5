"""Per-runtime pools of side streams, and ordering events, used by pipeline fork launches and captures.

A stream is *checked out* while one launch or capture enqueues on it, so two
threads never interleave their branches on the same side stream and a stream
taking part in a capture is never handed to eager work meanwhile. Once the
enqueue is over it goes back to the pool: later work on it simply queues
behind what is there.

Events handed out are plain non-timing events used only to order streams, taken
from the runtime's one event pool (``rt.event_pool``, shared with the completion
engine and the allocators' fences) and given back to it. HIP and CUDA bind a ``stream_wait_event`` to the event's most recent record at
the time of the call, so an event can be returned to the pool as soon as every
wait on it has been enqueued, even while the work is in flight.

The pool of a runtime is created on first use (:func:`pool_for`) and closed
with the runtime's streams and events by ``Runtime.close``.

Thread rules: every method may be called from any thread.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

from ._errors import ClosedError

from ._event import Event

if TYPE_CHECKING:
    from ._runtime import Runtime
    from ._stream import Stream

__all__ = ["StreamPool", "pool_for"]

_pools: weakref.WeakKeyDictionary[Runtime, StreamPool] = weakref.WeakKeyDictionary()
_pools_lock = threading.Lock()


class StreamPool:
    """Side streams (per priority) and ordering events of one runtime."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._events = runtime._event_pool
        self._lock = threading.Lock()
        self._streams: dict[int, list[Stream]] = {}
        self._created_streams = 0

    @property
    def created_streams(self) -> int:
        """Side streams created so far (the pool grows to the widest fork seen)."""
        return self._created_streams

    def acquire_streams(self, count: int, priority: int = 0) -> list[Stream]:
        """Check out ``count`` side streams of ``priority``, creating any that are missing."""
        out: list[Stream] = []
        with self._lock:
            free = self._streams.setdefault(priority, [])
            while free and len(out) < count:
                s = free.pop()
                if not s.is_closed:
                    out.append(s)
        while len(out) < count:
            self._check_open()
            out.append(self._runtime.create_stream(priority, name=f"streamrt-side-{self._created_streams}"))
            self._created_streams += 1
        return out

    def release_streams(self, streams: list[Stream], priority: int = 0) -> None:
        """Return checked-out streams."""
        with self._lock:
            self._streams.setdefault(priority, []).extend(s for s in streams if not s.is_closed)

    def acquire_event(self) -> Event:
        """Check out an ordering event (non-timing; not one of the runtime's user events)."""
        self._check_open()
        return Event(self._runtime, self._events.take(), False)

    def reserve_events(self, count: int) -> None:
        """Make sure ``count`` idle events exist, creating the missing ones now (e.g. before a capture)."""
        self._check_open()
        self._events.reserve(count)

    def release_event(self, event: Event) -> None:
        """Return an event once every wait on its latest record has been enqueued."""
        event._closed = True  # the handle is the pool's again
        self._events.give(event._handle)

    def _check_open(self) -> None:
        if self._runtime.is_closed:
            raise ClosedError("runtime is closed")


def pool_for(runtime: Runtime) -> StreamPool:
    """The stream pool of ``runtime`` (created on first use)."""
    pool = _pools.get(runtime)
    if pool is None:
        with _pools_lock:
            pool = _pools.get(runtime)
            if pool is None:
                pool = _pools[runtime] = StreamPool(runtime)
    return pool
