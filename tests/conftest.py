"""Shared fixtures: the ``backend`` fixture runs contract tests on every backend.

``sim`` always runs. ``cuda`` and ``hip`` are marked ``gpu`` and skip with the
reason when their library or a GPU is missing. On an NVIDIA machine with
hip-python installed and no ROCm, the HIP-on-CUDA forwarding library
(tests/hip_on_cuda) is built and hip-python is pointed at it before first use.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator

import pytest

import streamrt as srt
from streamrt._backends import probe_backend

GPU_BACKENDS = ("cuda", "hip")


@functools.cache
def backend_skip_reason(name: str) -> str | None:
    """Why backend ``name`` cannot run here, or ``None``. Prepares HIP-on-CUDA when it applies."""
    if name == "hip" and os.environ.get("STREAMRT_NO_HIP_ON_CUDA") != "1":
        from support.hip_on_cuda import prepare_if_needed

        prepared = prepare_if_needed()
        if prepared is not None:
            return prepared
    reason = probe_backend(name)
    return None if reason is None else f"{name} backend unavailable: {reason}"


def _backend_params() -> list[object]:
    params: list[object] = [pytest.param("sim", id="sim")]
    params += [pytest.param(name, id=name, marks=pytest.mark.gpu) for name in GPU_BACKENDS]
    return params


@pytest.fixture(params=_backend_params())
def backend(request: pytest.FixtureRequest) -> str:
    """The backend name; skipped with the reason when it is not available here."""
    reason = backend_skip_reason(request.param)
    if reason is not None:
        pytest.skip(reason)
    return request.param


@pytest.fixture
def rt(backend: str) -> Iterator[srt.Runtime]:
    """A runtime on each backend, closed (drained) after the test."""
    runtime = srt.open_runtime(backend)
    try:
        yield runtime
    finally:
        runtime.close()


@pytest.fixture
def sim_rt() -> Iterator[srt.Runtime]:
    runtime = srt.open_runtime("sim")
    try:
        yield runtime
    finally:
        runtime.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` outside the backend fixture skip when no GPU backend is usable."""
    for item in items:
        if "gpu" in item.keywords and "backend" not in getattr(item, "fixturenames", ()):
            reasons = [backend_skip_reason(n) for n in GPU_BACKENDS]
            if all(reasons):
                item.add_marker(pytest.mark.skip(reason="; ".join(r for r in reasons if r)))
