"""``CudaCore``: the CUDA backend's state, handle conversion and device selection.

Every call group (``_streams``, ``_memory``, ``_hostcalls``, ``_graphs``,
``_kernels``) is a subclass of :class:`CudaCore`; ``_backend.CudaBackend``
composes them. The constructor binds the hot-path binding functions once, so a
hot call costs one attribute lookup per binding function, and keeps the
int-handle -> wrapper caches the hot paths read first.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from .._cstring import c_string
from .._native_ops import NativeOps
from .._native_ops import load as load_native_ops
from ..protocol import Capabilities
from ._codes import _CUDA_ERROR_INVALID_CONTEXT, _check, _driver_error
from . import _loading
from ._loading import _driver, _proc_address, _runtime, _stream_wait_value64

__all__ = ["CudaCore"]

_CACHE_LIMIT = 4096  # bound on cached wrapper objects for handles created elsewhere
_CAN_USE_64_BIT_STREAM_MEM_OPS = 122  # CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS (cuda.h; 93 is the V1 API)


class CudaCore:
    """State and internals shared by the CUDA backend's call groups; also device selection and records."""

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

        libcuda = _loading._load_libcuda()  # looked up at call time: tests replace it
        launch_host_func = libcuda.cuLaunchHostFunc
        launch_host_func.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        launch_host_func.restype = ctypes.c_int
        self._libcuda = libcuda
        self._cuLaunchHostFunc = launch_host_func
        self._cuStreamWaitValue64 = _stream_wait_value64(libcuda)
        # A launch's calls in one native call (None where _launch_c is not built; see _native_ops).
        self.native_ops: NativeOps | None = load_native_ops(
            libcuda,
            hip=False,
            make_error=_driver_error,
            make_current=self._make_context_current,
            context_error=_CUDA_ERROR_INVALID_CONTEXT,
            resolve=lambda name: _proc_address(libcuda, name),
            backend=self,
        )
        if self.native_ops is not None:
            self.native_ops.serve_events(self)
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
            device_name=c_string(props.name),
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

    def _current_capability(self) -> tuple[int, int]:
        """The compute capability ``(major, minor)`` of the calling thread's current device."""
        err, device = self._rt.cudaGetDevice()
        _check(err, "cudaGetDevice")
        arch = self.capabilities(int(device)).architecture  # "sm_90"
        digits = arch[3:]
        return (int(digits[:-1]), int(digits[-1]))

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
