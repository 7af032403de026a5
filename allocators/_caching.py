"""The caching allocators: size-classed blocks, reused once every stream that used them has passed,
or at once on the one stream that used them.

How a block moves (see ``docs/allocators.md``)::

    source --miss--> in use --release, no stream used it--------------------> shared list --hit--> in use
                        |\\--release, only the stream it was allocated for--> that stream's list
                        |                                   --hit on that stream, no event--> in use
                        \\--release after other streams' work--> in flight (a Fence)
                                 --fence found passed when allocate looks--> in use, or shared list
    a stream's list --a request elsewhere finds nothing else--> in flight (one event on that stream)
    cached / in flight --trim, eviction, OOM flush, close--> releaser thread --> source.free

**Hot path.** ``allocate`` of a size seen before, with a free block in the
shared list (no ``stream``) or in the stream's own list (``stream=s``, device
memory), and ``release`` of a block that needs no fence, are a dict lookup, a
list pop or append and a few counter updates: no lock, no event, no thread
hop (``stream=s`` adds the capture check of ``detect_capture``). They run in
the allocator's :mod:`~allocators._fastpath` (C when built, else its Python
twin), which shares the hits / in-use / peak / requested counters with the
slow paths. It relies on the GIL (see ``_fastpath``). Where the GIL is
disabled (free-threaded CPython) the hot path is switched off and every
operation takes the allocator's lock. Everything else -- the slow paths, and
every table change made by them -- takes the lock.

**Keepalive.** A block that other streams used gets one event per stream at
release (:class:`~allocators._fence.Fence`). The events are queried lazily,
when ``allocate`` finds no free block of the class: at most a few pending
blocks per call, never from a runtime thread. Pinned blocks have no per-stream
lists: the host writes them directly, outside any stream's order.

Thread rules: every method may be called from any thread. ``allocate`` may
block on the source and, when memory runs out, on in-flight work (the flush)
and on the releaser thread. Real frees only ever run on the runtime's
releaser thread.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import streamrt as srt

from . import _captures
from ._cached_buffer import CachedBuffer
from ._capture import CapturePool
from ._capture_routing import open_pool, route, take_implicit_pool
from ._debug import DebugChecks
from ._fastpath import FIELDS, GIL_ENABLED, FastPath
from ._fence import Fence
from ._free_lists import FreeLists, pop
from . import _drain
from ._size_classes import SizeClasses
from ._sources import RawSource, Source
from ._statistics import CachingAllocatorStatistics

if TYPE_CHECKING:
    from collections.abc import Iterable, Set

    from ._fastpath import Entry

__all__ = ["CachingAllocator", "CachingDeviceAllocator", "CachingPinnedAllocator"]

_NO_FLUSH = " (no flush during a graph capture)"


def _check_nbytes(nbytes: Any) -> int:
    if isinstance(nbytes, bool) or not hasattr(nbytes, "__index__"):
        raise TypeError(f"nbytes must be an int, not {type(nbytes).__name__}")
    value = int(nbytes.__index__())
    if value < 0:
        raise ValueError(f"nbytes must be >= 0, got {value}")
    return value


def _check_limit(value: int | None, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int or None, got {value!r}")
    return value


class CachingAllocator:
    """A caching allocator of ``kind`` memory over a :class:`~allocators.Source`.

    Use :class:`CachingPinnedAllocator` or :class:`CachingDeviceAllocator`.

    Args:
        runtime: the runtime whose streams use the memory.
        source: where blocks come from (default :class:`~allocators.RawSource`:
            the runtime's own malloc). Its ``kind`` must match.
        max_cached_bytes: bound on the bytes kept for reuse (cached plus in
            flight). Over it, cached blocks are freed, largest first; in-flight
            blocks are freed once found passed. ``None``: unbounded (see :meth:`trim`).
        max_total_bytes: bound on the bytes held from the source (in use,
            cached, in flight and in capture pools). A request that would cross
            it flushes the cache, then raises :class:`streamrt.OutOfMemoryError`.
        size_classes: the rounding rule (default: 512 B granule, 4 classes per
            doubling: less than 1.25x waste for requests above 2 KiB).
        debug: poison released blocks with ``0xDB`` and check every block handed
            out (on the simulator, against its hazard checker); see
            :mod:`allocators._debug`. Slower; for debugging.
        detect_capture: ask the backend whether ``stream`` is capturing on
            ``allocate(n, stream=stream)`` and serve a capturing stream from a
            capture pool. ``False`` saves that backend call; then only pools
            entered with ``with allocator.capture_pool(stream):`` are used.
    """

    kind: str = ""
    #: Blocks released after work on the stream they were allocated for alone go to that stream's own list.
    per_stream: bool = False
    # Slots, not an instance dict: smaller, and quicker to read on every path.
    __slots__ = (
        "_runtime", "_backend", "_source", "_classes", "_max_cached", "_max_total", "_check_capture",
        "_detect_capture", "_lock", "_lists", "_buffer_type", "_events", "_pools", "_bindings", "_implicit",
        "_held", "_freeing", "_pool_bytes", "_reserving", "_misses", "_frees", "_flushes", "_evictions",
        "_fences", "_closed", "_source_closed", "_fp", "_take", "_take_on", "_debug", "__weakref__",
    )  # fmt: skip

    def __init__(
        self,
        runtime: srt.Runtime,
        source: Source | None = None,
        *,
        max_cached_bytes: int | None = None,
        max_total_bytes: int | None = None,
        size_classes: SizeClasses | None = None,
        debug: bool = False,
        detect_capture: bool = True,
    ) -> None:
        if not isinstance(runtime, srt.Runtime):
            raise TypeError(f"runtime must be a streamrt.Runtime, not {type(runtime).__name__}")
        kind = type(self).kind
        if kind not in ("host", "device"):
            raise TypeError("use CachingPinnedAllocator or CachingDeviceAllocator")
        if source is None:
            source = RawSource(runtime, kind)
        elif not isinstance(source, Source):
            raise TypeError(
                f"source must implement allocators.Source (kind, capture_safe, allocate, free, close), got {type(source).__name__}"
            )
        if source.kind != kind:
            raise ValueError(f"a {source.kind} source cannot feed a {kind} allocator")
        classes = size_classes if size_classes is not None else SizeClasses()
        if not isinstance(classes, SizeClasses):
            raise TypeError("size_classes must be an allocators.SizeClasses")
        self._runtime = runtime
        self._backend = runtime.backend
        self._source = source
        self._classes = classes
        self._max_cached = _check_limit(max_cached_bytes, "max_cached_bytes")
        self._max_total = _check_limit(max_total_bytes, "max_total_bytes")
        self._check_capture = runtime.capabilities.supports_graphs
        self._detect_capture = bool(detect_capture) and self._check_capture
        self._lock = threading.Lock()
        fast_on = GIL_ENABLED and not debug  # the lock-free hot path needs the GIL
        self._lists = FreeLists(classes, memoize=fast_on)
        self._events = runtime.event_pool  # the runtime's one pool (closed with the runtime)
        # Capture pools: every open pool, streams bound to one, implicit pools per stream.
        self._pools: set[CapturePool] = set()
        self._bindings: dict[srt.Stream, CapturePool] = {}
        self._implicit: dict[srt.Stream, CapturePool] = {}
        # Counters, in size-class bytes unless named "requested". Cached bytes are
        # what is left: held - in_use - in_flight - freeing - pool - reserving.
        self._held = 0
        self._freeing = 0  # taken out of the cache, free submitted to the releaser, not yet run
        self._pool_bytes = 0
        self._reserving = 0  # counted as held, source.allocate not yet returned
        self._misses = 0
        self._frees = 0
        self._flushes = 0
        self._evictions = 0
        self._fences = 0
        self._closed = False
        self._source_closed = False
        # The buffers this allocator hands out (the allocator seam's fast construction), and the hot
        # path (allocators._fastpath) with the counters it shares with the slow paths: hits,
        # stream_hits, in_use, peak, requested. post_release: the allocator closed, or a cache limit to keep.
        extra: dict[str, Any] = {"_allocator": self}
        if not fast_on:
            extra["release"] = CachedBuffer._release_locked
        self._buffer_type: type[CachedBuffer] = CachedBuffer.allocation_type(kind, runtime, **extra)
        lists = self._lists
        is_capturing = self._backend.stream_is_capturing if self._detect_capture else None
        self._fp = FastPath(self._buffer_type, FIELDS, lists.fast, lists.streams, self._bindings, is_capturing)
        self._fp.post_release = self._max_cached is not None
        self._buffer_type._give = self._fp.give
        self._take = self._fp.take
        self._take_on = self._fp.take_on
        self._debug = DebugChecks(self) if debug else None

    # -- properties ---------------------------------------------------------------------------
    @property
    def runtime(self) -> srt.Runtime:
        return self._runtime

    @property
    def source(self) -> Source:
        return self._source

    @property
    def size_classes(self) -> SizeClasses:
        return self._classes

    @property
    def max_cached_bytes(self) -> int | None:
        return self._max_cached

    @property
    def max_total_bytes(self) -> int | None:
        return self._max_total

    @property
    def debug(self) -> bool:
        return self._debug is not None

    @property
    def is_closed(self) -> bool:
        return self._closed

    def block_size(self, nbytes: int) -> int:
        """The bytes of the block that serves a request of ``nbytes`` bytes."""
        return self._classes.round(_check_nbytes(nbytes))

    # -- allocation ------------------------------------------------------------------------------
    def allocate(self, nbytes: int, *, stream: srt.Stream | None = None) -> srt.Buffer:
        """A Buffer of ``nbytes`` bytes of ``kind`` memory, from the cache when possible.

        ``stream``: the stream that will use the buffer. Its release then waits
        for that stream even if no work names the buffer; on a capturing
        stream the buffer comes from the stream's capture pool. A block is
        handed out only once every stream that used it has passed its release
        (so the host may write into a reused pinned block at once), except a
        device block that only ``stream`` used: that one may be handed out at
        once for ``stream``, whose work runs after its earlier work in stream
        order. Use such a buffer on ``stream``, or order other streams after
        it (``other.wait(stream.record())``), as with torch's and CuPy's pools.

        Blocks on the source on a miss. When memory runs out, flushes the cache
        (waiting for in-flight work), retries, then raises
        :class:`streamrt.OutOfMemoryError`. Raises ``ClosedError`` after :meth:`close`.
        """
        buf = self._take(nbytes) if stream is None else self._take_on(nbytes, stream)
        if buf is not None:
            return buf
        return self._allocate(nbytes, stream)

    def _allocate(self, nbytes: Any, stream: srt.Stream | None) -> srt.Buffer:
        """The slow path of :meth:`allocate`: validation, capture routing, pending blocks, the source."""
        nbytes = _check_nbytes(nbytes)
        home = None
        if stream is not None:
            pool = route(self, stream)
            if pool is not None:
                return pool.allocate(nbytes, stream=stream)
            if self.per_stream and not stream.is_closed:
                home = stream
        lists = self._lists
        own = False
        with self._lock:
            if self._closed:
                raise srt.ClosedError(f"{type(self).__name__} is closed")
            entry = lists.entry(nbytes, home)
            cls = entry[0]
            ptr = pop(entry[1]) if home is not None else 0  # the stream's own list first
            own = ptr != 0
            if not ptr:
                ptr = self._reuse_locked(cls, home)
            if ptr:
                self._fp.hits += 1
                self._fp.stream_hits += own
                self._account_out_locked(cls, nbytes)
        if not ptr:
            ptr = self._obtain(cls, nbytes, stream, capturing=False)
            with self._lock:
                self._reserving -= cls
                self._misses += 1
                self._account_out_locked(cls, nbytes)
        buf = self._fp.hand_out(ptr, nbytes, entry, stream)
        if self._debug is not None:
            self._debug.handed_out(ptr, cls, check_host=not own)
        return buf

    def _reuse_locked(self, cls: int, home: srt.Stream | None) -> int:
        """A block of ``cls`` every stream has passed (a shared list, then in flight), or 0.

        With none, and streams' own lists holding blocks of ``cls``, those are
        put in flight behind one event per stream and looked at once more.
        """
        lists = self._lists
        free = lists.ready.get(cls)
        ptr = pop(free) if free else 0
        if ptr or _captures.captures_underway():
            return ptr
        runtime, events = self._runtime, self._events
        ptr = lists.reclaim(cls, runtime, events)
        if not ptr and lists.own and self._fence_own_locked(cls=cls, exclude=home):
            ptr = lists.reclaim(cls, runtime, events)
        return ptr

    def _fence_own_locked(self, **select: Any) -> int:
        """Put blocks of streams' own lists in flight behind one fence per stream (``FreeLists.take_own``'s
        ``select``); the number of fences recorded."""
        lists, runtime, events = self._lists, self._runtime, self._events
        taken = lists.take_own(**select)
        for stream, blocks in taken:
            fence = Fence() if runtime.is_closed else Fence.record(runtime, events, (stream,), check_capture=self._check_capture)
            for ptr, cls in blocks:
                lists.pend(ptr, cls, fence)
            self._fences += not fence.is_empty
        return len(taken)

    def _account_out_locked(self, cls: int, nbytes: int) -> None:
        fp = self._fp
        in_use = fp.in_use + cls
        fp.in_use = in_use
        if in_use > fp.peak:
            fp.peak = in_use
        fp.requested += nbytes

    def _obtain(self, cls: int, nbytes: int, stream: srt.Stream | None, *, capturing: bool) -> int:
        """A new block from the source within ``max_total_bytes``; flush and retry once when out of memory.

        On return the block counts in ``_held`` and ``_reserving``; the caller
        moves it from ``_reserving`` to where it goes. ``capturing``: a capture
        is underway, so nothing may wait or free (no flush).
        """
        self._reserve(cls, nbytes, capturing)
        source = self._source
        try:
            try:
                return source.allocate(cls, stream)
            except srt.OutOfMemoryError:
                if capturing:
                    raise
            _drain.flush(self)
            return source.allocate(cls, stream)
        except srt.OutOfMemoryError as exc:
            with self._lock:
                self._held -= cls
                self._reserving -= cls
            why = "the source is out of memory" + (_NO_FLUSH if capturing else "")
            raise self._oom(nbytes, cls, why) from exc
        except BaseException:
            with self._lock:
                self._held -= cls
                self._reserving -= cls
            raise

    def _reserve(self, cls: int, nbytes: int, capturing: bool) -> None:
        with self._lock:
            if self._closed:
                raise srt.ClosedError(f"{type(self).__name__} is closed")
            limit = self._max_total
            if limit is None or self._held + cls <= limit:
                self._held += cls
                self._reserving += cls
                return
        if not capturing:
            _drain.flush(self)
            with self._lock:
                if self._held + cls <= limit:
                    self._held += cls
                    self._reserving += cls
                    return
        raise self._oom(nbytes, cls, f"max_total_bytes={limit} would be exceeded" + (_NO_FLUSH if capturing else ""))

    def _oom(self, nbytes: int, cls: int, why: str) -> srt.OutOfMemoryError:
        with self._lock:
            in_use, held, pool = self._fp.in_use, self._held, self._pool_bytes
            cached = self._cached_locked() + self._lists.in_flight + self._freeing
        return srt.OutOfMemoryError(
            f"{type(self).__name__}: cannot allocate {nbytes} bytes (a {cls}-byte block): {why}; "
            f"after flushing the cache: {in_use} bytes in use, {cached} cached or in flight, "
            f"{pool} in capture pools, {held} held, limit {self._max_total}",
            requested=nbytes,
            cached=cached,
            limit=self._max_total,
            in_use=in_use,
        )

    def _cached_locked(self) -> int:
        # One expression with no calls: never interleaved with a fast-path update.
        return self._held - self._fp.in_use - self._lists.in_flight - self._freeing - self._pool_bytes - self._reserving

    # -- release -------------------------------------------------------------------------------
    def _release_slow(self, ptr: int, nbytes: int, streams: Set[srt.Stream] | None, entry: Entry) -> None:
        """:meth:`CachedBuffer.release` beyond its fast path: streams to wait for, debug, a closed allocator."""
        cls, free, home = entry
        if self._closed:
            _drain.release_after_close(self, ptr, nbytes, cls, streams or ())
            return
        stream = None if home is None else home[0]
        # Only the stream it was allocated for used it (the hot path's rule): back to that stream's list.
        own = stream is not None and streams is not None and len(streams) == 1 and stream in streams and not stream.is_closed
        fence: Fence | None = None
        if self._debug is not None:
            fence = self._debug.poison(ptr, cls, streams or frozenset(), stream if own else None)
        elif streams and not own:
            fence = Fence.record(self._runtime, self._events, streams, check_capture=self._check_capture)
        with self._lock:
            closed = self._closed
            if not closed:
                self._fp.in_use -= cls
                self._fp.requested -= nbytes
                if fence is not None and not fence.is_empty:
                    self._fences += 1
                    self._lists.pend(ptr, cls, fence)
                elif home is None or (own and home[0] is not None):
                    free.append(ptr)
                else:  # its stream's lists were retired meanwhile (the stream closed): after the whole device
                    self._lists.pend(ptr, cls, Fence.device_wide(self._runtime))
        if closed:
            if fence is not None:
                fence.discard(self._events)
            _drain.release_after_close(self, ptr, nbytes, cls, streams or ())
        elif self._fp.post_release:
            _drain.after_release(self)

    def _finish_release(self, buf: CachedBuffer, step: int) -> None:
        """The rest of a :meth:`CachedBuffer.release` after ``FastPath.give`` returned ``step`` (1 or 2)."""
        if step == 1:
            self._release_slow(buf._ptr, buf._nbytes, buf._streams, buf._entry)
        else:
            _drain.after_release(self)

    def _adopt_blocks(self, blocks: list[tuple[int, int]], fence: Fence) -> None:
        """Take back blocks of a closed capture pool; reusable once ``fence`` has passed.

        All blocks sharing one fence enter the tables together, under one lock,
        so no two threads ever touch one fence at once.
        """
        with self._lock:
            for _ptr, cls in blocks:
                self._pool_bytes -= cls
            closed = self._closed
            if closed:
                for _ptr, cls in blocks:
                    self._freeing += cls
            elif fence.is_empty:
                for ptr, cls in blocks:
                    self._lists.ready.setdefault(cls, []).append(ptr)
            else:
                for ptr, cls in blocks:
                    self._lists.pend(ptr, cls, fence)
        if closed:
            self._runtime.releaser.submit(_drain.free_after_fence, self, list(blocks), fence)

    # -- capture pools -------------------------------------------------------------------------------
    def capture_pool(self, stream: srt.Stream | None = None, *, reserve: Iterable[int] = ()) -> CapturePool:
        """A capture-private pool: memory that lives as long as a graph.

        ``stream``: the stream to be captured; while the pool is entered
        (``with pool:``) every ``allocate(n, stream=stream)`` is served by it.
        ``reserve``: request sizes to obtain now, before the capture, one block
        each (a capture may not call a synchronizing malloc). See
        :class:`~allocators.CapturePool` for the hand-off to the graph.
        """
        return open_pool(self, stream, reserve)

    def take_capture_pool(self, stream: srt.Stream) -> CapturePool | None:
        """The pool made implicitly for the latest capture on ``stream`` (an ``allocate(n, stream=stream)``
        found it capturing), now owned by the caller, who closes it with the graph; ``None`` if none."""
        return take_implicit_pool(self, stream)

    def _check_stream(self, stream: Any) -> None:
        if not isinstance(stream, srt.Stream):
            raise TypeError(f"stream must be a streamrt.Stream, not {type(stream).__name__}")
        if stream.runtime is not self._runtime:
            raise ValueError("stream belongs to another runtime")

    # -- maintenance -------------------------------------------------------------------------------
    def statistics(self) -> CachingAllocatorStatistics:
        """A snapshot of the counters. Queries the fences of in-flight blocks first (not during a capture),
        and frees blocks found passed beyond ``max_cached_bytes``."""
        evicted: list[tuple[int, int]] = []
        with self._lock:
            if not self._closed:
                if self._lists.own and not _captures.captures_underway():
                    self._fence_own_locked(closed_only=True)
                self._poll_all_locked()
                evicted = _drain.evict_locked(self)
            own = self._lists.own_bytes()
            # Read every counter in one run with no call in between (see the module docstring).
            fp = self._fp
            held, in_use, requested, in_flight, freeing, pool, reserving, peak, hits, stream_hits, misses = (
                self._held, fp.in_use, fp.requested, self._lists.in_flight, self._freeing,
                self._pool_bytes, self._reserving, fp.peak, fp.hits, fp.stream_hits, self._misses,
            )  # fmt: skip
            frees, flushes, evictions, fences = self._frees, self._flushes, self._evictions, self._fences
        _drain.submit_frees(self, evicted, wait=False)
        return CachingAllocatorStatistics(
            in_use_bytes=in_use,
            cached_bytes=held - in_use - in_flight - freeing - pool - reserving,
            in_flight_bytes=in_flight + freeing + reserving,
            peak_in_use_bytes=peak,
            held_bytes=held,
            requested_bytes=requested,
            allocations=hits + misses,
            hits=hits,
            misses=misses,
            frees=frees,
            capture_pool_bytes=pool,
            flushes=flushes,
            evictions=evictions,
            stream_cached_bytes=own,
            stream_hits=stream_hits,
            fences=fences,
            max_cached_bytes=self._max_cached,
            max_total_bytes=self._max_total,
        )

    def _cached_in_lists(self) -> int:
        """Bytes in the free lists, counted one by one (tests compare it with ``cached_bytes``)."""
        with self._lock:
            return self._lists.shared_bytes() + self._lists.own_bytes()

    def reset_peak(self) -> None:
        """Restart ``peak_in_use_bytes`` from the current ``in_use_bytes``."""
        with self._lock:
            self._fp.peak = self._fp.in_use

    def trim(self, *, wait: bool = True) -> None:
        """Give every cached block back to the source.

        Blocks of a stream's own list are freed once that stream has passed
        (one event each). In-flight blocks whose streams have passed are freed
        too; the others stay in flight (nothing waits for them). Capture pools
        are left alone. The frees run on the releaser thread; ``wait``
        (default) blocks until they have run. Note that the drivers' free
        (``cudaFree``, ``hipHostFree``, the simulator's) itself waits for the
        device to be idle.
        """
        _drain.trim(self, wait=wait)

    def close(self) -> None:
        """Wait for in-flight work, free every cached block, close the capture pools. Idempotent.

        Buffers still in use stay valid; each is freed when released (after its
        streams pass). ``allocate`` then raises ``ClosedError``. Blocks that a
        stream still capturing may use are not freed.
        """
        _drain.close(self)

    def _poll_all_locked(self) -> None:
        """Move every pending block whose fence has passed to the cache (not during a capture)."""
        if not _captures.captures_underway():
            self._lists.poll_all(self._runtime, self._events)

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<{type(self).__name__} over {self._source!r}{state}>"


class CachingPinnedAllocator(CachingAllocator):
    """Caching allocator of page-locked host memory (``kind == "host"``).

    A reused block is handed out only after every stream that used it has
    passed its release, so the host may write into it at once (so there are
    no per-stream lists: host writes are in no stream's order). See
    :class:`CachingAllocator` for the arguments.
    """

    __slots__ = ()

    kind = "host"


class CachingDeviceAllocator(CachingAllocator):
    """Caching allocator of device memory (``kind == "device"``), with per-stream free lists.

    A block released after work on the stream it was allocated for alone
    (``allocate(n, stream=s)``) goes to ``s``'s own list and is handed out
    again for ``allocate(n, stream=s)`` at once, with no event. See
    :class:`CachingAllocator` for the arguments.
    """

    __slots__ = ()

    kind = "device"
    per_stream = True
