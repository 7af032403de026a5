"""CUDA return codes into the streamrt error hierarchy: the one place both APIs' errors are mapped.

:func:`_check` takes runtime-API (``cudaError_t``) codes, :func:`_check_driver`
driver-API (``CUresult``) codes. Both return on success and raise otherwise;
:func:`_driver_error` returns the error a driver code maps to.
"""

from __future__ import annotations

from typing import Any

from ..._errors import BackendError, CaptureError, OutOfMemoryError
from .._cstring import c_string
from ._loading import _driver, _runtime

__all__: list[str] = []

# Driver-API result codes used on the error path (values fixed by cuda.h).
_CUDA_ERROR_INVALID_VALUE = 1
_CUDA_ERROR_INVALID_CONTEXT = 201


def _is_capture_error(name: str) -> bool:
    return (
        name.startswith("cudaErrorStreamCapture")
        or name == "cudaErrorCapturedEvent"
        or name.startswith("CUDA_ERROR_STREAM_CAPTURE_")
        or name == "CUDA_ERROR_CAPTURED_EVENT"
    )


def _error(code: int, name: str, message: str, call: str, requested: int | None, oom: bool, extra: str) -> Exception:
    if oom:
        asked = f": requested {requested} bytes" if requested is not None else ""
        return OutOfMemoryError(
            f"cuda out of memory in {call}{asked}{extra} ({name}: {message})",
            requested=requested,
            backend="cuda",
            code=code,
        )
    error = BackendError("cuda", code, name, message, call)
    if _is_capture_error(name):
        capture = CaptureError(f"graph capture failed: {error}")
        capture.__cause__ = error
        return capture
    return error


def _check(err: Any, call: str, requested: int | None = None, extra: str = "") -> None:
    """Turn a CUDA runtime return code into the streamrt error hierarchy; success returns.

    ``cudaErrorMemoryAllocation`` becomes ``OutOfMemoryError`` (with ``requested``
    when known); capture errors become ``CaptureError`` raised from the
    ``BackendError``; everything else is a ``BackendError``. The runtime's
    per-thread last error is cleared, since the error has been reported here.
    """
    code = int(err)
    if code == 0:
        return
    rt = _runtime()
    name = c_string(rt.cudaGetErrorName(code)[1])
    message = c_string(rt.cudaGetErrorString(code)[1])
    rt.cudaGetLastError()
    raise _error(code, name, message, call, requested, name == "cudaErrorMemoryAllocation", extra)


def _check_driver(err: Any, call: str, requested: int | None = None) -> None:
    """Like :func:`_check`, for driver-API ``CUresult`` codes."""
    code = int(err)
    if code != 0:
        raise _driver_error(code, call, requested)


def _driver_error(code: int, call: str, requested: int | None = None) -> Exception:
    """The streamrt error of a failed driver-API call (``code`` != 0), as :func:`_check_driver` raises it."""
    drv = _driver()
    try:
        result = drv.CUresult(code)
        name = str(result.name)
    except ValueError:
        result, name = None, f"CUresult {code}"
    message = name
    if result is not None:
        try:
            status, text = drv.cuGetErrorString(result)
            if int(status) == 0 and text:
                message = c_string(text)
        except Exception:  # the name alone is still a usable message
            pass
    return _error(code, name, message, call, requested, name == "CUDA_ERROR_OUT_OF_MEMORY", "")


def _not_a_signal(address: int, call: str) -> BackendError:
    message = f"{address:#x} is not a signal of this backend (use signal_alloc)"
    return BackendError("cuda", _CUDA_ERROR_INVALID_VALUE, "cudaErrorInvalidValue", message, call)
