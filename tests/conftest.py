"""Shared fixtures: the ``backend`` fixture runs contract tests on every backend.

``sim`` always runs. ``cuda`` and ``hip`` are marked ``gpu`` and skip with the
reason when their library or a GPU is missing; tests marked ``multi_gpu(n)``
skip with the GPU counts found when fewer than ``n`` GPUs are present. On an NVIDIA machine with
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


@functools.cache
def gpu_count(name: str) -> tuple[int, str | None]:
    """``(number of GPUs, None)`` for a usable GPU backend ``name``, else ``(0, why not)``."""
    reason = backend_skip_reason(name)
    if reason is not None:
        return 0, reason
    from streamrt._backends import load_backend

    backend = load_backend(name)
    try:
        return backend.device_count(), None
    finally:
        backend.close()


def _multi_gpu_skip_reason(item: pytest.Item, need: int) -> str | None:
    """Why ``item`` (marked ``multi_gpu(need)``) cannot run here, or ``None``.

    A test parametrized by backend name (a ``backend`` or ``gpu_backend``
    parameter) needs ``need`` GPUs on that backend; any other, on some GPU backend.
    """
    params = getattr(getattr(item, "callspec", None), "params", {})
    named = [params[k] for k in ("gpu_backend", "backend") if params.get(k) in GPU_BACKENDS]
    names = named[:1] or list(GPU_BACKENDS)
    counts = {n: gpu_count(n) for n in names}
    if max(c for c, _ in counts.values()) >= need:
        return None
    found = "; ".join(f"{n}: {c} GPU(s)" + (f" ({why})" if why else "") for n, (c, why) in counts.items())
    return f"needs {need} GPUs, fewer present ({found})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` outside the backend fixture skip when no GPU backend is usable; tests marked
    ``multi_gpu(n)`` skip, with the counts found, when fewer than ``n`` GPUs are present."""
    for item in items:
        multi = item.get_closest_marker("multi_gpu")
        if multi is not None:
            need = int(multi.args[0]) if multi.args else 2
            reason = _multi_gpu_skip_reason(item, need)
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
                continue
        if "gpu" in item.keywords and "backend" not in getattr(item, "fixturenames", ()):
            reasons = [backend_skip_reason(n) for n in GPU_BACKENDS]
            if all(reasons):
                item.add_marker(pytest.mark.skip(reason="; ".join(r for r in reasons if r)))
