"""Events, cross-stream ordering, idleness and timing on every backend."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt


def test_event_orders_work_across_streams(rt: srt.Runtime) -> None:
    producer, consumer = rt.create_stream(), rt.create_stream()
    n = 1 << 22
    d = rt.device_allocator.allocate(n)
    h = rt.host_allocator.allocate(n)
    gate = threading.Event()
    producer.launch_host_func(gate.wait, 10)  # holds the producer until released
    producer.memset(d, 9)
    ev = producer.record()
    consumer.wait(ev)
    consumer.copy(h, d)
    assert not consumer.is_idle  # blocked behind the producer's host function
    gate.set()
    consumer.synchronize()
    assert ev.is_done
    assert (h.numpy() == 9).all()


def test_synchronize_makes_the_stream_idle(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    d = rt.device_allocator.allocate(1 << 20)
    for _ in range(8):
        s.memset(d, 1)
    s.synchronize()
    assert s.is_idle


def test_event_synchronize_and_is_done(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    gate = threading.Event()
    s.launch_host_func(gate.wait, 10)
    ev = s.record()
    assert not ev.is_done
    gate.set()
    ev.synchronize()
    assert ev.is_done


def test_record_reuses_an_existing_event(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    ev = rt.create_event()
    assert s.record(ev) is ev
    s.synchronize()
    assert ev.is_done


def test_elapsed_ms_between_timing_events_is_positive_for_real_work(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    n = 64 << 20
    d = rt.device_allocator.allocate(n)
    h = rt.host_allocator.allocate(n)
    t0, t1 = rt.create_event(timing=True), rt.create_event(timing=True)
    s.record(t0)
    s.copy(h, d)
    s.record(t1)
    t1.synchronize()
    ms = t0.elapsed_ms(t1)
    # 64 MiB over PCIe/NVLink-C2C or the simulated 55 GB/s link takes well over 0.1 ms.
    assert 0.1 < ms < 1000


def test_elapsed_ms_needs_timing_events(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    a, b = s.record(), s.record()
    s.synchronize()
    with pytest.raises(ValueError, match="timing"):
        a.elapsed_ms(b)


def test_priorities_are_clamped_into_the_device_range(rt: srt.Runtime) -> None:
    least, greatest = rt.capabilities.priority_range
    hi = rt.create_stream(priority=-1000)
    lo = rt.create_stream(priority=1000)
    assert hi.priority == greatest and lo.priority == least


def test_wrap_stream_accepts_raw_handles_and_cuda_stream_objects(rt: srt.Runtime) -> None:
    s = rt.create_stream()

    class Foreign:
        def __init__(self, handle: int) -> None:
            self.cuda_stream = handle

    class Protocol:
        def __init__(self, handle: int) -> None:
            self.handle = handle

        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, self.handle)

    for obj in (s.handle, Foreign(s.handle), Protocol(s.handle)):
        w = rt.wrap_stream(obj)
        assert w.handle == s.handle
        d = rt.device_allocator.allocate(8)
        h = rt.host_allocator.allocate(8)
        w.memset(d, 4)
        w.copy(h, d)
        w.synchronize()
        assert (h.numpy() == 4).all()
        w.close()  # a wrapped stream is not destroyed
    s.memset(rt.device_allocator.allocate(8), 0)
    s.synchronize()


def test_host_function_runs_off_the_calling_thread(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    seen: list[str] = []
    c = s.launch_host_func(lambda: seen.append(threading.current_thread().name))
    c.wait(10)
    assert seen and seen[0] != threading.current_thread().name


def test_host_function_exception_reaches_the_waiter_and_the_stream_goes_on(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    d = rt.device_allocator.allocate(8)
    h = rt.host_allocator.allocate(8)

    def boom() -> None:
        raise KeyError("from the host function")

    c = s.launch_host_func(boom)
    s.memset(d, 6)
    s.copy(h, d)
    s.synchronize()
    assert isinstance(c.exception(timeout=10), KeyError)
    with pytest.raises(KeyError):
        c.result()
    assert (h.numpy() == 6).all()


def test_native_ctypes_host_function_runs_with_user_data(rt: srt.Runtime) -> None:
    import ctypes

    counter = ctypes.c_int64(0)
    # A ctypes callback is a native function pointer: it runs on the driver thread itself.
    HostFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

    @HostFn
    def bump(p: int) -> None:
        ctypes.cast(p, ctypes.POINTER(ctypes.c_int64))[0] += 1

    s = rt.create_stream()
    assert s.launch_host_func(bump, counter) is None
    s.launch_host_func(bump, ctypes.addressof(counter))
    s.synchronize()
    assert counter.value == 2
