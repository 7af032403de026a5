"""The statistics record of the caching allocators."""

from __future__ import annotations

from dataclasses import dataclass

import streamrt as srt

__all__ = ["CachingAllocatorStatistics"]


@dataclass(frozen=True)
class CachingAllocatorStatistics(srt.AllocatorStatistics):
    """A snapshot of a caching allocator (all sizes in bytes). Frozen.

    Inherited from :class:`streamrt.AllocatorStatistics`:

    * ``in_use_bytes``: block bytes of buffers handed out and not yet released
      (size-class bytes, so ``>= requested_bytes``); capture-pool buffers excluded;
    * ``requested_bytes``: the sizes asked for by those same buffers;
    * ``cached_bytes``: released blocks free for reuse: every stream that used
      them has passed, or (``stream_cached_bytes``) only one stream used them
      and they are reused on it;
    * ``in_flight_bytes``: released blocks still waiting for the streams that used them;
    * ``held_bytes``: everything obtained from the source and not given back;
      always ``in_use + cached + in_flight + capture_pool_bytes``;
    * ``peak_in_use_bytes``: the largest ``in_use_bytes`` seen;
    * ``allocations`` = ``hits + misses``; ``hits``: served from the cache (or
      a capture pool's reserve); ``misses``: served by the source;
    * ``frees``: blocks given back to the source.

    Added here:

    Attributes:
        capture_pool_bytes: blocks owned by open capture pools (reserved, handed
            out or released; they return to the cache when the pool closes).
        flushes: out-of-memory flushes (cache emptied, in-flight work waited for).
        evictions: blocks freed to keep ``cached_bytes`` under ``max_cached_bytes``.
        stream_cached_bytes: the part of ``cached_bytes`` in streams' own free
            lists (device blocks that only the stream they were allocated for
            used): handed out again at once, with no event, for that stream.
        stream_hits: the part of ``hits`` served from a stream's own list.
        fences: release points recorded with events: one per release of a block
            that other streams used (or that was allocated for no stream and used
            on one), one per stream whose own blocks were put in flight for use
            elsewhere. A block reused on its own stream records none.
        max_cached_bytes: the configured cache limit (``None``: unlimited).
        max_total_bytes: the configured limit on ``held_bytes`` (``None``: unlimited).
    """

    capture_pool_bytes: int = 0
    flushes: int = 0
    evictions: int = 0
    stream_cached_bytes: int = 0
    stream_hits: int = 0
    fences: int = 0
    max_cached_bytes: int | None = None
    max_total_bytes: int | None = None
