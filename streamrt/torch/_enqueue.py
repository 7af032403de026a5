"""Stream operations for the per-step helpers' hot paths, on arguments the helper built itself.

``Stream.copy``, ``Stream.record`` and ``Stream.wait`` validate what a user hands them
(buffers of this runtime, sizes, kinds, overlaps) and note the buffers' streams. The
helpers (``Prefetcher``, ``fetch``, ``MetricsLogger``) enqueue on addresses and events they
made and checked themselves, so they use these: each holds the stream's enqueue lock and
raises ``ClosedError`` on a closed stream like ``Stream``'s methods, and goes to the
stream's backend (the tracing wrapper while a trace is open) with nothing else. Noting a
buffer's streams is the caller's job (``Buffer.note_stream``) where its release relies on it.

Thread rules: like ``Stream``'s methods (any thread; one enqueue at a time per stream).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._backends.protocol import MemcpyKind

if TYPE_CHECKING:
    from .._event import Event
    from .._stream import Stream

__all__ = ["D2H", "H2D", "copy", "record", "wait"]

H2D = MemcpyKind.HOST_TO_DEVICE
D2H = MemcpyKind.DEVICE_TO_HOST


def copy(stream: Stream, dst: int, src: int, nbytes: int, kind: MemcpyKind) -> None:
    """Enqueue a copy of ``nbytes`` bytes from address ``src`` to ``dst`` on ``stream``."""
    with stream._lock:
        if stream._closed:
            stream._check_open()
        stream._backend.memcpy_async(dst, src, nbytes, kind, stream._handle)


def record(stream: Stream, event: Event) -> Event:
    """Record ``event`` (of the stream's runtime, open) at the current end of ``stream``."""
    with stream._lock:
        if stream._closed:
            stream._check_open()
        stream._backend.event_record(event._handle, stream._handle)
        event._recorded_on = stream._handle
    return event


def wait(stream: Stream, event: Event) -> None:
    """Make later work on ``stream`` wait for ``event`` (of the stream's runtime, open)."""
    with stream._lock:
        if stream._closed:
            stream._check_open()
        stream._backend.stream_wait_event(stream._handle, event._handle)
