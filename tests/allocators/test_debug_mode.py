"""Debug mode: released blocks are poisoned with 0xDB; on the simulator, stale accesses are reported as hazards."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from typing import Any

import pytest
from alloc_helpers import Gate, read_back

import allocators
import streamrt as srt
from streamrt._backends.protocol import MemcpyKind

N = 16 << 10


def _reuse(a: allocators.CachingAllocator, rt: srt.Runtime, ptr: int, n: int = N, stream: srt.Stream | None = None) -> srt.Buffer:
    """Allocate until the block at ``ptr`` comes back (its poison memset may still be running)."""
    rt.synchronize()
    b = a.allocate(n, stream=stream)
    assert b.ptr == ptr
    return b


def test_a_pinned_block_is_poisoned_on_release(rt: srt.Runtime, make_allocator) -> None:
    a = make_allocator("host", debug=True)
    b = a.allocate(N)
    b.numpy()[:] = 0x11
    ptr = b.ptr
    b.release()
    assert bytes((ctypes.c_ubyte * 8).from_address(ptr)) == bytes([allocators.POISON]) * 8  # at once: a host fill
    again = _reuse(a, rt, ptr)
    assert (again.numpy() == 0xDB).all()
    again.release()


def test_blocks_used_on_streams_are_poisoned_once_the_streams_pass(rt: srt.Runtime, make_allocator) -> None:
    s, other = rt.create_stream(), rt.create_stream()
    for kind in ("host", "device"):
        a = make_allocator(kind, debug=True)
        b = a.allocate(N)
        s.memset(b, 0x22)
        other.memset(b, 0x33)
        ptr = b.ptr
        b.release()
        again = _reuse(a, rt, ptr)
        assert (read_back(rt, s, again) == 0xDB).all(), kind
        again.release()


def test_a_block_back_in_its_streams_own_list_is_poisoned_on_that_stream(rt: srt.Runtime, make_allocator) -> None:
    """Same-stream reuse needs no fence, in debug mode too: the poison memset runs on the stream, in order."""
    a = make_allocator("device", debug=True)
    s = rt.create_stream()
    b = a.allocate(N, stream=s)
    s.memset(b, 0x22)
    ptr = b.ptr
    b.release()
    again = a.allocate(N, stream=s)  # at once: the poison runs before anything s does next
    assert again.ptr == ptr
    assert (read_back(rt, s, again) == 0xDB).all()
    st = a.statistics()
    assert (st.stream_hits, st.fences) == (1, 0)
    again.release()


def test_a_block_no_stream_used_is_poisoned_on_the_device_too(rt: srt.Runtime, make_allocator) -> None:
    a = make_allocator("device", debug=True)
    s = rt.create_stream()
    b = a.allocate(N)
    ptr = b.ptr
    b.release()
    again = _reuse(a, rt, ptr)
    assert (read_back(rt, s, again) == 0xDB).all()
    again.release()


def _hazards(rt: srt.Runtime) -> tuple[Any, ...]:
    backend: Any = rt.backend  # the simulator's own API
    return tuple(backend.hazards())


@pytest.fixture
def hazard_rt() -> Iterator[srt.Runtime]:
    runtime = srt.open_runtime("sim", check_hazards=True)
    try:
        yield runtime
    finally:
        runtime.close()


def test_correct_use_across_streams_reports_no_hazard(hazard_rt: srt.Runtime) -> None:
    rt = hazard_rt
    h = allocators.CachingPinnedAllocator(rt, debug=True)
    d = allocators.CachingDeviceAllocator(rt, debug=True)
    s1, s2 = rt.create_stream(), rt.create_stream()
    try:
        for i in range(20):
            s = (s1, s2)[i % 2]
            src = h.allocate(N)
            src.numpy()[:] = i
            dev = d.allocate(N, stream=s)
            s.copy(dev, src)
            s.copy(src, dev)
            src.release()
            dev.release()
        rt.synchronize()
        assert _hazards(rt) == ()
    finally:
        h.close()
        d.close()


def test_device_work_on_a_released_block_races_with_its_poison(hazard_rt: srt.Runtime) -> None:
    """A raw pointer kept past ``release()`` and used on another stream is reported, naming both ops."""
    rt = hazard_rt
    d = allocators.CachingDeviceAllocator(rt, debug=True)
    s1, s2 = rt.create_stream(), rt.create_stream()
    try:
        b = d.allocate(N, stream=s1)
        s1.memset(b, 1)
        stale = b.ptr
        b.release()
        rt.backend.memset_async(stale, 2, 64, s2.handle)  # the bug: use after release, no ordering
        rt.synchronize()
        found = _hazards(rt)
        assert found and found[0].kind == "race"
        assert "memset" in found[0].message
    finally:
        d.close()


def test_host_access_to_a_block_still_in_flight_is_reported(hazard_rt: srt.Runtime) -> None:
    """Work the allocator was not told about (a raw backend copy) still reads the block when it is released."""
    rt = hazard_rt
    h = allocators.CachingPinnedAllocator(rt, debug=True)
    d = allocators.CachingDeviceAllocator(rt)
    s = rt.create_stream()
    g = Gate(s)
    try:
        src = h.allocate(N)
        dev = d.allocate(N)
        rt.backend.memcpy_async(dev.ptr, src.ptr, N, MemcpyKind.HOST_TO_DEVICE, s.handle)  # not noted on src
        src.release()  # the poison fill is a host write while the copy is pending
        found = _hazards(rt)
        assert found and found[0].kind == "host_access"
    finally:
        g.open()
        rt.synchronize()
        h.close()
        d.close()
