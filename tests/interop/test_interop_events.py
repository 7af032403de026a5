"""Stream.wait on other libraries' events and on torch.distributed Work: ordered, with no host synchronization."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from interop_helpers import races

import streamrt as srt


class TorchLikeEvent:
    def __init__(self, handle: int) -> None:
        self.cuda_event = handle  # torch.cuda.Event: 0 until first recorded


class CupyLikeEvent:
    def __init__(self, handle: int) -> None:
        self.ptr = handle

    def record(self, stream: Any = None) -> None:
        raise AssertionError("streamrt never calls it")


class CoreLikeEvent:
    def __init__(self, handle: int) -> None:
        self.handle = handle


CoreLikeEvent.__module__ = "cuda.core._event"  # what identifies a cuda.core Event


@pytest.mark.parametrize("kind", [TorchLikeEvent, CupyLikeEvent, CoreLikeEvent])
def test_a_foreign_event_orders_the_stream_after_the_other_library(hz: srt.Runtime, foreign_stream: int, kind: type) -> None:
    backend = hz.backend
    s = hz.create_stream()
    d = hz.device_allocator.allocate(1 << 16)
    h = hz.host_allocator.allocate(1 << 16)
    event = backend.event_create(timing=False)
    backend.memset_async(d.ptr, 5, d.nbytes, foreign_stream)  # the other library's kernel
    backend.event_record(event, foreign_stream)
    s.wait(kind(event))
    s.copy(h, d)
    s.synchronize()
    assert races(hz) == [] and (h.numpy() == 5).all()
    # without the wait the checker sees the race, so the test above can fail
    backend.memset_async(d.ptr, 6, d.nbytes, foreign_stream)
    s.copy(h, d)
    s.synchronize()
    assert races(hz)
    backend.event_destroy(event)


def test_a_never_recorded_torch_event_is_done(hz: srt.Runtime) -> None:
    s = hz.create_stream()
    s.wait(TorchLikeEvent(0))
    assert s.is_idle


def test_wait_refuses_streams_and_other_objects(hz: srt.Runtime) -> None:
    s = hz.create_stream()
    with pytest.raises(TypeError, match="is a stream: use stream.wait_stream"):
        s.wait(hz.create_stream())
    with pytest.raises(TypeError, match="wait takes an Event .* or a torch.distributed Work, not int"):
        s.wait(3)


def test_foreign_waits_are_traced_as_event_waits(hz: srt.Runtime, foreign_stream: int) -> None:
    s = hz.create_stream(name="main")
    event = hz.backend.event_create(timing=False)
    hz.backend.event_record(event, foreign_stream)
    with hz.trace() as t:
        s.wait(TorchLikeEvent(event))
    assert [r.kind for r in t.trace.ops(stream="main")] == ["wait_event"]
    hz.backend.event_destroy(event)


# -- torch.distributed ---------------------------------------------------------------------------------


def _work_class() -> Any:
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")

    class SlowWork(dist.Work):  # a collective that finishes when the test says so
        def __init__(self) -> None:
            super().__init__()
            self.done = threading.Event()

        def wait(self, timeout: Any = None) -> bool:
            self.done.wait()
            return True

    return SlowWork


def test_a_work_orders_the_stream_not_the_host(hz: srt.Runtime) -> None:
    work = _work_class()()
    s = hz.create_stream()
    d = hz.device_allocator.allocate(64, stream=s)
    h = hz.host_allocator.allocate(64)
    t0 = time.perf_counter()
    s.wait(work)  # returns at once: the stream waits, the caller does not
    s.memset(d, 2)
    s.copy(h, d)
    assert time.perf_counter() - t0 < 1.0
    idle = s.wait_idle()
    time.sleep(0.05)
    assert not idle.is_done and not (h.numpy() == 2).any()  # held behind the collective
    work.done.set()
    idle.wait(10)
    assert (h.numpy() == 2).all()


def test_a_gloo_all_reduce_orders_the_stream(hz: srt.Runtime, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        h = hz.host_allocator.allocate(16)
        x = torch.from_dlpack(h).view(torch.float32)
        x[:] = 1.5
        work = dist.all_reduce(x, async_op=True)
        s = hz.create_stream()
        d = hz.device_allocator.allocate(16, stream=s)
        s.wait(work)
        s.copy(d, h)  # after the collective wrote x
        s.copy(h, d)
        s.synchronize()
        assert np.allclose(h.numpy(np.float32), 1.5)
    finally:
        dist.destroy_process_group()


# -- on the GPU, with the real libraries --------------------------------------------------------------


SPIN_CYCLES = 200_000_000  # ~0.1 s of torch.cuda._sleep on an H200: streamrt's wait is enqueued long before


@pytest.mark.gpu
def test_torch_event_after_a_running_kernel(cuda_rt: srt.Runtime, torch_cuda: Any) -> None:
    torch = torch_cuda
    side = torch.cuda.Stream()
    x = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    s = cuda_rt.create_stream()  # made before the kernel: a pinned allocation may take longer than its spin
    h = cuda_rt.host_allocator.allocate(x.numel())
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SPIN_CYCLES)
        x.fill_(7)
        done = torch.cuda.Event()
        done.record(side)
    t0 = time.perf_counter()
    s.wait(done)
    s.copy(h, cuda_rt.as_buffer(x))
    assert time.perf_counter() - t0 < 0.05 and not done.query()  # nothing waited on the host
    s.synchronize()
    assert (h.numpy() == 7).all()


@pytest.mark.gpu
def test_cupy_and_cuda_core_events(cuda_rt: srt.Runtime, torch_cuda: Any) -> None:
    cupy = pytest.importorskip("cupy")
    torch = torch_cuda
    side = torch.cuda.Stream()
    x = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    s = cuda_rt.create_stream()
    h = cuda_rt.host_allocator.allocate(x.numel())
    with torch.cuda.stream(side):
        torch.cuda._sleep(SPIN_CYCLES)
        x.fill_(3)
    ev = cupy.cuda.Event()
    ev.record(cupy.cuda.ExternalStream(side.cuda_stream))
    s.wait(ev)
    s.copy(h, cuda_rt.as_buffer(x))
    s.synchronize()
    assert (h.numpy() == 3).all()
    core = pytest.importorskip("cuda.core")
    device_cls = getattr(core, "Device", None) or pytest.importorskip("cuda.core.experimental").Device
    dev = device_cls(0)
    dev.set_current()
    theirs = dev.create_stream(cuda_rt.wrap_stream(side.cuda_stream))
    with torch.cuda.stream(side):
        torch.cuda._sleep(SPIN_CYCLES)
        x.fill_(4)
    s.wait(theirs.record())
    s.copy(h, cuda_rt.as_buffer(x))
    s.synchronize()
    assert (h.numpy() == 4).all()


@pytest.mark.gpu
def test_a_work_on_the_gpu_is_a_device_side_wait(cuda_rt: srt.Runtime, torch_cuda: Any, tmp_path: Path) -> None:
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    torch = torch_cuda
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        x = torch.full((1024,), 2.0)
        work = dist.all_reduce(x, async_op=True)
        s = cuda_rt.create_stream()
        d = cuda_rt.device_allocator.allocate(x.numel() * 4, stream=s)
        s.wait(work)  # block_current_stream with s as torch's current stream: returns at once
        s.memset(d, 1)
        s.synchronize()
        assert work.is_completed()
    finally:
        dist.destroy_process_group()
