"""Host functions and signals of the sim backend.

Host functions run on the device's callback thread in stream order; a signal is
8 bytes of pinned memory (from the memory calls) that a ``wait_signal`` op
watches. See ``_backend`` for the behaviour and ``_device`` for the watcher.
"""

from __future__ import annotations

import ctypes
from typing import Any

from . import _codes as C
from ._codes import fail
from ._core import check_count
from ._device import signal_reached
from ._memcalls import MemoryCalls

__all__ = ["HostCalls"]


class HostCalls(MemoryCalls):
    """launch_host_func / signal_alloc / signal_free / stream_wait_signal / expect_host_work.

    Builds on :class:`~._memcalls.MemoryCalls`: signals are pinned host allocations.
    """

    # == host functions =================================================================================
    def launch_host_func(self, stream: int, fn_ptr: int, user_data: int) -> None:
        """Enqueue the native ``void fn(void*)``; it runs on the device's callback thread in stream order."""
        call = "launch_host_func"
        tls = self._enter(call)
        estimate, tls.host_work = tls.host_work, None
        fp = check_count(fn_ptr, "fn_ptr", call)
        if fp == 0:
            fail(C.INVALID_VALUE, "fn_ptr is NULL", call)
        ud = 0 if user_data is None else check_count(user_data, "user_data", call)
        with self._lock:
            s = self._stream(stream, tls, call)
            cfn = self._hostfn(fp)
            p = self._profile
            duration = p.host_func_us
            if estimate is not None:
                duration += p.python_host_call_us
                if not self._charge_host_time:
                    estimate = None  # deterministic times: the model's cost alone
            if s.capture is not None:
                self._capture_node(
                    tls, s, "host_func", call, duration_us=duration, fn=cfn, args=(ud,), host=True, estimate=estimate
                )
                return
            hzinfo = None
            if self._hz is not None:
                vc = self._hz.stream_clock(s)
                epoch = self._hz.next_epoch(s.key, vc)
                hzinfo = (s.key, dict(vc), epoch)
            if estimate is not None:
                duration += estimate.us
            op = self._enqueue(tls, s, "host_func", self._next_seq(), duration=duration, work=True, fn=cfn, args=(ud,), host=True)
            op.hz = hzinfo

    # == signals ======================================================================================
    def signal_alloc(self) -> int:
        """8 zeroed bytes of pinned memory, 8-aligned, for :meth:`stream_wait_signal`."""
        signal = self.host_malloc(8)
        ctypes.memset(signal, 0, 8)
        with self._lock:
            self._signals.add(signal)
        return signal

    def signal_free(self, signal: int) -> None:
        """Free a signal after the device's work, as ``host_free`` does.

        Refused (``INVALID_VALUE``, nothing freed) for memory that is not a
        signal of this backend, and while a stream waits on it for a value not
        stored yet: on a GPU that free would never return.
        """
        call = "signal_free"
        self._enter(call)
        sig = check_count(signal, "signal", call)
        with self._lock:
            if sig not in self._signals:
                fail(C.INVALID_VALUE, f"{sig:#x} is not a signal of this backend (use signal_alloc)", call)
            waits = [op for op in self._signal_waits.get(sig, ()) if not op.done]
            unreached = [op for op in waits if not signal_reached(op)]
            if unreached:
                fail(C.INVALID_VALUE, f"signal {sig:#x} is still waited on by {unreached[0]!r}", call)
            self._signal_waits.pop(sig, None)
            self._signals.discard(sig)
        self.host_free(sig)

    def stream_wait_signal(self, stream: int, signal: int, value: int) -> None:
        """Later work on ``stream`` waits until the 64-bit word at ``signal`` is ``>= value``.

        Virtual time: the wait takes nothing of its own, unless the runtime
        announced Python host work (:meth:`expect_host_work`): then it lasts
        ``python_host_call_us`` plus, with ``charge_host_time``, the estimate.
        """
        call = "stream_wait_signal"
        tls = self._enter(call)
        estimate, tls.host_work = tls.host_work, None
        sig = check_count(signal, "signal", call)
        v = check_count(value, "value", call)
        if v >= 1 << 64:
            fail(C.INVALID_VALUE, f"value {v} does not fit in 64 bits", call)
        with self._lock:
            s = self._stream(stream, tls, call)
            if sig not in self._signals:
                fail(C.INVALID_VALUE, f"{sig:#x} is not a signal of this backend (use signal_alloc)", call)
            alloc = self._mem.find(sig)  # kept alive until the wait has run
            if s.capture is not None:
                self._violation([s.capture], C.CAPTURE_UNSUPPORTED, "stream_wait_signal cannot be captured", call)
            duration = 0.0
            if estimate is not None:
                duration = self._profile.python_host_call_us
                if self._charge_host_time:
                    duration += estimate.us
            op = self._enqueue(tls, s, "wait_signal", self._next_seq(), duration=duration, work=False, submit=False)
            op.signal = (sig, v)
            op.refs = alloc
            waits = self._signal_waits.setdefault(sig, [])
            if len(waits) >= 16:
                waits[:] = [w for w in waits if not w.done]
            waits.append(op)
            self._sched.submit(op)

    def expect_host_work(self, estimate: Any) -> None:
        """Simulator only: the next host function this thread launches waits for Python host work.

        The runtime calls it before enqueueing what holds a stream while its
        worker runs a Python function: the ``stream_wait_signal`` wait, or the
        ``sem_wait`` host function where signals are not used.
        ``estimate.us`` is the runtime's live estimate of that function's run
        time: the wait then lasts ``python_host_call_us`` (a host function
        ``host_func_us + python_host_call_us``), plus ``estimate.us`` when the profile has
        ``charge_host_time`` (read now; a captured node reads it at every
        replay). Not part of the backend protocol: GPU backends have no such
        call, since their host functions take the time they take.
        """
        self._tls.host_work = estimate
