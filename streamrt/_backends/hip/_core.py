"""``HipCore``: the hip backend's state, handle conversion and device selection.

Every call group (``_streams``, ``_memory``, ``_hostcalls``, ``_graphs``,
``_kernels``) is a subclass of :class:`HipCore`; ``_backend.HipBackend``
composes them. The constructor binds every hip-python function of
``_symbols`` once, as ``self._<name>``, and keeps the int-handle -> wrapper
caches the hot paths read first.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..._errors import BackendError
from .._cstring import c_string
from .._native_ops import NativeOps
from .._native_ops import available as native_ops_available
from .._native_ops import load as load_native_ops
from ..protocol import Capabilities, CaptureMode, MemcpyKind
from . import _loading as L
from ._codes import _INVALID_VALUE, _NO_DEVICE, _check, _error
from ._symbols import _HIP_CALLS, _HIPRTC_CALLS

__all__ = ["HipCore"]

# Conversion caches (int handle -> hip-python wrapper) are cleared when they reach this size.
_CACHE_LIMIT = 4096


class HipCore:
    """State and internals shared by the hip backend's call groups; also device selection and records."""

    if TYPE_CHECKING:
        # The hip-python functions of _HIP_CALLS / _HIPRTC_CALLS, bound in __init__ as ``_<name>``.
        def __getattr__(self, name: str) -> Callable[..., Any]: ...

    def __init__(self) -> None:
        L._load()
        hip = L._hip
        for py_name in _HIP_CALLS:
            setattr(self, "_" + py_name, getattr(hip, py_name))
        for py_name in _HIPRTC_CALLS:
            setattr(self, "_" + py_name, getattr(L._hiprtc, py_name))
        # Enum members hip-python insists on, indexed by value.
        self._memcpy_kinds = tuple(hip.hipMemcpyKind(int(k)) for k in MemcpyKind)
        self._capture_modes = tuple(hip.hipStreamCaptureMode(int(m)) for m in CaptureMode)
        # Wrapper factories for handles first seen as ints.
        self._new_pointer: Callable[[int], Any] = L._types.Pointer
        self._new_arg_array: Callable[[int], Any] = L._types.ListOfPointer
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
        self._no_extra = L._helpers.HipModuleLaunchKernel_extra.fromObj(None)
        self._capabilities: dict[int, Capabilities] = {}
        self._offload_arch: dict[int, str] = {}
        self._compiler_version: str | None = None
        self._closed = False
        self.native_ops: NativeOps | None = self._load_native_ops()
        if self.native_ops is not None:
            self.native_ops.serve_events(self)

    def _load_native_ops(self) -> NativeOps | None:
        """A launch's calls in one native call, on the HIP library hip-python opened (see ``_native_ops``).

        ``None`` where ``_launch_c`` is not built or no ``libamdhip64.so`` is mapped
        (a stand-in hip-python): the hip-python calls serve the same contract.
        """
        if not native_ops_available():
            return None
        self._hipGetDeviceCount()  # hip-python opens its library on its first call
        path = L.loaded_hip_library()
        if path is None:
            return None
        return load_native_ops(ctypes.CDLL(path), hip=True, make_error=_error, backend=self)

    # -- handle conversion -------------------------------------------------------------------
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

    # -- devices -----------------------------------------------------------------------------
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
        offload_arch = c_string(props.gcnArchName)  # "gfx942:sramecc+:xnack-"; "sm_90" on HIP-on-CUDA
        if not offload_arch:
            raise BackendError(
                "hip", _INVALID_VALUE, "hipErrorInvalidValue", "device reports no gcnArchName", "hipGetDeviceProperties"
            )
        caps = Capabilities(
            backend="hip",
            device_name=c_string(props.name),
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

    def _can_wait_value(self, device: int) -> bool:
        """``hipDeviceAttributeCanUseStreamWaitValue``; ``False`` if the query itself fails."""
        attribute = L._hip.hipDeviceAttribute_t.hipDeviceAttributeCanUseStreamWaitValue
        err, value = self._hipDeviceGetAttribute(attribute, device)
        return not err and bool(value)

    def device_synchronize(self) -> None:
        """Wait (GIL released) for all work on the current device."""
        _check(self._hipDeviceSynchronize()[0], "hipDeviceSynchronize")

    def mem_get_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of the current device."""
        err, free, total = self._hipMemGetInfo()
        _check(err, "hipMemGetInfo")
        return int(free), int(total)
