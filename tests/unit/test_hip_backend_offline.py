"""The hip backend without a HIP device: probing, the unavailable error, lazy import, error mapping.

The mapping tests replace hip-python with a small stand-in module, so they run
(and check the one ``_check``) on machines without hip-python.
"""

from __future__ import annotations

import enum
import subprocess
import sys
import types
from collections.abc import Iterator

import pytest

import streamrt as srt
from streamrt._backends import hip as hip_backend
from streamrt._backends import load_backend
from streamrt._backends.hip import _codes, _loading
from streamrt._errors import BackendError, BackendUnavailableError, CaptureError, OutOfMemoryError

_INSTALL_HINT = "pip install 'streamrt[hip]'"


def test_importing_the_backend_does_not_import_hip_python() -> None:
    code = (
        "import sys, streamrt._backends.hip\n"
        "loaded = sorted(m for m in sys.modules if m == 'hip' or m.startswith(('hip.', 'rocm')))\n"
        "print(loaded)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_probe_gives_a_reason_when_hip_is_not_usable() -> None:
    reason = hip_backend.probe()
    if reason is None:
        pytest.skip("a HIP device is usable here")
    assert isinstance(reason, str)
    assert any(
        cause in reason
        for cause in ("hip-python is not installed", "libamdhip64.so", "no usable HIP device", "no HIP device found")
    ), reason


def test_create_raises_unavailable_naming_the_cause() -> None:
    reason = hip_backend.probe()
    if reason is None:
        pytest.skip("a HIP device is usable here")
    with pytest.raises(BackendUnavailableError) as info:
        hip_backend.create()
    message = str(info.value)
    assert "backend 'hip' is not available" in message
    assert reason.split(". ")[0] in message


def test_open_runtime_hip_raises_unavailable_when_hip_is_missing() -> None:
    if hip_backend.probe() is None:
        pytest.skip("a HIP device is usable here")
    with pytest.raises(BackendUnavailableError):
        srt.open_runtime("hip")


def test_missing_hip_python_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_loading, "_hip_python_installed", lambda: False)
    reason = hip_backend.probe()
    assert reason is not None
    assert "hip-python is not installed" in reason and _INSTALL_HINT in reason
    with pytest.raises(BackendUnavailableError, match=r"hip-python is not installed.*pip install 'streamrt\[hip\]'"):
        load_backend("hip")


def test_create_rejects_options() -> None:
    with pytest.raises(TypeError, match="takes no options"):
        hip_backend.create(profile="h200")


# -- a stand-in for hip-python -------------------------------------------------------------


class _FakeHipError(enum.IntEnum):
    hipSuccess = 0
    hipErrorInvalidValue = 1
    hipErrorOutOfMemory = 2
    hipErrorInsufficientDriver = 35
    hipErrorNoDevice = 100
    hipErrorInvalidHandle = 400
    hipErrorNotReady = 600
    hipErrorStreamCaptureInvalidated = 901


_FAKE_TEXT = {
    0: "no error",
    1: "invalid argument",
    2: "out of memory",
    35: "driver version is insufficient for runtime version",
    100: "no ROCm-capable device is detected",
    400: "invalid resource handle",
    600: "device not ready",
    901: "operation failed due to a previous error during capture",
}


def _fake_hip(device_count: object) -> types.SimpleNamespace:
    """hip-python's calling convention: a tuple led by the error enum; names as byte strings."""

    def hipGetDeviceCount() -> tuple[object, int]:  # noqa: N802 (HIP's name)
        if isinstance(device_count, Exception):
            raise device_count
        assert isinstance(device_count, tuple)
        return device_count

    fake = types.SimpleNamespace(
        hipError_t=_FakeHipError,
        hipGetErrorName=lambda err: (_FakeHipError.hipSuccess, err.name.encode()),
        hipGetErrorString=lambda err: (_FakeHipError.hipSuccess, _FAKE_TEXT[int(err)].encode()),
        hipGetDeviceCount=hipGetDeviceCount,
        last_error_reads=0,
    )

    def hipGetLastError() -> object:  # noqa: N802 (HIP's name)
        fake.last_error_reads += 1
        return _FakeHipError.hipSuccess

    fake.hipGetLastError = hipGetLastError
    return fake


@pytest.fixture
def fake_hip(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.SimpleNamespace]:
    fake = _fake_hip((_FakeHipError.hipSuccess, 1))
    monkeypatch.setattr(_loading, "_hip_python_installed", lambda: True)
    monkeypatch.setattr(_loading, "_hip", fake)
    yield fake


def test_unloadable_libamdhip64_names_rocm_path(fake_hip: types.SimpleNamespace) -> None:
    error = RuntimeError("failed to dlopen 'libamdhip64.so': cannot open shared object file")
    fake_hip.hipGetDeviceCount = _fake_hip(error).hipGetDeviceCount
    reason = hip_backend.probe()
    assert reason is not None
    assert "libamdhip64.so could not be loaded" in reason and "ROCM_PATH" in reason
    with pytest.raises(BackendUnavailableError, match="ROCM_PATH"):
        hip_backend.create()


def test_no_device_is_reported_with_hips_error_name(fake_hip: types.SimpleNamespace) -> None:
    fake_hip.hipGetDeviceCount = _fake_hip((_FakeHipError.hipErrorNoDevice, 0)).hipGetDeviceCount
    reason = hip_backend.probe()
    assert reason is not None
    assert "no usable HIP device (hipErrorNoDevice: no ROCm-capable device is detected)" in reason


def test_zero_devices_is_reported(fake_hip: types.SimpleNamespace) -> None:
    fake_hip.hipGetDeviceCount = _fake_hip((_FakeHipError.hipSuccess, 0)).hipGetDeviceCount
    assert "no HIP device found" in (hip_backend.probe() or "")


def test_check_passes_success(fake_hip: types.SimpleNamespace) -> None:
    _codes._check(_FakeHipError.hipSuccess, "hipStreamQuery")
    _codes._check(0, "hipStreamQuery")


def test_check_raises_backend_error_with_code_name_and_call(fake_hip: types.SimpleNamespace) -> None:
    with pytest.raises(BackendError) as info:
        _codes._check(_FakeHipError.hipErrorInvalidHandle, "hipStreamDestroy")
    err = info.value
    assert (err.backend, err.code, err.name, err.call) == ("hip", 400, "hipErrorInvalidHandle", "hipStreamDestroy")
    assert "invalid resource handle" in str(err)
    assert fake_hip.last_error_reads == 1  # the thread's last error was cleared


def test_check_turns_out_of_memory_into_out_of_memory_error(fake_hip: types.SimpleNamespace) -> None:
    with pytest.raises(OutOfMemoryError) as info:
        _codes._check(_FakeHipError.hipErrorOutOfMemory, "hipMalloc", requested=1 << 40)
    err = info.value
    assert isinstance(err, MemoryError)
    assert (err.backend, err.code, err.requested) == ("hip", 2, 1 << 40)
    assert "hipErrorOutOfMemory" in str(err) and "hipMalloc" in str(err)


def test_check_turns_capture_errors_into_capture_error(fake_hip: types.SimpleNamespace) -> None:
    with pytest.raises(CaptureError) as info:
        _codes._check(_FakeHipError.hipErrorStreamCaptureInvalidated, "hipStreamEndCapture")
    cause = info.value.__cause__
    assert isinstance(cause, BackendError)
    assert (cause.code, cause.name) == (901, "hipErrorStreamCaptureInvalidated")


def test_error_name_of_a_code_hip_does_not_define(fake_hip: types.SimpleNamespace) -> None:
    assert hip_backend.error_name(12345) == "hipErrorUnknown(12345)"
    assert "12345" in hip_backend.error_string(12345)
