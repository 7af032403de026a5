"""The caching allocators' hot path: a cache hit, on no stream or on the stream's own free list, and the
release of a block that needs no fence.

:class:`FastPath` is implemented twice with one contract: in C (``_fastpath_c.c``, built by
``pip install``; what :data:`FastPath` is when it was built) and here in Python
(:class:`PyFastPath`, the fallback). The tests run the allocators over both.

One FastPath belongs to one allocator. Its buffers are of ``buffer_type``, a
``streamrt.Buffer.allocation_type`` class, built without ``__init__`` by setting the
fields named in ``fields``: ``streamrt.Buffer.ALLOCATION_FIELDS`` (address, size,
released flag, the set of streams that used it) and the allocator's ``_entry``.

An *entry* is ``(size class, free list, home)``: the list a released block goes back to when
no stream but its home used it. ``home`` is ``None`` for the allocator's shared lists (blocks
every stream that used them has passed), and for a stream's own list (blocks only that stream
used: reusable on it at once, in stream order, with no event) the stream's *holder*
``[stream]``, which the allocator sets to ``[None]`` when it retires the stream's lists
(``allocators._free_lists``).

* ``take(nbytes)``: a new buffer over a block of the shared list of the request size, or
  ``None`` when ``nbytes`` is not an exact ``int``, the size is not memoized in ``fast``, or
  the list is empty (the caller's slow path then decides).
* ``take_on(nbytes, stream)``: a new buffer over a block of ``stream``'s own list, its
  streams ``{stream}``; ``None`` (the slow path decides) when the stream or the size is not
  memoized in ``streams``, the list is empty, the stream is closed, a capture pool is bound
  to some stream (``bindings`` is not empty), or ``is_capturing(handle)`` says the stream is
  capturing (``is_capturing`` is ``None`` when the allocator does not detect captures).
* ``hand_out(ptr, nbytes, entry, stream)``: a new buffer over ``ptr`` (for the slow path; no
  counter changes); its streams are ``{stream}``, or ``None`` when ``stream`` is ``None``.
* ``give(buffer)``: ``0``: the block is back in its entry's list; ``1``: the buffer needs the
  slow path (a stream other than its home used it, or its home is retired; only the released
  flag was set); ``2``: back in its list, and ``post_release`` asks the allocator to look (it
  closed meanwhile, or keeps a cache limit). Raises ``ValueError`` when the buffer was released
  already.

``fast`` maps a request size to its shared entry, ``streams`` maps a Stream to ``(handle,
{request size: entry})``; the allocator fills both. The counters ``hits``, ``stream_hits``
(hits from a stream's own list), ``in_use``, ``peak`` and ``requested`` (bytes) are read and
updated by the allocator's slow paths under its lock. Each call relies on the GIL: after the
calls that may run other Python code (dict lookups, ``is_closed``, ``is_capturing``, making
the buffer), it re-reads the list, and from there to its return it neither calls Python code
nor checks for a thread switch, so its list and counter updates are atomic with respect to
other threads. On a free-threaded interpreter the allocators do not use a FastPath at all.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import streamrt as srt

__all__ = ["FIELDS", "GIL_ENABLED", "NATIVE", "Entry", "FastPath", "PyFastPath"]

#: ``(size class, free list, None or the home stream's holder [stream])``
Entry = tuple[int, list[int], Any]
#: The fields a hand-out sets: streamrt's allocation fields, then the allocator's entry.
FIELDS = (*srt.Buffer.ALLOCATION_FIELDS, "_entry")

_new = object.__new__


class PyFastPath:
    """The Python implementation of the FastPath contract (see the module docstring)."""

    __slots__ = (
        "_type", "_fast", "_streams", "_bindings", "_is_capturing",
        "hits", "stream_hits", "in_use", "peak", "requested", "post_release",
    )  # fmt: skip

    def __init__(
        self,
        buffer_type: type,
        fields: tuple[str, ...],
        fast: dict[int, Entry],
        streams: dict[Any, tuple[int, dict[int, Entry]]],
        bindings: dict[Any, Any],
        is_capturing: Callable[[int], bool] | None,
    ) -> None:
        if tuple(fields) != FIELDS:
            raise TypeError(f"PyFastPath sets the fields {FIELDS}, not {tuple(fields)}")
        self._type = buffer_type
        self._fast = fast
        self._streams = streams
        self._bindings = bindings
        self._is_capturing = is_capturing
        self.hits = self.stream_hits = self.in_use = self.peak = self.requested = 0
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
        buf: Any = _new(self._type)
        buf._ptr = ptr
        buf._nbytes = nbytes
        buf._released = False
        buf._streams = None
        buf._entry = entry
        return buf

    def take_on(self, nbytes: Any, stream: Any) -> Any:
        if type(nbytes) is not int:
            return None
        try:
            memo = self._streams.get(stream)
        except TypeError:  # unhashable: not a Stream; the slow path says so
            return None
        if memo is None:
            return None
        entry = memo[1].get(nbytes)
        if entry is None or not entry[1] or stream.is_closed or self._bindings:
            return None
        is_capturing = self._is_capturing
        if is_capturing is not None and is_capturing(memo[0]):
            return None
        buf: Any = _new(self._type)
        streams = {stream}
        try:
            ptr = entry[1].pop()  # re-read: the calls above may have let another thread empty it
        except IndexError:
            return None
        self.hits += 1
        self.stream_hits += 1
        in_use = self.in_use + entry[0]
        self.in_use = in_use
        if in_use > self.peak:
            self.peak = in_use
        self.requested += nbytes
        buf._ptr = ptr
        buf._nbytes = nbytes
        buf._released = False
        buf._streams = streams
        buf._entry = entry
        return buf

    def hand_out(self, ptr: int, nbytes: int, entry: Entry, stream: Any) -> Any:
        buf: Any = _new(self._type)
        buf._ptr = ptr
        buf._nbytes = nbytes
        buf._released = False
        buf._streams = None if stream is None else {stream}
        buf._entry = entry
        return buf

    def give(self, buf: Any) -> int:
        if buf._released:
            raise ValueError("buffer released twice")
        buf._released = True
        streams = buf._streams
        cls, free, home = buf._entry
        if home is None:
            if streams:
                return 1
        elif not streams or len(streams) != 1 or home[0] not in streams:  # home[0] is None once retired
            return 1
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
