"""The caching allocators: size-classed blocks, reused once every stream that used them has passed.

How a block moves (see ``docs/allocators.md``)::

    source --miss--> in use --release, no stream used it--> cached --hit--> in use
                        \\--release after stream work--> in flight (a Fence)
                                 --fence found passed when allocate looks--> in use, or cached
    cached / in flight --trim, eviction, OOM flush, close--> releaser thread --> source.free

**Hot path.** ``allocate`` of a size seen before, with a free block of its
class, and ``release`` of a block no stream used, are a dict lookup, a list
pop or append and a few counter updates: no lock, no event, no thread hop.
They run in the allocator's :mod:`~allocators._fastpath` (C when built, else
its Python twin), which shares the hits / in-use / peak / requested counters
with the slow paths. Buffers are :class:`CachedBuffer`, whose ``release``
calls that path first. It relies on the GIL (see ``_fastpath``). Where the
GIL is disabled (free-threaded CPython) the hot path is switched off and every
operation takes the allocator's lock. Everything else -- the slow paths, and
every table change made by them -- takes the lock.

**Keepalive.** A block that streams used gets one event per stream at release
(:class:`~allocators._fence.Fence`). The events are queried lazily, when
``allocate`` finds no free block of the class: at most a few pending blocks
per call, never from a runtime thread.

Thread rules: every method may be called from any thread. ``allocate`` may
block on the source and, when memory runs out, on in-flight work (the flush)
and on the releaser thread. Real frees only ever run on the runtime's
releaser thread.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

import streamrt as srt

from . import _captures
from ._capture import CapturePool
from ._debug import DebugChecks
from ._fastpath import GIL_ENABLED, FastPath
from ._fence import EventPool, Fence
from ._size_classes import SizeClasses
from ._sources import RawSource, Source
from ._statistics import CachingAllocatorStatistics
from ._streamrt_api import note_stream

if TYPE_CHECKING:
    from collections.abc import Iterable, Set

__all__ = ["CachingAllocator", "CachingDeviceAllocator", "CachingPinnedAllocator"]

_POLL_PER_MISS = 4  # pending blocks of a class whose fences one allocate may query
_FAST_LIMIT = 4096  # distinct request sizes memoized for the fast path
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


def _pop(free: list[int]) -> int:
    """Pop a block, or 0 when the list is (or just became) empty."""
    try:
        return free.pop()
    except IndexError:
        return 0


class CachedBuffer(srt.Buffer):
    """A :class:`streamrt.Buffer` handed out by a :class:`CachingAllocator`.

    It behaves as any allocator Buffer; only the round trip is specialised.
    Its ``release`` gives the block back through the allocator's hot path
    (:mod:`allocators._fastpath`: a block no stream used goes straight back to
    its free list) instead of through Buffer's ``on_release`` hook. Each
    allocator hands out buffers of its own subclass, whose class attributes
    hold the fields its buffers share (kind, runtime, allocator; never a view,
    no owner, no hook), so a hand-out sets five fields and runs no ``__init__``
    (see the keepalive rules in ``docs/allocators.md``). Not constructed by
    hand. Thread rules are Buffer's.
    """

    __slots__ = ("_entry",)  # (size class, free list): where release puts the block back
    # Buffer's slots that are the same for every cached buffer (never a view, no owner, no hook).
    _base = None
    _offset = 0
    _owner = None
    _on_release = None
    _readonly = False
    # Set by each allocator's subclass.
    _allocator: CachingAllocator
    _give: Callable[[CachedBuffer], int]
    _entry: tuple[int, list[int]]

    def __init__(self) -> None:
        raise TypeError("CachedBuffers are made by a CachingAllocator's allocate()")

    def release(self) -> None:
        """Give the block back to its allocator: cached at once if no stream used it, else in flight
        until every stream that did has passed. Non-blocking. Releasing twice raises ``ValueError``."""
        step = self._give(self)  # the allocator's FastPath.give (allocators._fastpath)
        if step:
            self._allocator._finish_release(self, step)

    def _release_locked(self) -> None:
        """``release`` of an allocator without the lock-free fast path (debug mode, no GIL)."""
        if self._released:
            raise ValueError("buffer released twice")
        self._released = True
        self._allocator._release_slow(self._ptr, self._nbytes, self._streams)


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
    # Slots, not an instance dict: smaller, and quicker to read on every path.
    __slots__ = (
        "_runtime", "_backend", "_source", "_classes", "_max_cached", "_max_total", "_check_capture",
        "_detect_capture", "_lock", "_fast", "_fast_on", "_buffer_type", "_ready", "_pending", "_events",
        "_pools", "_bindings", "_implicit", "_held", "_in_flight", "_freeing",
        "_pool_bytes", "_reserving", "_misses", "_frees", "_flushes", "_evictions",
        "_closed", "_source_closed", "_fp", "_take", "_debug", "__weakref__",
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
        # Request size -> (size class, that class's free list). Lists are never replaced.
        self._fast: dict[int, tuple[int, list[int]]] = {}
        self._fast_on = GIL_ENABLED and not debug  # the lock-free hot path needs the GIL
        # The CachedBuffer subclass this allocator hands out: the fields its buffers share.
        shared: dict[str, Any] = {"__slots__": (), "__module__": __name__, "_kind": kind, "_runtime": runtime, "_allocator": self}
        if not self._fast_on:
            shared["release"] = CachedBuffer._release_locked
        self._buffer_type: type[CachedBuffer] = type("CachedBuffer", (CachedBuffer,), shared)
        self._ready: dict[int, list[int]] = {}  # size class -> free blocks (LIFO)
        self._pending: dict[int, deque[tuple[int, Fence]]] = {}  # size class -> released, fence not yet seen passed
        self._events = EventPool(runtime)
        # Capture pools: every open pool, streams bound to one, implicit pools per stream.
        self._pools: set[CapturePool] = set()
        self._bindings: dict[srt.Stream, CapturePool] = {}
        self._implicit: dict[srt.Stream, CapturePool] = {}
        # Counters, in size-class bytes unless named "requested". Cached bytes are
        # what is left: held - in_use - in_flight - freeing - pool - reserving.
        self._held = 0
        self._in_flight = 0
        self._freeing = 0  # taken out of the cache, free submitted to the releaser, not yet run
        self._pool_bytes = 0
        self._reserving = 0  # counted as held, source.allocate not yet returned
        self._misses = 0
        self._frees = 0
        self._flushes = 0
        self._evictions = 0
        self._closed = False
        self._source_closed = False
        # The hot path (allocators._fastpath) and the counters it shares with the slow paths:
        # hits, in_use, peak, requested. post_release: the allocator closed, or a cache limit to keep.
        self._fp = FastPath(self._buffer_type, self._fast)
        self._fp.post_release = self._max_cached is not None
        self._buffer_type._give = self._fp.give
        self._take = self._fp.take
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

    # -- size classes -----------------------------------------------------------------------------
    def block_size(self, nbytes: int) -> int:
        """The bytes of the block that serves a request of ``nbytes`` bytes."""
        return self._entry(_check_nbytes(nbytes))[0]

    def _entry(self, nbytes: int) -> tuple[int, list[int]]:
        """``(size class, free list)`` of a validated request size; memoized for the fast path."""
        entry = self._fast.get(nbytes)
        if entry is not None:
            return entry
        cls = self._classes.round(nbytes)
        free = self._ready.get(cls)
        if free is None:
            free = self._ready.setdefault(cls, [])
        entry = (cls, free)
        if self._fast_on and len(self._fast) < _FAST_LIMIT and not self._closed:
            self._fast[nbytes] = entry
        return entry

    # -- allocation ------------------------------------------------------------------------------
    def allocate(self, nbytes: int, *, stream: srt.Stream | None = None) -> srt.Buffer:
        """A Buffer of ``nbytes`` bytes of ``kind`` memory, from the cache when possible.

        ``stream``: the stream that will use the buffer. Its release then waits
        for that stream even if no work names the buffer; on a capturing
        stream the buffer comes from the stream's capture pool. A reused block
        is handed out only once every stream that used it has passed its
        release, so the host may write into a reused pinned block at once.

        Blocks on the source on a miss. When memory runs out, flushes the cache
        (waiting for in-flight work), retries, then raises
        :class:`streamrt.OutOfMemoryError`. Raises ``ClosedError`` after :meth:`close`.
        """
        if stream is None:
            buf = self._take(nbytes)
            if buf is not None:
                return buf
        return self._allocate(nbytes, stream)

    def _allocate(self, nbytes: Any, stream: srt.Stream | None) -> srt.Buffer:
        """The slow path of :meth:`allocate`: validation, capture routing, pending blocks, the source."""
        nbytes = _check_nbytes(nbytes)
        entry = self._entry(nbytes)
        cls, free = entry
        if stream is not None:
            pool = self._route(stream)
            if pool is not None:
                return pool.allocate(nbytes, stream=stream)
        with self._lock:
            if self._closed:
                raise srt.ClosedError(f"{type(self).__name__} is closed")
            ptr = _pop(free) if free else 0
            if not ptr and self._pending.get(cls):
                ptr = self._reclaim_locked(cls)
            if ptr:
                self._fp.hits += 1
                self._account_out_locked(cls, nbytes)
        if not ptr:
            ptr = self._obtain(cls, nbytes, stream, capturing=False)
            with self._lock:
                self._reserving -= cls
                self._misses += 1
                self._account_out_locked(cls, nbytes)
        buf = self._fp.hand_out(ptr, nbytes, entry)
        if stream is not None:
            note_stream(buf, stream)
        if self._debug is not None:
            self._debug.handed_out(ptr, cls)
        return buf

    def _account_out_locked(self, cls: int, nbytes: int) -> None:
        fp = self._fp
        in_use = fp.in_use + cls
        fp.in_use = in_use
        if in_use > fp.peak:
            fp.peak = in_use
        fp.requested += nbytes

    def _reclaim_locked(self, cls: int) -> int:
        """A pending block of ``cls`` whose fence has passed, or 0. Queries at most a few fences."""
        if _captures.captures_underway():
            return 0
        queue = self._pending[cls]
        runtime, events = self._runtime, self._events
        for _ in range(min(len(queue), _POLL_PER_MISS)):
            ptr, fence = queue[0]
            if fence.poll(runtime, events):
                queue.popleft()
                self._in_flight -= cls
                return ptr
            queue.rotate(-1)
        return 0

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
            self._flush()
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
            self._flush()
            with self._lock:
                if self._held + cls <= limit:
                    self._held += cls
                    self._reserving += cls
                    return
        raise self._oom(nbytes, cls, f"max_total_bytes={limit} would be exceeded" + (_NO_FLUSH if capturing else ""))

    def _oom(self, nbytes: int, cls: int, why: str) -> srt.OutOfMemoryError:
        with self._lock:
            in_use, held, pool = self._fp.in_use, self._held, self._pool_bytes
            cached = self._cached_locked() + self._in_flight + self._freeing
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
        return self._held - self._fp.in_use - self._in_flight - self._freeing - self._pool_bytes - self._reserving

    # -- release -------------------------------------------------------------------------------
    def _release_slow(self, ptr: int, nbytes: int, streams: Set[srt.Stream] | None) -> None:
        """:meth:`CachedBuffer.release` beyond its fast path: streams to wait for, debug, a closed allocator."""
        cls, free = self._entry(nbytes)
        fence: Fence | None = None
        if self._closed:
            self._release_after_close(ptr, nbytes, cls, streams or ())
            return
        if self._debug is not None:
            fence = self._debug.poison(ptr, cls, streams or frozenset())
        elif streams:
            fence = Fence.record(self._runtime, self._events, streams, check_capture=self._check_capture)
        with self._lock:
            closed = self._closed
            if not closed:
                self._fp.in_use -= cls
                self._fp.requested -= nbytes
                if fence is None or fence.is_empty:
                    free.append(ptr)
                else:
                    self._pend_locked(ptr, cls, fence)
        if closed:
            if fence is not None:
                fence.discard(self._events)
            self._release_after_close(ptr, nbytes, cls, streams or ())
        elif self._fp.post_release:
            self._after_release()

    def _finish_release(self, buf: CachedBuffer, step: int) -> None:
        """The rest of a :meth:`CachedBuffer.release` after ``FastPath.give`` returned ``step`` (1 or 2)."""
        if step == 1:
            self._release_slow(buf._ptr, buf._nbytes, buf._streams)
        else:
            self._after_release()

    def _pend_locked(self, ptr: int, cls: int, fence: Fence) -> None:
        """Put a block in flight: reusable once ``fence`` is found passed. Lock held."""
        queue = self._pending.get(cls)
        if queue is None:
            queue = self._pending[cls] = deque()
        queue.append((ptr, fence))
        self._in_flight += cls

    def _after_release(self) -> None:
        """After a release: drain the cache if the allocator closed meanwhile, else keep the cache limit."""
        if self._closed:
            with self._lock:
                blocks = self._take_ready_locked()
            self._submit_frees(blocks, wait=False)
        else:
            self._enforce_cache_limit()

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
                    self._ready.setdefault(cls, []).append(ptr)
            else:
                for ptr, cls in blocks:
                    self._pend_locked(ptr, cls, fence)
        if closed:
            self._runtime.releaser.submit(self._free_after_fence, list(blocks), fence)

    def _release_after_close(self, ptr: int, nbytes: int, cls: int, streams: Iterable[srt.Stream]) -> None:
        """A buffer released after :meth:`close`: freed once its streams pass (on the releaser thread)."""
        with self._lock:
            self._fp.in_use -= cls
            self._fp.requested -= nbytes
            self._freeing += cls
        runtime = self._runtime
        fence = Fence() if runtime.is_closed else Fence.record(runtime, self._events, streams, check_capture=self._check_capture)
        runtime.releaser.submit(self._free_after_fence, [(ptr, cls)], fence)

    def _free_after_fence(self, blocks: list[tuple[int, int]], fence: Fence) -> None:
        """On the releaser thread: wait for ``fence``, then free ``blocks``."""
        if self._runtime.is_closed:
            fence.discard(self._events)
        elif not fence.wait(self._runtime, self._events):
            # A stream is still capturing a graph that may use the blocks: they cannot be freed safely.
            with self._lock:
                for _ptr, cls in blocks:
                    self._freeing -= cls
                    self._held -= cls
            return
        self._free_now(blocks)

    # -- freeing -----------------------------------------------------------------------------------
    def _free_now(self, blocks: list[tuple[int, int]]) -> None:
        """Give ``blocks`` back to the source. Runs on the releaser thread (or inline after it stopped)."""
        error: BaseException | None = None
        free = self._source.free
        runtime_open = not self._runtime.is_closed
        for ptr, cls in blocks:
            try:
                if runtime_open:
                    free(ptr)
            except BaseException as exc:  # keep freeing the others; report the first failure
                if error is None:
                    error = exc
            finally:
                with self._lock:
                    self._freeing -= cls
                    self._held -= cls
                    self._frees += 1
        self._maybe_close_source()
        if error is not None:
            raise error

    def _submit_frees(self, blocks: list[tuple[int, int]], *, wait: bool) -> None:
        """Free ``blocks`` (already counted in ``_freeing``) on the releaser thread; ``wait`` blocks until done."""
        if not blocks:
            return
        releaser = self._runtime.releaser
        if threading.get_ident() == releaser.thread_ident:
            self._free_now(blocks)
            return
        if not wait:
            releaser.submit(self._free_now, blocks)
            return
        done = threading.Event()

        def free_then_signal() -> None:
            try:
                self._free_now(blocks)
            finally:
                done.set()

        releaser.submit(free_then_signal)
        done.wait()

    def _take_ready_locked(self) -> list[tuple[int, int]]:
        blocks: list[tuple[int, int]] = []
        for cls, free in self._ready.items():
            while True:
                ptr = _pop(free)
                if not ptr:
                    break
                blocks.append((ptr, cls))
                self._freeing += cls
        return blocks

    def _poll_all_locked(self) -> None:
        """Move every pending block whose fence has passed to the cache (not during a capture)."""
        if _captures.captures_underway():
            return
        runtime, events = self._runtime, self._events
        for cls, queue in self._pending.items():
            if not queue:
                continue
            still: deque[tuple[int, Fence]] = deque()
            free = self._ready.setdefault(cls, [])
            for ptr, fence in queue:
                if fence.poll(runtime, events):
                    self._in_flight -= cls
                    free.append(ptr)
                else:
                    still.append((ptr, fence))
            queue.clear()
            queue.extend(still)

    def _enforce_cache_limit(self) -> None:
        """Free cached blocks, largest first, until cached + in flight is within ``max_cached_bytes``."""
        if self._max_cached is None:
            return
        with self._lock:
            if self._in_flight and self._cached_locked() + self._in_flight > self._max_cached:
                self._poll_all_locked()
            blocks = self._evict_locked()
        self._submit_frees(blocks, wait=False)

    def _evict_locked(self) -> list[tuple[int, int]]:
        """Take cached blocks, largest first, until cached + in flight is within ``max_cached_bytes``."""
        limit = self._max_cached
        blocks: list[tuple[int, int]] = []
        if limit is None or self._cached_locked() + self._in_flight <= limit:
            return blocks
        for cls in sorted((c for c, free in self._ready.items() if free), reverse=True):
            free = self._ready[cls]
            while self._cached_locked() + self._in_flight > limit:
                ptr = _pop(free)
                if not ptr:
                    break
                blocks.append((ptr, cls))
                self._freeing += cls
            if self._cached_locked() + self._in_flight <= limit:
                break
        self._evictions += len(blocks)
        return blocks

    def _flush(self, *, count: bool = True) -> None:
        """Out of memory: free every cached block, wait for in-flight ones and free them too."""
        capturing = _captures.captures_underway()
        with self._lock:
            self._flushes += count
            blocks = self._take_ready_locked()
            waiting: list[tuple[int, int, Fence]] = []
            if not capturing:
                for cls, queue in self._pending.items():
                    while queue:
                        ptr, fence = queue.popleft()
                        waiting.append((ptr, cls, fence))
                        self._in_flight -= cls
                        self._freeing += cls
        runtime, events = self._runtime, self._events
        passed: dict[int, bool] = {}  # one wait per fence: entries sharing a fence were taken out together
        for _ptr, _cls, fence in waiting:
            if id(fence) not in passed:
                passed[id(fence)] = fence.wait(runtime, events)
        back = [(ptr, cls, fence) for ptr, cls, fence in waiting if not passed[id(fence)]]
        blocks.extend((ptr, cls) for ptr, cls, fence in waiting if passed[id(fence)])
        if back:  # a stream is still capturing: back to in flight, all together
            with self._lock:
                for ptr, cls, fence in back:
                    self._freeing -= cls
                    self._pend_locked(ptr, cls, fence)
        self._submit_frees(blocks, wait=True)

    # -- capture pools -------------------------------------------------------------------------------
    def capture_pool(self, stream: srt.Stream | None = None, *, reserve: Iterable[int] = ()) -> CapturePool:
        """A capture-private pool: memory that lives as long as a graph.

        ``stream``: the stream to be captured; while the pool is entered
        (``with pool:``) every ``allocate(n, stream=stream)`` is served by it.
        ``reserve``: request sizes to obtain now, before the capture, one block
        each (a capture may not call a synchronizing malloc). See
        :class:`~allocators.CapturePool` for the hand-off to the graph.
        """
        if stream is not None:
            self._check_stream(stream)
        with self._lock:
            if self._closed:
                raise srt.ClosedError(f"{type(self).__name__} is closed")
            pool = CapturePool(self, stream)
        try:
            for nbytes in reserve:
                pool.reserve(nbytes)
        except BaseException:
            pool.close()
            raise
        return pool

    def take_capture_pool(self, stream: srt.Stream) -> CapturePool | None:
        """The pool made implicitly for the latest capture on ``stream`` (an ``allocate(n, stream=stream)``
        found it capturing), now owned by the caller, who closes it with the graph; ``None`` if none."""
        self._check_stream(stream)
        with self._lock:
            pool = self._implicit.pop(stream, None)
        if pool is not None:
            pool._unbind()
        return pool

    def _check_stream(self, stream: Any) -> None:
        if not isinstance(stream, srt.Stream):
            raise TypeError(f"stream must be a streamrt.Stream, not {type(stream).__name__}")
        if stream.runtime is not self._runtime:
            raise ValueError("stream belongs to another runtime")

    def _route(self, stream: srt.Stream) -> CapturePool | None:
        """The capture pool serving allocations on ``stream`` now, or ``None`` for the cache."""
        self._check_stream(stream)
        if self._bindings:
            pool = self._bindings.get(stream)
            if pool is not None:
                if not pool.is_implicit:
                    return pool
                if not stream.is_closed and self._backend.stream_is_capturing(stream.handle):
                    return pool
                pool._unbind()  # its capture ended; it waits in _implicit for take_capture_pool
        if self._detect_capture and not stream.is_closed and self._backend.stream_is_capturing(stream.handle):
            return self._implicit_pool(stream)
        return None

    def _implicit_pool(self, stream: srt.Stream) -> CapturePool:
        """Bind a new pool to ``stream``, found capturing with no pool bound to it."""
        with self._lock:
            if self._closed:
                raise srt.ClosedError(f"{type(self).__name__} is closed")
            pool = self._bindings.get(stream)
            if pool is not None:  # another thread bound one meanwhile
                return pool
            # An unclaimed pool of an earlier capture on this stream stays open (its graph
            # may still be replayed) until close(); take_capture_pool returns the latest.
            pool = CapturePool(self, stream, implicit=True)
            self._implicit[stream] = pool
            pool._bind_locked()
        return pool

    # -- maintenance -------------------------------------------------------------------------------
    def statistics(self) -> CachingAllocatorStatistics:
        """A snapshot of the counters. Queries the fences of in-flight blocks first (not during a capture),
        and frees blocks found passed beyond ``max_cached_bytes``."""
        evicted: list[tuple[int, int]] = []
        with self._lock:
            if not self._closed:
                self._poll_all_locked()
                evicted = self._evict_locked()
            # Read every counter in one run with no call in between (see the module docstring).
            fp = self._fp
            held, in_use, requested, in_flight, freeing, pool, reserving, peak, hits, misses = (
                self._held, fp.in_use, fp.requested, self._in_flight, self._freeing,
                self._pool_bytes, self._reserving, fp.peak, fp.hits, self._misses,
            )  # fmt: skip
            frees, flushes, evictions = self._frees, self._flushes, self._evictions
        self._submit_frees(evicted, wait=False)
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
            max_cached_bytes=self._max_cached,
            max_total_bytes=self._max_total,
        )

    def _cached_in_lists(self) -> int:
        """Bytes in the free lists, counted one by one (tests compare it with ``cached_bytes``)."""
        with self._lock:
            return sum(cls * len(free) for cls, free in self._ready.items())

    def reset_peak(self) -> None:
        """Restart ``peak_in_use_bytes`` from the current ``in_use_bytes``."""
        with self._lock:
            self._fp.peak = self._fp.in_use

    def trim(self, *, wait: bool = True) -> None:
        """Give every cached block back to the source.

        In-flight blocks whose streams have passed are freed too; the others
        stay in flight (nothing waits for them). Capture pools are left alone.
        The frees run on the releaser thread; ``wait`` (default) blocks until
        they have run. Note that the drivers' free (``cudaFree``,
        ``hipHostFree``, the simulator's) itself waits for the device to be idle.
        """
        with self._lock:
            if self._closed:
                return
            self._poll_all_locked()
            blocks = self._take_ready_locked()
        self._submit_frees(blocks, wait=wait)

    def close(self) -> None:
        """Wait for in-flight work, free every cached block, close the capture pools. Idempotent.

        Buffers still in use stay valid; each is freed when released (after its
        streams pass). ``allocate`` then raises ``ClosedError``. Blocks that a
        stream still capturing may use are not freed.
        """
        with self._lock:
            if self._closed:
                return
            pools = list(self._pools)
        for pool in pools:
            pool.close()
        with self._lock:
            self._closed = True
            self._fp.post_release = True
            self._fast.clear()
            self._implicit.clear()
            self._bindings.clear()
        self._flush(count=False)
        self._events.close()
        if self._debug is not None:
            self._debug.close()
        self._maybe_close_source()

    def _maybe_close_source(self) -> None:
        with self._lock:
            if not self._closed or self._source_closed or self._fp.in_use or self._freeing or self._pool_bytes:
                return
            self._source_closed = True
        self._source.close()

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<{type(self).__name__} over {self._source!r}{state}>"


class CachingPinnedAllocator(CachingAllocator):
    """Caching allocator of page-locked host memory (``kind == "host"``).

    A reused block is handed out only after every stream that used it has
    passed its release, so the host may write into it at once. See
    :class:`CachingAllocator` for the arguments.
    """

    __slots__ = ()

    kind = "host"


class CachingDeviceAllocator(CachingAllocator):
    """Caching allocator of device memory (``kind == "device"``). See :class:`CachingAllocator`."""

    __slots__ = ()

    kind = "device"
