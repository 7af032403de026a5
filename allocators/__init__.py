"""allocators: caching pinned-host and device allocators for streamrt.

Implements the :class:`streamrt.Allocator` protocol through streamrt's public
API and its allocator seam (``streamrt.Buffer``'s construction and
stream-ordered release; see ``docs/allocators.md``). The device allocator keeps
free lists per stream: a block only its stream used is reused on that stream
at once, with no event. ``streamrt.open_runtime`` uses :func:`default_allocator`
for its default ``"caching"`` allocators; pass another allocator, or a factory,
to plug in a different source or a whole allocator::

    import streamrt as srt
    import allocators

    rt = srt.open_runtime(
        "auto",
        host_allocator=allocators.caching_allocator_factory(source=allocators.TorchSource,
                                                            max_cached_bytes=1 << 30),
        device_allocator=lambda rt, kind: allocators.CachingDeviceAllocator(rt, debug=True),
    )

See ``docs/allocators.md`` for the keepalive rules, size classes, limits,
capture pools and the debug mode.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import streamrt as srt

from ._cached_buffer import CachedBuffer
from ._caching import CachingAllocator, CachingDeviceAllocator, CachingPinnedAllocator
from ._capture import CapturePool
from ._debug import POISON
from ._size_classes import SizeClasses
from ._sources import RawSource, Source, StreamOrderedSource, TorchSource
from ._statistics import CachingAllocatorStatistics

__all__ = [
    "POISON",
    "CachedBuffer",
    "CachingAllocator",
    "CachingAllocatorStatistics",
    "CachingDeviceAllocator",
    "CachingPinnedAllocator",
    "CapturePool",
    "RawSource",
    "SizeClasses",
    "Source",
    "StreamOrderedSource",
    "TorchSource",
    "caching_allocator_factory",
    "default_allocator",
]

SourceFactory = Callable[[srt.Runtime, str], Source]


def _allocator_class(kind: str) -> type[CachingAllocator]:
    if kind == "host":
        return CachingPinnedAllocator
    if kind == "device":
        return CachingDeviceAllocator
    raise ValueError(f"kind must be 'host' or 'device', got {kind!r}")


def caching_allocator_factory(source: SourceFactory | None = None, **options: Any) -> Callable[[srt.Runtime, str], CachingAllocator]:
    """A ``(runtime, kind) -> Allocator`` factory for ``open_runtime(host_allocator=..., device_allocator=...)``.

    ``source``: a ``(runtime, kind) -> Source`` callable (a source class such
    as :class:`TorchSource` is one); default :class:`RawSource`. ``options``
    go to the allocator (``max_cached_bytes``, ``max_total_bytes``,
    ``size_classes``, ``debug``, ``detect_capture``).
    """

    def make(runtime: srt.Runtime, kind: str) -> CachingAllocator:
        cls = _allocator_class(kind)
        return cls(runtime, None if source is None else source(runtime, kind), **options)

    return make


def default_allocator(runtime: srt.Runtime, kind: str) -> CachingAllocator:
    """The caching allocator ``open_runtime`` uses for ``"caching"``: over :class:`RawSource`.

    The environment variable ``STREAMRT_ALLOCATOR_DEBUG=1`` turns on the debug
    mode (poisoning, reuse checks) for the runtime's default allocators.
    """
    debug = os.environ.get("STREAMRT_ALLOCATOR_DEBUG", "") not in ("", "0")
    return _allocator_class(kind)(runtime, RawSource(runtime, kind), debug=debug)
