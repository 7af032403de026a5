"""The CUDA backend, over NVIDIA cuda-python's ``cuda.bindings``.

Runtime calls go through ``cuda.bindings.runtime`` (cudart), modules and kernel
launches through ``cuda.bindings.driver``, runtime compilation through
``cuda.bindings.nvrtc``. Nothing here is imported until :func:`probe`,
:func:`create` or :class:`CudaBackend` needs it, so ``import streamrt`` works
without cuda-bindings.

Host functions do *not* go through the bindings' ``cudaLaunchHostFunc`` /
``cuLaunchHostFunc``: those wrap the function pointer in a trampoline that
takes the GIL on the driver thread and frees its payload after the first call,
so a captured host node runs once and then reads freed memory on replay
(cuda-python issue 790). :meth:`CudaBackend.launch_host_func` calls the driver's
``cuLaunchHostFunc`` directly through ctypes (which releases the GIL), passing
the native function pointer and user data untouched.

Handle conversion: the bindings accept plain ``int`` handles, but convert each
one by building a wrapper object per call. The hot paths therefore pass cached
wrapper objects (``driver.CUstream``, ``cudaEvent_t``, ``cudaGraphExec_t``,
``driver.CUfunction``) looked up by the int handle; pointers, sizes and enum
values are passed as plain ints.
"""

from __future__ import annotations

import ctypes
import importlib
import re
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import BackendError, CaptureError, KernelCompileError, OutOfMemoryError
from . import unavailable
from ._cuda_user_objects import CudaUserObjects
from .protocol import Capabilities, CaptureMode, MemcpyKind, PointerKind

__all__ = ["CudaBackend", "MIN_CUDA_BINDINGS", "create", "nvrtc_compile", "probe", "share_key"]

#: Oldest cuda-bindings accepted: from 12.9.1 (and 13.0.0) every binding call
#: releases the GIL around the C call, which the blocking calls here rely on.
MIN_CUDA_BINDINGS = (12, 9, 1)

_INSTALL_HINT = "pip install 'streamrt[cuda]'"
_CACHE_LIMIT = 4096  # bound on cached wrapper objects for handles created elsewhere

# Driver-API result codes used on the error path (values fixed by cuda.h).
_CUDA_ERROR_INVALID_VALUE = 1
_CUDA_ERROR_INVALID_CONTEXT = 201
_CU_STREAM_WAIT_VALUE_GEQ = 0  # CUstreamWaitValue_flags (cuda.h)
_CAN_USE_64_BIT_STREAM_MEM_OPS = 122  # CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS (cuda.h; 93 is the V1 API)
# cudaErrorPeerAccessAlreadyEnabled (driver_types.h): enable_peer_access treats it as success.
_PEER_ACCESS_ALREADY_ENABLED = 704

# cudaMemoryType values (fixed by driver_types.h) -> PointerKind.
_POINTER_KINDS = {
    0: PointerKind.PAGEABLE,  # cudaMemoryTypeUnregistered
    1: PointerKind.HOST,  # cudaMemoryTypeHost
    2: PointerKind.DEVICE,  # cudaMemoryTypeDevice
    3: PointerKind.MANAGED,  # cudaMemoryTypeManaged
}


# -- lazy imports ---------------------------------------------------------------------


def _runtime() -> Any:
    return importlib.import_module("cuda.bindings.runtime")


def _driver() -> Any:
    return importlib.import_module("cuda.bindings.driver")


def _version_tuple(text: str) -> tuple[int, ...] | None:
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    return tuple(int(part) for part in match.groups(default="0"))


def _bindings_version() -> str | None:
    bindings = importlib.import_module("cuda.bindings")
    version = getattr(bindings, "__version__", None)
    if isinstance(version, str):
        return version
    try:
        from importlib.metadata import version as dist_version

        return dist_version("cuda-bindings")
    except Exception:
        return None


def _decode(raw: Any) -> str:
    if isinstance(raw, (bytes, bytearray)):
        return bytes(raw).split(b"\0", 1)[0].decode("utf-8", errors="replace")
    return str(raw)


# -- availability -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Missing:
    """Why the backend cannot be used: ``what`` is missing, ``how`` to fix it.

    ``short_hint`` is appended to the one-line probe reason where it is brief
    enough to belong there (an install command).
    """

    what: str
    how: str
    short_hint: str = ""

    @property
    def line(self) -> str:
        return f"{self.what} ({self.short_hint})" if self.short_hint else self.what


def _diagnose() -> _Missing | None:
    """``None`` when cuda-bindings imports and reports at least one device."""
    try:
        rt = _runtime()
    except ImportError:
        return _Missing("cuda-bindings is not installed", f"Install it with: {_INSTALL_HINT}", _INSTALL_HINT)
    except Exception as exc:  # a broken install (missing shared library, ABI mismatch)
        return _Missing(
            f"cuda-bindings failed to import ({exc!r})", f"Reinstall it with: {_INSTALL_HINT}", _INSTALL_HINT
        )
    version = _bindings_version()
    parsed = _version_tuple(version) if version else None
    if parsed is not None and parsed < MIN_CUDA_BINDINGS:
        floor = ".".join(map(str, MIN_CUDA_BINDINGS))
        upgrade = f"pip install -U 'cuda-bindings>={floor}'"
        return _Missing(
            f"cuda-bindings {version} is too old (its calls release the GIL only from {floor} on)",
            f"Upgrade it with: {upgrade}",
            upgrade,
        )
    try:
        err, count = rt.cudaGetDeviceCount()
    except Exception as exc:  # the bindings raise when a shared library cannot be found
        return _Missing(f"no CUDA device: cudaGetDeviceCount raised {exc!r}", _driver_hint(None, version))
    code = int(err)
    if code != 0:
        name = _decode(rt.cudaGetErrorName(code)[1])
        return _Missing(f"no CUDA device: {name}", _driver_hint(name, version))
    if not count:
        return _Missing(
            "no CUDA device: cudaGetDeviceCount found 0 devices", _driver_hint("cudaErrorNoDevice", version)
        )
    return None


def _driver_hint(error_name: str | None, version: str | None) -> str:
    sim = "open_runtime('sim') works without a GPU"
    if error_name == "cudaErrorInsufficientDriver":
        major = (version or "13").split(".", 1)[0]
        return (
            f"The NVIDIA driver is missing or older than the CUDA {major} runtime built into "
            f"cuda-bindings {version or '?'}: install or update the NVIDIA driver, or install the "
            f"cuda-bindings major version that matches the driver; {sim}"
        )
    if error_name == "cudaErrorNoDevice":
        return f"No GPU is visible to this process: check nvidia-smi and CUDA_VISIBLE_DEVICES; {sim}"
    return f"Check the NVIDIA driver installation with nvidia-smi; {sim}"


def probe() -> str | None:
    """``None`` when cuda-bindings imports and a CUDA device is present, else a one-line reason.

    Cheap after the first call (the first ``cudaGetDeviceCount`` loads the driver).
    Never raises.
    """
    try:
        missing = _diagnose()
    except Exception as exc:
        return f"cuda probe failed: {exc!r}"
    return None if missing is None else missing.line


def share_key(**options: Any) -> object:
    """Runtimes of one process share one CUDA backend object (the driver is process-wide).

    Equal options (normally none) give the same key; unhashable options a private backend.
    """
    key = tuple(sorted(options.items()))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def create(**options: Any) -> CudaBackend:
    """Create the CUDA backend. Options: ``device`` (int; made current on the calling thread).

    Raises ``BackendUnavailableError`` naming what is missing and how to install it.
    """
    missing = _diagnose()
    if missing is not None:
        raise unavailable("cuda", missing.what, missing.how)
    return CudaBackend(**options)


# -- error mapping -------------------------------------------------------------------------


def _is_capture_error(name: str) -> bool:
    return (
        name.startswith("cudaErrorStreamCapture")
        or name == "cudaErrorCapturedEvent"
        or name.startswith("CUDA_ERROR_STREAM_CAPTURE_")
        or name == "CUDA_ERROR_CAPTURED_EVENT"
    )


def _raise(code: int, name: str, message: str, call: str, requested: int | None, oom: bool, extra: str) -> None:
    if oom:
        asked = f": requested {requested} bytes" if requested is not None else ""
        raise OutOfMemoryError(
            f"cuda out of memory in {call}{asked}{extra} ({name}: {message})",
            requested=requested,
            backend="cuda",
            code=code,
        )
    error = BackendError("cuda", code, name, message, call)
    if _is_capture_error(name):
        raise CaptureError(f"graph capture failed: {error}") from error
    raise error


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
    name = _decode(rt.cudaGetErrorName(code)[1])
    message = _decode(rt.cudaGetErrorString(code)[1])
    rt.cudaGetLastError()
    _raise(code, name, message, call, requested, name == "cudaErrorMemoryAllocation", extra)


def _check_driver(err: Any, call: str, requested: int | None = None) -> None:
    """Like :func:`_check`, for driver-API ``CUresult`` codes."""
    code = int(err)
    if code == 0:
        return
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
                message = _decode(text)
        except Exception:  # the name alone is still a usable message
            pass
    _raise(code, name, message, call, requested, name == "CUDA_ERROR_OUT_OF_MEMORY", "")


# -- runtime compilation -----------------------------------------------------------------------


def _nvrtc() -> Any:
    """``cuda.bindings.nvrtc`` with its library loaded; ``BackendUnavailableError`` if it is not installed."""
    nvrtc = importlib.import_module("cuda.bindings.nvrtc")
    try:
        err, _major, _minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # the bindings raise when libnvrtc cannot be found
        version = _bindings_version() or "13"
        wheel = "nvidia-cuda-nvrtc-cu12" if version.startswith("12.") else "nvidia-cuda-nvrtc"
        raise unavailable(
            "cuda", f"NVRTC (libnvrtc) could not be loaded: {exc}", f"Install it with: pip install '{wheel}'"
        ) from exc
    if int(err) != 0:
        raise unavailable("cuda", f"nvrtcVersion failed ({err!r})", "Reinstall NVRTC: pip install 'nvidia-cuda-nvrtc'")
    return nvrtc


def _has_option(options: Sequence[str], *prefixes: str) -> bool:
    return any(opt.startswith(prefixes) for opt in options)


def nvrtc_compile(source: str, name: str, options: Sequence[str], capability: tuple[int, int]) -> bytes:
    """Compile ``source`` with NVRTC for compute capability ``capability``; return a loadable image.

    Adds ``-default-device``, ``--std=c++17``, ``-D__STREAMRT_CUDA__=1`` and the
    architecture unless ``options`` already set them. When NVRTC supports the
    device's ``sm_XY`` the result is a CUBIN; otherwise it is PTX for the newest
    virtual architecture NVRTC supports at or below the device's (the driver
    JIT-compiles it). Raises ``KernelCompileError`` with the full log on failure.
    Blocking; releases the GIL while NVRTC works.
    """
    nvrtc = _nvrtc()
    arch = capability[0] * 10 + capability[1]
    err, supported = nvrtc.nvrtcGetSupportedArchs()
    supported = sorted(int(a) for a in supported) if int(err) == 0 else [arch]
    flags: list[str] = []
    target = f"sm_{arch}"
    if not _has_option(options, "--gpu-architecture", "-arch", "--gpu-name"):
        if arch in supported:
            flags.append(f"--gpu-architecture=sm_{arch}")
        else:
            older = [a for a in supported if a <= arch]
            if not older:
                raise KernelCompileError(
                    f"nvrtc cannot compile {name!r}: device architecture sm_{arch} is older than every "
                    f"architecture this NVRTC supports",
                    f"supported architectures: {', '.join(f'sm_{a}' for a in supported)}",
                )
            target = f"compute_{older[-1]}"
            flags.append(f"--gpu-architecture={target}")
    if not _has_option(options, "-default-device", "--device-as-default-execution-space"):
        flags.append("-default-device")
    if not _has_option(options, "--std", "-std"):
        flags.append("--std=c++17")
    flags.append("-D__STREAMRT_CUDA__=1")
    all_options = [opt.encode() for opt in (*flags, *options)]

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    if int(err) != 0:
        raise KernelCompileError(f"nvrtcCreateProgram failed for {name!r}: {_nvrtc_error(nvrtc, err)}", "")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(all_options), all_options)
        log = _nvrtc_log(nvrtc, prog)
        if int(err) != 0:
            raise KernelCompileError(
                f"nvrtc failed to compile {name!r} for {target} ({_nvrtc_error(nvrtc, err)}); "
                f"options: {' '.join(o.decode() for o in all_options)}",
                log,
            )
        image = _nvrtc_output(nvrtc, prog, "CUBIN")
        if not image:
            image = _nvrtc_output(nvrtc, prog, "PTX")  # keeps the terminating NUL the loader wants
        if not image:
            raise KernelCompileError(f"nvrtc produced no CUBIN or PTX for {name!r}", log)
        return image
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvrtc_error(nvrtc: Any, err: Any) -> str:
    try:
        return _decode(nvrtc.nvrtcGetErrorString(err)[1])
    except Exception:
        return repr(err)


def _nvrtc_log(nvrtc: Any, prog: Any) -> str:
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if int(err) != 0 or size <= 1:
        return ""
    buf = b" " * size
    (err,) = nvrtc.nvrtcGetProgramLog(prog, buf)
    return _decode(buf) if int(err) == 0 else ""


def _nvrtc_output(nvrtc: Any, prog: Any, kind: str) -> bytes:
    err, size = getattr(nvrtc, f"nvrtcGet{kind}Size")(prog)
    if int(err) != 0 or not size:
        return b""
    buf = b" " * size
    (err,) = getattr(nvrtc, f"nvrtcGet{kind}")(prog, buf)
    return buf if int(err) == 0 else b""


# -- the backend ---------------------------------------------------------------------------------


def _load_libcuda() -> ctypes.CDLL:
    names = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")
    last: OSError | None = None
    for lib_name in names:
        try:
            return ctypes.CDLL(lib_name)
        except OSError as exc:
            last = exc
    raise unavailable(
        "cuda",
        f"the CUDA driver library ({names[0]}) could not be loaded: {last}",
        "Install the NVIDIA driver (nvidia-smi must work)",
    )


def _stream_wait_value64(libcuda: ctypes.CDLL) -> Any:
    """The driver's ``cuStreamWaitValue64`` (the version of CUDA 12: no module parameter needed), or ``None``."""
    prototype = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint)
    address = ctypes.c_void_p()
    get_proc = getattr(libcuda, "cuGetProcAddress_v2", None)
    if get_proc is not None:
        get_proc.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p]
        get_proc.restype = ctypes.c_int
        status = ctypes.c_int(0)
        if get_proc(b"cuStreamWaitValue64", ctypes.byref(address), 12000, 0, ctypes.byref(status)) != 0:
            address = ctypes.c_void_p()
    if not address.value:
        symbol = getattr(libcuda, "cuStreamWaitValue64_v2", None)
        if symbol is None:
            return None
        address = ctypes.cast(symbol, ctypes.c_void_p)
    return prototype(address.value) if address.value else None


def _not_a_signal(address: int, call: str) -> BackendError:
    message = f"{address:#x} is not a signal of this backend (use signal_alloc)"
    return BackendError("cuda", _CUDA_ERROR_INVALID_VALUE, "cudaErrorInvalidValue", message, call)


class CudaBackend(CudaUserObjects):
    """The :class:`~streamrt._backends.protocol.Backend` primitives on CUDA.

    Requires cuda-bindings >= 12.9.1 (or 13.x): from that version every binding
    call releases the GIL around the C call, so the blocking calls here
    (``stream_synchronize``, ``event_synchronize``, ``device_synchronize``,
    ``malloc``/``free``/``host_malloc``/``host_free`` — which may synchronize —,
    ``graph_instantiate``, ``module_load_data``, ``compile_source``) never hold
    the GIL while they wait. ``launch_host_func`` goes through ctypes, which
    releases the GIL as well.

    Thread rules:

    * Every method may be called from any thread, as the CUDA runtime allows.
      The handle caches are dicts mutated only with single atomic operations.
    * The current device is per thread. ``ensure_device`` remembers, per thread,
      the device this backend last made current there and skips the call when it
      matches; code that changes the device behind its back on the same thread
      (``torch.cuda.set_device``) must be followed by ``set_device``.
    * No method may be called from a host function (a driver callback thread):
      CUDA forbids API calls there.
    * ``launch_host_func`` hands the native function pointer to the driver as is:
      no Python and no GIL on the driver thread, and a captured host node calls
      ``fn(user_data)`` on every replay. Keeping ``user_data`` and the function
      alive is the caller's job.

    ``close`` releases nothing on the device (streams, events and memory belong to
    their creators) and is idempotent.
    """

    name = "cuda"

    def __init__(self, device: int | None = None) -> None:
        rt = _runtime()
        drv = _driver()
        self._rt = rt
        self._drv = drv
        try:
            from cuda.bindings.utils import get_cuda_native_handle as native_handle
        except ImportError:  # older 12.x bindings: int() is the documented way
            native_handle = int
        self._native_handle = native_handle
        self._tls = threading.local()
        self._closed = False
        self._caps: dict[int, Capabilities] = {}

        # Bound binding functions: one attribute lookup on the hot path.
        self._cudaMemsetAsync = rt.cudaMemsetAsync
        self._cudaMemcpyAsync = rt.cudaMemcpyAsync
        self._cudaMemcpyPeerAsync = rt.cudaMemcpyPeerAsync
        self._cudaEventRecord = rt.cudaEventRecord
        self._cudaStreamWaitEvent = rt.cudaStreamWaitEvent
        self._cudaGraphLaunch = rt.cudaGraphLaunch
        self._cudaEventQuery = rt.cudaEventQuery
        self._cudaStreamQuery = rt.cudaStreamQuery
        self._cuLaunchKernel = drv.cuLaunchKernel
        self._CUstream = drv.CUstream
        self._cudaEvent_t = rt.cudaEvent_t
        self._cudaGraphExec_t = rt.cudaGraphExec_t
        self._CUfunction = drv.CUfunction
        self._not_ready = int(rt.cudaError_t.cudaErrorNotReady)

        # int handle -> binding wrapper object. driver.CUstream is accepted by the
        # runtime and the driver API alike; 0 (legacy), 1 and 2 are CUDA's implicit streams.
        self._streams: dict[int, Any] = {h: drv.CUstream(h) for h in (0, 1, 2)}
        self._events: dict[int, Any] = {}
        self._graphs: dict[int, Any] = {}
        self._graph_execs: dict[int, Any] = {}
        self._modules: dict[int, Any] = {}
        self._functions: dict[int, Any] = {}
        self._stream_get = self._streams.get
        self._event_get = self._events.get

        libcuda = _load_libcuda()
        launch_host_func = libcuda.cuLaunchHostFunc
        launch_host_func.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        launch_host_func.restype = ctypes.c_int
        self._libcuda = libcuda
        self._cuLaunchHostFunc = launch_host_func
        self._cuStreamWaitValue64 = _stream_wait_value64(libcuda)
        self._signals: dict[int, int] = {}  # signal (host address) -> its device address

        if device is not None:
            count = self.device_count()
            if not 0 <= int(device) < count:
                raise ValueError(
                    f"CUDA device {device} does not exist: this machine has {count}; choose 0..{count - 1}"
                )
            self.set_device(int(device))  # cudaSetDevice also makes the primary context current

    # -- handle conversion (slow paths; hot paths hit the dict first) --------------------------

    def _stream(self, handle: int) -> Any:
        obj = self._stream_get(handle)
        if obj is None:
            obj = self._CUstream(handle)
            if len(self._streams) < _CACHE_LIMIT:
                self._streams[handle] = obj
        return obj

    def _event(self, handle: int) -> Any:
        obj = self._event_get(handle)
        if obj is None:
            obj = self._cudaEvent_t(handle)
            if len(self._events) < _CACHE_LIMIT:
                self._events[handle] = obj
        return obj

    def _make_context_current(self) -> None:
        """Initialize cudart on this thread: the current device's primary context becomes current."""
        (err,) = self._rt.cudaFree(0)
        _check(err, "cudaFree(0)")

    # -- devices ------------------------------------------------------------------------------

    def device_count(self) -> int:
        err, count = self._rt.cudaGetDeviceCount()
        _check(err, "cudaGetDeviceCount")
        return int(count)

    def set_device(self, device: int) -> None:
        (err,) = self._rt.cudaSetDevice(device)
        _check(err, "cudaSetDevice")
        self._tls.device = device

    def ensure_device(self, device: int) -> None:
        """Make ``device`` current on the calling thread unless this backend already did."""
        if getattr(self._tls, "device", None) != device:
            self.set_device(device)

    def capabilities(self, device: int) -> Capabilities:
        """The device's record, cached per device.

        The first call for a device other than the calling thread's current one
        makes it current briefly (the stream priority range is a per-context
        query), which initializes that device's primary context.
        """
        caps = self._caps.get(device)
        if caps is not None:
            return caps
        rt = self._rt
        err, props = rt.cudaGetDeviceProperties(device)
        _check(err, "cudaGetDeviceProperties")
        err, pools = rt.cudaDeviceGetAttribute(rt.cudaDeviceAttr.cudaDevAttrMemoryPoolsSupported, device)
        _check(err, "cudaDeviceGetAttribute(cudaDevAttrMemoryPoolsSupported)")
        caps = Capabilities(
            backend="cuda",
            device_name=_decode(props.name),
            architecture=f"sm_{int(props.major)}{int(props.minor)}",
            is_simulated=False,
            supports_graphs=True,
            supports_stream_ordered_alloc=bool(pools),
            supports_pageable_async_copy=True,
            priority_range=self._priority_range(device),
            virtual_clock=False,
            total_memory=int(props.totalGlobalMem),
            multiprocessor_count=int(props.multiProcessorCount),
            supports_stream_signals=self._can_wait_value64(device),
            max_shared_memory_per_block=int(props.sharedMemPerBlock),
            dlpack_device_type=2,  # kDLCUDA
            profiler_ranges="nvtx",
        )
        self._caps[device] = caps
        return caps

    def _can_wait_value64(self, device: int) -> bool:
        if self._cuStreamWaitValue64 is None:
            return False
        get_attribute = self._libcuda.cuDeviceGetAttribute
        get_attribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int]
        get_attribute.restype = ctypes.c_int
        value = ctypes.c_int(0)
        return get_attribute(ctypes.byref(value), _CAN_USE_64_BIT_STREAM_MEM_OPS, device) == 0 and value.value == 1

    def _priority_range(self, device: int) -> tuple[int, int]:
        rt = self._rt
        err, current = rt.cudaGetDevice()
        _check(err, "cudaGetDevice")
        if current != device:
            (err,) = rt.cudaSetDevice(device)
            _check(err, "cudaSetDevice")
        try:
            err, least, greatest = rt.cudaDeviceGetStreamPriorityRange()
            _check(err, "cudaDeviceGetStreamPriorityRange")
        finally:
            if current != device:
                (err,) = rt.cudaSetDevice(current)
                _check(err, "cudaSetDevice")
        return (int(least), int(greatest))

    def device_synchronize(self) -> None:
        (err,) = self._rt.cudaDeviceSynchronize()
        _check(err, "cudaDeviceSynchronize")

    def mem_get_info(self) -> tuple[int, int]:
        err, free, total = self._rt.cudaMemGetInfo()
        _check(err, "cudaMemGetInfo")
        return (int(free), int(total))

    # -- several devices -------------------------------------------------------------------------

    def can_access_peer(self, device: int, peer: int) -> bool:
        """``cudaDeviceCanAccessPeer(device, peer)``; ``False`` for ``device == peer``."""
        err, can = self._rt.cudaDeviceCanAccessPeer(device, peer)
        _check(err, "cudaDeviceCanAccessPeer")
        return bool(can)

    def enable_peer_access(self, peer: int) -> None:
        """``cudaDeviceEnablePeerAccess(peer, 0)`` from the current device; already enabled is success."""
        (err,) = self._rt.cudaDeviceEnablePeerAccess(peer, 0)
        if err:
            if int(err) == _PEER_ACCESS_ALREADY_ENABLED:
                self._rt.cudaGetLastError()  # do not leave it as the thread's last error
                return
            _check(err, "cudaDeviceEnablePeerAccess")

    def memcpy_peer_async(self, dst: int, dst_device: int, src: int, src_device: int, nbytes: int, stream: int) -> None:
        """``cudaMemcpyPeerAsync``: stream-ordered; staged by the driver when peer access is off."""
        s = self._stream_get(stream)
        err = self._cudaMemcpyPeerAsync(
            dst, dst_device, src, src_device, nbytes, self._stream(stream) if s is None else s
        )[0]
        if err:
            _check(err, "cudaMemcpyPeerAsync")

    # -- streams --------------------------------------------------------------------------------

    def stream_create(self, priority: int = 0) -> int:
        rt = self._rt
        err, stream = rt.cudaStreamCreateWithPriority(rt.cudaStreamNonBlocking, priority)
        _check(err, "cudaStreamCreateWithPriority")
        handle = int(self._native_handle(stream))
        self._streams[handle] = self._CUstream(handle)
        return handle

    def stream_destroy(self, stream: int) -> None:
        (err,) = self._rt.cudaStreamDestroy(self._stream(stream))
        _check(err, "cudaStreamDestroy")
        if stream > 2:
            self._streams.pop(stream, None)

    def stream_synchronize(self, stream: int) -> None:
        (err,) = self._rt.cudaStreamSynchronize(self._stream(stream))
        _check(err, "cudaStreamSynchronize")

    def stream_query(self, stream: int) -> bool:
        s = self._stream_get(stream)
        err = self._cudaStreamQuery(self._stream(stream) if s is None else s)[0]
        if not err:
            return True
        if err == self._not_ready:
            return False
        _check(err, "cudaStreamQuery")
        return False  # unreachable: _check raised

    def stream_wait_event(self, stream: int, event: int) -> None:
        s = self._stream_get(stream)
        e = self._event_get(event)
        err = self._cudaStreamWaitEvent(
            self._stream(stream) if s is None else s, self._event(event) if e is None else e, 0
        )[0]
        if err:
            _check(err, "cudaStreamWaitEvent")

    # -- events -----------------------------------------------------------------------------------

    def event_create(self, *, timing: bool, blocking_sync: bool = True) -> int:
        rt = self._rt
        flags = 0 if timing else rt.cudaEventDisableTiming
        if blocking_sync:
            flags |= rt.cudaEventBlockingSync
        err, event = rt.cudaEventCreateWithFlags(flags)
        _check(err, "cudaEventCreateWithFlags")
        handle = int(self._native_handle(event))
        self._events[handle] = event
        return handle

    def event_destroy(self, event: int) -> None:
        (err,) = self._rt.cudaEventDestroy(self._event(event))
        _check(err, "cudaEventDestroy")
        self._events.pop(event, None)

    def event_record(self, event: int, stream: int) -> None:
        e = self._event_get(event)
        s = self._stream_get(stream)
        err = self._cudaEventRecord(self._event(event) if e is None else e, self._stream(stream) if s is None else s)[0]
        if err:
            _check(err, "cudaEventRecord")

    def event_query(self, event: int) -> bool:
        e = self._event_get(event)
        err = self._cudaEventQuery(self._event(event) if e is None else e)[0]
        if not err:
            return True
        if err == self._not_ready:
            return False
        _check(err, "cudaEventQuery")
        return False  # unreachable: _check raised

    def event_synchronize(self, event: int) -> None:
        (err,) = self._rt.cudaEventSynchronize(self._event(event))
        _check(err, "cudaEventSynchronize")

    def event_elapsed_ms(self, start: int, end: int) -> float:
        err, ms = self._rt.cudaEventElapsedTime(self._event(start), self._event(end))
        _check(err, "cudaEventElapsedTime")
        return float(ms)

    # -- memory -----------------------------------------------------------------------------------

    def _device_memory_note(self) -> str:
        try:
            err, free, total = self._rt.cudaMemGetInfo()
        except Exception:
            return ""
        return f" ({int(free)} of {int(total)} bytes free on the device)" if int(err) == 0 else ""

    def malloc(self, nbytes: int) -> int:
        err, ptr = self._rt.cudaMalloc(nbytes)
        if err:
            _check(err, "cudaMalloc", requested=nbytes, extra=self._device_memory_note())
        return int(ptr)

    def free(self, ptr: int) -> None:
        (err,) = self._rt.cudaFree(ptr)
        _check(err, "cudaFree")

    def host_malloc(self, nbytes: int) -> int:
        rt = self._rt
        err, ptr = rt.cudaHostAlloc(nbytes, rt.cudaHostAllocPortable)
        _check(err, "cudaHostAlloc", requested=nbytes)
        return int(ptr)

    def host_free(self, ptr: int) -> None:
        (err,) = self._rt.cudaFreeHost(ptr)
        _check(err, "cudaFreeHost")

    def malloc_async(self, nbytes: int, stream: int) -> int:
        err, ptr = self._rt.cudaMallocAsync(nbytes, self._stream(stream))
        if err:
            _check(err, "cudaMallocAsync", requested=nbytes, extra=self._device_memory_note())
        return int(ptr)

    def free_async(self, ptr: int, stream: int) -> None:
        (err,) = self._rt.cudaFreeAsync(ptr, self._stream(stream))
        _check(err, "cudaFreeAsync")

    def pointer_kind(self, ptr: int) -> PointerKind:
        """What ``ptr`` points to. Memory CUDA does not know (a failed query included) is pageable."""
        rt = self._rt
        err, attrs = rt.cudaPointerGetAttributes(ptr)
        if err:
            if int(err) == int(rt.cudaError_t.cudaErrorInvalidValue):
                rt.cudaGetLastError()  # the failed query must not surface in a later call
                return PointerKind.PAGEABLE
            _check(err, "cudaPointerGetAttributes")
        return _POINTER_KINDS.get(int(attrs.type), PointerKind.PAGEABLE)

    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        s = self._stream_get(stream)
        err = self._cudaMemsetAsync(ptr, value, nbytes, self._stream(stream) if s is None else s)[0]
        if err:
            _check(err, "cudaMemsetAsync")

    def memcpy_async(self, dst: int, src: int, nbytes: int, kind: MemcpyKind, stream: int) -> None:
        s = self._stream_get(stream)
        err = self._cudaMemcpyAsync(dst, src, nbytes, kind, self._stream(stream) if s is None else s)[0]
        if err:
            _check(err, "cudaMemcpyAsync")

    # -- host functions -------------------------------------------------------------------------------

    def launch_host_func(self, stream: int, fn_ptr: int, user_data: int) -> None:
        """Enqueue ``fn_ptr(user_data)`` through the driver's ``cuLaunchHostFunc`` (see the class notes)."""
        code = self._cuLaunchHostFunc(stream, fn_ptr, user_data)
        if code:
            if code == _CUDA_ERROR_INVALID_CONTEXT:  # a thread that never touched cudart
                self._make_context_current()
                code = self._cuLaunchHostFunc(stream, fn_ptr, user_data)
            _check_driver(code, "cuLaunchHostFunc")

    # -- signals --------------------------------------------------------------------------------------

    def signal_alloc(self) -> int:
        """8 bytes of mapped pinned memory (``cudaHostAlloc``, portable and mapped), zeroed."""
        rt = self._rt
        err, ptr = rt.cudaHostAlloc(8, rt.cudaHostAllocPortable | rt.cudaHostAllocMapped)
        _check(err, "cudaHostAlloc", requested=8)
        signal = int(ptr)
        ctypes.c_uint64.from_address(signal).value = 0
        err, device_ptr = rt.cudaHostGetDevicePointer(signal, 0)
        if err:
            self._rt.cudaFreeHost(signal)
            _check(err, "cudaHostGetDevicePointer")
        self._signals[signal] = int(device_ptr)
        return signal

    def signal_free(self, signal: int) -> None:
        """``cudaFreeHost`` (which waits for the device, as every free does)."""
        if signal not in self._signals:
            raise _not_a_signal(signal, "signal_free")
        (err,) = self._rt.cudaFreeHost(signal)
        _check(err, "cudaFreeHost")
        del self._signals[signal]

    def stream_wait_signal(self, stream: int, signal: int, value: int) -> None:
        """``cuStreamWaitValue64(stream, signal, value, CU_STREAM_WAIT_VALUE_GEQ)`` through ctypes."""
        device_ptr = self._signals.get(signal)
        if device_ptr is None:
            raise _not_a_signal(signal, "cuStreamWaitValue64")
        wait = self._cuStreamWaitValue64
        if wait is None:
            raise BackendError("cuda", 801, "cudaErrorNotSupported", "this driver has no cuStreamWaitValue64", "cuStreamWaitValue64")
        code = wait(stream, device_ptr, value, _CU_STREAM_WAIT_VALUE_GEQ)
        if code:
            if code == _CUDA_ERROR_INVALID_CONTEXT:  # a thread that never touched cudart
                self._make_context_current()
                code = wait(stream, device_ptr, value, _CU_STREAM_WAIT_VALUE_GEQ)
            _check_driver(code, "cuStreamWaitValue64")

    # -- graphs ---------------------------------------------------------------------------------------

    def stream_begin_capture(self, stream: int, mode: CaptureMode) -> None:
        rt = self._rt
        (err,) = rt.cudaStreamBeginCapture(self._stream(stream), rt.cudaStreamCaptureMode(int(mode)))
        _check(err, "cudaStreamBeginCapture")

    def stream_end_capture(self, stream: int) -> int:
        err, graph = self._rt.cudaStreamEndCapture(self._stream(stream))
        _check(err, "cudaStreamEndCapture")
        handle = int(self._native_handle(graph))
        self._graphs[handle] = graph
        return handle

    def stream_is_capturing(self, stream: int) -> bool:
        """``True`` while ``stream`` is in capture mode, including a capture already invalidated."""
        rt = self._rt
        err, status = rt.cudaStreamIsCapturing(self._stream(stream))
        _check(err, "cudaStreamIsCapturing")
        return int(status) != int(rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone)

    def _graph(self, graph: int) -> Any:
        obj = self._graphs.get(graph)
        return self._rt.cudaGraph_t(graph) if obj is None else obj

    def graph_instantiate(self, graph: int) -> int:
        err, graph_exec = self._rt.cudaGraphInstantiate(self._graph(graph), 0)
        _check(err, "cudaGraphInstantiate")
        handle = int(self._native_handle(graph_exec))
        self._graph_execs[handle] = graph_exec
        return handle

    def graph_launch(self, graph_exec: int, stream: int) -> None:
        g = self._graph_execs.get(graph_exec)
        s = self._stream_get(stream)
        err = self._cudaGraphLaunch(
            self._cudaGraphExec_t(graph_exec) if g is None else g, self._stream(stream) if s is None else s
        )[0]
        if err:
            _check(err, "cudaGraphLaunch")

    def graph_exec_destroy(self, graph_exec: int) -> None:
        g = self._graph_execs.get(graph_exec)
        (err,) = self._rt.cudaGraphExecDestroy(self._cudaGraphExec_t(graph_exec) if g is None else g)
        _check(err, "cudaGraphExecDestroy")
        self._graph_execs.pop(graph_exec, None)

    def graph_destroy(self, graph: int) -> None:
        (err,) = self._rt.cudaGraphDestroy(self._graph(graph))
        _check(err, "cudaGraphDestroy")
        self._graphs.pop(graph, None)

    # -- kernels ------------------------------------------------------------------------------------------

    def compiler_version(self) -> str:
        err, major, minor = _nvrtc().nvrtcVersion()
        return f"nvrtc {int(major)}.{int(minor)}"

    def _current_capability(self) -> tuple[int, int]:
        err, device = self._rt.cudaGetDevice()
        _check(err, "cudaGetDevice")
        arch = self.capabilities(int(device)).architecture  # "sm_90"
        digits = arch[3:]
        return (int(digits[:-1]), int(digits[-1]))

    def compile_source(self, source: str, name: str, options: Sequence[str]) -> bytes:
        """Compile for the calling thread's current device; see :func:`nvrtc_compile`."""
        return nvrtc_compile(source, name, options, self._current_capability())

    def module_load_data(self, image: bytes) -> int:
        self._make_context_current()  # the driver loads into the thread's current context
        err, module = self._drv.cuModuleLoadData(image)
        _check_driver(err, "cuModuleLoadData")
        handle = int(self._native_handle(module))
        self._modules[handle] = module
        return handle

    def module_get_function(self, module: int, name: str) -> int:
        mod = self._modules.get(module)
        err, function = self._drv.cuModuleGetFunction(self._drv.CUmodule(module) if mod is None else mod, name.encode())
        _check_driver(err, f"cuModuleGetFunction({name!r})")
        handle = int(self._native_handle(function))
        self._functions[handle] = function
        return handle

    def module_unload(self, module: int) -> None:
        mod = self._modules.get(module)
        (err,) = self._drv.cuModuleUnload(self._drv.CUmodule(module) if mod is None else mod)
        _check_driver(err, "cuModuleUnload")
        self._modules.pop(module, None)

    def launch_kernel(
        self,
        function: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        stream: int,
        arg_ptrs: int,
    ) -> None:
        """Launch; ``arg_ptrs`` is the address of a ``void*[]`` of argument addresses."""
        f = self._functions.get(function)
        if f is None:
            f = self._CUfunction(function)
        s = self._stream_get(stream)
        gx, gy, gz = grid
        bx, by, bz = block
        err = self._cuLaunchKernel(
            f, gx, gy, gz, bx, by, bz, shared_mem, self._stream(stream) if s is None else s, arg_ptrs, 0
        )[0]
        if err:
            if int(err) == _CUDA_ERROR_INVALID_CONTEXT:
                self._make_context_current()
                err = self._cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared_mem, self._stream(stream), arg_ptrs, 0)[0]
            _check_driver(err, "cuLaunchKernel")

    # -- errors and lifetime --------------------------------------------------------------------------------

    def error_name(self, code: int) -> str:
        return _decode(self._rt.cudaGetErrorName(int(code))[1])

    def error_string(self, code: int) -> str:
        return _decode(self._rt.cudaGetErrorString(int(code))[1])

    def close(self) -> None:
        """Drop the handle caches. Frees nothing on the device; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._events.clear()
        self._graphs.clear()
        self._graph_execs.clear()
        self._functions.clear()
        self._modules.clear()
