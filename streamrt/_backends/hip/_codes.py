"""HIP and hiprtc return codes into the streamrt error hierarchy: every return code goes through :func:`_check`."""

from __future__ import annotations

from ..._errors import BackendError, CaptureError, OutOfMemoryError, StreamRTError
from .._cstring import c_string
from . import _loading as L

__all__ = ["error_name", "error_string"]

# hipError_t values used here (HIP's enum; hip-python 10.0).
_INVALID_VALUE = 1
_OUT_OF_MEMORY = 2
_NO_DEVICE = 100
_NOT_READY = 600
# hipErrorStreamCapture{Unsupported,Invalidated,Merge,Unmatched,Unjoined,Isolation,
# Implicit}, hipErrorCapturedEvent, hipErrorStreamCaptureWrongThread.
_CAPTURE_ERRORS = frozenset(range(900, 909))

# hiprtcResult values used here.
_HIPRTC_ERROR_INVALID_OPTION = 5
_HIPRTC_ERROR_COMPILATION = 6


def error_name(code: int) -> str:
    """``hipGetErrorName`` for ``code``; a placeholder for a code HIP does not define."""
    try:
        member = L._hip.hipError_t(int(code))
    except ValueError:
        return f"hipErrorUnknown({int(code)})"
    return c_string(L._hip.hipGetErrorName(member)[1])


def error_string(code: int) -> str:
    """``hipGetErrorString`` for ``code``."""
    try:
        member = L._hip.hipError_t(int(code))
    except ValueError:
        return f"unknown HIP error code {int(code)}"
    return c_string(L._hip.hipGetErrorString(member)[1])


def _error(code: int, call: str, requested: int | None = None) -> StreamRTError:
    """The streamrt error for a failed HIP call (see :func:`_check`).

    Clears the calling thread's HIP last error: the failure is reported here,
    and must not surface again in another library that checks
    ``hipGetLastError`` after its own calls (PyTorch does, after every launch).
    """
    code = int(code)
    L._hip.hipGetLastError()
    name = error_name(code)
    message = error_string(code)
    if code == _OUT_OF_MEMORY:
        asked = f" ({requested} bytes requested)" if requested is not None else ""
        return OutOfMemoryError(
            f"hip error {code} ({name}) in {call}: {message}{asked}",
            requested=requested,
            backend="hip",
            code=code,
        )
    backend_error = BackendError("hip", code, name, message, call)
    if code in _CAPTURE_ERRORS:
        capture_error = CaptureError(str(backend_error))
        capture_error.__cause__ = backend_error
        return capture_error
    return backend_error


def _not_a_signal(address: int, call: str) -> BackendError:
    message = f"{address:#x} is not a signal of this backend (use signal_alloc)"
    return BackendError("hip", _INVALID_VALUE, "hipErrorInvalidValue", message, call)


def _check(code: int, call: str, requested: int | None = None) -> None:
    """Raise for a failed HIP call; return for ``hipSuccess``.

    ``hipErrorOutOfMemory`` raises :class:`OutOfMemoryError`, stream-capture
    errors raise :class:`CaptureError` (caused by the :class:`BackendError`),
    every other code raises :class:`BackendError`. Hot paths test ``if err:``
    first, so a successful call costs no function call. A failure clears the
    thread's HIP last error (see :func:`_error`).
    """
    if code:
        raise _error(code, call, requested)


def _rtc_error(code: int, call: str) -> BackendError:
    """A failed hiprtc call (other than a compile error) as a :class:`BackendError`."""
    try:
        member = L._hiprtc.hiprtcResult(int(code))
    except ValueError:
        return BackendError("hip", int(code), f"HIPRTC_ERROR({int(code)})", "unknown hiprtc result", call)
    return BackendError("hip", int(code), member.name, c_string(L._hiprtc.hiprtcGetErrorString(member)[1]), call)
