"""torch interop: streams both ways, tensors as Buffers, record_stream, torch-backed allocators."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading

import numpy as np
import pytest

import streamrt as srt

torch = pytest.importorskip("torch", reason="torch is not installed (make test installs torch==2.13.0, the CPU build)")
import streamrt.torch as st


def _device(rt: srt.Runtime) -> torch.device:
    return torch.device("cpu") if rt.capabilities.is_simulated else torch.device("cuda", rt.device)


def test_importing_streamrt_does_not_import_torch() -> None:
    """torch is optional: neither ``import streamrt`` nor ``import streamrt.torch`` loads it."""
    code = "import sys, streamrt, streamrt.torch; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_simulator_streams_have_no_torch_counterpart(sim_rt: srt.Runtime) -> None:
    with pytest.raises(TypeError, match="no torch counterpart"):
        st.as_torch_stream(sim_rt.create_stream())


def test_stream_round_trips(trt: srt.Runtime) -> None:
    """torch stream -> streamrt -> torch gives the same object; streamrt stream -> torch -> streamrt the same handle;
    torch work put on a streamrt stream is ordered with streamrt work on it."""
    if trt.capabilities.is_simulated:
        pytest.skip("the simulator's streams are not CUDA streams (checked by test_simulator_streams_have_no_torch_counterpart)")
    ts = torch.cuda.Stream(trt.device)
    wrapped = st.wrap_stream(trt, ts)
    assert wrapped.handle == ts.cuda_stream
    assert st.as_torch_stream(wrapped) is ts
    own = trt.create_stream()
    ext = st.as_torch_stream(own)
    assert ext.cuda_stream == own.handle
    assert st.as_torch_stream(own) is ext
    assert st.wrap_stream(trt, ext).handle == own.handle

    dev = st.device_empty(trt, 4096, torch.uint8)
    host = trt.host_allocator.allocate(4096)
    release = threading.Event()
    own.launch_host_func(release.wait, 30.0)  # the stream is busy until released
    with torch.cuda.stream(ext):
        dev.fill_(7)  # torch work on the streamrt stream: queued behind the host function
    own.copy(host, st.tensor_buffer(trt, dev))  # streamrt work after it on the same stream
    release.set()
    own.synchronize()
    assert (host.numpy() == 7).all()
    host.release()


def test_current_stream_is_torchs(trt: srt.Runtime) -> None:
    """current_stream is cached per torch stream; on a GPU it follows torch's current stream."""
    s = st.current_stream(trt)
    assert st.current_stream(trt) is s
    if trt.capabilities.is_simulated:
        assert s.name == "torch-host"
        return
    assert s.handle == torch.cuda.current_stream(trt.device).cuda_stream
    other = torch.cuda.Stream(trt.device)
    with torch.cuda.stream(other):
        assert st.current_stream(trt).handle == other.cuda_stream
    assert st.current_stream(trt) is s


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool])
def test_device_tensor_round_trip_through_buffers(trt: srt.Runtime, dtype: torch.dtype) -> None:
    """A device tensor is a device Buffer of the same bytes: H2D into it and D2H out of it move its contents."""
    host = (torch.arange(96) % 5).to(dtype).reshape(8, 12)
    dev = st.device_empty(trt, host.shape, dtype)
    buf = st.tensor_buffer(trt, dev)
    assert buf.kind == "device"
    assert buf.nbytes == host.numel() * host.element_size()
    s = trt.create_stream()
    up = trt.host_allocator.allocate(buf.nbytes)
    up.numpy()[:] = host.reshape(-1).view(torch.uint8).numpy()
    down = trt.host_allocator.allocate(buf.nbytes)
    s.copy(buf, up)
    s.copy(down, buf)
    s.synchronize()
    assert bytes(down.numpy()) == bytes(up.numpy())
    assert torch.equal(dev.cpu(), host)
    up.release()
    down.release()


def test_cpu_tensor_memory_kinds(trt: srt.Runtime) -> None:
    """Ordinary CPU tensors are pageable Buffers (refused by async copies); pinned ones are host Buffers."""
    t = torch.zeros(1000)
    buf = st.tensor_buffer(trt, t)
    assert buf.kind == "pageable"
    assert buf.ptr == t.data_ptr() and buf.nbytes == 4000
    with pytest.raises(ValueError, match="pinned"):
        trt.create_stream().copy(trt.device_allocator.allocate(4000), buf)
    if not trt.capabilities.is_simulated:
        pinned = torch.zeros(1000, pin_memory=True)
        assert st.tensor_buffer(trt, pinned).kind == "host"


def test_tensor_buffer_rejects_what_it_cannot_wrap(trt: srt.Runtime) -> None:
    with pytest.raises(ValueError, match="contiguous"):
        st.tensor_buffer(trt, torch.zeros(4, 4).t())
    with pytest.raises(TypeError, match="torch tensor"):
        st.tensor_buffer(trt, np.zeros(4))
    with pytest.raises(TypeError, match="meta"):
        st.tensor_buffer(trt, torch.empty(4, device="meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA tensor")
def test_cuda_tensor_refused_by_the_simulator(sim_rt: srt.Runtime) -> None:
    with pytest.raises(ValueError, match="simulator"):
        st.tensor_buffer(sim_rt, torch.zeros(4, device="cuda"))


def test_simulator_device_tensor_returns_its_block(sim_rt: srt.Runtime) -> None:
    """On the simulator a device tensor aliases an allocator block, returned when torch frees the memory
    (the last view gone), not before."""
    alloc = sim_rt.device_allocator
    base = alloc.statistics().in_use_bytes
    t = st.device_empty(sim_rt, (256, 256), torch.float32)
    assert sim_rt.backend.pointer_kind(t.data_ptr()).value == "device"
    assert alloc.statistics().in_use_bytes >= base + t.numel() * 4
    view = t[10:20]
    del t
    gc.collect()
    sim_rt.releaser.drain()
    assert alloc.statistics().in_use_bytes > base  # the view still holds the memory
    view.fill_(1.0)
    del view
    gc.collect()
    sim_rt.releaser.drain()
    assert alloc.statistics().in_use_bytes == base


def test_record_stream_defers_reuse(trt: srt.Runtime) -> None:
    """Without record_stream torch reuses a freed block at once on its stream; after recording a
    busy streamrt stream on it, torch does not hand the block out while that stream has work pending."""
    if trt.capabilities.is_simulated:
        st.record_stream(torch.zeros(4), trt.create_stream())  # CPU tensors: a no-op
        return
    n = 1 << 22
    dev = torch.device("cuda", trt.device)
    x = torch.empty(n, dtype=torch.uint8, device=dev)
    ptr = x.data_ptr()
    del x
    y = torch.empty(n, dtype=torch.uint8, device=dev)
    assert y.data_ptr() == ptr  # the control: immediate reuse on the same stream
    side = trt.create_stream()
    release = threading.Event()
    side.launch_host_func(release.wait, 30.0)  # side is busy until released
    st.record_stream(y, side)
    del y
    z = torch.empty(n, dtype=torch.uint8, device=dev)
    try:
        assert z.data_ptr() != ptr
    finally:
        release.set()
        side.synchronize()


def test_torch_allocators_use_torch_memory(backend: str) -> None:
    """torch_allocators() builds caching allocators over allocators.TorchSource (device memory stays the
    simulator's on the simulator) that serve stream copies."""
    import allocators

    if backend != "sim" and not torch.cuda.is_available():
        pytest.skip(f"the {backend} backend needs a torch build with CUDA/ROCm")
    factory = st.torch_allocators(max_cached_bytes=1 << 26)
    with srt.open_runtime(backend, host_allocator=factory, device_allocator=factory) as rt:
        assert isinstance(rt.host_allocator.source, allocators.TorchSource)
        expected = allocators.RawSource if rt.capabilities.is_simulated else allocators.TorchSource
        assert isinstance(rt.device_allocator.source, expected)
        s = rt.create_stream()
        h = rt.host_allocator.allocate(1 << 16)
        h.numpy()[:] = 9
        d = rt.device_allocator.allocate(1 << 16, stream=s)
        back = rt.host_allocator.allocate(1 << 16)
        s.copy(d, h)
        s.copy(back, d)
        s.synchronize()
        assert (back.numpy() == 9).all()
        for b in (h, d, back):
            b.release()
