"""Capture-private pools: memory that lives as long as a graph.

A graph captured from a stream keeps the addresses its nodes used; every
replay reads and writes them again. Memory allocated during the capture must
therefore stay reserved for the graph's whole life, not return to the cache
when its Buffer is released. A :class:`CapturePool` owns such memory:

* blocks it hands out are never reused by anything else while it is open,
  not even by the pool itself after they are released;
* closing the pool (what ``Graph.close`` does) returns every block to the
  allocator's cache once the streams the graph was launched on have passed
  (or, when none are named, once the whole device has);
* no synchronizing call is made while it is entered: it hands out blocks
  reserved beforehand (:meth:`CapturePool.reserve`) or blocks already free
  in the allocator's cache; the source is called during a capture only if
  it is ``capture_safe``; otherwise the allocation raises
  :class:`streamrt.CaptureError` before anything happens, naming the size
  to reserve.

The hand-off, for code that captures graphs (streamrt's pipelines)::

    pools = [a.capture_pool(stream, reserve=sizes_a) for a in (rt.host_allocator, rt.device_allocator)
             if hasattr(a, "capture_pool")]
    with contextlib.ExitStack() as stack:
        for pool in pools:
            stack.enter_context(pool)         # allocate(n, stream=stream) now comes from the pool
        backend.stream_begin_capture(...); ...; graph = backend.stream_end_capture(...)
    graph_object.pools = pools                # the Graph owns them ...
    ...
    for pool in pools:                        # ... and in Graph.close():
        pool.close(streams=streams_the_graph_was_launched_on)

A stream found capturing by ``allocate(n, stream=s)`` with no pool entered for
it gets an *implicit* pool; ``allocator.take_capture_pool(s)`` hands it to the
graph's owner. Unclaimed implicit pools stay open until the allocator closes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import streamrt as srt

from . import _captures
from ._fence import Fence
from ._free_lists import pop

if TYPE_CHECKING:
    from collections.abc import Iterable, Set

    from ._caching import CachingAllocator

__all__ = ["CapturePool"]


class CapturePool:
    """Memory for one graph. Create with ``allocator.capture_pool(stream, reserve=...)``.

    ``with pool:`` marks a capture underway on :attr:`stream`: allocations on
    that stream are served by the pool, and every caching allocator stops
    querying events (illegal during a global-mode capture). Leaving the
    ``with`` block ends that; the pool and its memory stay until :meth:`close`.

    Thread rules: all methods may be called from any thread; the pool shares
    its allocator's lock.
    """

    def __init__(self, allocator: CachingAllocator, stream: srt.Stream | None, *, implicit: bool = False) -> None:
        self._alloc = allocator
        self._stream = stream
        self._implicit = implicit
        self._free: dict[int, list[int]] = {}  # size class -> reserved blocks, never handed out
        self._out: dict[int, int] = {}  # ptr -> size class, handed out and not released
        self._retired: list[tuple[int, int]] = []  # released; kept until close
        self._nbytes = 0
        self._bound = False
        self._closed = False
        self._close_streams: tuple[srt.Stream, ...] = ()
        self._deallocate_cb = self._deallocate
        allocator._pools.add(self)

    # -- properties -------------------------------------------------------------------------
    @property
    def allocator(self) -> CachingAllocator:
        return self._alloc

    @property
    def stream(self) -> srt.Stream | None:
        """The stream whose allocations the pool serves while entered."""
        return self._stream

    @property
    def is_implicit(self) -> bool:
        """Made by the allocator for a stream found capturing (see ``take_capture_pool``)."""
        return self._implicit

    @property
    def is_active(self) -> bool:
        """Entered (a capture is underway) and not yet left."""
        return self._bound

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def nbytes(self) -> int:
        """Bytes of all blocks the pool owns (reserved, handed out, released)."""
        return self._nbytes

    # -- memory ---------------------------------------------------------------------------------
    def reserve(self, nbytes: int, count: int = 1) -> None:
        """Obtain ``count`` blocks for requests of ``nbytes`` bytes now, before a capture.

        Takes free blocks from the allocator's cache first, then asks the
        source (which may block, flush and raise ``OutOfMemoryError``).
        Raises ``CaptureError`` while the pool is entered and the source is not capture-safe.
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"count must be a non-negative int, got {count!r}")
        alloc = self._alloc
        cls = alloc.block_size(nbytes)
        capturing = self._bound or _captures.captures_underway()
        for _ in range(count):
            with alloc._lock:
                self._check_open()
                ptr = self._from_cache_locked(cls)
            if not ptr:
                if capturing and not alloc._source.capture_safe:
                    raise srt.CaptureError(f"cannot reserve during a graph capture: {alloc._source!r} may synchronize")
                ptr = alloc._obtain(cls, nbytes, None, capturing=capturing)
                with alloc._lock:
                    alloc._reserving -= cls
                    alloc._pool_bytes += cls
                    self._nbytes += cls
            with alloc._lock:
                closed = self._closed
                if not closed:
                    self._free.setdefault(cls, []).append(ptr)
            if closed:  # closed meanwhile by another thread
                alloc._adopt_blocks([(ptr, cls)], Fence())
                self._check_open()

    def _from_cache_locked(self, cls: int) -> int:
        """A free block of the allocator's cache, now the pool's; 0 if none. No event is queried."""
        alloc = self._alloc
        free = alloc._lists.ready.get(cls)
        ptr = pop(free) if free else 0
        if ptr:
            alloc._pool_bytes += cls
            self._nbytes += cls
        return ptr

    def allocate(self, nbytes: int, *, stream: srt.Stream | None = None) -> srt.Buffer:
        """A Buffer from the pool: a reserved block, else a free block of the cache, else the source.

        During a capture (the pool entered) the source is used only if it is
        capture-safe; otherwise raises ``CaptureError`` naming the size to reserve.
        """
        alloc = self._alloc
        cls = alloc.block_size(nbytes)
        if stream is not None:
            alloc._check_stream(stream)
        nbytes = int(nbytes)
        capturing = self._bound or _captures.captures_underway()
        with alloc._lock:
            self._check_open()
            free = self._free.get(cls)
            ptr = free.pop() if free else self._from_cache_locked(cls)
            if ptr:
                alloc._fp.hits += 1
                self._out[ptr] = cls
        if not ptr:
            source = alloc._source
            if capturing and not source.capture_safe:
                raise srt.CaptureError(
                    f"the capture pool has no free {cls}-byte block for a {nbytes}-byte request, and {source!r} "
                    f"cannot allocate during a graph capture: reserve it before capturing "
                    f"(allocator.capture_pool(stream, reserve=[{nbytes}]) or pool.reserve({nbytes}))"
                )
            ptr = alloc._obtain(cls, nbytes, stream, capturing=capturing)
            with alloc._lock:
                alloc._reserving -= cls
                alloc._misses += 1
                alloc._pool_bytes += cls
                self._nbytes += cls
                self._out[ptr] = cls
        buf = srt.Buffer(ptr, nbytes, alloc.kind, alloc._runtime, deallocate=self._deallocate_cb, stream=stream)
        if alloc._debug is not None:
            alloc._debug.handed_out(ptr, cls)
        return buf

    def _deallocate(self, ptr: int, _nbytes: int, streams: Set[srt.Stream]) -> None:
        """The buffers' stream-ordered release: kept for the graph while open; after close, back to the cache."""
        alloc = self._alloc
        if alloc._debug is not None:
            alloc._debug.released(ptr)
        with alloc._lock:
            cls = self._out.pop(ptr)
            if not self._closed:
                self._retired.append((ptr, cls))
                return
            self._nbytes -= cls
            after = self._close_streams
        runtime = alloc._runtime
        used = set(streams) | set(after)
        if runtime.is_closed:
            fence = Fence()
        elif used:
            fence = Fence.record(runtime, alloc._events, used, check_capture=alloc._check_capture)
        else:
            fence = Fence.device_wide(runtime)
        alloc._adopt_blocks([(ptr, cls)], fence)

    # -- capture scope -----------------------------------------------------------------------------
    def __enter__(self) -> CapturePool:
        with self._alloc._lock:
            self._bind_locked()
        return self

    def __exit__(self, *exc: object) -> None:
        self._unbind()

    def _bind_locked(self) -> None:
        self._check_open()
        if self._bound:
            raise RuntimeError("this capture pool is already entered")
        stream = self._stream
        if stream is not None:
            bindings = self._alloc._bindings
            other = bindings.get(stream)
            if other is not None:
                if not other._implicit:
                    raise ValueError(f"another capture pool is already entered for {stream!r}")
                other._unbind_locked()  # a stale implicit pool of an earlier, finished capture
            bindings[stream] = self
        self._bound = True
        if self._implicit and stream is not None:
            _captures.track_implicit(stream)
        else:
            _captures.begin_explicit()

    def _unbind(self) -> None:
        with self._alloc._lock:
            self._unbind_locked()

    def _unbind_locked(self) -> None:
        if not self._bound:
            return
        self._bound = False
        stream = self._stream
        if stream is not None:
            bindings = self._alloc._bindings
            if bindings.get(stream) is self:
                del bindings[stream]
        if self._implicit and stream is not None:
            _captures.untrack_implicit(stream)
        else:
            _captures.end_explicit()

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self, streams: Iterable[srt.Stream] = ()) -> None:
        """The graph is gone: return the pool's blocks to the allocator's cache. Idempotent.

        ``streams``: the streams the graph was launched on; the blocks become
        reusable once they have passed this point. With none named, once all
        work on the device has completed (a synchronize on the releaser
        thread). Buffers still handed out return to the cache when released.
        Non-blocking.
        """
        streams = tuple(streams)
        alloc = self._alloc
        for s in streams:
            alloc._check_stream(s)
        with alloc._lock:
            if self._closed:
                return
            self._closed = True
            self._unbind_locked()
            alloc._pools.discard(self)
            if self._stream is not None and alloc._implicit.get(self._stream) is self:
                del alloc._implicit[self._stream]
            reserved = [(ptr, cls) for cls, ptrs in self._free.items() for ptr in ptrs]
            retired = self._retired
            self._free = {}
            self._retired = []
            self._nbytes -= sum(cls for _p, cls in reserved) + sum(cls for _p, cls in retired)
            self._close_streams = streams
        if reserved:
            alloc._adopt_blocks(reserved, Fence())
        if retired:
            runtime = alloc._runtime
            if runtime.is_closed:
                fence = Fence()
            elif streams:
                fence = Fence.record(runtime, alloc._events, streams, check_capture=alloc._check_capture)
            else:
                fence = Fence.device_wide(runtime)
            alloc._adopt_blocks(retired, fence)

    def _check_open(self) -> None:
        if self._closed:
            raise srt.ClosedError("capture pool is closed")

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("active" if self._bound else "open")
        kind: Any = self._alloc.kind
        return f"<CapturePool {kind} {state} nbytes={self._nbytes}{' implicit' if self._implicit else ''}>"
