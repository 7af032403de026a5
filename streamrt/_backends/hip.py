"""The HIP backend, over hip-python (``pip install 'streamrt[hip]'``).

hip-python is imported lazily, on the first :func:`probe` or :func:`create`:
importing this module costs nothing when HIP is absent. hip-python itself
opens ``libamdhip64.so`` / ``libhiprtc.so`` on the first call into them, from
``$ROCM_PATH/lib`` (or ``$ROCM_HOME/lib``, ``/opt/rocm/lib``) or the loader path.

Conventions of hip-python 10 that shape this module:

* every call returns a tuple whose first item is a ``hipError_t`` (an
  ``IntEnum``; ``hipSuccess`` is 0 and so falsy);
* handle and pointer arguments accept ``int``, but converting an ``int`` costs
  about a microsecond per argument, while an instance of the binding's own
  ``Pointer`` subclasses is passed straight through. The backend therefore
  keeps one wrapper object per handle it has seen (the object it got back on
  creation, or one made on first use), in bounded caches keyed by the int
  handle; the wrappers own nothing, so dropping them is always safe;
* enum-typed arguments (memcpy kind, capture mode) must be the binding's enum
  members: they are looked up in tuples made once.

Every HIP entry point the backend calls is bound once, by name, from
:data:`_HIP_CALLS` / :data:`_HIPRTC_CALLS`; :data:`REQUIRED_HIP_SYMBOLS` and
:data:`REQUIRED_HIPRTC_SYMBOLS` are the C symbols behind them (what a HIP
library, such as the HIP-on-CUDA test harness, must export). Every return code
goes through :func:`_check`.

Thread rules: the backend object may be used from any thread. hip-python
releases the GIL around every HIP call, so blocking calls (``*_synchronize``)
never hold it. The current device is per thread, as in HIP.
"""

from __future__ import annotations

import ctypes
import importlib.util
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._errors import BackendError, CaptureError, KernelCompileError, OutOfMemoryError, StreamRTError
from . import unavailable
from ._hip_user_objects import HipUserObjects
from .protocol import Capabilities, CaptureMode, MemcpyKind, PointerKind, priority_clamp

__all__ = [
    "HipBackend",
    "INSTALL_HINT",
    "REQUIRED_HIP_SYMBOLS",
    "REQUIRED_HIPRTC_SYMBOLS",
    "create",
    "probe",
    "share_key",
]

INSTALL_HINT = "pip install 'streamrt[hip]'"

# hip-python function name -> the C symbol it resolves in libamdhip64.so.
_HIP_CALLS: dict[str, str] = {
    "hipGetDeviceCount": "hipGetDeviceCount",
    "hipSetDevice": "hipSetDevice",
    "hipGetDevice": "hipGetDevice",
    "hipGetDeviceProperties": "hipGetDevicePropertiesR0600",
    "hipDeviceSynchronize": "hipDeviceSynchronize",
    "hipMemGetInfo": "hipMemGetInfo",
    "hipDeviceGetStreamPriorityRange": "hipDeviceGetStreamPriorityRange",
    "hipStreamCreateWithPriority": "hipStreamCreateWithPriority",
    "hipStreamDestroy": "hipStreamDestroy",
    "hipStreamSynchronize": "hipStreamSynchronize",
    "hipStreamQuery": "hipStreamQuery",
    "hipStreamWaitEvent": "hipStreamWaitEvent",
    "hipEventCreateWithFlags": "hipEventCreateWithFlags",
    "hipEventDestroy": "hipEventDestroy",
    "hipEventRecord": "hipEventRecord",
    "hipEventQuery": "hipEventQuery",
    "hipEventSynchronize": "hipEventSynchronize",
    "hipEventElapsedTime": "hipEventElapsedTime",
    "hipMalloc": "hipMalloc",
    "hipFree": "hipFree",
    "hipHostMalloc": "hipHostMalloc",
    "hipHostFree": "hipHostFree",
    "hipMallocAsync": "hipMallocAsync",
    "hipFreeAsync": "hipFreeAsync",
    "hipPointerGetAttributes": "hipPointerGetAttributes",
    "hipGetLastError": "hipGetLastError",
    "hipMemsetAsync": "hipMemsetAsync",
    "hipMemcpyAsync": "hipMemcpyAsync",
    "hipDeviceCanAccessPeer": "hipDeviceCanAccessPeer",
    "hipDeviceEnablePeerAccess": "hipDeviceEnablePeerAccess",
    "hipMemcpyPeerAsync": "hipMemcpyPeerAsync",
    "hipLaunchHostFunc": "hipLaunchHostFunc",
    "hipDeviceGetAttribute": "hipDeviceGetAttribute",
    "hipExtMallocWithFlags": "hipExtMallocWithFlags",
    "hipStreamWaitValue64": "hipStreamWaitValue64",
    "hipStreamBeginCapture": "hipStreamBeginCapture",
    "hipStreamEndCapture": "hipStreamEndCapture",
    "hipStreamIsCapturing": "hipStreamIsCapturing",
    "hipGraphInstantiate": "hipGraphInstantiate",
    "hipGraphLaunch": "hipGraphLaunch",
    "hipGraphExecDestroy": "hipGraphExecDestroy",
    "hipGraphDestroy": "hipGraphDestroy",
    "hipModuleLoadData": "hipModuleLoadData",
    "hipModuleGetFunction": "hipModuleGetFunction",
    "hipModuleUnload": "hipModuleUnload",
    "hipModuleLaunchKernel": "hipModuleLaunchKernel",
    "hipGetErrorName": "hipGetErrorName",
    "hipGetErrorString": "hipGetErrorString",
}

# hip-python hiprtc function name -> the C symbol it resolves in libhiprtc.so.
_HIPRTC_CALLS: dict[str, str] = {
    "hiprtcVersion": "hiprtcVersion",
    "hiprtcCreateProgram": "hiprtcCreateProgram",
    "hiprtcCompileProgram": "hiprtcCompileProgram",
    "hiprtcGetProgramLogSize": "hiprtcGetProgramLogSize",
    "hiprtcGetProgramLog": "hiprtcGetProgramLog",
    "hiprtcGetCodeSize": "hiprtcGetCodeSize",
    "hiprtcGetCode": "hiprtcGetCode",
    "hiprtcDestroyProgram": "hiprtcDestroyProgram",
    "hiprtcGetErrorString": "hiprtcGetErrorString",
}

REQUIRED_HIP_SYMBOLS: tuple[str, ...] = tuple(sorted(set(_HIP_CALLS.values())))
REQUIRED_HIPRTC_SYMBOLS: tuple[str, ...] = tuple(sorted(set(_HIPRTC_CALLS.values())))

# hipError_t values used here (HIP's enum; hip-python 10.0).
_SUCCESS = 0
_INVALID_VALUE = 1
_OUT_OF_MEMORY = 2
_NO_DEVICE = 100
_NOT_READY = 600
_PEER_ACCESS_ALREADY_ENABLED = 704
# hipExtMallocWithFlags / hipStreamWaitValue64 arguments (hip_runtime_api.h).
_MALLOC_SIGNAL_MEMORY = 0x2  # hipMallocSignalMemory
_WAIT_VALUE_GTE = 0x0  # hipStreamWaitValueGte
_ALL_BITS = (1 << 64) - 1
# hipErrorStreamCapture{Unsupported,Invalidated,Merge,Unmatched,Unjoined,Isolation,
# Implicit}, hipErrorCapturedEvent, hipErrorStreamCaptureWrongThread.
_CAPTURE_ERRORS = frozenset(range(900, 909))

# hipStreamNonBlocking, hipEventBlockingSync, hipEventDisableTiming, hipHostMallocPortable.
_STREAM_NON_BLOCKING = 0x1
_EVENT_BLOCKING_SYNC = 0x1
_EVENT_DISABLE_TIMING = 0x2
_HOST_MALLOC_PORTABLE = 0x1

# hiprtcResult values used here.
_HIPRTC_ERROR_INVALID_OPTION = 5
_HIPRTC_ERROR_COMPILATION = 6

# hipMemoryType -> PointerKind (Unregistered 0, Host 1, Device 2, Managed 3, Array 10, Unified 11).
_MEMORY_TYPES = {
    0: PointerKind.PAGEABLE,
    1: PointerKind.HOST,
    2: PointerKind.DEVICE,
    3: PointerKind.MANAGED,
    10: PointerKind.DEVICE,
    11: PointerKind.MANAGED,
}

# Conversion caches (int handle -> hip-python wrapper) are cleared when they reach this size.
_CACHE_LIMIT = 4096

# The hip-python modules, loaded by _load().
_hip: Any = None
_hiprtc: Any = None
_types: Any = None
_helpers: Any = None


def _load() -> None:
    """Import hip-python (once). Raises ``ImportError`` when it is not installed."""
    global _hip, _hiprtc, _types, _helpers
    if _hip is not None:
        return
    import hip as _package  # noqa: F401  (the hip-python distribution; fails if absent)
    from rocm.bindings import _hip_helpers as helpers
    from rocm.bindings import hip as hip_module
    from rocm.bindings import hiprtc as hiprtc_module
    from rocm.bindings.util import types

    _types, _helpers, _hiprtc = types, helpers, hiprtc_module
    _hip = hip_module  # last: marks the load complete


def _text(value: object) -> str:
    """A hip-python ``CStr`` / ``bytes`` / ``str`` as ``str`` (up to the first NUL)."""
    if isinstance(value, str):
        return value.split("\0", 1)[0]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value).split("\0", 1)[0]


def error_name(code: int) -> str:
    """``hipGetErrorName`` for ``code``; a placeholder for a code HIP does not define."""
    try:
        member = _hip.hipError_t(int(code))
    except ValueError:
        return f"hipErrorUnknown({int(code)})"
    return _text(_hip.hipGetErrorName(member)[1])


def error_string(code: int) -> str:
    """``hipGetErrorString`` for ``code``."""
    try:
        member = _hip.hipError_t(int(code))
    except ValueError:
        return f"unknown HIP error code {int(code)}"
    return _text(_hip.hipGetErrorString(member)[1])


def _error(code: int, call: str, requested: int | None = None) -> StreamRTError:
    """The streamrt error for a failed HIP call (see :func:`_check`).

    Clears the calling thread's HIP last error: the failure is reported here,
    and must not surface again in another library that checks
    ``hipGetLastError`` after its own calls (PyTorch does, after every launch).
    """
    code = int(code)
    _hip.hipGetLastError()
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
        member = _hiprtc.hiprtcResult(int(code))
    except ValueError:
        return BackendError("hip", int(code), f"HIPRTC_ERROR({int(code)})", "unknown hiprtc result", call)
    return BackendError("hip", int(code), member.name, _text(_hiprtc.hiprtcGetErrorString(member)[1]), call)


def _hip_python_installed() -> bool:
    """Whether hip-python's packages (``hip`` and ``rocm.bindings``) can be imported; imports nothing."""
    return importlib.util.find_spec("hip") is not None and importlib.util.find_spec("rocm") is not None


def _diagnose() -> tuple[str, str] | None:
    """``None`` when HIP is usable here, else ``(what is missing, how to get it)``."""
    if not _hip_python_installed():
        return "hip-python is not installed", f"Install it with: {INSTALL_HINT}"
    try:
        _load()
    except ImportError as exc:
        return f"hip-python could not be imported ({exc})", f"Reinstall it with: {INSTALL_HINT}"
    try:
        err, count = _hip.hipGetDeviceCount()
    except RuntimeError as exc:  # hip-python could not dlopen libamdhip64.so
        return (
            f"libamdhip64.so could not be loaded ({exc})",
            "Install ROCm, or set ROCM_PATH to the ROCm installation whose lib/ holds libamdhip64.so",
        )
    if err:
        return (
            f"no usable HIP device ({error_name(err)}: {error_string(err)})",
            "Check the GPU driver and that this process may access the GPU",
        )
    if count == 0:
        return "no HIP device found", "Check the GPU driver and that this process may access the GPU"
    return None


def probe() -> str | None:
    """``None`` when the HIP backend is usable here, else a one-line reason with the fix."""
    problem = _diagnose()
    return None if problem is None else f"{problem[0]}. {problem[1]}"


def share_key(**options: Any) -> object:
    """Runtimes of one process share one HIP backend object (the runtime is process-wide).

    The backend takes no options: any option gives ``None`` and ``create`` rejects it.
    """
    return None if options else ()


def create(**options: Any) -> HipBackend:
    """The HIP backend. Raises ``BackendUnavailableError`` naming what is missing and how to get it."""
    if options:
        raise TypeError(f"the hip backend takes no options; got {', '.join(sorted(options))}")
    problem = _diagnose()
    if problem is not None:
        raise unavailable("hip", problem[0], problem[1])
    return HipBackend()


class HipBackend(HipUserObjects):
    """The :class:`~streamrt._backends.protocol.Backend` primitives on HIP. Create with :func:`create`."""

    name = "hip"

    if TYPE_CHECKING:
        # The hip-python functions of _HIP_CALLS / _HIPRTC_CALLS, bound in __init__ as ``_<name>``.
        def __getattr__(self, name: str) -> Callable[..., Any]: ...

    def __init__(self) -> None:
        _load()
        hip = _hip
        for py_name in _HIP_CALLS:
            setattr(self, "_" + py_name, getattr(hip, py_name))
        for py_name in _HIPRTC_CALLS:
            setattr(self, "_" + py_name, getattr(_hiprtc, py_name))
        # Enum members hip-python insists on, indexed by value.
        self._memcpy_kinds = tuple(hip.hipMemcpyKind(int(k)) for k in MemcpyKind)
        self._capture_modes = tuple(hip.hipStreamCaptureMode(int(m)) for m in CaptureMode)
        # Wrapper factories for handles first seen as ints.
        self._new_pointer: Callable[[int], Any] = _types.Pointer
        self._new_arg_array: Callable[[int], Any] = _types.ListOfPointer
        self._new_stream: Callable[[int], Any] = hip.ihipStream_t.fromObj
        self._new_event: Callable[[int], Any] = hip.ihipEvent_t.fromObj
        self._new_graph: Callable[[int], Any] = hip.ihipGraph.fromObj
        self._new_graph_exec: Callable[[int], Any] = hip.hipGraphExec.fromObj
        self._new_module: Callable[[int], Any] = hip.ihipModule_t.fromObj
        self._new_function: Callable[[int], Any] = hip.ihipModuleSymbol_t.fromObj
        self._new_host_fn: Callable[[int], Any] = hip.hipHostFn_t.fromObj
        # Conversion caches: int handle -> wrapper. The null stream is always there.
        self._pointers: dict[int, Any] = {}
        self._signals: set[int] = set()  # addresses returned by signal_alloc and not freed
        self._arg_arrays: dict[int, Any] = {}
        self._streams: dict[int, Any] = {0: self._new_stream(0)}
        self._events: dict[int, Any] = {}
        self._graphs: dict[int, Any] = {}
        self._graph_execs: dict[int, Any] = {}
        self._modules: dict[int, Any] = {}
        self._functions: dict[int, Any] = {}
        self._host_fns: dict[int, Any] = {}
        self._module_functions: dict[int, list[int]] = {}
        self._no_extra = _helpers.HipModuleLaunchKernel_extra.fromObj(None)
        self._capabilities: dict[int, Capabilities] = {}
        self._offload_arch: dict[int, str] = {}
        self._compiler_version: str | None = None
        self._closed = False

    # -- handle conversion -------------------------------------------------------
    @staticmethod
    def _remember(cache: dict[int, Any], factory: Callable[[int], Any], handle: int) -> Any:
        """Make the wrapper for ``handle`` and cache it (slow path of every call)."""
        wrapper = factory(handle)
        if len(cache) >= _CACHE_LIMIT:
            cache.clear()
        cache[handle] = wrapper
        return wrapper

    def _keep(self, cache: dict[int, Any], wrapper: Any) -> int:
        """Cache a wrapper hip-python returned and give back its int handle."""
        handle = int(wrapper)
        if len(cache) >= _CACHE_LIMIT:
            cache.clear()
        cache[handle] = wrapper
        return handle

    def _stream(self, stream: int) -> Any:
        wrapper = self._streams.get(stream)
        return wrapper if wrapper is not None else self._remember(self._streams, self._new_stream, stream)

    def _event(self, event: int) -> Any:
        wrapper = self._events.get(event)
        return wrapper if wrapper is not None else self._remember(self._events, self._new_event, event)

    def _pointer(self, ptr: int) -> Any:
        wrapper = self._pointers.get(ptr)
        return wrapper if wrapper is not None else self._remember(self._pointers, self._new_pointer, ptr)

    # -- devices -------------------------------------------------------------------
    def device_count(self) -> int:
        """Number of HIP devices; 0 when HIP reports ``hipErrorNoDevice``."""
        err, count = self._hipGetDeviceCount()
        if err == _NO_DEVICE:
            return 0
        _check(err, "hipGetDeviceCount")
        return int(count)

    def set_device(self, device: int) -> None:
        """Make ``device`` current on the calling thread."""
        _check(self._hipSetDevice(device)[0], "hipSetDevice")

    def ensure_device(self, device: int) -> None:
        """Make ``device`` current on the calling thread if it is not already."""
        if self._current_device() != device:
            self.set_device(device)

    def _current_device(self) -> int:
        err, device = self._hipGetDevice()
        _check(err, "hipGetDevice")
        return int(device)

    def capabilities(self, device: int) -> Capabilities:
        """What ``device`` can do (queried once per device, then cached)."""
        cached = self._capabilities.get(device)
        if cached is not None:
            return cached
        err, props = self._hipGetDeviceProperties(device)
        _check(err, "hipGetDeviceProperties")
        current = self._current_device()
        if current != device:
            self.set_device(device)
        try:
            err, least, greatest = self._hipDeviceGetStreamPriorityRange()
            _check(err, "hipDeviceGetStreamPriorityRange")
        finally:
            if current != device:
                self.set_device(current)
        offload_arch = _text(props.gcnArchName)  # "gfx942:sramecc+:xnack-"; "sm_90" on HIP-on-CUDA
        if not offload_arch:
            raise BackendError(
                "hip", _INVALID_VALUE, "hipErrorInvalidValue", "device reports no gcnArchName", "hipGetDeviceProperties"
            )
        caps = Capabilities(
            backend="hip",
            device_name=_text(props.name),
            architecture=offload_arch.split(":", 1)[0],
            is_simulated=False,
            supports_graphs=True,
            supports_stream_ordered_alloc=bool(props.memoryPoolsSupported),
            supports_pageable_async_copy=True,
            priority_range=(int(least), int(greatest)),
            virtual_clock=False,
            total_memory=int(props.totalGlobalMem),
            multiprocessor_count=int(props.multiProcessorCount),
            supports_stream_signals=self._can_wait_value(device),
            max_shared_memory_per_block=int(props.sharedMemPerBlock),
            dlpack_device_type=10,  # kDLROCM
            profiler_ranges="roctx",
        )
        self._offload_arch[device] = offload_arch
        self._capabilities[device] = caps
        return caps

    def device_synchronize(self) -> None:
        """Wait (GIL released) for all work on the current device."""
        _check(self._hipDeviceSynchronize()[0], "hipDeviceSynchronize")

    def mem_get_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of the current device."""
        err, free, total = self._hipMemGetInfo()
        _check(err, "hipMemGetInfo")
        return int(free), int(total)

    # -- several devices -------------------------------------------------------
    def can_access_peer(self, device: int, peer: int) -> bool:
        """``hipDeviceCanAccessPeer(device, peer)``; ``False`` for ``device == peer``."""
        err, can = self._hipDeviceCanAccessPeer(device, peer)
        _check(err, "hipDeviceCanAccessPeer")
        return bool(can)

    def enable_peer_access(self, peer: int) -> None:
        """``hipDeviceEnablePeerAccess(peer, 0)`` from the current device; already enabled is success."""
        err = self._hipDeviceEnablePeerAccess(peer, 0)[0]
        if err:
            if err == _PEER_ACCESS_ALREADY_ENABLED:
                self._hipGetLastError()  # do not leave it as the thread's last error
                return
            _check(err, "hipDeviceEnablePeerAccess")

    def memcpy_peer_async(self, dst: int, dst_device: int, src: int, src_device: int, nbytes: int, stream: int) -> None:
        """``hipMemcpyPeerAsync``: stream-ordered; staged through the host when peer access is off."""
        st = self._streams.get(stream)
        if st is None:
            st = self._remember(self._streams, self._new_stream, stream)
        err = self._hipMemcpyPeerAsync(self._pointer(dst), dst_device, self._pointer(src), src_device, nbytes, st)[0]
        if err:
            _check(err, "hipMemcpyPeerAsync")

    # -- streams ---------------------------------------------------------------
    def stream_create(self, priority: int = 0) -> int:
        """A non-blocking stream on the current device; ``priority`` is clamped into the device's range."""
        priority = operator.index(priority)
        prio = priority_clamp(priority, self.capabilities(self._current_device()).priority_range)
        err, stream = self._hipStreamCreateWithPriority(_STREAM_NON_BLOCKING, prio)
        _check(err, "hipStreamCreateWithPriority")
        return self._keep(self._streams, stream)

    def stream_destroy(self, stream: int) -> None:
        _check(self._hipStreamDestroy(self._stream(stream))[0], "hipStreamDestroy")
        if stream:
            self._streams.pop(stream, None)

    def stream_synchronize(self, stream: int) -> None:
        """Wait (GIL released) until all work on ``stream`` has completed."""
        _check(self._hipStreamSynchronize(self._stream(stream))[0], "hipStreamSynchronize")

    def stream_query(self, stream: int) -> bool:
        """``True`` when all work on ``stream`` has completed (``hipErrorNotReady`` -> ``False``)."""
        err = self._hipStreamQuery(self._stream(stream))[0]
        if not err:
            return True
        if err == _NOT_READY:
            return False
        raise _error(err, "hipStreamQuery")

    def stream_wait_event(self, stream: int, event: int) -> None:
        err = self._hipStreamWaitEvent(self._stream(stream), self._event(event), 0)[0]
        if err:
            _check(err, "hipStreamWaitEvent")

    # -- events ----------------------------------------------------------------
    def event_create(self, *, timing: bool, blocking_sync: bool = True) -> int:
        """An event; without ``timing`` it is created with ``hipEventDisableTiming``."""
        flags = (0 if timing else _EVENT_DISABLE_TIMING) | (_EVENT_BLOCKING_SYNC if blocking_sync else 0)
        err, event = self._hipEventCreateWithFlags(flags)
        _check(err, "hipEventCreateWithFlags")
        return self._keep(self._events, event)

    def event_destroy(self, event: int) -> None:
        _check(self._hipEventDestroy(self._event(event))[0], "hipEventDestroy")
        self._events.pop(event, None)

    def event_record(self, event: int, stream: int) -> None:
        ev = self._events.get(event)
        if ev is None:
            ev = self._remember(self._events, self._new_event, event)
        st = self._streams.get(stream)
        if st is None:
            st = self._remember(self._streams, self._new_stream, stream)
        err = self._hipEventRecord(ev, st)[0]
        if err:
            _check(err, "hipEventRecord")

    def event_query(self, event: int) -> bool:
        """``True`` when the work before the event's record has completed."""
        ev = self._events.get(event)
        if ev is None:
            ev = self._remember(self._events, self._new_event, event)
        err = self._hipEventQuery(ev)[0]
        if not err:
            return True
        if err == _NOT_READY:
            return False
        raise _error(err, "hipEventQuery")

    def event_synchronize(self, event: int) -> None:
        """Wait (GIL released; sleeping if the event is blocking-sync) for the event."""
        _check(self._hipEventSynchronize(self._event(event))[0], "hipEventSynchronize")

    def event_elapsed_ms(self, start: int, end: int) -> float:
        err, ms = self._hipEventElapsedTime(self._event(start), self._event(end))
        _check(err, "hipEventElapsedTime")
        return float(ms)

    # -- memory ----------------------------------------------------------------
    def malloc(self, nbytes: int) -> int:
        """Device memory; 0 for ``nbytes == 0``. ``OutOfMemoryError`` when HIP has none left."""
        if nbytes == 0:
            return 0
        err, ptr = self._hipMalloc(nbytes)
        _check(err, "hipMalloc", requested=nbytes)
        return self._keep(self._pointers, ptr)

    def free(self, ptr: int) -> None:
        if ptr == 0:
            return
        _check(self._hipFree(self._pointer(ptr))[0], "hipFree")
        self._pointers.pop(ptr, None)

    def host_malloc(self, nbytes: int) -> int:
        """Page-locked, portable host memory (``hipHostMalloc(n, hipHostMallocPortable)``)."""
        if nbytes == 0:
            return 0
        err, ptr = self._hipHostMalloc(nbytes, _HOST_MALLOC_PORTABLE)
        _check(err, "hipHostMalloc", requested=nbytes)
        return self._keep(self._pointers, ptr)

    def host_free(self, ptr: int) -> None:
        if ptr == 0:
            return
        _check(self._hipHostFree(self._pointer(ptr))[0], "hipHostFree")
        self._pointers.pop(ptr, None)

    def malloc_async(self, nbytes: int, stream: int) -> int:
        """Stream-ordered device memory (``hipMallocAsync``)."""
        if nbytes == 0:
            return 0
        err, ptr = self._hipMallocAsync(nbytes, self._stream(stream))
        _check(err, "hipMallocAsync", requested=nbytes)
        return self._keep(self._pointers, ptr)

    def free_async(self, ptr: int, stream: int) -> None:
        if ptr == 0:
            return
        _check(self._hipFreeAsync(self._pointer(ptr), self._stream(stream))[0], "hipFreeAsync")
        self._pointers.pop(ptr, None)

    def pointer_kind(self, ptr: int) -> PointerKind:
        """What ``ptr`` points to. Memory HIP does not know is ``PAGEABLE``.

        Older HIP releases answer ``hipErrorInvalidValue`` for such memory and
        leave it as the thread's last error; that error is cleared here.
        """
        err, attributes = self._hipPointerGetAttributes(self._pointer(ptr))
        if err == _INVALID_VALUE:
            self._hipGetLastError()
            return PointerKind.PAGEABLE
        _check(err, "hipPointerGetAttributes")
        if attributes.isManaged:
            return PointerKind.MANAGED
        return _MEMORY_TYPES.get(int(attributes.type), PointerKind.PAGEABLE)

    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        p = self._pointers.get(ptr)
        if p is None:
            p = self._remember(self._pointers, self._new_pointer, ptr)
        s = self._streams.get(stream)
        if s is None:
            s = self._remember(self._streams, self._new_stream, stream)
        err = self._hipMemsetAsync(p, value, nbytes, s)[0]
        if err:
            _check(err, "hipMemsetAsync")

    def memcpy_async(self, dst: int, src: int, nbytes: int, kind: MemcpyKind, stream: int) -> None:
        pointers = self._pointers
        d = pointers.get(dst)
        if d is None:
            d = self._remember(pointers, self._new_pointer, dst)
        s = pointers.get(src)
        if s is None:
            s = self._remember(pointers, self._new_pointer, src)
        st = self._streams.get(stream)
        if st is None:
            st = self._remember(self._streams, self._new_stream, stream)
        err = self._hipMemcpyAsync(d, s, nbytes, self._memcpy_kinds[kind], st)[0]
        if err:
            _check(err, "hipMemcpyAsync")

    # -- host functions ----------------------------------------------------------
    def launch_host_func(self, stream: int, fn_ptr: int, user_data: int) -> None:
        """Enqueue the native ``void fn(void*)`` at ``fn_ptr`` (``hipLaunchHostFunc``)."""
        st = self._streams.get(stream)
        if st is None:
            st = self._remember(self._streams, self._new_stream, stream)
        fn = self._host_fns.get(fn_ptr)
        if fn is None:
            fn = self._remember(self._host_fns, self._new_host_fn, fn_ptr)
        data = self._pointers.get(user_data)
        if data is None:
            data = self._remember(self._pointers, self._new_pointer, user_data)
        err = self._hipLaunchHostFunc(st, fn, data)[0]
        if err:
            _check(err, "hipLaunchHostFunc")

    # -- signals -----------------------------------------------------------------
    def _can_wait_value(self, device: int) -> bool:
        """``hipDeviceAttributeCanUseStreamWaitValue``; ``False`` if the query itself fails."""
        attribute = _hip.hipDeviceAttribute_t.hipDeviceAttributeCanUseStreamWaitValue
        err, value = self._hipDeviceGetAttribute(attribute, device)
        return not err and bool(value)

    def signal_alloc(self) -> int:
        """``hipExtMallocWithFlags(8, hipMallocSignalMemory)``, as ``hipStreamWaitValue64`` requires, zeroed."""
        err, ptr = self._hipExtMallocWithFlags(8, _MALLOC_SIGNAL_MEMORY)
        _check(err, "hipExtMallocWithFlags", requested=8)
        signal = self._keep(self._pointers, ptr)
        ctypes.c_uint64.from_address(signal).value = 0
        self._signals.add(signal)
        return signal

    def signal_free(self, signal: int) -> None:
        """``hipFree`` (which waits for the device, as every free does). Refuses any other memory."""
        if signal not in self._signals:
            raise _not_a_signal(signal, "signal_free")
        _check(self._hipFree(self._pointer(signal))[0], "hipFree")
        self._signals.discard(signal)
        self._pointers.pop(signal, None)

    def stream_wait_signal(self, stream: int, signal: int, value: int) -> None:
        """``hipStreamWaitValue64(stream, signal, value, hipStreamWaitValueGte, ~0)``."""
        if signal not in self._signals:
            raise _not_a_signal(signal, "hipStreamWaitValue64")
        err = self._hipStreamWaitValue64(self._stream(stream), self._pointer(signal), value, _WAIT_VALUE_GTE, _ALL_BITS)[0]
        if err:
            _check(err, "hipStreamWaitValue64")

    # -- graphs ------------------------------------------------------------------
    def stream_begin_capture(self, stream: int, mode: CaptureMode) -> None:
        err = self._hipStreamBeginCapture(self._stream(stream), self._capture_modes[mode])[0]
        _check(err, "hipStreamBeginCapture")

    def stream_end_capture(self, stream: int) -> int:
        """End capture; the graph handle. ``CaptureError`` when the capture was invalidated.

        On failure the stream has left capture mode and any partial graph is destroyed.
        """
        err, graph = self._hipStreamEndCapture(self._stream(stream))
        if err:
            if graph is not None:
                self._hipGraphDestroy(graph)
            raise _error(err, "hipStreamEndCapture")
        if graph is None:
            raise CaptureError("hipStreamEndCapture returned no graph: the stream was not capturing")
        return self._keep(self._graphs, graph)

    def stream_is_capturing(self, stream: int) -> bool:
        """``True`` while ``stream`` is capturing (also when its capture is already invalidated)."""
        err, status = self._hipStreamIsCapturing(self._stream(stream))
        _check(err, "hipStreamIsCapturing")
        return int(status) != 0

    def graph_instantiate(self, graph: int) -> int:
        graph_obj = self._graphs.get(graph)
        if graph_obj is None:
            graph_obj = self._remember(self._graphs, self._new_graph, graph)
        err, graph_exec, _error_node, _log = self._hipGraphInstantiate(graph_obj, 0)
        _check(err, "hipGraphInstantiate")
        return self._keep(self._graph_execs, graph_exec)

    def graph_launch(self, graph_exec: int, stream: int) -> None:
        ge = self._graph_execs.get(graph_exec)
        if ge is None:
            ge = self._remember(self._graph_execs, self._new_graph_exec, graph_exec)
        st = self._streams.get(stream)
        if st is None:
            st = self._remember(self._streams, self._new_stream, stream)
        err = self._hipGraphLaunch(ge, st)[0]
        if err:
            _check(err, "hipGraphLaunch")

    def graph_exec_destroy(self, graph_exec: int) -> None:
        ge = self._graph_execs.get(graph_exec)
        if ge is None:
            ge = self._new_graph_exec(graph_exec)
        _check(self._hipGraphExecDestroy(ge)[0], "hipGraphExecDestroy")
        self._graph_execs.pop(graph_exec, None)

    def graph_destroy(self, graph: int) -> None:
        g = self._graphs.get(graph)
        if g is None:
            g = self._new_graph(graph)
        _check(self._hipGraphDestroy(g)[0], "hipGraphDestroy")
        self._graphs.pop(graph, None)

    # -- kernels -------------------------------------------------------------------
    def compiler_version(self) -> str:
        """``"hiprtc MAJOR.MINOR"`` (on HIP-on-CUDA: NVRTC's version)."""
        if self._compiler_version is None:
            err, major, minor = self._hiprtcVersion()
            if err:
                raise _rtc_error(err, "hiprtcVersion")
            self._compiler_version = f"hiprtc {int(major)}.{int(minor)}"
        return self._compiler_version

    def compile_source(self, source: str, name: str, options: Sequence[str]) -> bytes:
        """Compile HIP C++ with hiprtc for the current device; the code object.

        Adds ``--offload-arch=<gcnArchName>`` and ``-D__STREAMRT_HIP__=1`` to
        ``options``. A compile error (or an option hiprtc rejects) raises
        :class:`KernelCompileError` with hiprtc's log.
        """
        device = self._current_device()
        self.capabilities(device)
        arch = self._offload_arch[device]
        opts = [f"--offload-arch={arch}".encode(), b"-D__STREAMRT_HIP__=1"]
        opts += [str(option).encode() for option in options]
        err, prog = self._hiprtcCreateProgram(source.encode(), name.encode(), 0, [], [])
        if err:
            raise _rtc_error(err, "hiprtcCreateProgram")
        try:
            err = self._hiprtcCompileProgram(prog, len(opts), opts)[0]
            if err in (_HIPRTC_ERROR_COMPILATION, _HIPRTC_ERROR_INVALID_OPTION):
                reason = _hiprtc.hiprtcResult(int(err)).name
                raise KernelCompileError(f"hiprtc could not compile {name!r} for {arch} ({reason})", self._log(prog))
            if err:
                raise _rtc_error(err, "hiprtcCompileProgram")
            err, size = self._hiprtcGetCodeSize(prog)
            if err:
                raise _rtc_error(err, "hiprtcGetCodeSize")
            code = bytearray(int(size))
            err = self._hiprtcGetCode(prog, code)[0]
            if err:
                raise _rtc_error(err, "hiprtcGetCode")
            return bytes(code)
        finally:
            self._hiprtcDestroyProgram(prog.createRef())

    def _log(self, prog: Any) -> str:
        """hiprtc's log for ``prog`` (empty if it cannot be read)."""
        err, size = self._hiprtcGetProgramLogSize(prog)
        if err or not size:
            return ""
        log = bytearray(int(size))
        if self._hiprtcGetProgramLog(prog, log)[0]:
            return ""
        return _text(bytes(log)).rstrip()

    def module_load_data(self, image: bytes) -> int:
        """Load a code object from :meth:`compile_source` (``hipModuleLoadData``)."""
        err, module = self._hipModuleLoadData(bytes(image))
        _check(err, "hipModuleLoadData")
        return self._keep(self._modules, module)

    def module_get_function(self, module: int, name: str) -> int:
        mod = self._modules.get(module)
        if mod is None:
            mod = self._remember(self._modules, self._new_module, module)
        err, function = self._hipModuleGetFunction(mod, name.encode())
        _check(err, "hipModuleGetFunction")
        handle = self._keep(self._functions, function)
        self._module_functions.setdefault(module, []).append(handle)
        return handle

    def module_unload(self, module: int) -> None:
        mod = self._modules.get(module)
        if mod is None:
            mod = self._new_module(module)
        _check(self._hipModuleUnload(mod)[0], "hipModuleUnload")
        self._modules.pop(module, None)
        for function in self._module_functions.pop(module, ()):
            self._functions.pop(function, None)

    def launch_kernel(
        self,
        function: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        stream: int,
        arg_ptrs: int,
    ) -> None:
        """``hipModuleLaunchKernel`` with ``kernelParams=arg_ptrs`` and no ``extra``."""
        f = self._functions.get(function)
        if f is None:
            f = self._remember(self._functions, self._new_function, function)
        st = self._streams.get(stream)
        if st is None:
            st = self._remember(self._streams, self._new_stream, stream)
        args = self._arg_arrays.get(arg_ptrs)
        if args is None:
            args = self._remember(self._arg_arrays, self._new_arg_array, arg_ptrs)
        gx, gy, gz = grid
        bx, by, bz = block
        err = self._hipModuleLaunchKernel(f, gx, gy, gz, bx, by, bz, shared_mem, st, args, self._no_extra)[0]
        if err:
            _check(err, "hipModuleLaunchKernel")

    # -- errors and lifetime -----------------------------------------------------------
    def error_name(self, code: int) -> str:
        return error_name(code)

    def error_string(self, code: int) -> str:
        return error_string(code)

    def close(self) -> None:
        """Drop the handle caches. Idempotent; makes no HIP call (HIP objects belong to their owners)."""
        if self._closed:
            return
        self._closed = True
        for cache in (
            self._pointers,
            self._arg_arrays,
            self._events,
            self._graphs,
            self._graph_execs,
            self._modules,
            self._functions,
            self._host_fns,
            self._module_functions,
        ):
            cache.clear()
        self._streams = {0: self._new_stream(0)}
