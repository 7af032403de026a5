"""Stream and event calls of the hip backend."""

from __future__ import annotations

import operator

from ..protocol import priority_clamp
from ._codes import _NOT_READY, _check, _error
from ._core import HipCore

__all__ = ["StreamCalls"]

# hipStreamNonBlocking, hipEventBlockingSync, hipEventDisableTiming.
_STREAM_NON_BLOCKING = 0x1
_EVENT_BLOCKING_SYNC = 0x1
_EVENT_DISABLE_TIMING = 0x2


class StreamCalls(HipCore):
    """stream_create / stream_destroy / stream_synchronize / stream_query / stream_wait_event / event_*."""

    # -- streams -----------------------------------------------------------------------------
    def stream_create(self, priority: int = 0) -> int:
        """A non-blocking stream on the current device; ``priority`` is clamped into the device's range."""
        priority = operator.index(priority)
        prio = priority_clamp(priority, self.capabilities(self._current_device()).priority_range)
        err, stream = self._hipStreamCreateWithPriority(_STREAM_NON_BLOCKING, prio)
        _check(err, "hipStreamCreateWithPriority")
        return self._keep(self._streams, stream)

    def stream_destroy(self, stream: int) -> None:
        _check(self._hipStreamDestroy(self._stream(stream))[0], "hipStreamDestroy")
        if stream:
            self._streams.pop(stream, None)

    def stream_synchronize(self, stream: int) -> None:
        """Wait (GIL released) until all work on ``stream`` has completed."""
        _check(self._hipStreamSynchronize(self._stream(stream))[0], "hipStreamSynchronize")

    def stream_query(self, stream: int) -> bool:
        """``True`` when all work on ``stream`` has completed (``hipErrorNotReady`` -> ``False``)."""
        err = self._hipStreamQuery(self._stream(stream))[0]
        if not err:
            return True
        if err == _NOT_READY:
            return False
        raise _error(err, "hipStreamQuery")

    def stream_wait_event(self, stream: int, event: int) -> None:
        err = self._hipStreamWaitEvent(self._stream(stream), self._event(event), 0)[0]
        if err:
            _check(err, "hipStreamWaitEvent")

    # -- events ------------------------------------------------------------------------------
    def event_create(self, *, timing: bool, blocking_sync: bool = True) -> int:
        """An event; without ``timing`` it is created with ``hipEventDisableTiming``."""
        flags = (0 if timing else _EVENT_DISABLE_TIMING) | (_EVENT_BLOCKING_SYNC if blocking_sync else 0)
        err, event = self._hipEventCreateWithFlags(flags)
        _check(err, "hipEventCreateWithFlags")
        return self._keep(self._events, event)

    def event_destroy(self, event: int) -> None:
        _check(self._hipEventDestroy(self._event(event))[0], "hipEventDestroy")
        self._events.pop(event, None)

    def event_record(self, event: int, stream: int) -> None:
        ev = self._events.get(event)
        if ev is None:
            ev = self._remember(self._events, self._new_event, event)
        st = self._streams.get(stream)
        if st is None:
            st = self._remember(self._streams, self._new_stream, stream)
        err = self._hipEventRecord(ev, st)[0]
        if err:
            _check(err, "hipEventRecord")

    def event_query(self, event: int) -> bool:
        """``True`` when the work before the event's record has completed."""
        ev = self._events.get(event)
        if ev is None:
            ev = self._remember(self._events, self._new_event, event)
        err = self._hipEventQuery(ev)[0]
        if not err:
            return True
        if err == _NOT_READY:
            return False
        raise _error(err, "hipEventQuery")

    def event_synchronize(self, event: int) -> None:
        """Wait (GIL released; sleeping if the event is blocking-sync) for the event."""
        _check(self._hipEventSynchronize(self._event(event))[0], "hipEventSynchronize")

    def event_elapsed_ms(self, start: int, end: int) -> float:
        err, ms = self._hipEventElapsedTime(self._event(start), self._event(end))
        _check(err, "hipEventElapsedTime")
        return float(ms)
