"""The allocator seam: streamrt's public construction and stream-ordered release contract.

An allocator written against it here (``CountingAllocator``) is what docs/allocators.md
describes; the caching allocators use the same seam, including its fast construction.
"""

from __future__ import annotations

import threading
import time
from typing import AbstractSet

import pytest
from alloc_helpers import Gate

import allocators
import streamrt as srt
from allocators import _fastpath

N = 4096


class CountingAllocator:
    """A minimal allocator over the seam: raw device memory, freed once every stream that used it passed."""

    kind = "device"

    def __init__(self, rt: srt.Runtime) -> None:
        self.rt = rt
        self.released: list[tuple[int, int, frozenset[srt.Stream]]] = []
        self.freed: list[int] = []
        self.done = threading.Event()

    def allocate(self, nbytes: int, *, stream: srt.Stream | None = None) -> srt.Buffer:
        ptr = self.rt.backend.malloc(max(nbytes, 1))
        return srt.Buffer(ptr, nbytes, self.kind, self.rt, deallocate=self._deallocate, stream=stream)

    def _deallocate(self, ptr: int, nbytes: int, streams: AbstractSet[srt.Stream]) -> None:
        self.released.append((ptr, nbytes, frozenset(streams)))
        srt.release_after_streams(self.rt, streams, lambda: self.rt.releaser.submit(self._free, ptr))

    def _free(self, ptr: int) -> None:
        self.rt.backend.free(ptr)
        self.freed.append(ptr)
        self.done.set()

    def statistics(self) -> srt.AllocatorStatistics:
        return srt.AllocatorStatistics()

    def trim(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_a_seam_allocator_is_an_allocator_and_hears_of_every_stream_at_release(rt: srt.Runtime) -> None:
    a = CountingAllocator(rt)
    assert isinstance(a, srt.Allocator)
    s, t = rt.create_stream(), rt.create_stream()
    buf = a.allocate(N, stream=s)
    assert set(buf.streams) == {s}, "stream= is noted at construction"
    t.memset(buf.view(0, 64), 1)  # a view's use counts for its base
    g = Gate(t)
    try:
        buf.release()
        assert a.released == [(buf.ptr, N, frozenset({s, t}))]
        assert not a.done.wait(0.05), "freed while t still had work before the release"
    finally:
        g.open()
    assert a.done.wait(30) and a.freed == [buf.ptr]
    with pytest.raises(ValueError, match="released twice"):
        buf.release()
    assert len(a.released) == 1, "deallocate is called once"


def test_a_buffer_no_stream_used_is_released_with_no_streams(rt: srt.Runtime) -> None:
    a = CountingAllocator(rt)
    buf = a.allocate(N)
    assert not buf.streams
    with pytest.raises(ValueError, match="view"):
        buf.view(0, 16).release()
    buf.release()
    assert a.released == [(buf.ptr, N, frozenset())]
    assert a.done.wait(30)


def test_allocation_type_buffers_are_whole_once_the_allocation_fields_are_set(rt: srt.Runtime) -> None:
    """The fast construction: a subclass instance made without __init__ reads every Buffer slot."""
    kind = srt.Buffer.allocation_type("device", rt, tag="mine")
    assert issubclass(kind, srt.Buffer) and kind.__slots__ == () and kind.tag == "mine"
    s = rt.create_stream()
    ptr = rt.backend.malloc(N)
    try:
        buf = object.__new__(kind)
        values = {"_ptr": ptr, "_nbytes": N, "_released": False, "_streams": {s}}
        assert set(values) == set(srt.Buffer.ALLOCATION_FIELDS)
        for name, value in values.items():
            setattr(buf, name, value)
        for name in srt.Buffer.__slots__:
            if name != "__weakref__":
                getattr(buf, name)  # AttributeError: a Buffer field the seam leaves unset
        assert (buf.ptr, buf.nbytes, buf.kind, buf.runtime, buf.base, buf.offset, buf.readonly) == (ptr, N, "device", rt, buf, 0, False)
        assert set(buf.streams) == {s} and not buf.is_released
        s.memset(buf, 3)
        s.synchronize()
        buf.release()  # no deallocate hook: only marked released
        assert buf.is_released
        with pytest.raises(ValueError, match="after release"):
            s.memset(buf, 0)
    finally:
        rt.backend.free(ptr)


def test_the_hot_path_takes_its_field_names_from_the_seam(rt: srt.Runtime, fastpath: str) -> None:
    """Both hot paths find the fields by the names streamrt documents, and refuse anything else."""
    impl = _fastpath.FastPath if fastpath == "native" else _fastpath.PyFastPath
    kind = allocators.CachedBuffer.allocation_type("host", rt)
    assert _fastpath.FIELDS == (*srt.Buffer.ALLOCATION_FIELDS, "_entry")
    impl(kind, _fastpath.FIELDS, {}, {}, {}, None)
    wrong = ("_ptr", "_kind", "_released", "_streams", "_entry")  # _kind is a class attribute there, not a slot
    with pytest.raises(TypeError):
        impl(kind, wrong, {}, {}, {}, None)


def test_the_raw_allocator_releases_through_the_seam(rt: srt.Runtime) -> None:
    raw = srt.RawAllocator(rt, "device")
    s = rt.create_stream()
    buf = raw.allocate(N, stream=s)
    assert set(buf.streams) == {s}
    buf.release()
    deadline = time.monotonic() + 30  # the free runs on the releaser once a completion lane saw s pass
    while raw.statistics().frees == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    st = raw.statistics()
    assert (st.in_use_bytes, st.in_flight_bytes, st.frees) == (0, 0, 1)
