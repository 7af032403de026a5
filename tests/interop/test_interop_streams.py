"""Streams across libraries: Stream.__cuda_stream__ out; torch, CuPy, cuda.core streams and ints into wrap_stream."""

from __future__ import annotations

from typing import Any

import pytest

import streamrt as srt


def test_cuda_stream_protocol_gives_version_0_and_the_handle_on_gpus(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    if rt.capabilities.is_simulated:
        with pytest.raises(TypeError, match="simulator stream, not a CUDA or HIP stream"):
            s.__cuda_stream__()
    else:
        assert s.__cuda_stream__() == (0, s.handle)  # hipStream_t on hip, as torch for ROCm does
        assert rt.wrap_stream(s) is s
    s.close()
    with pytest.raises(srt.ClosedError):
        s.__cuda_stream__()


class CupyLikeStream:
    """What rt.wrap_stream sees of a cupy.cuda.Stream: .ptr, .wait_event and .device_id."""

    def __init__(self, handle: int, device_id: int = 0) -> None:
        self.ptr = handle
        self.device_id = device_id

    def wait_event(self, event: Any) -> None:
        raise AssertionError("streamrt never calls it")


def test_wrap_stream_takes_cupy_streams_by_ptr(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    w = rt.wrap_stream(CupyLikeStream(s.handle))
    assert w.handle == s.handle
    d = rt.device_allocator.allocate(16)
    h = rt.host_allocator.allocate(16)
    w.memset(d, 9)
    w.copy(h, d)
    w.synchronize()
    assert (h.numpy() == 9).all()
    w.close()  # not destroyed: the owner's stream goes on
    s.memset(d, 0)
    s.synchronize()


def test_wrap_stream_refuses_what_is_not_a_stream(rt: srt.Runtime) -> None:
    s = rt.create_stream()

    class MemoryPointer:  # cupy.cuda.MemoryPointer also has .ptr, but it is memory
        ptr = 4096

    class Version1:
        def __cuda_stream__(self) -> tuple[int, int]:
            return (1, s.handle)

    class Broken:
        def __cuda_stream__(self) -> int:
            return s.handle

    with pytest.raises(TypeError, match=r"\.ptr \(CuPy\)"):
        rt.wrap_stream(MemoryPointer())
    with pytest.raises(TypeError, match="cannot wrap a Buffer as a stream"):
        rt.wrap_stream(rt.device_allocator.allocate(8))
    with pytest.raises(TypeError, match="version 1 of the CUDA stream protocol"):
        rt.wrap_stream(Version1())
    with pytest.raises(TypeError, match="not a \\(version, handle\\) pair"):
        rt.wrap_stream(Broken())
    with pytest.raises(ValueError, match="on device 5, the runtime on device 0"):
        rt.wrap_stream(CupyLikeStream(s.handle, device_id=5))


# -- on the GPU, with the real libraries --------------------------------------------------------------


def _roundtrip(rt: srt.Runtime, foreign: Any, handle: int) -> None:
    w = rt.wrap_stream(foreign)
    assert w.handle == handle
    d = rt.device_allocator.allocate(1 << 12, stream=w)
    h = rt.host_allocator.allocate(1 << 12)
    w.memset(d, 0x5A)
    w.copy(h, d)
    w.synchronize()
    assert (h.numpy() == 0x5A).all()
    d.release()
    h.release()


@pytest.mark.gpu
def test_wrap_torch_stream(cuda_rt: srt.Runtime, torch_cuda: Any) -> None:
    ts = torch_cuda.cuda.Stream()
    _roundtrip(cuda_rt, ts, ts.cuda_stream)
    # and the other way: torch takes a streamrt stream through the protocol's handle
    s = cuda_rt.create_stream()
    ext = torch_cuda.cuda.ExternalStream(s.__cuda_stream__()[1])
    with torch_cuda.cuda.stream(ext):
        x = torch_cuda.ones(1024, device="cuda")
        total = x.sum()
    s.synchronize()
    assert total.item() == 1024


@pytest.mark.gpu
def test_wrap_cupy_stream(cuda_rt: srt.Runtime) -> None:
    cupy = pytest.importorskip("cupy")
    cs = cupy.cuda.Stream(non_blocking=True)
    _roundtrip(cuda_rt, cs, cs.ptr)
    ext = cupy.cuda.ExternalStream(cuda_rt.create_stream().handle)  # CuPy takes streamrt's handle
    with ext:
        assert int(cupy.arange(10).sum()) == 45


@pytest.mark.gpu
def test_wrap_cuda_core_stream_and_give_it_ours(cuda_rt: srt.Runtime) -> None:
    core = pytest.importorskip("cuda.core")
    device_cls = getattr(core, "Device", None) or pytest.importorskip("cuda.core.experimental").Device
    dev = device_cls(0)
    dev.set_current()
    cs = dev.create_stream()
    _roundtrip(cuda_rt, cs, int(cs.handle))
    ours = cuda_rt.create_stream()
    theirs = dev.create_stream(ours)  # cuda.core reads __cuda_stream__
    assert int(theirs.handle) == ours.handle
