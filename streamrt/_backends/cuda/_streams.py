"""Stream and event calls of the CUDA backend (cudart)."""

from __future__ import annotations

from ._codes import _check
from ._core import CudaCore

__all__ = ["StreamCalls"]


class StreamCalls(CudaCore):
    """stream_create / stream_destroy / stream_synchronize / stream_query / stream_wait_event / event_*."""

    # -- streams --------------------------------------------------------------------------------

    def stream_create(self, priority: int = 0) -> int:
        rt = self._rt
        err, stream = rt.cudaStreamCreateWithPriority(rt.cudaStreamNonBlocking, priority)
        _check(err, "cudaStreamCreateWithPriority")
        handle = int(self._native_handle(stream))
        self._streams[handle] = self._CUstream(handle)
        return handle

    def stream_destroy(self, stream: int) -> None:
        (err,) = self._rt.cudaStreamDestroy(self._stream(stream))
        _check(err, "cudaStreamDestroy")
        if stream > 2:
            self._streams.pop(stream, None)

    def stream_synchronize(self, stream: int) -> None:
        (err,) = self._rt.cudaStreamSynchronize(self._stream(stream))
        _check(err, "cudaStreamSynchronize")

    def stream_query(self, stream: int) -> bool:
        s = self._stream_get(stream)
        err = self._cudaStreamQuery(self._stream(stream) if s is None else s)[0]
        if not err:
            return True
        if err == self._not_ready:
            return False
        _check(err, "cudaStreamQuery")
        return False  # unreachable: _check raised

    def stream_wait_event(self, stream: int, event: int) -> None:
        s = self._stream_get(stream)
        e = self._event_get(event)
        err = self._cudaStreamWaitEvent(
            self._stream(stream) if s is None else s, self._event(event) if e is None else e, 0
        )[0]
        if err:
            _check(err, "cudaStreamWaitEvent")

    # -- events -----------------------------------------------------------------------------------

    def event_create(self, *, timing: bool, blocking_sync: bool = True) -> int:
        rt = self._rt
        flags = 0 if timing else rt.cudaEventDisableTiming
        if blocking_sync:
            flags |= rt.cudaEventBlockingSync
        err, event = rt.cudaEventCreateWithFlags(flags)
        _check(err, "cudaEventCreateWithFlags")
        handle = int(self._native_handle(event))
        self._events[handle] = event
        return handle

    def event_destroy(self, event: int) -> None:
        (err,) = self._rt.cudaEventDestroy(self._event(event))
        _check(err, "cudaEventDestroy")
        self._events.pop(event, None)

    def event_record(self, event: int, stream: int) -> None:
        e = self._event_get(event)
        s = self._stream_get(stream)
        err = self._cudaEventRecord(self._event(event) if e is None else e, self._stream(stream) if s is None else s)[0]
        if err:
            _check(err, "cudaEventRecord")

    def event_query(self, event: int) -> bool:
        e = self._event_get(event)
        err = self._cudaEventQuery(self._event(event) if e is None else e)[0]
        if not err:
            return True
        if err == self._not_ready:
            return False
        _check(err, "cudaEventQuery")
        return False  # unreachable: _check raised

    def event_synchronize(self, event: int) -> None:
        (err,) = self._rt.cudaEventSynchronize(self._event(event))
        _check(err, "cudaEventSynchronize")

    def event_elapsed_ms(self, start: int, end: int) -> float:
        err, ms = self._rt.cudaEventElapsedTime(self._event(start), self._event(end))
        _check(err, "cudaEventElapsedTime")
        return float(ms)
