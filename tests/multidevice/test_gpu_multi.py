"""Several GPUs: peer copies and cross-device waits on CUDA and on HIP (HIP-on-CUDA on NVIDIA machines).

Marked ``multi_gpu(2)``: skipped, with the GPU counts found, on machines with fewer than two GPUs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from md_helpers import HostGate, pattern
from support.transfer import download, upload

import streamrt as srt

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu(2)]


@pytest.fixture(params=["cuda", "hip"])
def gpu_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def gpus(gpu_backend: str) -> Iterator[list[srt.Runtime]]:
    rt0 = srt.open_runtime(gpu_backend, device=0)
    try:
        rt1 = srt.open_runtime(gpu_backend, device=1)
    except BaseException:
        rt0.close()
        raise
    try:
        yield [rt0, rt1]
    finally:
        rt1.close()
        rt0.close()


def test_the_runtimes_of_two_gpus_share_one_backend(gpus) -> None:
    rt0, rt1 = gpus
    assert rt0.backend is rt1.backend
    assert (rt0.device, rt1.device) == (0, 1)


def test_a_peer_copy_round_trip(gpus) -> None:
    """GPU 0 -> GPU 1 on GPU 1's stream, changed there, then back on GPU 0's stream after an event."""
    rt0, rt1 = gpus
    s0, s1 = rt0.create_stream(), rt1.create_stream()
    n = 8 << 20
    data = pattern(n, 4)
    a = upload(rt0, s0, data)
    b = rt1.device_allocator.allocate(n, stream=s1)
    s1.copy(b, a)
    s1.memset(b.view(0, 4096), 0xA5)
    back = rt0.device_allocator.allocate(n, stream=s0)
    s0.wait(s1.record())
    s0.copy(back, b)
    expected = data.copy()
    expected[:4096] = 0xA5
    assert np.array_equal(download(rt0, s0, back), expected)
    assert np.array_equal(download(rt1, s1, b), expected)


def test_gpu_1_waits_for_a_gated_event_of_gpu_0(gpus) -> None:
    rt0, rt1 = gpus
    s0, s1 = rt0.create_stream(), rt1.create_stream()
    h1 = rt1.host_allocator.allocate(4096)
    h1.numpy()[:] = 7
    d1 = rt1.device_allocator.allocate(4096, stream=s1)
    gate = HostGate()
    s0.launch_host_func(gate)
    s1.wait(s0.record())
    s1.memset(d1, 0xAB)
    s1.copy(h1, d1)
    try:
        assert gate.started.wait(5)
        time.sleep(0.1)
        assert not s1.is_idle
        assert (h1.numpy() == 7).all()
    finally:
        gate.open()
    s1.synchronize()
    assert (h1.numpy() == 0xAB).all()


def test_events_and_completions_belong_to_their_gpu_whatever_is_current(gpus) -> None:
    """Opening the runtime of GPU 1 made it current on this thread; GPU 0's events still record on GPU 0's streams."""
    rt0, rt1 = gpus
    s0 = rt0.create_stream()
    rt1.create_stream()
    t0, t1 = rt0.create_event(timing=True), rt0.create_event(timing=True)
    s0.record(t0)
    d0 = rt0.device_allocator.allocate(1 << 20, stream=s0)
    s0.memset(d0, 1)
    s0.record(t1)
    s0.wait_idle().wait(10)
    assert s0.launch_host_func(lambda: 5).result(10) == 5
    assert t0.elapsed_ms(t1) >= 0.0
