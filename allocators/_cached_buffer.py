"""The buffers the caching allocators hand out: ``streamrt.Buffer`` built through the allocator seam."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import streamrt as srt

if TYPE_CHECKING:
    from ._caching import CachingAllocator
    from ._fastpath import Entry

__all__ = ["CachedBuffer"]


class CachedBuffer(srt.Buffer):
    """A :class:`streamrt.Buffer` handed out by a :class:`~allocators.CachingAllocator`.

    It behaves as any allocator Buffer; only the round trip is specialised.
    Each allocator hands out its own subclass, made by
    ``streamrt.Buffer.allocation_type`` (kind, runtime and allocator are class
    attributes), so the hot path (:mod:`allocators._fastpath`) builds a buffer
    by setting streamrt's allocation fields and :attr:`_entry`, with no
    ``__init__``. Its ``release`` gives the block back through that hot path:
    a block no stream but its own used goes straight back to its free list.
    Not constructed by hand. Thread rules are Buffer's.
    """

    __slots__ = ("_entry",)  # (size class, free list, home): where release puts the block back (allocators._fastpath)
    # Set by each allocator's subclass.
    _allocator: CachingAllocator
    _give: Callable[[CachedBuffer], int]
    _entry: Entry

    def __init__(self) -> None:
        raise TypeError("CachedBuffers are made by a CachingAllocator's allocate()")

    def release(self) -> None:
        """Give the block back to its allocator: cached at once if no stream but its own used it, else
        in flight until every stream that did has passed. Non-blocking. Releasing twice raises ``ValueError``."""
        step = self._give(self)  # the allocator's FastPath.give (allocators._fastpath)
        if step:
            self._allocator._finish_release(self, step)

    def _release_locked(self) -> None:
        """``release`` of an allocator without the lock-free hot path (debug mode, no GIL)."""
        if self._released:
            raise ValueError("buffer released twice")
        self._released = True
        self._allocator._release_slow(self._ptr, self._nbytes, self._streams, self._entry)
