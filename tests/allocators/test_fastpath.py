"""The hot path (allocators/_fastpath.py, _fastpath_c.c): what it serves, what it leaves to the slow path.

conftest.py runs each test over the C implementation and over its Python twin.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import allocators
import streamrt as srt
from allocators import _fastpath

N = 4096


def test_the_c_hot_path_is_built_where_the_install_requires_it() -> None:
    """CI sets STREAMRT_REQUIRE_NATIVE=1: there, a failed build must not pass unnoticed as the fallback."""
    if os.environ.get("STREAMRT_REQUIRE_NATIVE") != "1":
        pytest.skip("STREAMRT_REQUIRE_NATIVE is not set")
    assert _fastpath.NATIVE, "allocators._fastpath_c did not build: see the pip install output"


def test_hits_are_counted_and_handed_out_from_the_free_list(rt: srt.Runtime, make_allocator) -> None:
    a = make_allocator("host")
    first = a.allocate(N)  # a miss memoizes the size
    first.release()
    again = a.allocate(N)
    st = a.statistics()
    assert again.ptr == first.ptr and type(again) is type(first)
    assert (st.hits, st.misses, st.in_use_bytes, st.requested_bytes) == (1, 1, a.block_size(N), N)
    assert not again.is_released and not again.streams
    again.release()
    st = a.statistics()
    assert (st.in_use_bytes, st.requested_bytes, st.cached_bytes) == (0, 0, a.block_size(N))


@pytest.mark.parametrize("nbytes", [float(N), True])
def test_a_size_that_is_not_an_int_is_refused_even_when_that_size_is_cached(rt: srt.Runtime, make_allocator, nbytes) -> None:
    """4096.0 hashes as 4096: the hot path must not serve it from 4096's free list."""
    a = make_allocator("host")
    a.allocate(N).release()
    a.allocate(1).release()
    with pytest.raises(TypeError, match="nbytes must be an int"):
        a.allocate(nbytes)
    assert a.statistics().allocations == 2


def test_an_integer_like_size_takes_the_validating_path_and_gets_an_int(rt: srt.Runtime, make_allocator) -> None:
    a = make_allocator("host")
    a.allocate(N).release()
    buf = a.allocate(np.int64(N))
    assert type(buf.nbytes) is int and buf.nbytes == N
    assert a.statistics().hits == 1  # served from the cache by the slow path
    buf.release()


def test_releasing_twice_raises_and_changes_nothing(rt: srt.Runtime, make_allocator) -> None:
    a = make_allocator("device")
    buf = a.allocate(N)
    buf.release()
    before = a.statistics()
    with pytest.raises(ValueError, match="released twice"):
        buf.release()
    assert a.statistics() == before
    assert a._cached_in_lists() == before.cached_bytes  # the block is in its list once


def test_a_buffer_a_stream_used_goes_to_the_slow_path_and_waits_for_it(rt: srt.Runtime, make_allocator, gate) -> None:
    a = make_allocator("device")
    s = rt.create_stream()
    g = gate(s)
    buf = a.allocate(N)
    s.memset(buf, 1)  # queued behind the gate
    buf.release()
    st = a.statistics()
    assert st.in_flight_bytes == a.block_size(N) and st.cached_bytes == 0
    again = a.allocate(N)
    assert again.ptr != buf.ptr  # the first block is still pending
    g.open()
    s.synchronize()
    again.release()


def test_cached_buffers_are_not_made_by_hand() -> None:
    with pytest.raises(TypeError, match="made by a CachingAllocator"):
        allocators.CachedBuffer()


def test_round_trips_leak_no_references(rt: srt.Runtime, make_allocator) -> None:
    """The hot path moves references between the free list and the buffers; none may be lost or kept."""
    import gc
    import sys
    import weakref

    a = make_allocator("host")
    a.allocate(N).release()
    cls, free, _home = a._lists.fast[N]
    ptr = free[-1]
    counts = (sys.getrefcount(ptr), sys.getrefcount(free), sys.getrefcount(a._lists.fast[N]))
    for _ in range(5000):
        a.allocate(N).release()
    buf = a.allocate(N)
    gone = weakref.ref(buf)
    buf.release()
    del buf
    gc.collect()
    assert gone() is None, "a released buffer is kept alive"
    assert free == [ptr] and free[-1] is ptr
    assert (sys.getrefcount(ptr), sys.getrefcount(free), sys.getrefcount(a._lists.fast[N])) == counts
    assert a.statistics().hits == 5001


def test_an_uninitialized_c_hot_path_raises_instead_of_crashing(fastpath: str) -> None:
    if fastpath != "native":
        pytest.skip("the C implementation's own guard")
    bare = _fastpath.FastPath.__new__(_fastpath.FastPath)
    assert bare.take(N) is None
    with pytest.raises(TypeError, match="__init__ was not called"):
        bare.give(object())
    assert bare.take_on(N, object()) is None
    with pytest.raises(TypeError, match="__init__ was not called"):
        bare.hand_out(0x1000, N, (N, [], None), None)
