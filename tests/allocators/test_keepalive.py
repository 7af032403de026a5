"""Keepalives: a released block is reused only after every stream that used it has passed the release.

Contract tests: they run on every backend through the ``rt`` fixture. Work is
held in flight by a gate (a host function blocked on an Event).
"""

from __future__ import annotations

import numpy as np
import pytest
from alloc_helpers import conserved, read_back

import allocators
import streamrt as srt

N = 64 << 10


def test_a_block_no_stream_used_is_reused_at_once(make_allocator) -> None:
    a = make_allocator("host")
    b = a.allocate(N)
    ptr = b.ptr
    b.release()
    again = a.allocate(N - 100)  # same size class
    assert again.ptr == ptr
    s = a.statistics()
    assert (s.hits, s.misses, s.allocations) == (1, 1, 2)
    again.release()


def test_pinned_buffers_are_host_writable_pinned_memory(rt: srt.Runtime, make_allocator) -> None:
    a = make_allocator("host")
    b = a.allocate(N)
    assert (b.kind, b.nbytes) == ("host", N)
    b.numpy()[:] = 7
    assert rt.backend.pointer_kind(b.ptr).value == "host"
    d = make_allocator("device").allocate(N)
    assert d.kind == "device" and rt.backend.pointer_kind(d.ptr).value == "device"
    b.release()
    d.release()


def test_in_flight_block_is_not_reused_and_its_copy_reads_the_old_data(rt: srt.Runtime, make_allocator, gate) -> None:
    a = make_allocator("host")
    s = rt.create_stream()
    dev = rt.device_allocator.allocate(N)
    staging = a.allocate(N)
    staging.numpy()[:] = 0x11
    g = gate(s)
    s.copy(dev, staging)  # behind the gate: still pending
    ptr = staging.ptr
    staging.release()
    fresh = a.allocate(N)
    assert fresh.ptr != ptr, "handed out a block whose copy is still pending"
    fresh.numpy()[:] = 0x22  # safe: a different block
    st = a.statistics()
    assert st.in_flight_bytes == a.block_size(N) and conserved(st)
    g.open()
    assert (read_back(rt, s, dev) == 0x11).all()
    again = a.allocate(N)
    assert again.ptr == ptr, "the block must come back once its stream has passed"
    for b in (fresh, again, dev):
        b.release()


def test_use_on_several_streams_waits_for_all_of_them(rt: srt.Runtime, make_allocator, gate) -> None:
    a = make_allocator("device")
    s1, s2 = rt.create_stream(), rt.create_stream()
    blk = a.allocate(N)
    s1.memset(blk, 1)
    s1.synchronize()  # s1 is done with it ...
    g = gate(s2)
    s2.memset(blk, 2)  # ... but s2 still has pending work on it
    ptr = blk.ptr
    blk.release()
    other = a.allocate(N)
    assert other.ptr != ptr
    g.open()
    s2.synchronize()
    back = a.allocate(N)
    assert back.ptr == ptr
    other.release()
    back.release()


def test_allocate_with_stream_keeps_the_block_until_that_stream_passes(rt: srt.Runtime, make_allocator, gate) -> None:
    """``allocate(n, stream=s)`` counts ``s`` as a user even if no op names the buffer."""
    a = make_allocator("device")
    s = rt.create_stream()
    g = gate(s)
    blk = a.allocate(N, stream=s)
    assert s in blk.streams
    ptr = blk.ptr
    blk.release()
    other = a.allocate(N)
    assert other.ptr != ptr
    g.open()
    s.synchronize()
    assert a.allocate(N).ptr == ptr


def test_views_used_on_a_stream_keep_the_base_block(rt: srt.Runtime, make_allocator, gate) -> None:
    a = make_allocator("host")
    s = rt.create_stream()
    dev = rt.device_allocator.allocate(N)
    blk = a.allocate(N)
    blk.numpy()[:] = 3
    g = gate(s)
    s.copy(dev.view(0, 256), blk.view(128, 256))
    ptr = blk.ptr
    blk.release()
    assert a.allocate(N).ptr != ptr
    g.open()
    s.synchronize()
    dev.release()


def test_a_closed_stream_is_waited_for_through_the_device(rt: srt.Runtime, make_allocator) -> None:
    a = make_allocator("device")
    s = rt.create_stream()
    blk = a.allocate(N)
    s.memset(blk, 9)
    s.close()  # the stream is destroyed; its work still completes
    ptr = blk.ptr
    blk.release()
    rt.synchronize()
    rt.releaser.drain()  # the whole-device wait runs on the releaser thread
    assert a.allocate(N).ptr == ptr


def test_release_twice_and_use_after_release_raise(rt: srt.Runtime, make_allocator) -> None:
    a = make_allocator("host")
    s = rt.create_stream()
    b = a.allocate(N)
    dev = rt.device_allocator.allocate(N)
    b.release()
    with pytest.raises(ValueError, match="released twice"):
        b.release()
    with pytest.raises(ValueError, match="after release"):
        b.numpy()
    with pytest.raises(ValueError, match="after release"):
        s.copy(dev, b)
    with pytest.raises(ValueError, match="view"):
        a.allocate(N).view(0, 16).release()
    dev.release()
    assert conserved(a.statistics())


def test_cached_buffers_are_whole_buffers_on_the_fast_and_the_slow_path(rt: srt.Runtime, make_allocator) -> None:
    """A cached buffer sets every slot a Buffer has, whether handed out by the hot path or by the slow path."""
    a = make_allocator("host")
    s = rt.create_stream()
    slow = a.allocate(N)  # a miss: the slow path's hand_out
    slow.release()
    fast = a.allocate(N)  # a hit: the hot path's take
    assert fast.ptr == slow.ptr
    assert a.statistics().hits == 1
    on_stream = a.allocate(N, stream=s)  # the slow path with a stream
    slots = [name for name in srt.Buffer.__slots__ if name != "__weakref__"]
    for buf in (slow, fast, on_stream):
        assert isinstance(buf, allocators.CachedBuffer) and isinstance(buf, srt.Buffer)
        for name in slots:
            getattr(buf, name)  # raises AttributeError for a slot left unset
        assert (buf.nbytes, buf.kind, buf.runtime, buf.base, buf.offset, buf.readonly) == (N, "host", rt, buf, 0, False)
    assert set(on_stream.streams) == {s} and not fast.streams
    view = fast.view(16, 32)
    assert (view.ptr, view.base, view.offset) == (fast.ptr + 16, fast, 16)
    fast.numpy()[:] = 7
    s.copy(on_stream, fast)
    s.synchronize()
    assert (on_stream.numpy() == 7).all()
    on_stream.release()
    fast.release()
    assert view.is_released
    with pytest.raises(ValueError, match="after release"):
        s.memset(view, 0)
    assert conserved(a.statistics())


def test_a_reused_pinned_block_is_safe_to_write_at_once(rt: srt.Runtime, make_allocator) -> None:
    """Write, copy out, release; the next owner writes at once; every copy saw its own pattern."""
    a = make_allocator("host")
    s = rt.create_stream()
    rounds = 24
    dev = rt.device_allocator.allocate(rounds * 4096)
    for i in range(rounds):
        b = a.allocate(4096)
        b.numpy()[:] = i + 1
        s.copy(dev.view(i * 4096, 4096), b)
        b.release()
    out = read_back(rt, s, dev).reshape(rounds, 4096)
    assert all((out[i] == i + 1).all() for i in range(rounds))
    dev.release()


def test_statistics_account_every_byte(rt: srt.Runtime, make_allocator, gate) -> None:
    a = make_allocator("device")
    s = rt.create_stream()
    live = [a.allocate(n) for n in (100, 5000, 3 << 20)]
    g = gate(s)
    s.memset(live[1], 0)
    live[1].release()
    live[0].release()
    st = a.statistics()
    assert conserved(st)
    assert st.in_use_bytes == a.block_size(3 << 20)
    assert st.requested_bytes == 3 << 20
    assert st.in_flight_bytes == a.block_size(5000)
    assert st.cached_bytes == a.block_size(100) == a._cached_in_lists()
    assert st.peak_in_use_bytes == sum(a.block_size(n) for n in (100, 5000, 3 << 20))
    g.open()
    s.synchronize()
    st = a.statistics()
    assert st.in_flight_bytes == 0 and st.cached_bytes == a.block_size(100) + a.block_size(5000) == a._cached_in_lists()
    live[2].release()
    assert conserved(a.statistics())


def test_bad_arguments_raise_before_anything_happens(rt: srt.Runtime, make_allocator) -> None:
    a = make_allocator("host")
    for bad, err in ((-1, ValueError), (1.5, TypeError), ("8", TypeError), (True, TypeError), (None, TypeError)):
        with pytest.raises(err):
            a.allocate(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Stream"):
        a.allocate(8, stream=123)  # type: ignore[arg-type]
    other = srt.open_runtime("sim")
    try:
        with pytest.raises(ValueError, match="another runtime"):
            a.allocate(8, stream=other.create_stream())
    finally:
        other.close()
    assert a.statistics().allocations == 0
    z = a.allocate(np.int64(0))
    assert z.nbytes == 0 and z.ptr != 0
    z.release()
    with pytest.raises(ValueError):
        allocators.CachingPinnedAllocator(rt, allocators.RawSource(rt, "device"))
