"""Capture-private pools: allocations during a capture live as long as the graph, with no malloc during capture."""

from __future__ import annotations

import pytest
from alloc_helpers import conserved, read_back, recording

import allocators
import streamrt as srt
from streamrt._backends.protocol import CaptureMode

MiB = 1 << 20


def _skip_without_graphs(rt: srt.Runtime) -> None:
    if not rt.capabilities.supports_graphs:
        pytest.skip(f"{rt.backend_name} on this device has no graph capture")


def test_reserved_blocks_serve_a_capture_without_calling_the_source(rt: srt.Runtime, make_allocator) -> None:
    _skip_without_graphs(rt)
    src = recording(rt, "device")
    a = make_allocator("device", src)
    s = rt.create_stream()
    backend = rt.backend
    pool = a.capture_pool(s, reserve=[MiB, 4096])
    calls = src.allocate_calls
    assert a.statistics().capture_pool_bytes == a.block_size(MiB) + a.block_size(4096)
    with pool:
        assert pool.is_active
        backend.stream_begin_capture(s.handle, CaptureMode.THREAD_LOCAL)
        try:
            x = a.allocate(MiB, stream=s)
            y = a.allocate(4000, stream=s)
            with pytest.raises(srt.CaptureError, match=r"reserve"):
                a.allocate(8 * MiB, stream=s)  # not reserved: refused before any call
            s.memset(x, 7)
            s.memset(y, 9)
        finally:
            graph = backend.stream_end_capture(s.handle)  # the capture is still valid
    assert not pool.is_active
    assert src.allocate_calls == calls, "the source was called during the capture"
    exe = backend.graph_instantiate(graph)
    try:
        for _ in range(3):
            backend.graph_launch(exe, s.handle)
        assert (read_back(rt, s, x) == 7).all() and (read_back(rt, s, y) == 9).all()
        st = a.statistics()
        assert st.capture_pool_bytes == pool.nbytes == a.block_size(MiB) + a.block_size(4096) and conserved(st)
        x_ptr = x.ptr
        x.release()
        y.release()
        other = a.allocate(MiB)
        assert other.ptr != x_ptr, "a block of a live graph was reused"
        backend.graph_launch(exe, s.handle)  # the graph still owns its memory
        s.synchronize()
    finally:
        backend.graph_exec_destroy(exe)
        backend.graph_destroy(graph)
    pool.close(streams=[s])
    assert pool.is_closed and a.statistics().capture_pool_bytes == 0
    s.synchronize()
    assert a.allocate(MiB).ptr == x_ptr  # back in the cache once the graph's stream passed
    with pytest.raises(srt.ClosedError):
        pool.allocate(16)
    other.release()


def test_a_capture_without_a_pool_gets_an_implicit_one_from_free_blocks(rt: srt.Runtime, make_allocator) -> None:
    _skip_without_graphs(rt)
    src = recording(rt, "host")
    a = make_allocator("host", src)
    s = rt.create_stream()
    backend = rt.backend
    warm = a.allocate(64 << 10)
    warm_ptr = warm.ptr
    warm.release()  # a free block of the class, known passed: usable during capture
    calls = src.allocate_calls
    dev = rt.device_allocator.allocate(64 << 10)
    backend.stream_begin_capture(s.handle, CaptureMode.THREAD_LOCAL)
    try:
        h = a.allocate(60 << 10, stream=s)
        assert h.ptr == warm_ptr
        with pytest.raises(srt.CaptureError):
            a.allocate(MiB, stream=s)  # no free block, and the raw source may not run during capture
        s.copy(dev, h)
    finally:
        graph = backend.stream_end_capture(s.handle)
    backend.graph_destroy(graph)
    assert src.allocate_calls == calls
    pool = a.take_capture_pool(s)
    assert pool is not None and pool.is_implicit and not pool.is_active
    assert a.take_capture_pool(s) is None
    h.release()
    pool.close(streams=[s])
    s.synchronize()
    assert a.allocate(60 << 10).ptr == warm_ptr
    dev.release()


def test_a_block_released_during_a_capture_waits_for_the_capture_to_end(rt: srt.Runtime, make_allocator) -> None:
    """Its stream cannot be recorded on while capturing; the allocator must neither reuse it nor query events."""
    _skip_without_graphs(rt)
    a = make_allocator("device")
    s = rt.create_stream()
    backend = rt.backend
    blk = a.allocate(MiB)
    a.allocate(MiB).release()  # a free block, so that the allocation below needs no malloc
    s.memset(blk, 1)
    ptr = blk.ptr
    backend.stream_begin_capture(s.handle, CaptureMode.THREAD_LOCAL)
    try:
        s.memset(blk, 2)  # captured use
        blk.release()
        other = a.allocate(MiB)  # the free block: the released one waits for the capture to end
        assert other.ptr != ptr
    finally:
        graph = backend.stream_end_capture(s.handle)
    backend.graph_destroy(graph)
    st = a.statistics()  # the first look after the capture records the deferred release point ...
    assert st.in_use_bytes == a.block_size(MiB) and st.in_flight_bytes + st.cached_bytes == a.block_size(MiB)
    s.synchronize()  # ... which the stream then passes
    again = a.allocate(MiB)
    assert again.ptr == ptr
    assert conserved(a.statistics())
    other.release()
    again.release()


def test_closing_a_pool_without_streams_waits_for_the_device(rt: srt.Runtime, make_allocator) -> None:
    a = make_allocator("host")
    pool = a.capture_pool()
    b = pool.allocate(4096)  # not capturing: may use the source
    b.numpy()[:] = 1
    ptr = b.ptr
    b.release()
    assert a.allocate(4096).ptr != ptr
    pool.close()
    rt.releaser.drain()
    assert a.allocate(4096).ptr == ptr
    pool.close()  # idempotent


def test_buffers_outliving_their_pool_return_to_the_cache_when_released(rt: srt.Runtime, make_allocator) -> None:
    a = make_allocator("device")
    s = rt.create_stream()
    pool = a.capture_pool(s, reserve=[4096])
    b = pool.allocate(4096, stream=s)
    pool.close(streams=[s])
    assert a.statistics().capture_pool_bytes == a.block_size(4096)
    s.memset(b, 0)
    ptr = b.ptr
    b.release()
    s.synchronize()
    st = a.statistics()
    assert st.capture_pool_bytes == 0 and conserved(st)
    assert a.allocate(4096).ptr == ptr


def test_pool_arguments_are_checked(rt: srt.Runtime, make_allocator) -> None:
    a = make_allocator("host")
    s = rt.create_stream()
    with pytest.raises(TypeError):
        a.capture_pool(stream=object())  # type: ignore[arg-type]
    p1 = a.capture_pool(s)
    p2 = a.capture_pool(s)
    with p1:
        with pytest.raises(ValueError, match="already entered"):
            p2.__enter__()
        with pytest.raises(RuntimeError, match="already entered"):
            p1.__enter__()
    with pytest.raises(ValueError):
        p1.reserve(16, count=-1)
    p1.close()
    p2.close()
    assert isinstance(p1, allocators.CapturePool) and p1.is_closed
