"""The process-wide record of graph captures the allocators know about.

While any stream captures a graph in HIP/CUDA's default (global) capture
mode, calls that may synchronize -- ``event_query`` and ``event_synchronize``
included -- are illegal from *every* thread of the process and invalidate the
capture. The caching allocators query events lazily, so they must know when a
capture may be underway, wherever it was started. They learn it from two places:

* a capture pool entered as a context (``with pool:``), which the code that
  begins and ends the capture opens around it (explicit);
* a stream found capturing by ``backend.stream_is_capturing`` when it is
  passed to ``allocate(n, stream=s)`` (implicit); such a stream is re-checked,
  with the capture-safe ``stream_is_capturing``, until its capture has ended.

While :func:`captures_underway` is true the allocators only hand out blocks
already known to be free and never query or wait on events. Captures that
streamrt never sees (begun by other libraries on streams never passed to an
allocator) are invisible: such code should capture in thread-local or relaxed
mode, or open a capture pool around its capture.
"""

from __future__ import annotations

import threading

import streamrt as srt

__all__ = ["begin_explicit", "end_explicit", "track_implicit", "untrack_implicit", "captures_underway"]

_lock = threading.Lock()
_explicit = 0
_implicit: dict[srt.Stream, int] = {}


def begin_explicit() -> None:
    """A capture pool was entered: a capture is underway until :func:`end_explicit`."""
    global _explicit
    with _lock:
        _explicit += 1


def end_explicit() -> None:
    global _explicit
    with _lock:
        _explicit -= 1


def track_implicit(stream: srt.Stream) -> None:
    """``stream`` was found capturing; it counts until found not capturing (or closed)."""
    with _lock:
        _implicit[stream] = _implicit.get(stream, 0) + 1


def untrack_implicit(stream: srt.Stream) -> None:
    with _lock:
        count = _implicit.get(stream, 0) - 1
        if count > 0:
            _implicit[stream] = count
        else:
            _implicit.pop(stream, None)


def captures_underway() -> bool:
    """Whether a capture the allocators know of may be underway (cheap when none is)."""
    if _explicit:
        return True
    if not _implicit:
        return False
    with _lock:
        for stream in list(_implicit):
            if stream.is_closed or stream.runtime.is_closed or not stream.runtime.backend.stream_is_capturing(stream.handle):
                del _implicit[stream]
        return bool(_implicit) or _explicit > 0
