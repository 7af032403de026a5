"""Memory across libraries on a CUDA GPU: round trips with torch and CuPy while kernels are still running.

Each test puts a long torch.cuda._sleep in front of the producer's write, so an unordered read would see
the old bytes; the host never waits for the producer.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import streamrt as srt

pytestmark = pytest.mark.gpu

SPIN_CYCLES = 200_000_000  # ~0.1 s on an H200
N = 1 << 20


def test_torch_consumes_a_buffer_after_streamrt_work_on_it(cuda_rt: srt.Runtime, torch_cuda: Any) -> None:
    torch = torch_cuda
    slow = torch.cuda.Stream()
    s = cuda_rt.wrap_stream(slow)  # streamrt work queued behind torch's sleep
    d = cuda_rt.device_allocator.allocate(N, stream=s)
    with torch.cuda.stream(slow):
        torch.cuda._sleep(SPIN_CYCLES)
    s.memset(d, 5)
    consumer = torch.cuda.Stream()
    torch.zeros(8, dtype=torch.uint8, device="cuda").sum(dtype=torch.int64)  # the reduction kernel loaded beforehand
    t0 = time.perf_counter()
    with torch.cuda.stream(consumer):
        t = torch.from_dlpack(d)  # torch passes its current stream: it waits for the memset on the device
        total = t.sum(dtype=torch.int64)
    assert time.perf_counter() - t0 < 0.05  # no host wait (the sleep in front of the memset is ~0.1 s)
    assert t.device.type == "cuda" and t.data_ptr() == d.ptr and t.dtype == torch.uint8
    consumer.synchronize()  # `total` was made on `consumer`: .item() reads it on the default stream
    assert total.item() == 5 * N
    del t
    torch.cuda.synchronize()


def test_cupy_consumes_a_buffer_through_the_cuda_array_interface(cuda_rt: srt.Runtime, torch_cuda: Any) -> None:
    cupy = pytest.importorskip("cupy")
    torch = torch_cuda
    slow = torch.cuda.Stream()
    s = cuda_rt.wrap_stream(slow)
    d = cuda_rt.device_allocator.allocate(N, stream=s)
    with torch.cuda.stream(slow):
        torch.cuda._sleep(SPIN_CYCLES)
    s.memset(d, 2)
    cai = d.__cuda_array_interface__
    assert cai["version"] == 3 and cai["stream"] == s.handle and cai["data"] == (d.ptr, False)
    arr = cupy.asarray(d)  # CuPy orders itself after the named stream
    assert int(arr.sum()) == 2 * N
    # used on two streams: the interface names the runtime's interop stream, which waits for both
    other = cuda_rt.create_stream()
    other.memset(d.view(0, 16), 2)
    joined = d.__cuda_array_interface__["stream"]
    assert joined not in (s.handle, other.handle)
    assert cupy.asarray(d)[:16].tolist() == [2] * 16


def test_streamrt_reads_torch_memory_a_running_kernel_still_writes(cuda_rt: srt.Runtime, torch_cuda: Any) -> None:
    torch = torch_cuda
    x = torch.zeros(N, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    s = cuda_rt.create_stream()
    h = cuda_rt.host_allocator.allocate(N)
    producer = torch.cuda.Stream()
    t0 = time.perf_counter()
    with torch.cuda.stream(producer):
        torch.cuda._sleep(SPIN_CYCLES)
        x.fill_(9)
        buf = cuda_rt.as_buffer(x, stream=s)  # __dlpack__(stream=s): torch makes s wait for its current stream
    s.copy(h, buf)
    assert time.perf_counter() - t0 < 0.05
    s.synchronize()
    assert (h.numpy() == 9).all()


def test_streamrt_reads_cupy_memory_by_its_cai_stream(cuda_rt: srt.Runtime, torch_cuda: Any) -> None:
    cupy = pytest.importorskip("cupy")
    torch = torch_cuda
    s = cuda_rt.create_stream()
    h = cuda_rt.host_allocator.allocate(N)
    producer = torch.cuda.Stream()
    arr = cupy.zeros(N, dtype=cupy.uint8)
    cupy.cuda.Device().synchronize()

    class InterfaceOnly:  # the CUDA-array-interface path alone (CuPy also speaks DLPack)
        def __init__(self, cai: dict[str, Any]) -> None:
            self.__cuda_array_interface__ = cai

    with torch.cuda.stream(producer):
        torch.cuda._sleep(SPIN_CYCLES)
    with cupy.cuda.ExternalStream(producer.cuda_stream):
        arr.fill(4)
        cai = arr.__cuda_array_interface__  # version 3, "stream": CuPy's current stream
    assert cai["stream"] == producer.cuda_stream
    s.copy(h, InterfaceOnly(cai))  # ordered after the producer's stream on the device
    s.synchronize()
    assert (h.numpy() == 4).all()


def test_pinned_buffers_export_as_cpu_memory_torch_accepts(cuda_rt: srt.Runtime, torch_cuda: Any) -> None:
    torch = torch_cuda
    h = cuda_rt.host_allocator.allocate(64)
    assert h.__dlpack_device__() == (1, 0)  # kDLCPU: torch.from_dlpack refuses kDLCUDAHost
    h.numpy()[:] = 1
    t = torch.from_dlpack(h)
    assert t.device.type == "cpu" and t.tolist() == [1] * 64
    d = cuda_rt.device_allocator.allocate(64)
    assert d.__dlpack_device__() == (2, cuda_rt.device)
    with pytest.raises(BufferError, match="ambiguous"):
        d.__dlpack__(stream=0)
