"""The simulator's error codes, names and strings, and the one place failures are raised.

The codes mirror CUDA runtime codes (``cudaErrorInvalidValue`` = 1 becomes
``simErrorInvalidValue`` = 1, and so on) so that code comparing numbers across
backends sees the same values. One code has no CUDA counterpart:
:data:`HAZARD` (10000), raised only by hazard checking in ``"raise"`` mode.
"""

from __future__ import annotations

from typing import NoReturn

from ..._errors import BackendError

__all__ = [
    "ERRORS",
    "error_name",
    "error_string",
    "make_error",
    "fail",
]

SUCCESS = 0
INVALID_VALUE = 1
MEMORY_ALLOCATION = 2
DEINITIALIZED = 4
INVALID_CONFIGURATION = 9
INVALID_DEVICE = 101
INVALID_KERNEL_IMAGE = 200
INVALID_HANDLE = 400
ILLEGAL_STATE = 401
SYMBOL_NOT_FOUND = 500
NOT_READY = 600
ILLEGAL_ADDRESS = 700
LAUNCH_FAILURE = 719
NOT_PERMITTED = 800
NOT_SUPPORTED = 801
CAPTURE_UNSUPPORTED = 900
CAPTURE_INVALIDATED = 901
CAPTURE_MERGE = 902
CAPTURE_UNMATCHED = 903
CAPTURE_UNJOINED = 904
CAPTURE_ISOLATION = 905
CAPTURE_IMPLICIT = 906
CAPTURED_EVENT = 907
CAPTURE_WRONG_THREAD = 908
UNKNOWN = 999
HAZARD = 10000

#: code -> (name, description); names follow CUDA's with the ``sim`` prefix.
ERRORS: dict[int, tuple[str, str]] = {
    SUCCESS: ("simSuccess", "no error"),
    INVALID_VALUE: ("simErrorInvalidValue", "invalid argument"),
    MEMORY_ALLOCATION: ("simErrorMemoryAllocation", "out of memory"),
    DEINITIALIZED: ("simErrorDeinitialized", "the simulated device has been closed"),
    INVALID_CONFIGURATION: ("simErrorInvalidConfiguration", "invalid launch configuration"),
    INVALID_DEVICE: ("simErrorInvalidDevice", "invalid device ordinal"),
    INVALID_KERNEL_IMAGE: ("simErrorInvalidKernelImage", "device kernel image is invalid"),
    INVALID_HANDLE: ("simErrorInvalidResourceHandle", "invalid resource handle"),
    ILLEGAL_STATE: ("simErrorIllegalState", "the operation is not valid in the current state"),
    SYMBOL_NOT_FOUND: ("simErrorSymbolNotFound", "named symbol not found"),
    NOT_READY: ("simErrorNotReady", "device not ready"),
    ILLEGAL_ADDRESS: ("simErrorIllegalAddress", "an illegal memory access was encountered"),
    LAUNCH_FAILURE: ("simErrorLaunchFailure", "unspecified launch failure"),
    NOT_PERMITTED: ("simErrorNotPermitted", "operation not permitted"),
    NOT_SUPPORTED: ("simErrorNotSupported", "operation not supported"),
    CAPTURE_UNSUPPORTED: ("simErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"),
    CAPTURE_INVALIDATED: (
        "simErrorStreamCaptureInvalidated",
        "operation failed due to a previous error during capture",
    ),
    CAPTURE_MERGE: ("simErrorStreamCaptureMerge", "operation would result in a merge of separate capture sequences"),
    CAPTURE_UNMATCHED: ("simErrorStreamCaptureUnmatched", "capture was not ended in the same stream as it began"),
    CAPTURE_UNJOINED: ("simErrorStreamCaptureUnjoined", "capturing stream has unjoined work"),
    CAPTURE_ISOLATION: (
        "simErrorStreamCaptureIsolation",
        "dependency created on uncaptured work in another stream",
    ),
    CAPTURE_IMPLICIT: (
        "simErrorStreamCaptureImplicit",
        "operation would make the legacy stream depend on a capturing blocking stream",
    ),
    CAPTURED_EVENT: (
        "simErrorCapturedEvent",
        "operation not permitted on an event last recorded in a capturing stream",
    ),
    CAPTURE_WRONG_THREAD: (
        "simErrorStreamCaptureWrongThread",
        "attempt to terminate a thread-local capture sequence from another thread",
    ),
    UNKNOWN: ("simErrorUnknown", "unknown error"),
    HAZARD: ("simErrorHazard", "a memory hazard was detected (hazard checking in 'raise' mode)"),
}

_UNRECOGNIZED = "unrecognized error code"


def error_name(code: int) -> str:
    """The symbolic name of ``code``; ``"unrecognized error code"`` for codes not in :data:`ERRORS`."""
    entry = ERRORS.get(int(code))
    return entry[0] if entry is not None else _UNRECOGNIZED


def error_string(code: int) -> str:
    """The description of ``code``; ``"unrecognized error code"`` for codes not in :data:`ERRORS`."""
    entry = ERRORS.get(int(code))
    return entry[1] if entry is not None else _UNRECOGNIZED


def make_error(code: int, message: str, call: str = "") -> BackendError:
    """A :class:`~streamrt.BackendError` for ``code`` with the sim name and ``message``."""
    return BackendError("sim", code, error_name(code), message, call)


def fail(code: int, message: str, call: str = "") -> NoReturn:
    """Raise :func:`make_error` (``code``, ``message``, ``call``). Every sim failure goes through here."""
    raise make_error(code, message, call)
