"""Capture info and user objects of the CUDA backend, through the driver API (``libcuda``) with ctypes.

A mixin of :class:`~streamrt._backends.cuda.CudaBackend`. The driver API is
called directly, as for ``cuLaunchHostFunc``: the bindings' user-object and
capture-info wrappers differ between cuda-bindings 12 and 13 (CUDA 13 gave
``cuStreamGetCaptureInfo`` the edge-data form), and the destructor must be
handed to the driver as a plain native pointer, with no trampoline that takes
the GIL. ``cuStreamGetCaptureInfo`` is resolved with ``cuGetProcAddress`` for
the CUDA 12.0 ABI (stream, status, id, graph, dependencies, count), which every
driver since keeps. Runtime and driver handles are the same pointers
(``cudaGraph_t`` is ``CUgraph``), so the graph a torch or CuPy capture builds
is named by the int this returns.

Thread rules: every method may be called from any thread; a thread with no
current context gets the device's primary context first (``cudaFree(0)``),
as the backend's other driver-API calls do.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any

from ..._errors import BackendError, CaptureError
from ._core import CudaCore

__all__ = ["CudaUserObjects"]

_CUDA_ERROR_INVALID_CONTEXT = 201
_CU_USER_OBJECT_NO_DESTRUCTOR_SYNC = 1
_CU_GRAPH_USER_OBJECT_MOVE = 1
_CAPTURE_ACTIVE, _CAPTURE_INVALIDATED = 1, 2  # CUstreamCaptureStatus
_CAPTURE_ERRORS = frozenset(range(900, 909))  # CUDA_ERROR_STREAM_CAPTURE_* .. CUDA_ERROR_CAPTURED_EVENT, WRONG_THREAD

_p = ctypes.c_void_p
_u = ctypes.c_uint


class _Driver:
    """The four driver entry points, bound once per process."""

    def __init__(self) -> None:
        names = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")
        lib: ctypes.CDLL | None = None
        for name in names:
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if lib is None:
            raise BackendError("cuda", 35, "CUDA_ERROR_NO_DEVICE", "the CUDA driver library could not be loaded", "cuUserObjectCreate")
        self.create = _bind(lib, "cuUserObjectCreate", [ctypes.POINTER(_p), _p, _p, _u, _u])
        self.release = _bind(lib, "cuUserObjectRelease", [_p, _u])
        self.retain = _bind(lib, "cuGraphRetainUserObject", [_p, _p, _u, _u])
        self.error_name = lib.cuGetErrorName
        self.error_name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.error_name.restype = ctypes.c_int
        prototype = ctypes.CFUNCTYPE(
            ctypes.c_int, _p, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(_p), _p, _p
        )
        address = _p()
        get_proc = getattr(lib, "cuGetProcAddress_v2", None)
        if get_proc is not None:
            get_proc.argtypes = [ctypes.c_char_p, ctypes.POINTER(_p), ctypes.c_int, ctypes.c_uint64, _p]
            get_proc.restype = ctypes.c_int
            status = ctypes.c_int(0)
            if get_proc(b"cuStreamGetCaptureInfo", ctypes.byref(address), 12000, 0, ctypes.byref(status)) != 0:
                address = _p()
        if not address.value:
            symbol = getattr(lib, "cuStreamGetCaptureInfo_v2", None)
            address = _p(ctypes.cast(symbol, _p).value if symbol is not None else None)
        self.capture_info = prototype(address.value) if address.value else None


def _bind(lib: ctypes.CDLL, name: str, argtypes: list[Any]) -> Any:
    fn = getattr(lib, name)
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn


_driver: _Driver | None = None
_driver_lock = threading.Lock()


def _get_driver() -> _Driver:
    global _driver
    if _driver is None:
        with _driver_lock:
            if _driver is None:
                _driver = _Driver()
    return _driver


class CudaUserObjects(CudaCore):
    """``stream_capture_graph`` and the user-object calls of the CUDA backend (see the module docstring)."""

    def _driver_call(self, call: str, fn: Any, *args: Any) -> None:
        code = fn(*args)
        if code == _CUDA_ERROR_INVALID_CONTEXT:  # a thread that never touched cudart
            self._make_context_current()
            code = fn(*args)
        if code:
            raise _error(_get_driver(), int(code), call)

    def stream_capture_graph(self, stream: int) -> int:
        drv = _get_driver()
        if drv.capture_info is None:
            raise BackendError("cuda", 801, "CUDA_ERROR_NOT_SUPPORTED", "this driver has no cuStreamGetCaptureInfo", "cuStreamGetCaptureInfo")
        status = ctypes.c_int(0)
        ident = ctypes.c_uint64(0)
        graph = _p()
        self._driver_call(
            "cuStreamGetCaptureInfo", drv.capture_info, stream, ctypes.byref(status), ctypes.byref(ident), ctypes.byref(graph), None, None
        )
        if status.value == _CAPTURE_INVALIDATED:
            raise CaptureError(f"the capture on stream {stream:#x} was invalidated (cuStreamGetCaptureInfo)")
        return int(graph.value or 0) if status.value == _CAPTURE_ACTIVE else 0

    def user_object_create(self, destructor: int, user_data: int) -> int:
        if not destructor:
            raise ValueError("the destructor is NULL")
        obj = _p()
        drv = _get_driver()
        self._driver_call(
            "cuUserObjectCreate", drv.create, ctypes.byref(obj), user_data, destructor, 1, _CU_USER_OBJECT_NO_DESTRUCTOR_SYNC
        )
        return int(obj.value or 0)

    def graph_retain_user_object(self, graph: int, user_object: int) -> None:
        self._driver_call("cuGraphRetainUserObject", _get_driver().retain, graph, user_object, 1, _CU_GRAPH_USER_OBJECT_MOVE)

    def user_object_release(self, user_object: int) -> None:
        self._driver_call("cuUserObjectRelease", _get_driver().release, user_object, 1)


def _error(drv: _Driver, code: int, call: str) -> BackendError | CaptureError:
    name = ctypes.c_char_p()
    text = name.value.decode() if drv.error_name(code, ctypes.byref(name)) == 0 and name.value else f"CUresult {code}"
    error = BackendError("cuda", code, text, text, call)
    if code in _CAPTURE_ERRORS:
        capture = CaptureError(f"graph capture failed: {error}")
        capture.__cause__ = error
        return capture
    return error
