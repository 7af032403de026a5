"""Host functions and signals of the hip backend (``hipLaunchHostFunc``, ``hipStreamWaitValue64``)."""

from __future__ import annotations

import ctypes

from ._codes import _check, _not_a_signal
from ._core import HipCore

__all__ = ["HostCalls"]

# hipExtMallocWithFlags / hipStreamWaitValue64 arguments (hip_runtime_api.h).
_MALLOC_SIGNAL_MEMORY = 0x2  # hipMallocSignalMemory
_WAIT_VALUE_GTE = 0x0  # hipStreamWaitValueGte
_ALL_BITS = (1 << 64) - 1


class HostCalls(HipCore):
    """launch_host_func / signal_alloc / signal_free / stream_wait_signal."""

    # -- host functions ----------------------------------------------------------------------
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

    # -- signals -----------------------------------------------------------------------------
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
