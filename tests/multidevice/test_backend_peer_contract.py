"""The peer primitives of every backend, as far as one device allows (runs on a 1-GPU machine too)."""

from __future__ import annotations

import numpy as np
import pytest
from md_helpers import pattern
from support.transfer import download, upload

import streamrt as srt


def test_a_device_is_not_its_own_peer(rt: srt.Runtime) -> None:
    backend = rt.backend
    assert backend.can_access_peer(rt.device, rt.device) is False
    with pytest.raises(srt.BackendError):
        backend.enable_peer_access(rt.device)
    s = rt.create_stream()  # the failed call left nothing behind
    d = rt.device_allocator.allocate(64, stream=s)
    s.memset(d, 1)
    assert (download(rt, s, d) == 1).all()


def test_memcpy_peer_async_within_one_device_moves_the_bytes(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    data = pattern(1 << 16, 9)
    src = upload(rt, s, data)
    dst = rt.device_allocator.allocate(1 << 16, stream=s)
    rt.backend.memcpy_peer_async(dst.ptr, rt.device, src.ptr, rt.device, 1 << 16, s.handle)
    assert np.array_equal(download(rt, s, dst), data)


def test_runtimes_of_one_gpu_backend_share_it_but_not_their_buffers(backend: str) -> None:
    """GPU backends are one object per process; the simulator's one-device backends are private."""
    with srt.open_runtime(backend) as a, srt.open_runtime(backend) as b:
        assert (a.backend is b.backend) == (backend != "sim")
        s = a.create_stream()
        theirs = b.device_allocator.allocate(64)
        with pytest.raises(ValueError, match="another runtime"):
            s.memset(theirs, 0)
        ev = b.create_stream().record()
        if a.backend is b.backend:
            s.wait(ev)  # one backend object: waits may cross runtimes
        else:
            with pytest.raises(ValueError, match="different backend instance"):
                s.wait(ev)
        s.synchronize()
        theirs.release()
