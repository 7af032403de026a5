"""The caching allocators' way back to the source: trim, eviction, the out-of-memory flush and close.

Every real free runs on the runtime's releaser thread (or inline once it has
stopped), after the streams that used the block have passed: blocks of the
shared lists have, blocks of a stream's own list wait for one event on that
stream first, blocks in flight wait for their fence.

These functions are parts of :class:`~allocators.CachingAllocator`, kept
apart because they are one concept: how memory leaves the cache. Each takes
the allocator; the names ending in ``_locked`` run with its lock held.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import streamrt as srt

from . import _captures
from ._fence import Fence
from ._free_lists import pop

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ._caching import CachingAllocator

__all__ = ["after_release", "close", "evict_locked", "flush", "free_after_fence", "release_after_close", "submit_frees", "trim"]

Blocks = list[tuple[int, int]]  # (ptr, size class)


# -- after a release -------------------------------------------------------------------------
def after_release(a: CachingAllocator) -> None:
    """After a release: drain the cache if the allocator closed meanwhile, else keep the cache limit."""
    if a._closed:
        with a._lock:
            blocks = take_ready_locked(a)
        submit_frees(a, blocks, wait=False)
    else:
        enforce_cache_limit(a)


def release_after_close(a: CachingAllocator, ptr: int, nbytes: int, cls: int, streams: Iterable[srt.Stream]) -> None:
    """A buffer released after :meth:`close`: freed once its streams pass (on the releaser thread)."""
    with a._lock:
        a._fp.in_use -= cls
        a._fp.requested -= nbytes
        a._freeing += cls
    runtime = a._runtime
    fence = Fence() if runtime.is_closed else Fence.record(runtime, a._events, streams, check_capture=a._check_capture)
    runtime.releaser.submit(free_after_fence, a, [(ptr, cls)], fence)


# -- freeing -----------------------------------------------------------------------------------
def free_after_fence(a: CachingAllocator, blocks: Blocks, fence: Fence) -> None:
    """On the releaser thread: wait for ``fence``, then free ``blocks``."""
    if a._runtime.is_closed:
        fence.discard(a._events)
    elif not fence.wait(a._runtime, a._events):
        # A stream is still capturing a graph that may use the blocks: they cannot be freed safely.
        with a._lock:
            for _ptr, cls in blocks:
                a._freeing -= cls
                a._held -= cls
        return
    free_now(a, blocks)


def free_now(a: CachingAllocator, blocks: Blocks) -> None:
    """Give ``blocks`` back to the source. Runs on the releaser thread (or inline after it stopped)."""
    error: BaseException | None = None
    free = a._source.free
    runtime_open = not a._runtime.is_closed
    for ptr, cls in blocks:
        try:
            if runtime_open:
                free(ptr)
        except BaseException as exc:  # keep freeing the others; report the first failure
            if error is None:
                error = exc
        finally:
            with a._lock:
                a._freeing -= cls
                a._held -= cls
                a._frees += 1
    maybe_close_source(a)
    if error is not None:
        raise error


def submit_frees(a: CachingAllocator, blocks: Blocks, *, wait: bool, fence: Fence | None = None) -> None:
    """Free ``blocks`` (already counted in ``_freeing``) on the releaser thread, after ``fence`` if one
    is given; ``wait`` blocks until done."""
    if not blocks:
        return
    releaser = a._runtime.releaser
    job: Any = free_now if fence is None else free_after_fence
    args: tuple[Any, ...] = (a, blocks) if fence is None else (a, blocks, fence)
    if threading.get_ident() == releaser.thread_ident:
        job(*args)
        return
    if not wait:
        releaser.submit(job, *args)
        return
    done = threading.Event()

    def free_then_signal() -> None:
        try:
            job(*args)
        finally:
            done.set()

    releaser.submit(free_then_signal)
    done.wait()


def take_ready_locked(a: CachingAllocator) -> Blocks:
    """Every block of the shared lists, now counted as being freed."""
    blocks = a._lists.take_ready()
    for _ptr, cls in blocks:
        a._freeing += cls
    return blocks


# -- the cache limit ------------------------------------------------------------------------------
def enforce_cache_limit(a: CachingAllocator) -> None:
    """Free cached blocks, largest first, until cached + in flight is within ``max_cached_bytes``."""
    if a._max_cached is None:
        return
    with a._lock:
        if a._lists.in_flight and a._cached_locked() + a._lists.in_flight > a._max_cached:
            a._poll_all_locked()
        blocks = evict_locked(a)
    submit_frees(a, blocks, wait=False)


def evict_locked(a: CachingAllocator) -> Blocks:
    """Take cached blocks, largest first, until cached + in flight is within ``max_cached_bytes``.

    Blocks of streams' own lists cannot be freed before their stream passes:
    when the shared lists are not enough they are all put in flight (one
    event per stream), and freed once found passed.
    """
    limit = a._max_cached
    blocks: Blocks = []
    lists = a._lists
    if limit is None or a._cached_locked() + lists.in_flight <= limit:
        return blocks
    for cls in sorted((c for c, free in lists.ready.items() if free), reverse=True):
        free = lists.ready[cls]
        while a._cached_locked() + lists.in_flight > limit and (ptr := pop(free)):
            blocks.append((ptr, cls))
            a._freeing += cls
        if a._cached_locked() + lists.in_flight <= limit:
            break
    a._evictions += len(blocks)
    if lists.own and a._cached_locked() + lists.in_flight > limit and not _captures.captures_underway():
        a._fence_own_locked()
    return blocks


# -- flush, trim, close -------------------------------------------------------------------------------
def flush(a: CachingAllocator, *, count: bool = True) -> None:
    """Out of memory: free every cached block, wait for in-flight ones and free them too."""
    capturing = _captures.captures_underway()
    with a._lock:
        a._flushes += count
        if not capturing and a._lists.own:
            a._fence_own_locked()
        blocks = take_ready_locked(a)
        waiting: list[tuple[int, int, Fence]] = []
        if not capturing:
            waiting = a._lists.take_pending()
            for _ptr, cls, _fence in waiting:
                a._freeing += cls
    runtime, events = a._runtime, a._events
    passed: dict[int, bool] = {}  # one wait per fence: entries sharing a fence were taken out together
    for _ptr, _cls, fence in waiting:
        if id(fence) not in passed:
            passed[id(fence)] = fence.wait(runtime, events)
    back = [(ptr, cls, fence) for ptr, cls, fence in waiting if not passed[id(fence)]]
    blocks.extend((ptr, cls) for ptr, cls, fence in waiting if passed[id(fence)])
    if back:  # a stream is still capturing: back to in flight, all together
        with a._lock:
            for ptr, cls, fence in back:
                a._freeing -= cls
                a._lists.pend(ptr, cls, fence)
    submit_frees(a, blocks, wait=True)


def trim(a: CachingAllocator, *, wait: bool = True) -> None:
    """:meth:`CachingAllocator.trim`."""
    groups: list[tuple[Blocks, Fence]] = []
    with a._lock:
        if a._closed:
            return
        a._poll_all_locked()
        blocks = take_ready_locked(a)
        if a._lists.own and not _captures.captures_underway():
            runtime = a._runtime
            for stream, own in a._lists.take_own():
                fence = Fence.record(runtime, a._events, (stream,), check_capture=a._check_capture)
                for _ptr, cls in own:
                    a._freeing += cls
                groups.append((own, fence))
    submit_frees(a, blocks, wait=wait)
    for own, fence in groups:
        submit_frees(a, own, wait=wait, fence=fence)


def close(a: CachingAllocator) -> None:
    """:meth:`CachingAllocator.close`."""
    with a._lock:
        if a._closed:
            return
        pools = list(a._pools)
    for pool in pools:
        pool.close()
    with a._lock:
        a._closed = True
        a._fp.post_release = True
        a._lists.forget_memo()
        a._fence_own_locked(retire_all=True)  # later releases take the slow path: freed after their streams
        a._implicit.clear()
        a._bindings.clear()
    flush(a, count=False)
    if a._debug is not None:
        a._debug.close()
    maybe_close_source(a)


def maybe_close_source(a: CachingAllocator) -> None:
    with a._lock:
        if not a._closed or a._source_closed or a._fp.in_use or a._freeing or a._pool_bytes:
            return
        a._source_closed = True
    a._source.close()

