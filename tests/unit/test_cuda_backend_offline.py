"""The CUDA backend where no GPU is present: probing, errors, the protocol, NVRTC.

Nothing here needs a GPU. Tests that exercise the bindings against a missing
driver skip when a CUDA device *is* present (the GPU contract tests cover that
case), so this file runs everywhere.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamrt._backends import cuda as cuda_backend
from streamrt._backends.cuda import _codes, _compile, _loading, _memory
from streamrt._backends.protocol import CaptureMode, MemcpyKind, PointerKind
from streamrt._errors import (
    BackendError,
    BackendUnavailableError,
    CaptureError,
    KernelCompileError,
    OutOfMemoryError,
)

REPO = Path(__file__).resolve().parents[2]
_BINDING_MODULES = ("cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.bindings.driver", "cuda.bindings.nvrtc")


def _bindings_importable() -> bool:
    try:
        importlib.import_module("cuda.bindings.runtime")
    except Exception:
        return False
    return True


needs_bindings = pytest.mark.skipif(not _bindings_importable(), reason="cuda-bindings is not installed here")


def _device_present() -> bool:
    return cuda_backend.probe() is None


no_device_only = pytest.mark.skipif(
    _device_present(), reason="a CUDA device is present: the GPU contract tests cover this path"
)


def _hide_bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import cuda.bindings...`` fail as if cuda-bindings were not installed."""
    for name in _BINDING_MODULES:
        monkeypatch.setitem(sys.modules, name, None)


def _fake_bindings(monkeypatch: pytest.MonkeyPatch, *, version: str, device_count: tuple[int, int]) -> None:
    """Install a minimal stand-in for cuda.bindings whose cudaGetDeviceCount returns ``device_count``."""
    names = {0: b"cudaSuccess", 35: b"cudaErrorInsufficientDriver", 100: b"cudaErrorNoDevice"}
    runtime = types.ModuleType("cuda.bindings.runtime")
    runtime.cudaGetDeviceCount = lambda: device_count  # type: ignore[attr-defined]
    runtime.cudaGetErrorName = lambda code: (0, names.get(int(code), b"cudaErrorUnknown"))  # type: ignore[attr-defined]
    bindings = types.ModuleType("cuda.bindings")
    bindings.__version__ = version  # type: ignore[attr-defined]
    bindings.runtime = runtime  # type: ignore[attr-defined]
    cuda = types.ModuleType("cuda")
    cuda.bindings = bindings  # type: ignore[attr-defined]
    for name, module in (("cuda", cuda), ("cuda.bindings", bindings), ("cuda.bindings.runtime", runtime)):
        monkeypatch.setitem(sys.modules, name, module)


# -- probe() and create() ---------------------------------------------------------------------


def test_probe_names_missing_bindings_and_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide_bindings(monkeypatch)
    reason = cuda_backend.probe()
    assert reason == "cuda-bindings is not installed (pip install 'streamrt[cuda]')"


def test_create_without_bindings_raises_unavailable_with_cause_and_install_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _hide_bindings(monkeypatch)
    with pytest.raises(BackendUnavailableError) as info:
        cuda_backend.create()
    message = str(info.value)
    assert "'cuda'" in message
    assert "cuda-bindings is not installed" in message
    assert "pip install 'streamrt[cuda]'" in message


def test_probe_reports_the_runtime_error_when_the_driver_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_bindings(monkeypatch, version="13.5.0", device_count=(35, 0))
    assert cuda_backend.probe() == "no CUDA device: cudaErrorInsufficientDriver"
    with pytest.raises(BackendUnavailableError) as info:
        cuda_backend.create()
    assert "no CUDA device: cudaErrorInsufficientDriver" in str(info.value)
    assert "NVIDIA driver" in str(info.value)


def test_probe_reports_zero_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_bindings(monkeypatch, version="13.5.0", device_count=(0, 0))
    reason = cuda_backend.probe()
    assert reason is not None and reason.startswith("no CUDA device") and "0 devices" in reason
    with pytest.raises(BackendUnavailableError, match="CUDA_VISIBLE_DEVICES"):
        cuda_backend.create()


def test_probe_rejects_bindings_that_hold_the_gil(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_bindings(monkeypatch, version="12.6.2", device_count=(0, 1))
    reason = cuda_backend.probe()
    assert reason is not None
    assert "12.6.2 is too old" in reason and "pip install -U 'cuda-bindings>=12.9.1'" in reason


def test_probe_accepts_recent_bindings_with_a_device(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_bindings(monkeypatch, version="12.9.1", device_count=(0, 2))
    assert cuda_backend.probe() is None


@needs_bindings
@no_device_only
def test_probe_on_this_machine_says_why_cuda_is_unusable() -> None:
    reason = cuda_backend.probe()
    assert isinstance(reason, str) and reason.startswith("no CUDA device: ")
    assert "\n" not in reason


def test_importing_the_backend_module_does_not_import_cuda_bindings() -> None:
    code = (
        "import sys, streamrt._backends.cuda\n"
        "loaded = sorted(m for m in sys.modules if m == 'cuda' or m.startswith('cuda.'))\n"
        "assert not loaded, loaded\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# -- error mapping (runtime error names are static; no driver needed) -------------------------------


@needs_bindings
def test_check_passes_success_through() -> None:
    rt = importlib.import_module("cuda.bindings.runtime")
    _codes._check(rt.cudaError_t.cudaSuccess, "cudaMalloc")  # must not raise
    _codes._check(0, "cudaMalloc")


@needs_bindings
def test_check_raises_backend_error_with_code_name_message_and_call() -> None:
    rt = importlib.import_module("cuda.bindings.runtime")
    with pytest.raises(BackendError) as info:
        _codes._check(rt.cudaError_t.cudaErrorInvalidValue, "cudaMemsetAsync")
    error = info.value
    assert (error.backend, error.code, error.name, error.call) == (
        "cuda",
        1,
        "cudaErrorInvalidValue",
        "cudaMemsetAsync",
    )
    assert "invalid argument" in str(error)


@needs_bindings
def test_check_turns_allocation_failure_into_out_of_memory_with_the_request() -> None:
    rt = importlib.import_module("cuda.bindings.runtime")
    with pytest.raises(OutOfMemoryError) as info:
        _codes._check(rt.cudaError_t.cudaErrorMemoryAllocation, "cudaMalloc", requested=1 << 40)
    error = info.value
    assert isinstance(error, MemoryError)
    assert (error.backend, error.code, error.requested) == ("cuda", 2, 1 << 40)
    assert str(1 << 40) in str(error) and "cudaMalloc" in str(error)


@needs_bindings
@pytest.mark.parametrize(
    "name",
    [
        "cudaErrorStreamCaptureUnsupported",
        "cudaErrorStreamCaptureInvalidated",
        "cudaErrorStreamCaptureMerge",
        "cudaErrorStreamCaptureUnmatched",
        "cudaErrorStreamCaptureUnjoined",
        "cudaErrorStreamCaptureIsolation",
        "cudaErrorStreamCaptureImplicit",
        "cudaErrorStreamCaptureWrongThread",
        "cudaErrorCapturedEvent",
    ],
)
def test_check_turns_capture_codes_into_capture_error_from_the_backend_error(name: str) -> None:
    rt = importlib.import_module("cuda.bindings.runtime")
    code = getattr(rt.cudaError_t, name)
    with pytest.raises(CaptureError) as info:
        _codes._check(code, "cudaStreamEndCapture")
    cause = info.value.__cause__
    assert isinstance(cause, BackendError)
    assert (cause.name, cause.code, cause.call) == (name, int(code), "cudaStreamEndCapture")
    assert name in str(info.value) and "cudaStreamEndCapture" in str(info.value)


@needs_bindings
def test_driver_check_maps_names_without_calling_the_driver() -> None:
    with pytest.raises(OutOfMemoryError) as oom:
        _codes._check_driver(2, "cuMemAlloc", requested=64)
    assert (oom.value.code, oom.value.requested) == (2, 64)
    with pytest.raises(CaptureError) as capture:
        _codes._check_driver(901, "cuLaunchHostFunc")
    assert isinstance(capture.value.__cause__, BackendError)
    assert capture.value.__cause__.name == "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"
    with pytest.raises(BackendError) as other:
        _codes._check_driver(1, "cuLaunchKernel")
    assert (other.value.name, other.value.call) == ("CUDA_ERROR_INVALID_VALUE", "cuLaunchKernel")


# -- the backend object against a missing driver --------------------------------------------------------


class _FakeLaunchHostFunc:
    """Stands in for libcuda's cuLaunchHostFunc: records its arguments, returns ``result``."""

    def __init__(self, result: int = 0) -> None:
        self.result = result
        self.calls: list[tuple[int, int, int]] = []
        self.argtypes: object = None
        self.restype: object = None

    def __call__(self, stream: int, fn: int, user_data: int) -> int:
        self.calls.append((stream, fn, user_data))
        return self.result


@pytest.fixture
def driverless(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[cuda_backend.CudaBackend, _FakeLaunchHostFunc]]:
    """A CudaBackend on the real bindings, with no driver behind them and a fake cuLaunchHostFunc."""
    fake = _FakeLaunchHostFunc()
    monkeypatch.setattr(_loading, "_load_libcuda", lambda: types.SimpleNamespace(cuLaunchHostFunc=fake))
    backend = cuda_backend.CudaBackend()
    yield backend, fake
    backend.close()


@needs_bindings
@no_device_only
def test_launch_host_func_passes_the_native_pointer_and_user_data_unchanged(driverless: Any) -> None:
    backend, fake = driverless
    backend.launch_host_func(0x7F00_0000_1000, 0x7F00_DEAD_BEE0, 0x7F00_0000_2000)
    assert fake.calls == [(0x7F00_0000_1000, 0x7F00_DEAD_BEE0, 0x7F00_0000_2000)]


@needs_bindings
@no_device_only
def test_launch_host_func_reports_driver_errors(driverless: Any) -> None:
    backend, fake = driverless
    fake.result = 400  # CUDA_ERROR_INVALID_HANDLE
    with pytest.raises(BackendError) as info:
        backend.launch_host_func(0x1234, 0x5678, 0)
    assert (info.value.name, info.value.call) == ("CUDA_ERROR_INVALID_HANDLE", "cuLaunchHostFunc")


@needs_bindings
@no_device_only
@pytest.mark.parametrize(
    ("call", "op"),
    [
        ("cudaMemsetAsync", lambda b: b.memset_async(0x1000, 0, 16, 0)),
        ("cudaMemsetAsync", lambda b: b.memset_async(0x1000, 0, 16, 0x7F00_0000_5000)),
        ("cudaMemcpyAsync", lambda b: b.memcpy_async(0x1000, 0x2000, 16, MemcpyKind.HOST_TO_DEVICE, 0)),
        ("cudaEventRecord", lambda b: b.event_record(0x7F00_0000_6000, 0)),
        ("cudaStreamWaitEvent", lambda b: b.stream_wait_event(0x7F00_0000_5000, 0x7F00_0000_6000)),
        ("cudaEventQuery", lambda b: b.event_query(0x7F00_0000_6000)),
        ("cudaStreamQuery", lambda b: b.stream_query(0)),
        ("cudaGraphLaunch", lambda b: b.graph_launch(0x7F00_0000_7000, 0)),
        ("cudaStreamBeginCapture", lambda b: b.stream_begin_capture(0x7F00_0000_5000, CaptureMode.RELAXED)),
        ("cudaStreamCreateWithPriority", lambda b: b.stream_create(-1)),
        ("cudaEventCreateWithFlags", lambda b: b.event_create(timing=False)),
        ("cudaMalloc", lambda b: b.malloc(1024)),
        ("cudaHostAlloc", lambda b: b.host_malloc(1024)),
        ("cudaPointerGetAttributes", lambda b: b.pointer_kind(0x1000)),
        ("cudaDeviceSynchronize", lambda b: b.device_synchronize()),
    ],
)
def test_calls_accept_int_handles_and_raise_backend_error_from_the_runtime(driverless: Any, call: str, op: Any) -> None:
    """The bindings take the arguments as passed (no TypeError) and the failure is mapped in one place."""
    backend, _ = driverless
    with pytest.raises(BackendError) as info:
        op(backend)
    assert info.value.backend == "cuda"
    assert info.value.call == call
    assert info.value.name.startswith("cudaError")


@needs_bindings
@no_device_only
def test_allocation_without_a_driver_is_not_reported_as_out_of_memory(driverless: Any) -> None:
    backend, _ = driverless
    with pytest.raises(BackendError) as info:
        backend.malloc(1 << 20)
    assert not isinstance(info.value, OutOfMemoryError)


@needs_bindings
def test_error_name_and_string_come_from_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        _loading, "_load_libcuda", lambda: types.SimpleNamespace(cuLaunchHostFunc=_FakeLaunchHostFunc())
    )
    backend = cuda_backend.CudaBackend()
    assert backend.error_name(2) == "cudaErrorMemoryAllocation"
    assert backend.error_string(2) == "out of memory"
    backend.close()
    backend.close()  # idempotent


# -- NVRTC (runs wherever libnvrtc can be loaded; no GPU needed) ---------------------------------------------


def _nvrtc_reason() -> str | None:
    try:
        _compile._nvrtc()
    except Exception as exc:
        return f"NVRTC is not loadable here: {exc}"
    return None


needs_nvrtc = pytest.mark.skipif(
    not _bindings_importable() or _nvrtc_reason() is not None,
    reason=(_nvrtc_reason() or "NVRTC unavailable")
    if _bindings_importable()
    else "cuda-bindings is not installed here",
)

_KERNEL = """
#ifndef __STREAMRT_CUDA__
#error "streamrt must define __STREAMRT_CUDA__"
#endif
extern "C" __global__ void fill(int* out, int value) { out[threadIdx.x] = value; }
"""


@needs_nvrtc
def test_nvrtc_compiles_a_cubin_for_a_supported_architecture() -> None:
    image = cuda_backend.nvrtc_compile(_KERNEL, "fill.cu", [], (9, 0))
    assert image.startswith(b"\x7fELF")


@needs_nvrtc
def test_nvrtc_falls_back_to_ptx_for_an_architecture_it_does_not_know() -> None:
    image = cuda_backend.nvrtc_compile(_KERNEL, "fill.cu", [], (9, 9))
    text = image.rstrip(b"\0").decode()
    assert ".entry fill" in text and ".target sm_90" in text
    assert image.endswith(b"\0")  # cuModuleLoadData needs NUL-terminated PTX


@needs_nvrtc
def test_nvrtc_failure_raises_kernel_compile_error_with_the_log() -> None:
    with pytest.raises(KernelCompileError) as info:
        cuda_backend.nvrtc_compile('extern "C" __global__ void broken( {', "broken.cu", ["-DEXTRA=1"], (9, 0))
    assert "broken.cu" in info.value.log and "error" in info.value.log
    assert "--gpu-architecture=sm_90" in str(info.value) and "-DEXTRA=1" in str(info.value)


@needs_nvrtc
def test_nvrtc_keeps_an_architecture_the_caller_chose() -> None:
    image = cuda_backend.nvrtc_compile(_KERNEL, "fill.cu", ["--gpu-architecture=compute_80"], (9, 0))
    assert b".target sm_80" in image


def test_pointer_kinds_cover_every_cuda_memory_type() -> None:
    assert set(_memory._POINTER_KINDS.values()) == set(PointerKind)
