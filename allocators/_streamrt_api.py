"""The one place where ``allocators`` reaches past streamrt's documented public API.

``allocators`` implements :class:`streamrt.Allocator` through ``import streamrt``
only. The few things it needs that streamrt does not (yet) document as public
are bound here, so that a change in streamrt is one edit in this file:

* ``new_buffer(ptr, nbytes, kind, runtime, None, fn)`` -- the
  :class:`streamrt.Buffer` constructor with its ``on_release`` hook (called
  once, from ``Buffer.release``, with the buffer; ``release`` itself rejects a
  second release and later use).
* ``note_stream(buffer, stream)`` -- record that work on ``stream`` uses
  ``buffer`` (what ``stream.copy``/``memset`` do), so release waits for it;
  used for ``allocate(n, stream=s)``.
* ``release_fields(buffer) -> (ptr, nbytes, streams)`` -- the three fields
  the release path needs, read in one C-level call from Buffer's slots
  (``streams`` is ``None`` or a set; the public properties would cost three
  Python calls on the allocators' hottest path).

One more reach lives beside the code it speeds up: ``_caching.CachedBuffer``
subclasses :class:`streamrt.Buffer` and shadows its constant slots with class
attributes, and the hot path (``_fastpath``: the C module finds the slots'
offsets through their descriptors; its Python twin uses the names) sets
``_ptr``, ``_nbytes``, ``_released`` and ``_streams`` when it hands a buffer
out and reads them when it takes one back (a test checks that a cached buffer
sets every slot Buffer has).
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Callable

import streamrt as srt

if TYPE_CHECKING:
    from collections.abc import Set

__all__ = ["new_buffer", "note_stream", "release_fields"]

#: ``srt.Buffer(ptr, nbytes, kind, runtime, owner, on_release)`` (positional: the hot path).
new_buffer: Callable[..., srt.Buffer] = srt.Buffer

#: ``release_fields(buf) -> (ptr, nbytes, set_of_streams_or_None)`` of a base (non-view) buffer; private slots of Buffer.
release_fields: Callable[[srt.Buffer], tuple[int, int, Set[srt.Stream] | None]] = operator.attrgetter("_ptr", "_nbytes", "_streams")

#: ``note_stream(buffer, stream)``: record that ``stream`` uses ``buffer`` (its release then waits for it).
note_stream: Callable[[srt.Buffer, srt.Stream], None] = srt.Buffer.note_stream
