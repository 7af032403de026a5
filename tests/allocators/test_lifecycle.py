"""Frees run on the releaser thread; trim returns cached memory; close waits for in-flight work first."""

from __future__ import annotations

import threading
import time

import pytest
from alloc_helpers import RecordingSource, conserved, recording

import allocators
import streamrt as srt

MiB = 1 << 20


def test_every_free_runs_on_the_releaser_thread(rt: srt.Runtime, make_allocator, gate) -> None:
    src = recording(rt, "host", fail_calls={4})
    a = make_allocator("host", src, max_cached_bytes=2 * MiB)
    s = rt.create_stream()
    dev = rt.device_allocator.allocate(MiB)
    used = a.allocate(MiB)
    g = gate(s)
    s.copy(dev, used)
    used.release()  # in flight
    for _ in range(2):
        a.allocate(3 * MiB).release()  # over max_cached_bytes: evicted
    g.open()
    a.allocate(MiB // 2)  # allocate call 4 fails: the flush waits for the copy and frees
    a.allocate(64 << 10).release()
    a.trim()
    a.close()
    assert len(src.free_threads) >= 3
    assert set(src.free_threads) == {rt.releaser.thread_ident}
    assert threading.get_ident() not in src.free_threads
    dev.release()


def test_trim_gives_cached_memory_back(rt: srt.Runtime, make_allocator, gate) -> None:
    src = recording(rt, "device")
    a = make_allocator("device", src)
    s = rt.create_stream()
    keep = a.allocate(MiB)
    for n in (MiB, 2 * MiB, 4096):
        a.allocate(n).release()
    pending = a.allocate(3 * MiB)
    g = gate(s)
    s.memset(pending, 0)
    pending.release()
    # The in-flight block stays; nothing waits for it. The drivers' free itself waits for the
    # device to be idle, so with the gate closed the frees can only be submitted, not awaited.
    a.trim(wait=False)
    g.open()
    rt.releaser.drain()
    st = a.statistics()  # the in-flight block has passed meanwhile: now it is cached
    assert st.cached_bytes == a.block_size(3 * MiB) and st.frees == 3 and len(src.freed) == 3
    assert st.held_bytes == a.block_size(MiB) + a.block_size(3 * MiB) and conserved(st)
    s.synchronize()
    a.trim()
    st = a.statistics()
    assert st.held_bytes == st.in_use_bytes == a.block_size(MiB) and st.frees == 4
    keep.release()


def test_close_waits_for_in_flight_work_then_frees_everything(rt: srt.Runtime, make_allocator, gate) -> None:
    src = recording(rt, "host")
    a = make_allocator("host", src)
    s = rt.create_stream()
    dev = rt.device_allocator.allocate(MiB)
    b = a.allocate(MiB)
    b.numpy()[:] = 5
    g = gate(s)
    s.copy(dev, b)
    b.release()
    a.allocate(4096).release()
    opened: list[float] = []

    def open_later() -> None:
        time.sleep(0.2)
        opened.append(time.monotonic())
        g.open()

    threading.Thread(target=open_later, daemon=True).start()
    a.close()
    assert opened, "close() returned before the in-flight copy could complete"
    assert len(src.freed) == 2 and src.closed
    st = a.statistics()
    assert st.held_bytes == 0 and conserved(st)
    with pytest.raises(srt.ClosedError):
        a.allocate(8)
    a.close()  # idempotent
    dev.release()


def test_buffers_outlive_close_and_are_freed_when_released(rt: srt.Runtime, make_allocator) -> None:
    src = recording(rt, "device")
    a = make_allocator("device", src)
    s = rt.create_stream()
    live = a.allocate(MiB)
    a.close()
    assert not src.closed  # a block is still in use
    s.memset(live, 3)  # still valid
    live.release()
    rt.releaser.drain()
    assert src.freed == [live.ptr] and src.closed
    assert a.statistics().held_bytes == 0


def test_open_runtime_takes_caching_allocators_and_factories() -> None:
    seen: dict[str, RecordingSource] = {}

    def source(rt: srt.Runtime, kind: str) -> RecordingSource:
        seen[kind] = recording(rt, kind)
        return seen[kind]

    factory = allocators.caching_allocator_factory(source=source, max_cached_bytes=8 * MiB)
    with srt.open_runtime("sim", host_allocator=factory, device_allocator=factory) as rt:
        assert isinstance(rt.host_allocator, allocators.CachingPinnedAllocator)
        assert isinstance(rt.device_allocator, allocators.CachingDeviceAllocator)
        assert rt.host_allocator.max_cached_bytes == 8 * MiB
        rt.host_allocator.allocate(100).release()
        rt.device_allocator.allocate(100).release()
        assert seen["host"].allocate_calls == seen["device"].allocate_calls == 1
    assert seen["host"].closed and seen["device"].closed  # runtime close closes its allocators


def test_the_default_allocators_are_caching_over_the_raw_source(rt: srt.Runtime) -> None:
    for alloc, kind in ((rt.host_allocator, "host"), (rt.device_allocator, "device")):
        assert isinstance(alloc, allocators.CachingAllocator) and isinstance(alloc, srt.Allocator)
        assert alloc.kind == kind and isinstance(alloc.source, allocators.RawSource)
        assert not alloc.debug
    with pytest.raises(ValueError, match="kind"):
        allocators.default_allocator(rt, "pageable")


def test_the_debug_environment_variable_turns_on_debug_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMRT_ALLOCATOR_DEBUG", "1")
    with srt.open_runtime("sim") as rt:
        host, dev = rt.host_allocator, rt.device_allocator
        assert isinstance(host, allocators.CachingAllocator) and isinstance(dev, allocators.CachingAllocator)
        assert host.debug and dev.debug


def test_a_source_must_follow_the_protocol(rt: srt.Runtime) -> None:
    with pytest.raises(TypeError, match="Source"):
        allocators.CachingPinnedAllocator(rt, object())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        allocators.CachingAllocator(rt)
    assert isinstance(allocators.RawSource(rt, "host"), allocators.Source)


def test_allocations_from_many_threads_stay_consistent(rt: srt.Runtime, make_allocator) -> None:
    a = make_allocator("host")
    errors: list[BaseException] = []
    seen: set[int] = set()
    lock = threading.Lock()

    def work(seed: int) -> None:
        try:
            for i in range(300):
                held = [a.allocate(512 * (1 + (seed + i + k) % 5)) for k in range(3)]
                with lock:
                    for b in held:
                        assert b.ptr not in seen, "one block handed out twice"
                        seen.add(b.ptr)
                with lock:
                    for b in held:
                        seen.discard(b.ptr)
                for b in held:
                    b.release()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    st = a.statistics()
    assert st.in_use_bytes == 0 and st.requested_bytes == 0 and conserved(st)
    assert st.cached_bytes == a._cached_in_lists() == st.held_bytes
    assert st.allocations == 4 * 300 * 3
