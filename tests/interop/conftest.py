"""Fixtures for the interop tests: a hazard-checking simulator, and a CUDA runtime for the GPU cases.

On the simulator another library is played by raw backend calls: a stream made
with ``rt.backend.stream_create`` is "the other library's stream", its
``memset_async`` is "its kernel", and the hazard checker says whether
streamrt's later use of the bytes was ordered after it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import streamrt as srt
from streamrt._backends import probe_backend


@pytest.fixture
def hz() -> Iterator[srt.Runtime]:
    """A simulator runtime whose hazard checker records races (``rt.backend.hazards()``)."""
    runtime = srt.open_runtime("sim", check_hazards=True)
    try:
        yield runtime
    finally:
        runtime.close()


@pytest.fixture
def foreign_stream(hz: srt.Runtime) -> Iterator[int]:
    """A raw simulator stream that streamrt did not make: another library's stream."""
    handle = hz.backend.stream_create(0)
    try:
        yield handle
    finally:
        hz.backend.stream_synchronize(handle)
        hz.backend.stream_destroy(handle)


@pytest.fixture
def cuda_rt() -> Iterator[srt.Runtime]:
    """A CUDA runtime (skipped with the reason without cuda-bindings or a GPU)."""
    reason = probe_backend("cuda")
    if reason is not None:
        pytest.skip(f"cuda backend unavailable: {reason}")
    runtime = srt.open_runtime("cuda")
    try:
        yield runtime
    finally:
        runtime.close()


@pytest.fixture
def torch_cuda(cuda_rt: srt.Runtime):  # type: ignore[no-untyped-def]
    """torch with a CUDA device (skipped otherwise)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA build of torch with a GPU")
    return torch
