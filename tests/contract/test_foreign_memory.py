"""Foreign memory: numpy (buffer protocol), torch (DLPack / CUDA array interface)."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt


def test_numpy_arrays_wrap_as_pageable_host_buffers(rt: srt.Runtime) -> None:
    a = np.arange(16, dtype=np.float32)
    b = rt.as_buffer(a)
    assert b.kind == "pageable" and b.nbytes == 64 and b.ptr == a.ctypes.data
    assert rt.as_buffer(a, nbytes=8).nbytes == 8
    with pytest.raises(ValueError, match="exceeds"):
        rt.as_buffer(a, nbytes=65)
    with pytest.raises(ValueError, match="contiguous"):
        rt.as_buffer(np.zeros((4, 4))[:, 1])


def test_pinned_buffers_are_recognised_when_wrapped_by_address(rt: srt.Runtime) -> None:
    h = rt.host_allocator.allocate(64)
    again = rt.as_buffer(h.numpy())
    assert again.kind == "host" and again.ptr == h.ptr


def test_objects_without_memory_are_rejected(rt: srt.Runtime) -> None:
    with pytest.raises(TypeError, match="exposes no memory"):
        rt.as_buffer(object())


def test_none_and_unsupported_foreign_memory_are_rejected(rt: srt.Runtime) -> None:
    class StridedDevice:  # a CUDA-array-interface object with a gap between its rows
        __cuda_array_interface__ = {"data": (0, False), "typestr": "<i4", "shape": (4, 4), "strides": (32, 4), "version": 3}

    class OtherDevice:  # DLPack memory on a device type streamrt does not know (Vulkan)
        def __dlpack__(self) -> object:
            raise AssertionError("never consumed")

        def __dlpack_device__(self) -> tuple[int, int]:
            return (7, 0)

    with pytest.raises(TypeError, match="got None"):
        rt.as_buffer(None)
    with pytest.raises(ValueError, match="contiguous"):
        rt.as_buffer(StridedDevice())
    with pytest.raises(TypeError, match="unsupported DLPack device type 7"):
        rt.as_buffer(OtherDevice())


def test_host_views_check_the_element_size_and_keep_read_only_memory_read_only(rt: srt.Runtime) -> None:
    h = rt.host_allocator.allocate(6)
    with pytest.raises(ValueError, match="whole number"):
        h.numpy(np.int32)
    assert h.view(0, 0).numpy(np.int32).shape == (0,)
    frozen = np.arange(4, dtype=np.int32)
    frozen.flags.writeable = False
    view = rt.as_buffer(frozen).numpy(np.int32)
    assert view.tolist() == [0, 1, 2, 3] and not view.flags.writeable
    h.release()


def test_torch_cpu_tensor_through_dlpack(rt: srt.Runtime) -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(8, dtype=torch.int32)
    b = rt.as_buffer(t)
    assert b.nbytes == 32 and b.ptr == t.data_ptr()
    assert b.numpy(np.int32).tolist() == list(range(8))


@pytest.mark.gpu
def test_torch_cuda_tensors_round_trip(rt: srt.Runtime) -> None:
    torch = pytest.importorskip("torch")
    if rt.capabilities.is_simulated or not torch.cuda.is_available():
        pytest.skip("needs torch with a CUDA device and a GPU backend")
    t = torch.arange(256, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    b = rt.as_buffer(t)
    assert b.kind == "device" and b.ptr == t.data_ptr() and b.nbytes == 1024
    pinned = torch.zeros(256, dtype=torch.int32).pin_memory()
    hb = rt.as_buffer(pinned)
    assert hb.kind == "host"
    s = rt.wrap_stream(torch.cuda.current_stream())
    s.copy(hb, b)
    s.synchronize()
    assert pinned.tolist() == list(range(256))
