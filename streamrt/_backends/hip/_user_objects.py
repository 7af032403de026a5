"""Capture info and user objects of the HIP backend, by ctypes on the HIP runtime hip-python loaded.

A mixin of :class:`~streamrt._backends.hip.HipBackend`. The four entry points
(:data:`USER_OBJECT_SYMBOLS`) are called through ctypes with their C
prototypes, on the very ``libamdhip64.so`` that hip-python opened (found
among the process's mapped libraries, so a ``ROCM_PATH`` build such as the
HIP-on-CUDA harness is the one used): the destructor must reach HIP as a
plain native pointer (hip-python would wrap a Python callable), and
``hipStreamGetCaptureInfo_v2`` returns an array of nodes that is not needed.
Flags are HIP's: ``hipUserObjectNoDestructorSync`` = 1,
``hipGraphUserObjectMove`` = 1; ``hipStreamCaptureStatus`` None 0, Active 1,
Invalidated 2.

Thread rules: every method may be called from any thread.
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any

from ..._errors import BackendError, CaptureError
from ._core import HipCore
from ._loading import loaded_hip_library

__all__ = ["HipUserObjects", "USER_OBJECT_SYMBOLS"]

#: The HIP C symbols this mixin calls (a HIP library, the HIP-on-CUDA harness too, must export them).
USER_OBJECT_SYMBOLS = ("hipGraphRetainUserObject", "hipStreamGetCaptureInfo_v2", "hipUserObjectCreate", "hipUserObjectRelease")

_USER_OBJECT_NO_DESTRUCTOR_SYNC = 1
_GRAPH_USER_OBJECT_MOVE = 1
_CAPTURE_ACTIVE, _CAPTURE_INVALIDATED = 1, 2
_CAPTURE_ERRORS = frozenset(range(900, 909))
_NOT_FOUND = 500  # hipErrorNotFound

_p = ctypes.c_void_p
_u = ctypes.c_uint


class _Hip:
    """The four entry points, bound once per process."""

    def __init__(self) -> None:
        path = loaded_hip_library()
        if path is None:
            raise BackendError("hip", _NOT_FOUND, "hipErrorNotFound", "libamdhip64.so is not loaded in this process", "hipUserObjectCreate")
        lib = ctypes.CDLL(path)
        self.create = _bind(lib, "hipUserObjectCreate", [ctypes.POINTER(_p), _p, _p, _u, _u])
        self.release = _bind(lib, "hipUserObjectRelease", [_p, _u])
        self.retain = _bind(lib, "hipGraphRetainUserObject", [_p, _p, _u, _u])
        self.capture_info = _bind(
            lib, "hipStreamGetCaptureInfo_v2",
            [_p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_ulonglong), ctypes.POINTER(_p), _p, _p],
        )


def _bind(lib: ctypes.CDLL, name: str, argtypes: list[Any]) -> Any:
    fn = getattr(lib, name)
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


_hip: _Hip | None = None
_hip_lock = threading.Lock()


def _get_hip() -> _Hip:
    global _hip
    if _hip is None:
        with _hip_lock:
            if _hip is None:
                _hip = _Hip()
    return _hip


class HipUserObjects(HipCore):
    """``stream_capture_graph`` and the user-object calls of the HIP backend (see the module docstring)."""

    if TYPE_CHECKING:  # HipBackend's

        def error_name(self, code: int) -> str: ...
        def error_string(self, code: int) -> str: ...

    def _hip_call(self, call: str, fn: Any, *args: Any) -> None:
        code = int(fn(*args))
        if code:
            error = BackendError("hip", code, self.error_name(code), self.error_string(code), call)
            if code in _CAPTURE_ERRORS:
                capture = CaptureError(str(error))
                capture.__cause__ = error
                raise capture
            raise error

    def stream_capture_graph(self, stream: int) -> int:
        status = ctypes.c_int(0)
        ident = ctypes.c_ulonglong(0)
        graph = _p()
        self._hip_call(
            "hipStreamGetCaptureInfo_v2", _get_hip().capture_info, stream, ctypes.byref(status), ctypes.byref(ident),
            ctypes.byref(graph), None, None,
        )
        if status.value == _CAPTURE_INVALIDATED:
            raise CaptureError(f"the capture on stream {stream:#x} was invalidated (hipStreamGetCaptureInfo_v2)")
        return int(graph.value or 0) if status.value == _CAPTURE_ACTIVE else 0

    def user_object_create(self, destructor: int, user_data: int) -> int:
        if not destructor:
            raise ValueError("the destructor is NULL")
        obj = _p()
        self._hip_call("hipUserObjectCreate", _get_hip().create, ctypes.byref(obj), user_data, destructor, 1, _USER_OBJECT_NO_DESTRUCTOR_SYNC)
        return int(obj.value or 0)

    def graph_retain_user_object(self, graph: int, user_object: int) -> None:
        self._hip_call("hipGraphRetainUserObject", _get_hip().retain, graph, user_object, 1, _GRAPH_USER_OBJECT_MOVE)

    def user_object_release(self, user_object: int) -> None:
        self._hip_call("hipUserObjectRelease", _get_hip().release, user_object, 1)
