"""How a caching allocator routes allocations to capture pools: explicit pools, and streams found capturing.

These functions are parts of :class:`~allocators.CachingAllocator` (its
``capture_pool``, ``take_capture_pool`` and the check each
``allocate(n, stream=s)`` slow path makes first), kept apart because they are
one concept. The hot path makes the same check itself: it leaves every
allocation to the slow path while a pool is bound to any stream, and asks
``stream_is_capturing`` when the allocator detects captures (see
:mod:`allocators._fastpath`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import streamrt as srt

from ._capture import CapturePool

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ._caching import CachingAllocator

__all__ = ["open_pool", "route", "take_implicit_pool"]


def open_pool(a: CachingAllocator, stream: srt.Stream | None, reserve: Iterable[int]) -> CapturePool:
    """:meth:`CachingAllocator.capture_pool`."""
    if stream is not None:
        a._check_stream(stream)
    with a._lock:
        if a._closed:
            raise srt.ClosedError(f"{type(a).__name__} is closed")
        pool = CapturePool(a, stream)
    try:
        for nbytes in reserve:
            pool.reserve(nbytes)
    except BaseException:
        pool.close()
        raise
    return pool


def take_implicit_pool(a: CachingAllocator, stream: srt.Stream) -> CapturePool | None:
    """:meth:`CachingAllocator.take_capture_pool`."""
    a._check_stream(stream)
    with a._lock:
        pool = a._implicit.pop(stream, None)
    if pool is not None:
        pool._unbind()
    return pool


def route(a: CachingAllocator, stream: srt.Stream) -> CapturePool | None:
    """The capture pool serving allocations on ``stream`` now, or ``None`` for the cache."""
    a._check_stream(stream)
    backend = a._backend
    if a._bindings:
        pool = a._bindings.get(stream)
        if pool is not None:
            if not pool.is_implicit:
                return pool
            if not stream.is_closed and backend.stream_is_capturing(stream.handle):
                return pool
            pool._unbind()  # its capture ended; it waits in _implicit for take_capture_pool
    if a._detect_capture and not stream.is_closed and backend.stream_is_capturing(stream.handle):
        return _implicit_pool(a, stream)
    return None


def _implicit_pool(a: CachingAllocator, stream: srt.Stream) -> CapturePool:
    """Bind a new pool to ``stream``, found capturing with no pool bound to it."""
    with a._lock:
        if a._closed:
            raise srt.ClosedError(f"{type(a).__name__} is closed")
        pool = a._bindings.get(stream)
        if pool is not None:  # another thread bound one meanwhile
            return pool
        # An unclaimed pool of an earlier capture on this stream stays open (its graph
        # may still be replayed) until close(); take_capture_pool returns the latest.
        pool = CapturePool(a, stream, implicit=True)
        a._implicit[stream] = pool
        pool._bind_locked()
    return pool
