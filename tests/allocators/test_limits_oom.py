"""Limits and out-of-memory: flush the cache (waiting for in-flight work), retry, then raise with the numbers."""

from __future__ import annotations

import threading
import time

import pytest
from alloc_helpers import conserved, recording

import streamrt as srt

MiB = 1 << 20


def test_an_injected_source_failure_flushes_the_cache_and_retries(rt: srt.Runtime, make_allocator) -> None:
    src = recording(rt, "device", fail_calls={3})
    a = make_allocator("device", src)
    cached = [a.allocate(MiB), a.allocate(2 * MiB)]
    for b in cached:
        b.release()
    big = a.allocate(3 * MiB)  # a miss: call 3 fails, the flush frees both cached blocks, call 4 succeeds
    st = a.statistics()
    assert st.flushes == 1 and st.frees == 2 and st.cached_bytes == 0
    assert src.allocate_calls == 4 and len(src.freed) == 2
    assert st.held_bytes == a.block_size(3 * MiB) and conserved(st)
    big.release()


def test_the_flush_waits_for_in_flight_blocks(rt: srt.Runtime, make_allocator, gate) -> None:
    src = recording(rt, "device", capacity=4 * MiB)
    a = make_allocator("device", src)
    s = rt.create_stream()
    first = a.allocate(3 * MiB)
    g = gate(s)
    s.memset(first, 0)
    first.release()  # in flight behind the gate: 3 MiB of the 4 MiB capacity still held
    opened: list[float] = []

    def open_later() -> None:
        time.sleep(0.2)
        opened.append(time.monotonic())
        g.open()

    threading.Thread(target=open_later, daemon=True).start()
    second = a.allocate(2 * MiB)  # capacity exceeded: flush must wait for the gate, free, retry
    assert opened and time.monotonic() >= opened[0]
    st = a.statistics()
    assert st.flushes == 1 and st.frees == 1 and conserved(st)
    second.release()


def test_out_of_memory_after_the_retry_carries_the_numbers(rt: srt.Runtime, make_allocator) -> None:
    src = recording(rt, "host", capacity=2 * MiB)
    a = make_allocator("host", src)
    kept = a.allocate(MiB)
    spare = a.allocate(512 << 10)
    spare.release()
    with pytest.raises(srt.OutOfMemoryError) as info:
        a.allocate(2 * MiB)
    err = info.value
    assert isinstance(err, MemoryError)
    assert err.requested == 2 * MiB and err.in_use == a.block_size(MiB) and err.cached == 0 and err.limit is None
    assert "2097152 bytes" in str(err) and "in use" in str(err)
    st = a.statistics()
    assert st.flushes == 1 and st.held_bytes == a.block_size(MiB) and conserved(st)
    assert a.allocate(512 << 10).nbytes == 512 << 10  # still usable afterwards
    kept.release()


def test_max_total_bytes_flushes_then_raises(rt: srt.Runtime, make_allocator) -> None:
    a = make_allocator("host", max_total_bytes=4 * MiB)
    x = a.allocate(3 * MiB)
    x.release()
    y = a.allocate(2 * MiB)  # 3 MiB cached + 2 MiB > 4 MiB: the cached block is freed first
    st = a.statistics()
    assert st.flushes == 1 and st.held_bytes == a.block_size(2 * MiB) <= 4 * MiB
    with pytest.raises(srt.OutOfMemoryError) as info:
        a.allocate(3 * MiB)
    assert info.value.limit == 4 * MiB and info.value.requested == 3 * MiB
    assert info.value.in_use == a.block_size(2 * MiB)
    assert a.statistics().held_bytes <= 4 * MiB
    y.release()


def test_max_cached_bytes_evicts_largest_first(rt: srt.Runtime, make_allocator) -> None:
    src = recording(rt, "host")
    a = make_allocator("host", src, max_cached_bytes=3 * MiB)
    bufs = [a.allocate(n) for n in (MiB, 2 * MiB, 4 * MiB, 64 << 10)]
    for b in bufs:
        b.release()
    rt.releaser.drain()
    st = a.statistics()
    assert st.cached_bytes + st.in_flight_bytes <= 3 * MiB
    assert st.evictions >= 1 and st.cached_bytes == a._cached_in_lists()
    big = bufs[2].ptr
    assert big in src.freed  # the 4 MiB block went first
    assert conserved(st)


def test_max_cached_zero_frees_every_released_block(rt: srt.Runtime, make_allocator, gate) -> None:
    src = recording(rt, "device")
    a = make_allocator("device", src, max_cached_bytes=0)
    s = rt.create_stream()
    b = a.allocate(MiB)
    g = gate(s)
    s.memset(b, 1)
    b.release()
    assert a.statistics().in_flight_bytes == a.block_size(MiB)  # not freed while in flight
    g.open()
    s.synchronize()
    c = a.allocate(4096)
    c.release()  # the next release finds the in-flight block passed and frees it too
    rt.releaser.drain()
    st = a.statistics()
    assert st.held_bytes == 0 and st.frees == 2 and len(src.freed) == 2


def test_held_stays_within_a_quarter_of_requested_for_large_mixed_sizes(rt: srt.Runtime, make_allocator) -> None:
    import random

    rng = random.Random(7)
    a = make_allocator("device")
    sizes = [rng.randint(MiB, 48 * MiB) for _ in range(20)]
    bufs = [a.allocate(n) for n in sizes]
    st = a.statistics()
    assert st.requested_bytes == sum(sizes)
    assert st.held_bytes == st.in_use_bytes <= 1.25 * st.requested_bytes
    assert all(a.block_size(n) < 1.25 * n for n in sizes)
    for b in bufs:
        b.release()


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_limits_must_be_byte_counts(rt: srt.Runtime, bad: object) -> None:
    import allocators

    with pytest.raises(ValueError):
        allocators.CachingDeviceAllocator(rt, max_cached_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        allocators.CachingDeviceAllocator(rt, max_total_bytes=bad)  # type: ignore[arg-type]
