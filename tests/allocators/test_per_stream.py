"""Per-stream free lists: a device block freed and reused on the same stream needs no fence; others still do.

Contract tests run on every backend through the ``rt`` fixture; the hazard tests use the
simulator's checker, which tracks happens-before with vector clocks (independent of timing).
conftest.py runs each test over the C hot path and over its Python twin.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from alloc_helpers import conserved, read_back, recording

import allocators
import streamrt as srt
from streamrt._backends.protocol import CaptureMode

N = 16 << 10


class EventCounter:
    """Counts the backend's ``event_record`` / ``event_query`` calls made on this thread (the allocator's
    thread; completion lanes poll on their own), through instance attributes over the backend's methods."""

    def __init__(self, rt: srt.Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
        self.recorded = self.queried = 0
        backend = rt.backend
        record, query = backend.event_record, backend.event_query
        caller = threading.get_ident()

        def counting_record(event: int, stream: int) -> None:
            self.recorded += threading.get_ident() == caller
            record(event, stream)

        def counting_query(event: int) -> bool:
            self.queried += threading.get_ident() == caller
            return query(event)

        monkeypatch.setattr(backend, "event_record", counting_record)
        monkeypatch.setattr(backend, "event_query", counting_query)


@pytest.fixture
def hazard_rt() -> Iterator[srt.Runtime]:
    runtime = srt.open_runtime("sim", check_hazards=True)
    try:
        yield runtime
    finally:
        runtime.close()


def _hazards(rt: srt.Runtime) -> tuple[Any, ...]:
    backend: Any = rt.backend  # the simulator's own API
    return tuple(backend.hazards())


def test_a_block_only_its_stream_used_is_reused_on_it_at_once_with_no_event(
    rt: srt.Runtime, make_allocator, gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = make_allocator("device")
    s = rt.create_stream()
    first = a.allocate(N, stream=s)  # a miss: the size and the stream are memoized
    ptr = first.ptr
    first.release()
    g = gate(s)  # everything below stays pending on s
    events = EventCounter(rt, monkeypatch)
    for i in range(10):
        b = a.allocate(N, stream=s)
        assert b.ptr == ptr, "the block of s's own list comes back for s at once"
        assert set(b.streams) == {s}
        s.memset(b, i + 1)
        b.release()
    assert (events.recorded, events.queried) == (0, 0), "same-stream reuse recorded or queried an event"
    st = a.statistics()
    assert (st.hits, st.stream_hits, st.misses, st.fences) == (10, 10, 1, 0)
    assert st.cached_bytes == st.stream_cached_bytes == a.block_size(N) == a._cached_in_lists()
    assert conserved(st)
    g.open()
    last = a.allocate(N, stream=s)
    assert (read_back(rt, s, last) == 10).all(), "the memsets ran in stream order"
    last.release()


def test_same_stream_reuse_is_race_free_for_the_hazard_checker(hazard_rt: srt.Runtime, fastpath: str) -> None:
    rt = hazard_rt
    d = allocators.CachingDeviceAllocator(rt)
    h = allocators.CachingPinnedAllocator(rt)
    s = rt.create_stream()
    try:
        for i in range(20):
            dev = d.allocate(N, stream=s)
            host = h.allocate(N)
            host.numpy()[:] = i
            s.copy(dev, host)
            s.memset(dev.view(0, 64), 0xEE)
            s.copy(host, dev)
            dev.release()
            host.release()
        rt.synchronize()
        st = d.statistics()
        assert st.stream_hits == 19 and st.fences == 0
        assert _hazards(rt) == ()
    finally:
        d.close()
        h.close()


def _cross_stream_round(d: allocators.CachingAllocator, s1: srt.Stream, s2: srt.Stream) -> int:
    """Allocate for s1, use on s1 then (ordered after it) on s2, release; the block's address."""
    b = d.allocate(N, stream=s1)
    s1.memset(b, 1)
    s2.wait(s1.record())
    s2.memset(b, 2)
    ptr = b.ptr
    b.release()
    return ptr


def test_a_block_other_streams_used_is_still_fenced(hazard_rt: srt.Runtime, fastpath: str) -> None:
    """Its reuse on the first stream waits for the second: the hazard checker sees every reuse ordered."""
    rt = hazard_rt
    d = allocators.CachingDeviceAllocator(rt)
    s1, s2 = rt.create_stream(), rt.create_stream()
    try:
        for _ in range(10):
            _cross_stream_round(d, s1, s2)
            again = d.allocate(N, stream=s1)  # the old block only if its fence was seen passed
            s1.memset(again, 3)
            again.release()
        rt.synchronize()
        st = d.statistics()
        assert st.fences >= 10  # one per cross-stream release
        assert _hazards(rt) == ()
    finally:
        d.close()


def test_the_hazard_checker_catches_cross_stream_reuse_without_a_fence(hazard_rt: srt.Runtime, fastpath: str) -> None:
    """The control: an allocator that forgets the other streams reuses the block while s2 may still write it."""

    class Careless(allocators.CachingDeviceAllocator):
        def _release_slow(self, ptr: int, nbytes: int, streams: object, entry: Any) -> None:
            home = entry[2][0]  # the stream it was allocated for: as if no other stream had used it
            super()._release_slow(ptr, nbytes, {home}, entry)

    rt = hazard_rt
    d = Careless(rt)
    s1, s2 = rt.create_stream(), rt.create_stream()
    try:
        ptr = _cross_stream_round(d, s1, s2)
        again = d.allocate(N, stream=s1)
        assert again.ptr == ptr
        s1.memset(again, 3)  # not ordered after s2's memset
        rt.synchronize()
        found = _hazards(rt)
        assert found and found[0].kind == "race"
        again.release()
    finally:
        d.close()


def test_a_block_of_a_streams_own_list_goes_elsewhere_only_behind_a_fence(rt: srt.Runtime, make_allocator, gate) -> None:
    a = make_allocator("device")
    s, t = rt.create_stream(), rt.create_stream()
    g = gate(s)
    b = a.allocate(N, stream=s)
    s.memset(b, 1)  # pending behind the gate
    ptr = b.ptr
    b.release()
    on_t = a.allocate(N, stream=t)
    assert on_t.ptr != ptr, "a block s still uses was handed out for t"
    st = a.statistics()
    assert st.fences == 1 and st.stream_cached_bytes == 0 and st.in_flight_bytes == a.block_size(N)
    anywhere = a.allocate(N)
    assert anywhere.ptr != ptr, "a block s still uses was handed out for no stream"
    g.open()
    s.synchronize()
    back = a.allocate(N, stream=t)
    assert back.ptr == ptr, "once s passed its fence the block serves any stream"
    assert a.statistics().fences == 1
    for buf in (on_t, anywhere, back):
        buf.release()
    assert conserved(a.statistics())


def test_pinned_blocks_have_no_per_stream_reuse(rt: srt.Runtime, make_allocator, gate) -> None:
    """The host writes pinned memory outside any stream's order: a reused pinned block has passed every stream."""
    a = make_allocator("host")
    s = rt.create_stream()
    g = gate(s)
    b = a.allocate(N, stream=s)
    s.memset(b, 1)
    ptr = b.ptr
    b.release()
    again = a.allocate(N, stream=s)
    assert again.ptr != ptr
    again.numpy()[:] = 2  # safe: another block
    st = a.statistics()
    assert (st.stream_hits, st.stream_cached_bytes, st.fences) == (0, 0, 1)
    g.open()
    again.release()


def test_a_capturing_stream_is_not_served_from_its_own_list(rt: srt.Runtime, make_allocator) -> None:
    """The hot path checks for a capture (detect_capture) and for a bound pool before it hands out a block."""
    if not rt.capabilities.supports_graphs:
        pytest.skip(f"{rt.backend_name} on this device has no graph capture")
    a = make_allocator("device")
    s = rt.create_stream()
    warm = a.allocate(N, stream=s)
    own = warm.ptr
    warm.release()
    backend = rt.backend
    backend.stream_begin_capture(s.handle, CaptureMode.THREAD_LOCAL)
    try:
        with pytest.raises(srt.CaptureError, match="reserve"):
            a.allocate(N, stream=s)  # the implicit pool has no block and the source may not be called
    finally:
        backend.graph_destroy(backend.stream_end_capture(s.handle))
    pool = a.take_capture_pool(s)
    assert pool is not None
    pool.close()
    explicit = a.capture_pool(s, reserve=[N])
    with explicit:
        from_pool = a.allocate(N, stream=s)  # a bound pool: the hot path leaves it to the pool
        assert from_pool.ptr != own
    from_pool.release()
    explicit.close(streams=[s])
    again = a.allocate(N, stream=s)
    assert again.ptr == own  # the own block stayed where it was
    again.release()


@pytest.mark.parametrize("detect", [False, True])
def test_the_capture_check_is_the_only_backend_call_of_a_same_stream_hit(
    rt: srt.Runtime, make_allocator, monkeypatch: pytest.MonkeyPatch, detect: bool
) -> None:
    """detect_capture=False leaves it out; detect_capture=True asks once per allocation."""
    s = rt.create_stream()
    calls: list[int] = []
    query = rt.backend.stream_is_capturing

    def counting(handle: int) -> bool:
        calls.append(handle)
        return query(handle)

    monkeypatch.setattr(rt.backend, "stream_is_capturing", counting)
    events = EventCounter(rt, monkeypatch)
    a = make_allocator("device", detect_capture=detect)
    a.allocate(N, stream=s).release()
    calls.clear()
    for _ in range(5):
        a.allocate(N, stream=s).release()
    expected = 5 if detect and rt.capabilities.supports_graphs else 0
    assert calls == [s.handle] * expected
    assert (events.recorded, events.queried) == (0, 0)
    assert a.statistics().stream_hits == 5


def test_a_closed_streams_own_blocks_are_retired_and_reused_once_the_device_passed(rt: srt.Runtime, make_allocator) -> None:
    a = make_allocator("device")
    s = rt.create_stream()
    cached = a.allocate(N, stream=s)
    live = a.allocate(N, stream=s)
    s.memset(cached, 1)
    s.memset(live, 1)
    ptrs = {cached.ptr, live.ptr}
    cached.release()  # into s's own list
    s.close()
    st = a.statistics()  # retires s: its block waits for a whole-device synchronize
    assert st.stream_cached_bytes == 0 and conserved(st)
    live.release()  # its home is retired: the slow path, behind the device too
    rt.releaser.drain()
    st = a.statistics()
    assert st.cached_bytes == 2 * a.block_size(N) == a._cached_in_lists(), "a block was left in a retired list"
    assert st.in_flight_bytes == 0 and st.stream_cached_bytes == 0
    t = rt.create_stream()
    assert {a.allocate(N).ptr, a.allocate(N, stream=t).ptr} == ptrs


def test_a_stream_of_another_runtime_or_not_a_stream_is_refused(rt: srt.Runtime, make_allocator) -> None:
    a = make_allocator("device")
    s = rt.create_stream()
    a.allocate(N, stream=s).release()
    for bad in (123, [s], "s"):
        with pytest.raises(TypeError, match="Stream"):
            a.allocate(N, stream=bad)  # type: ignore[arg-type]
    other = srt.open_runtime("sim")
    try:
        with pytest.raises(ValueError, match="another runtime"):
            a.allocate(N, stream=other.create_stream())
    finally:
        other.close()
    assert a.statistics().allocations == 1


def test_the_cache_limit_trim_and_the_oom_flush_reach_streams_own_lists(rt: srt.Runtime, make_allocator) -> None:
    s = rt.create_stream()
    block = allocators.SizeClasses().round(N)

    limited = make_allocator("device", max_cached_bytes=0)
    limited.allocate(N, stream=s).release()
    st = limited.statistics()
    assert st.cached_bytes == 0 and st.stream_cached_bytes == 0 and conserved(st)
    s.synchronize()
    limited.statistics()  # the block is found passed and freed
    rt.releaser.drain()
    assert limited.statistics().held_bytes == 0

    trimmed = make_allocator("device")
    trimmed.allocate(N, stream=s).release()
    assert trimmed.statistics().stream_cached_bytes == block
    trimmed.trim()
    st = trimmed.statistics()
    assert (st.held_bytes, st.frees, st.stream_cached_bytes) == (0, 1, 0)

    src = recording(rt, "device", capacity=block)  # room for one block
    tight = make_allocator("device", src)
    tight.allocate(N, stream=s).release()
    other = tight.allocate(N)  # the own block is fenced; reclaimed, or flushed and obtained again
    st = tight.statistics()
    assert st.held_bytes == block and st.in_use_bytes == block and conserved(st)
    other.release()
