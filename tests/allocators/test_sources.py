"""Sources: the raw runtime malloc, stream-ordered pools, torch; a user's own source plugs in the same way."""

from __future__ import annotations

import numpy as np
import pytest
from alloc_helpers import conserved, read_back

import allocators
import streamrt as srt

MiB = 1 << 20


def test_stream_ordered_source_serves_a_caching_device_allocator(rt: srt.Runtime, make_allocator) -> None:
    if not rt.capabilities.supports_stream_ordered_alloc:
        with pytest.raises(ValueError, match="stream-ordered"):
            allocators.StreamOrderedSource(rt)
        pytest.skip(f"{rt.backend_name}: no stream-ordered allocation on this device")
    src = allocators.StreamOrderedSource(rt)
    a = make_allocator("device", src)
    s = rt.create_stream()
    on_stream = a.allocate(MiB, stream=s)  # allocated in stream order on s
    s.memset(on_stream, 4)
    anywhere = a.allocate(2 * MiB)  # allocated on the source's stream, synchronized
    s.memset(anywhere, 5)
    assert (read_back(rt, s, on_stream) == 4).all() and (read_back(rt, s, anywhere) == 5).all()
    on_stream.release()
    anywhere.release()
    s.synchronize()
    a.trim()
    st = a.statistics()
    assert st.held_bytes == 0 and st.frees == 2 and conserved(st)
    with pytest.raises(ValueError, match="device"):
        allocators.StreamOrderedSource(rt, "host")


def test_torch_source_host_blocks(rt: srt.Runtime, make_allocator) -> None:
    """Pinned CPU tensors on GPU runtimes, plain CPU tensors on the simulator."""
    torch = pytest.importorskip("torch")
    if not rt.capabilities.is_simulated and not torch.cuda.is_available():
        pytest.skip("torch has no CUDA/ROCm device here")
    src = allocators.TorchSource(rt, "host")
    assert src.pinned == (not rt.capabilities.is_simulated)
    a = make_allocator("host", src)
    s = rt.create_stream()
    dev = rt.device_allocator.allocate(MiB)
    h = a.allocate(MiB)
    h.numpy()[:] = np.arange(MiB, dtype=np.uint64).astype(np.uint8)
    s.copy(dev, h)
    assert np.array_equal(read_back(rt, s, dev), h.numpy())
    if src.pinned:
        assert rt.backend.pointer_kind(h.ptr).value == "host"
    h.release()
    s.synchronize()  # the release fenced h behind s: once s has passed it, trim can free it
    a.trim()
    assert a.statistics().held_bytes == 0
    dev.release()


def test_torch_source_device_blocks(rt: srt.Runtime, make_allocator) -> None:
    torch = pytest.importorskip("torch")
    if rt.capabilities.is_simulated:
        with pytest.raises(ValueError, match="GPU runtime"):
            allocators.TorchSource(rt, "device")
        pytest.skip("torch's device allocator needs a GPU runtime")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA/ROCm device here")
    before = torch.cuda.memory_allocated(rt.device)
    a = make_allocator("device", allocators.TorchSource(rt, "device"))
    s = rt.create_stream()
    d = a.allocate(MiB, stream=s)
    assert torch.cuda.memory_allocated(rt.device) >= before + MiB  # torch accounts it
    s.memset(d, 6)
    assert (read_back(rt, s, d) == 6).all()
    d.release()
    s.synchronize()
    a.trim()
    assert torch.cuda.memory_allocated(rt.device) == before


def test_a_user_source_plugs_in_through_the_protocol(rt: srt.Runtime, make_allocator) -> None:
    class Arena:
        """Hands out slices of one preallocated block: no malloc after construction."""

        kind = "host"
        capture_safe = True

        def __init__(self, runtime: srt.Runtime, size: int) -> None:
            self.backend = runtime.backend
            self.base = self.backend.host_malloc(size)
            self.size = size
            self.top = 0
            self.freed: list[int] = []

        def allocate(self, nbytes: int, stream: srt.Stream | None) -> int:
            if self.top + nbytes > self.size:
                raise srt.OutOfMemoryError("arena full", requested=nbytes)
            ptr = self.base + self.top
            self.top += nbytes
            return ptr

        def free(self, ptr: int) -> None:
            self.freed.append(ptr)

        def close(self) -> None:
            self.backend.host_free(self.base)

    arena = Arena(rt, 4 * MiB)
    assert isinstance(arena, allocators.Source)
    a = make_allocator("host", arena)
    b = a.allocate(MiB)
    assert b.ptr == arena.base
    with pytest.raises(srt.OutOfMemoryError):
        a.allocate(4 * MiB)
    b.release()
    a.trim()
    assert arena.freed == [arena.base]
