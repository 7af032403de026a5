"""The tracer's clocks: device and host times of traced ops.

:class:`_EventClock` brackets each op with two pooled timing events (GPUs)
and reads host times from ``perf_counter``; :class:`_VirtualClock` reads host
times from each thread's virtual clock of the simulator, whose op log gives
the device times (the tracer matches calls to logged ops; ``_SIM_KIND`` and
``_SIM_WORK`` say what each logged op kind is in a trace). Thread rules: as
for the tracer.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__: list[str] = []

# Simulator op kinds -> trace kinds (for ops the simulator ran that no traced call enqueued).
_SIM_KIND = {
    "memset": "memset",
    "copy_h2d": "host_to_device",
    "copy_d2h": "device_to_host",
    "copy_d2d": "device_to_device",
    "copy_h2h": "host_to_host",
    "copy_peer": "device_to_device",
    "kernel": "kernel",
    "host_func": "host_native",
    "event_record": "record",
    "wait_event": "wait_event",
    "wait_signal": "wait_signal",
    "malloc_async": "malloc_async",
    "free_async": "free_async",
    "graph_launch": "graph_launch",
}
_SIM_WORK = frozenset({"memset", "copy_h2d", "copy_d2h", "copy_d2d", "copy_h2h", "copy_peer", "kernel", "host_func"})


class _EventClock:
    """Device times from pairs of timing events around each op; host times from ``perf_counter``.

    ``device``: the runtime's device when the backend has several (``None``
    with one): new events and the calibration stream are then made with it
    current on the calling thread, since an event is recorded only on streams
    of the device current at its creation.
    """

    clock = "events"

    def __init__(self, backend: Any, t0_ns: int, device: int | None = None) -> None:
        self._backend = backend
        self._t0 = t0_ns
        self._device = device
        self._pool: list[int] = []
        self._all: list[int] = []
        self._lock = threading.Lock()
        self._origin, self._origin_us = self._calibrate()

    def _event(self) -> int:
        with self._lock:
            if self._pool:
                return self._pool.pop()
        if self._device is not None:
            self._backend.ensure_device(self._device)
        ev = self._backend.event_create(timing=True, blocking_sync=True)
        with self._lock:
            self._all.append(ev)
        return ev

    def _calibrate(self) -> tuple[int, float]:
        """Record an origin event on a private stream and map its device time onto host time.

        The event completes between the host times before its record and after
        its synchronize; of five tries the narrowest window's midpoint is used.
        """
        backend = self._backend
        if self._device is not None:
            backend.ensure_device(self._device)
        stream = backend.stream_create(0)
        try:
            best: tuple[int, int, int] | None = None
            for _ in range(5):
                ev = self._event()
                a = time.perf_counter_ns()
                backend.event_record(ev, stream)
                backend.event_synchronize(ev)
                b = time.perf_counter_ns()
                if best is None or b - a < best[1] - best[0]:
                    if best is not None:
                        self._pool.append(best[2])
                    best = (a, b, ev)
                else:
                    self._pool.append(ev)
            assert best is not None
        finally:
            backend.stream_destroy(stream)
        return best[2], ((best[0] + best[1]) / 2 - self._t0) / 1000.0

    def host_now(self) -> float:
        return (time.perf_counter_ns() - self._t0) / 1000.0

    def mark(self, stream: int) -> int | None:
        """Record a timing event at the current end of ``stream``; ``None`` while it is capturing."""
        if self._backend.stream_is_capturing(stream):
            return None
        ev = self._event()
        self._backend.event_record(ev, stream)
        return ev

    def release(self, ev: int | None) -> None:
        if ev is not None:
            with self._lock:
                self._pool.append(ev)

    def device_time(self, ev: int | None) -> float | None:
        if ev is None:
            return None
        try:
            return self._origin_us + self._backend.event_elapsed_ms(self._origin, ev) * 1000.0
        except Exception:  # an event whose record failed or was captured: no time
            return None

    def close(self) -> None:
        with self._lock:
            events, self._all, self._pool = self._all, [], []
        for ev in events:
            try:
                self._backend.event_destroy(ev)
            except Exception:  # the backend may already be closing; events die with it
                pass


class _VirtualClock:
    """Device times from the simulator's op log; host times from each thread's virtual clock."""

    clock = "virtual"

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        self.host_now: Callable[[], float] = backend.host_now_us


def _has_virtual_clock(rt: Runtime) -> bool:
    backend = rt.backend
    return bool(rt.capabilities.virtual_clock) and callable(getattr(backend, "op_log", None)) and callable(
        getattr(backend, "host_now_us", None)
    )
