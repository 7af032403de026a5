"""The caching allocators' hot path: a cache hit, and the release of a block no stream used.

:class:`FastPath` is implemented twice with one contract: in C (``_fastpath_c.c``, built by
``pip install``; what :data:`FastPath` is when it was built) and here in Python
(:class:`PyFastPath`, the fallback). The tests run the allocators over both.

One FastPath belongs to one allocator:

* ``take(nbytes)``: a new buffer of ``buffer_type`` over a cached block of the
  request size, or ``None`` when ``nbytes`` is not an exact ``int``, the size is
  not memoized in ``fast``, or its free list is empty (the caller's slow path
  then decides).
* ``hand_out(ptr, nbytes, entry)``: a new buffer over ``ptr`` (for the
  allocator's slow path; no counter changes).
* ``give(buffer)``: ``0``: the block is back in its free list; ``1``: the
  buffer needs the slow path (a stream used it; only ``_released`` was set);
  ``2``: back in its free list and ``post_release`` asks the allocator to look
  (it closed meanwhile, or keeps a cache limit). Raises ``ValueError`` when the
  buffer was released already.

``fast`` maps a request size to ``(size class, free list of addresses)``; the
allocator fills it. The counters ``hits``, ``in_use``, ``peak`` and
``requested`` (bytes) are read and updated by the allocator's slow paths under
its lock. Both calls rely on the GIL: neither calls other Python code (nor
checks for a thread switch) between reading and updating the lists and
counters, so each is atomic with respect to other threads. On a free-threaded
interpreter the allocators do not use a FastPath at all.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["GIL_ENABLED", "NATIVE", "FastPath", "PyFastPath"]

_new = object.__new__


class PyFastPath:
    """The Python implementation of the FastPath contract (see the module docstring)."""

    __slots__ = ("_type", "_fast", "hits", "in_use", "peak", "requested", "post_release")

    def __init__(self, buffer_type: type, fast: dict[int, tuple[int, list[int]]]) -> None:
        self._type = buffer_type
        self._fast = fast
        self.hits = self.in_use = self.peak = self.requested = 0
        self.post_release = False

    def take(self, nbytes: Any) -> Any:
        if type(nbytes) is not int:
            return None
        entry = self._fast.get(nbytes)
        if entry is None:
            return None
        try:
            ptr = entry[1].pop()
        except IndexError:
            return None
        # One run of attribute updates with no call in between: atomic under the GIL.
        self.hits += 1
        in_use = self.in_use + entry[0]
        self.in_use = in_use
        if in_use > self.peak:
            self.peak = in_use
        self.requested += nbytes
        return self.hand_out(ptr, nbytes, entry)

    def hand_out(self, ptr: int, nbytes: int, entry: tuple[int, list[int]]) -> Any:
        buf: Any = _new(self._type)
        buf._ptr = ptr
        buf._nbytes = nbytes
        buf._released = False
        buf._streams = None
        buf._entry = entry
        return buf

    def give(self, buf: Any) -> int:
        if buf._released:
            raise ValueError("buffer released twice")
        buf._released = True
        if buf._streams:
            return 1
        cls, free = buf._entry
        # Counters first, then the append: a block in a free list is always counted as cached.
        self.in_use -= cls
        self.requested -= buf._nbytes
        free.append(buf._ptr)
        return 2 if self.post_release else 0


#: The hot path needs the GIL (see the module docstring): off on a free-threaded interpreter.
GIL_ENABLED = bool(getattr(sys, "_is_gil_enabled", lambda: True)())

FastPath: type[PyFastPath] | type[_fastpath_c.FastPath] = PyFastPath
NATIVE = False
if GIL_ENABLED:  # (importing a C module that does not declare itself free-threading-safe re-enables the GIL)
    try:
        from . import _fastpath_c
    except ImportError:  # not built (no compiler at install time): the Python implementation
        pass
    else:
        FastPath = _fastpath_c.FastPath
        NATIVE = True
