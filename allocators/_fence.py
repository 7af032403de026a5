"""Fences: the point a released block waits for before it may be handed out again.

A block released after work on streams used it gets a :class:`Fence`: one
event recorded on each of those streams at the moment of release (from an
the runtime's event pool, ``runtime.event_pool``). The fence is *queried
lazily* -- by the allocator, when it looks for a block of that size class --
and never waited on by a runtime thread, so releasing costs one
``event_record`` per stream and nothing else: no thread hop, no callback.

Three situations cannot record an event at release, and the fence covers them:

* a stream that is **capturing** a graph: an event recorded there would become
  a graph node, not a point in time. The stream is kept and its event
  recorded once the capture has ended (the work enqueued before the capture
  is then covered; what was captured runs only when the graph is launched,
  and the graph's memory is the capture pool's business);
* a stream that was **closed** (destroyed) since the buffer used it: the
  fence then waits for a whole-device synchronize run on the releaser thread
  (``streamrt.release_after_device``: after streamrt's captures in progress);
* an ``event_record`` that **fails**: treated like a closed stream.

Thread rules: a fence is built by the releasing thread and then only touched
under its allocator's lock (``poll``) or by a thread that took it out of the
allocator's tables (``wait``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import streamrt as srt

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["Fence"]


class Fence:
    """The release point of one block: all listed streams must pass it.

    Build with :meth:`record`. ``poll`` is non-blocking, ``wait`` blocks.
    """

    __slots__ = ("_events", "_deferred", "_device_sync")

    def __init__(self) -> None:
        self._events: list[int] = []
        self._deferred: list[srt.Stream] = []
        self._device_sync: threading.Event | None = None

    @classmethod
    def record(cls, runtime: srt.Runtime, events: srt.EventPool, streams: Iterable[srt.Stream], *, check_capture: bool = True) -> Fence:
        """Record the release point on every stream in ``streams`` (see the module docstring)."""
        fence = cls()
        backend = runtime.backend
        for stream in streams:
            if stream.is_closed:
                fence._need_device_sync(runtime)
                continue
            stream.settle()  # after what a deferred launch queued for it
            handle = stream.handle
            if check_capture and backend.stream_is_capturing(handle):
                fence._deferred.append(stream)
                continue
            event = events.take()
            try:
                backend.event_record(event, handle)
            except srt.StreamRTError:
                events.give(event)
                fence._need_device_sync(runtime)
                continue
            fence._events.append(event)
        return fence

    @classmethod
    def device_wide(cls, runtime: srt.Runtime) -> Fence:
        """A fence passed once all work on the device has completed (a synchronize on the releaser thread)."""
        fence = cls()
        fence._need_device_sync(runtime)
        return fence

    def _need_device_sync(self, runtime: srt.Runtime) -> None:
        if self._device_sync is None:
            done = threading.Event()
            self._device_sync = done
            srt.release_after_device(runtime, done.set)  # after streamrt's captures in progress

    @property
    def is_empty(self) -> bool:
        """Nothing to wait for (every stream was already accounted as passed)."""
        return not self._events and not self._deferred and self._device_sync is None

    @property
    def is_capture_deferred(self) -> bool:
        """Some stream was capturing at release and has not been recorded yet."""
        return bool(self._deferred)

    @property
    def waits_for_device(self) -> bool:
        """The fence waits for a whole-device synchronize (a closed stream, a failed record)."""
        return self._device_sync is not None

    @property
    def events(self) -> tuple[int, ...]:
        """The recorded events still to be seen complete."""
        return tuple(self._events)

    def add_event(self, event: int) -> None:
        """Also wait for ``event`` (a pooled event, already recorded)."""
        self._events.append(event)

    def _record_deferred(self, runtime: srt.Runtime, events: srt.EventPool) -> None:
        backend = runtime.backend
        still: list[srt.Stream] = []
        for stream in self._deferred:
            if stream.is_closed:
                self._need_device_sync(runtime)
            elif backend.stream_is_capturing(stream.handle):
                still.append(stream)
            else:
                event = events.take()
                try:
                    backend.event_record(event, stream.handle)
                except srt.StreamRTError:
                    events.give(event)
                    self._need_device_sync(runtime)
                else:
                    self._events.append(event)
        self._deferred = still

    def poll(self, runtime: srt.Runtime, events: srt.EventPool) -> bool:
        """``True`` once every stream has passed; completed events go back to ``events``. Non-blocking.

        Must not be called while a graph capture may be underway (``event_query``
        is illegal then); the allocator checks that first.
        """
        if self._deferred:
            self._record_deferred(runtime, events)
        sync = self._device_sync
        if sync is not None:
            if not sync.is_set():
                return False
            self._device_sync = None
        pending = self._events
        query = runtime.backend.event_query
        while pending:
            event = pending[-1]
            if not query(event):
                return False
            pending.pop()
            events.give(event)
        return not self._deferred

    def wait(self, runtime: srt.Runtime, events: srt.EventPool) -> bool:
        """Block until every stream has passed; ``False`` if a stream is still capturing (cannot wait).

        Releases the GIL while blocked (the backend's ``event_synchronize``).
        """
        if self._deferred:
            self._record_deferred(runtime, events)
        sync = self._device_sync
        if sync is not None:
            sync.wait()
            self._device_sync = None
        pending = self._events
        backend = runtime.backend
        while pending:
            event = pending[-1]
            if not runtime.is_closed:
                backend.event_synchronize(event)
            pending.pop()
            events.give(event)
        return not self._deferred

    def discard(self, events: srt.EventPool) -> None:
        """Give the events back without waiting (the runtime is closed or the work is known done)."""
        while self._events:
            events.give(self._events.pop())
        self._deferred = []
        self._device_sync = None
