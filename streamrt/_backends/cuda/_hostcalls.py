"""Host functions and signals of the CUDA backend, through the driver's C API (ctypes).

``launch_host_func`` and ``stream_wait_signal`` call ``libcuda`` directly
(ctypes releases the GIL): see the package docstring for why the bindings'
``cuLaunchHostFunc`` cannot be used.
"""

from __future__ import annotations

import ctypes

from ..._errors import BackendError
from ._codes import _CUDA_ERROR_INVALID_CONTEXT, _check, _check_driver, _not_a_signal
from ._core import CudaCore

__all__ = ["HostCalls"]

_CU_STREAM_WAIT_VALUE_GEQ = 0  # CUstreamWaitValue_flags (cuda.h)


class HostCalls(CudaCore):
    """launch_host_func / signal_alloc / signal_free / stream_wait_signal."""

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
