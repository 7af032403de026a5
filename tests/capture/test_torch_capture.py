"""Recording into ``torch.cuda.graph``: a pipeline with a Python host node between torch kernels (GPU only)."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import streamrt as srt
from streamrt import _graph_release
from streamrt._backends import probe_backend

N = 256


@pytest.fixture
def torch_rt() -> Iterator[tuple[Any, srt.Runtime]]:
    """torch with a CUDA device and a cuda runtime (skipped with the reason otherwise)."""
    reason = probe_backend("cuda")
    if reason is not None:
        pytest.skip(f"cuda backend unavailable: {reason}")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA build of torch with a GPU")
    reason = _graph_release.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    rt = srt.open_runtime("cuda")
    try:
        yield torch, rt
    finally:
        rt.close()


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["thread_local", "global"])
def test_a_pipeline_with_a_python_host_node_replays_inside_torch_cuda_graph(torch_rt: tuple[Any, srt.Runtime], mode: str) -> None:
    torch, rt = torch_rt
    side = torch.cuda.Stream()
    s = rt.wrap_stream(side)
    dev_in = rt.device_allocator.allocate(N * 4, stream=s)
    dev_out = rt.device_allocator.allocate(N * 4, stream=s)
    stage_in, stage_out = rt.host_allocator.allocate(N * 4), rt.host_allocator.allocate(N * 4)
    ran: list[int] = []

    def triple(a: srt.Buffer, b: srt.Buffer) -> None:
        ran.append(1)
        np.multiply(a.numpy(np.int32), 3, out=b.numpy(np.int32))

    p = srt.Pipeline("triple")
    p.copy(dst=stage_in, src=dev_in)
    p.host(triple, stage_in, stage_out, reads=[stage_in], writes=[stage_out], name="x3")
    p.copy(dst=dev_out, src=stage_out)
    t_in = torch.from_dlpack(dev_in).view(torch.int32)
    t_out = torch.from_dlpack(dev_out).view(torch.int32)
    x = torch.zeros(N, dtype=torch.int32, device="cuda")
    with torch.cuda.stream(side):  # warm-up of the torch kernels, outside the capture
        t_in.copy_(x * 2)
        y = t_out + 1
    side.synchronize()
    pending = _graph_release.pending_releases()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side, capture_error_mode=mode):
        t_in.copy_(x * 2)
        run = p.launch(s)  # recorded into torch's capture
        y = t_out + 1
    assert run.policy == "captured" and isinstance(run.exception(), srt.CaptureError)
    assert ran == [] and _graph_release.pending_releases() == pending + 1
    gen = torch.Generator(device="cuda").manual_seed(5)
    for i in range(50):
        x.copy_(torch.randint(-1000, 1000, (N,), device="cuda", dtype=torch.int32, generator=gen))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, x * 6 + 1), f"replay {i}"
    assert len(ran) == 50
    del g
    gc.collect()
    deadline = time.monotonic() + 10
    while _graph_release.pending_releases() > pending:  # torch destroyed the graph: the destructor fired
        assert time.monotonic() < deadline, "torch's graph never released streamrt's user object"
        time.sleep(0.01)
    rt.releaser.drain()
    p.launch(s).result(10)  # eager again on the same stream
