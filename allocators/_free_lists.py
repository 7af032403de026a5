"""The tables of a caching allocator's released blocks: shared free lists, streams' own lists, blocks in flight.

A released block is in one of three places, by size class:

* a **shared list** (``ready``): every stream that used it has passed its
  release; any request may have it;
* a **stream's own list** (``own``): the block was allocated for that stream
  and no other stream used it. Work the stream runs later is ordered after
  everything it did with the block, so ``allocate(n, stream=that_stream)``
  may have it at once, with no event, as CuPy's and torch's pools do. It is
  never handed out for another stream (or for no stream) directly: a request
  elsewhere that finds nothing else first moves it in flight behind one event
  on its stream (:meth:`FreeLists.take_own`);
* **in flight** (``pending``): waiting for a :class:`~allocators._fence.Fence`,
  queried lazily.

An *entry* ``(size class, free list, home)`` tells a hand-out which list its
block goes back to when no other stream used it: ``home`` is ``None`` for a
shared list, else the stream's *holder*, a one-item list ``[stream]`` that all
entries of that stream share. Retiring a stream (closed, or the allocator
closing) sets its holder to ``[None]``: from then on no release puts a block
into its lists (the hot path sends it to the slow path), so lists that
outstanding buffers still name are never left holding blocks.

Thread rules: every method runs with the allocator's lock held. The hot path
(:mod:`allocators._fastpath`) pops from and appends to the lists without it;
a list is never replaced while an entry names it.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import streamrt as srt

from ._fence import Fence

if TYPE_CHECKING:
    from ._fastpath import Entry
    from ._size_classes import SizeClasses

__all__ = ["FreeLists", "pop"]

_MEMO_LIMIT = 4096  # distinct request sizes memoized for the hot path, per table
_POLL_PER_MISS = 4  # pending blocks of a class whose fences one allocate may query


def pop(free: list[int]) -> int:
    """Pop a block, or 0 when the list is (or just became) empty."""
    try:
        return free.pop()
    except IndexError:
        return 0


class FreeLists:
    """Where one allocator's released blocks wait for reuse (see the module docstring)."""

    __slots__ = ("classes", "memoize", "fast", "ready", "streams", "own", "holders", "pending", "in_flight")

    def __init__(self, classes: SizeClasses, *, memoize: bool) -> None:
        self.classes = classes
        self.memoize = memoize  # fill the hot path's tables (off: debug mode, no GIL, closed)
        self.fast: dict[int, Entry] = {}  # request size -> shared entry (the hot path's take)
        self.ready: dict[int, list[int]] = {}  # size class -> shared list (LIFO)
        # stream -> (handle, request size -> own entry): the hot path's take_on.
        self.streams: dict[srt.Stream, tuple[int, dict[int, Entry]]] = {}
        self.own: dict[srt.Stream, dict[int, list[int]]] = {}  # stream -> size class -> its own list
        self.holders: dict[srt.Stream, list[Any]] = {}  # stream -> [stream], shared by its entries
        self.pending: dict[int, deque[tuple[int, Fence]]] = {}  # size class -> in flight, fence not yet seen passed
        self.in_flight = 0  # bytes in ``pending``

    # -- entries ---------------------------------------------------------------------------------
    def entry(self, nbytes: int, home: srt.Stream | None = None) -> Entry:
        """The entry of a validated request size, for ``home``'s own list or (``None``) a shared one; memoized."""
        if home is None:
            got = self.fast.get(nbytes)
            if got is not None:
                return got
            cls = self.classes.round(nbytes)
            new: Entry = (cls, self.ready.setdefault(cls, []), None)
            if self.memoize and len(self.fast) < _MEMO_LIMIT:
                self.fast[nbytes] = new
            return new
        memo = self.streams.get(home)
        if memo is not None:
            got = memo[1].get(nbytes)
            if got is not None:
                return got
        holder = self.holders.get(home)
        if holder is None:
            holder = self.holders[home] = [home]
        cls = self.classes.round(nbytes)
        new = (cls, self.own.setdefault(home, {}).setdefault(cls, []), holder)
        if self.memoize:
            if memo is None:
                memo = self.streams[home] = (home.handle, {})
            if len(memo[1]) < _MEMO_LIMIT:
                memo[1][nbytes] = new
        return new

    def forget_memo(self) -> None:
        """Stop the hot path's hand-outs: it then finds no entry (the allocator closed)."""
        self.memoize = False
        self.fast.clear()
        self.streams.clear()

    # -- hand-outs ---------------------------------------------------------------------------------
    def reclaim(self, cls: int, runtime: srt.Runtime, events: srt.EventPool) -> int:
        """A pending block of ``cls`` whose fence has passed, or 0. Queries at most a few fences.

        Not during a capture (the caller checks): ``event_query`` is illegal then.
        """
        queue = self.pending.get(cls)
        if not queue:
            return 0
        for _ in range(min(len(queue), _POLL_PER_MISS)):
            ptr, fence = queue[0]
            if fence.poll(runtime, events):
                queue.popleft()
                self.in_flight -= cls
                return ptr
            queue.rotate(-1)
        return 0

    # -- in flight -----------------------------------------------------------------------------------
    def pend(self, ptr: int, cls: int, fence: Fence) -> None:
        """Put a block in flight: reusable once ``fence`` is found passed."""
        queue = self.pending.get(cls)
        if queue is None:
            queue = self.pending[cls] = deque()
        queue.append((ptr, fence))
        self.in_flight += cls

    def poll_all(self, runtime: srt.Runtime, events: srt.EventPool) -> None:
        """Move every pending block whose fence has passed to its shared list (not during a capture)."""
        for cls, queue in self.pending.items():
            if not queue:
                continue
            still: deque[tuple[int, Fence]] = deque()
            free = self.ready.setdefault(cls, [])
            for ptr, fence in queue:
                if fence.poll(runtime, events):
                    self.in_flight -= cls
                    free.append(ptr)
                else:
                    still.append((ptr, fence))
            queue.clear()
            queue.extend(still)

    def take_pending(self) -> list[tuple[int, int, Fence]]:
        """Every block in flight, ``(ptr, size class, fence)``, taken out of the tables."""
        taken: list[tuple[int, int, Fence]] = []
        for cls, queue in self.pending.items():
            while queue:
                ptr, fence = queue.popleft()
                taken.append((ptr, cls, fence))
                self.in_flight -= cls
        return taken

    # -- streams' own lists ----------------------------------------------------------------------------
    def take_own(
        self,
        *,
        cls: int | None = None,
        exclude: srt.Stream | None = None,
        closed_only: bool = False,
        retire_all: bool = False,
    ) -> list[tuple[srt.Stream, list[tuple[int, int]]]]:
        """Blocks taken out of streams' own lists, ``(stream, [(ptr, size class), ...])`` per stream.

        ``cls``: only blocks of that size class. ``exclude``: leave that stream's
        lists alone. ``closed_only``: only closed streams. Closed streams are
        retired (see the module docstring); ``retire_all`` retires every stream
        (the allocator is closing). The caller puts the blocks behind a fence on
        their stream (a closed stream's fence waits for the whole device).
        """
        taken: list[tuple[srt.Stream, list[tuple[int, int]]]] = []
        for stream in list(self.own):
            if stream is exclude:
                continue
            retire = retire_all or stream.is_closed
            if closed_only and not retire:
                continue
            if retire:
                holder = self.holders.pop(stream, None)
                if holder is not None:
                    holder[0] = None  # first: no release adds to its lists from now on
                self.streams.pop(stream, None)
            blocks: list[tuple[int, int]] = []
            for c, free in self.own[stream].items():
                if cls is None or c == cls:
                    while ptr := pop(free):
                        blocks.append((ptr, c))
            if retire:
                del self.own[stream]
            if blocks:
                taken.append((stream, blocks))
        return taken

    # -- freeing -------------------------------------------------------------------------------------------
    def take_ready(self) -> list[tuple[int, int]]:
        """Every block of the shared lists, ``(ptr, size class)``, taken out of them."""
        blocks: list[tuple[int, int]] = []
        for cls, free in self.ready.items():
            while ptr := pop(free):
                blocks.append((ptr, cls))
        return blocks

    # -- accounting ----------------------------------------------------------------------------------
    def shared_bytes(self) -> int:
        return sum(cls * len(free) for cls, free in self.ready.items())

    def own_bytes(self) -> int:
        return sum(cls * len(free) for lists in self.own.values() for cls, free in lists.items())
