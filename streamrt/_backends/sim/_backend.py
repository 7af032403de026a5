"""``SimBackend``: the simulated device behind the backend protocol.

Behaviour, in the protocol's terms:

* **Asynchronous.** Enqueue calls return at once; per-device executor and
  callback threads (see ``_device``) run the work. Queries report real
  completion; synchronize calls block with the GIL released until it happens.
* **Streams** are FIFO. The null stream ``0`` (one per device, resolved by the
  calling thread's current device) is an ordinary stream: it does **not**
  synchronize with other streams, unlike CUDA's legacy default stream.
  Priorities are accepted, clamped to ``(0, -5)`` and otherwise ignored.
* **Events**: ``event_record`` is a marker in its stream; ``stream_wait_event``
  makes later work on a stream wait for the event's latest record (an event
  never recorded: no-op, and queries report it complete). ``event_elapsed_ms``
  is virtual time.
* **Memory** (``_memory``): device and pinned memory are real host mappings;
  memsets and copies move real bytes when they execute. ``free``/``host_free``
  first wait for all work on the allocation's device, like ``cudaFree``. Async
  copies that name pageable host memory run synchronously with respect to the
  calling thread (they return after the copy completed), as on GPUs.
* **Virtual time** (``_profile``): each op gets deterministic start/end times
  at enqueue. Each host thread has its own virtual clock: every API call
  advances it by ``api_call_us``; synchronize calls (and ``free``) advance it
  to the completion they waited for plus ``sync_wake_us``. Queries and pure
  look-ups (``*_query``, ``pointer_kind``, ``capabilities``, ...) cost nothing,
  since how often a program polls depends on real timing.
* **Several devices** (``devices=N``): each device has its own executor and
  callback threads, memory, null stream and virtual timeline
  (:meth:`SimBackend.device_time_us`). A stream may wait on an event recorded
  on another device: its later work waits for the real completion and starts
  no earlier than the event's virtual time. An event is recorded only on
  streams of the device that was current at its creation, and
  ``event_elapsed_ms`` refuses events of two devices (as CUDA and HIP do).
  ``can_access_peer`` is ``True`` for every pair; ``enable_peer_access`` is
  remembered and makes ``memcpy_peer_async`` (real bytes) run at
  ``peer_bandwidth_gbps`` instead of the staged-through-host rate.
* **Signals**: ``signal_alloc`` returns 8 zeroed bytes of pinned memory;
  ``stream_wait_signal`` is a ``wait_signal`` op that holds back its stream
  (only it) until the host has stored a value ``>=`` the one named, seen by
  the device's signal watcher (``_device``). ``signal_free`` refuses a signal
  a stream waits on for a value not stored yet; capture refuses the wait.
* **Capture and graphs** (``_graph``), **kernel twins** (``_kernels``) and
  **hazard checking** (``_hazards``): see those modules.

The protocol's calls are grouped by topic: devices, streams, events, host
functions and lifetime here; memory in ``_memcalls``; capture and graphs in
``_graphcalls``; kernels in ``_kernelcalls``; shared state and internals in ``_core``.
* **Errors** go through ``_codes.fail``: ``BackendError(backend="sim", code, name)``
  with CUDA's numbers. A failing call enqueues nothing and creates nothing.
  An error raised by a kernel twin while it runs is reported once by the
  device's next ``stream_synchronize`` / ``event_synchronize`` /
  ``device_synchronize``. Backend calls from a host function or a twin (the
  simulator's own threads) raise ``simErrorNotPermitted``.
* **close()** refuses new calls, waits (up to ``close_timeout`` seconds) for all
  enqueued work to complete, then stops and joins the threads and drops all
  memory. If work is still pending at the timeout (a host function that never
  returns), ops not yet started are abandoned — they never run — and a
  ``RuntimeWarning`` names any thread left stuck. Idempotent.
"""

from __future__ import annotations

import ctypes
import warnings
from typing import Any, NoReturn

from ..protocol import Capabilities, priority_clamp
from . import _codes as C
from ._codes import fail
from ._core import (
    CAPTURED,
    EVENT_BASE,
    RECORDED,
    STREAM_BASE,
    UNRECORDED,
    EventState,
    StreamState,
    check_count,
)
from ._device import signal_reached
from ._graphcalls import GraphCalls
from ._hazards import READ, WRITE, Hazard, merge
from ._kernelcalls import KernelCalls
from ._memcalls import MemoryCalls
from ._ops import OpRecord
from ._profile import SimProfile
from ._user_objects import SimUserObjects

__all__ = ["SimBackend"]


class SimBackend(SimUserObjects, MemoryCalls, GraphCalls, KernelCalls):
    """The simulated device. Create it with ``streamrt._backends.sim.create(...)``.

    Implements every method of :class:`~streamrt._backends.protocol.Backend`
    (see the module docstring for the behaviour) plus the simulator's own tools:
    :meth:`op_log`, :meth:`clear_op_log`, :meth:`host_now_us`, :meth:`device_time_us`,
    :meth:`peer_access_enabled`,
    :meth:`advance_host_clock`, :meth:`hazards`, :meth:`clear_hazards`,
    :meth:`check_host_access` and :attr:`profile`.

    Args:
        profile: the cost model.
        devices: number of simulated devices (each with its own threads and memory).
        check_hazards: ``False``; ``True`` (or ``"record"``) to record hazards;
            ``"raise"`` to raise :class:`~streamrt._backends.sim.HazardError` instead of
            enqueueing the offending op.
        op_log_limit: completed ops kept for :meth:`op_log` (0 turns the log off).
        hazard_history: accesses remembered per allocation for hazard checks.
        close_timeout: seconds :meth:`close` waits for queued work before abandoning it.
    """

    name = "sim"

    # == devices ==================================================================================
    def device_count(self) -> int:
        """Number of simulated devices (the ``devices`` option)."""
        self._enter("device_count")
        return self._ndev

    def set_device(self, device: int) -> None:
        """Make ``device`` current on the calling thread (affects the null stream, new streams, allocations)."""
        call = "set_device"
        tls = self._enter(call)
        tls.device = self._check_device(device, call)

    def ensure_device(self, device: int) -> None:
        """Same as :meth:`set_device` (cheap either way)."""
        call = "ensure_device"
        tls = self._enter(call)
        tls.device = self._check_device(device, call)

    def capabilities(self, device: int) -> Capabilities:
        call = "capabilities"
        self._enter(call)
        self._check_device(device, call)
        p = self._profile
        return Capabilities(
            backend="sim",
            device_name=f"streamrt simulated {p.name}",
            architecture="sim",
            is_simulated=True,
            supports_graphs=True,
            supports_stream_ordered_alloc=True,
            supports_pageable_async_copy=True,
            supports_stream_signals=True,
            priority_range=(0, -5),
            virtual_clock=True,
            total_memory=p.total_memory,
            multiprocessor_count=p.multiprocessor_count,
        )

    def device_synchronize(self) -> None:
        """Wait for all work on the current device; prohibited while one of its streams captures."""
        call = "device_synchronize"
        tls = self._enter(call)
        with self._lock:
            caps = [c for c in self._captures if c.device == tls.device]
            if caps:
                self._violation(
                    caps, C.CAPTURE_UNSUPPORTED, "device_synchronize would wait for a capturing stream", call
                )
        self._sync_device(tls, tls.device, call)
        self._raise_async_error(tls.device, call)

    def mem_get_info(self) -> tuple[int, int]:
        """``(free, total)`` simulated bytes of the current device (stream-ordered frees count once executed)."""
        tls = self._enter("mem_get_info")
        with self._lock:
            used = self._mem.used[tls.device]
        total = self._profile.total_memory
        return total - used, total

    # == several devices ==========================================================================
    def can_access_peer(self, device: int, peer: int) -> bool:
        """``True`` for any two different devices (the simulated machine is a full peer mesh)."""
        call = "can_access_peer"
        self._enter(call)
        return self._check_device(device, call) != self._check_device(peer, call)

    def enable_peer_access(self, peer: int) -> None:
        """Let the current device access ``peer``'s memory: its peer copies run at ``peer_bandwidth_gbps``.

        Idempotent. ``peer`` equal to the current device raises ``simErrorInvalidDevice`` (as on CUDA).
        """
        call = "enable_peer_access"
        tls = self._enter(call)
        p = self._check_device(peer, call)
        if p == tls.device:
            fail(C.INVALID_DEVICE, f"device {p} cannot be its own peer", call)
        with self._lock:
            self._peer_access.add((tls.device, p))
            self._charge(tls)

    # == streams ==================================================================================
    def stream_create(self, priority: int = 0) -> int:
        call = "stream_create"
        tls = self._enter(call)
        if isinstance(priority, bool) or not isinstance(priority, int):
            fail(C.INVALID_VALUE, f"priority must be an int, got {priority!r}", call)
        prio = priority_clamp(priority, (0, -5))
        with self._lock:
            handle = self._new_handle(STREAM_BASE)
            s = StreamState(handle, handle, tls.device, prio, self._hz is not None)
            self._streams[handle] = s
            self._devices[tls.device].streams.add(s)
            self._charge(tls)
        return handle

    def stream_destroy(self, stream: int) -> None:
        """Destroy ``stream``; work already enqueued still runs (and device_synchronize waits for it)."""
        call = "stream_destroy"
        tls = self._enter(call)
        with self._lock:
            s = self._stream(stream, tls, call)
            if s.handle == 0:
                fail(C.INVALID_HANDLE, "the null stream cannot be destroyed", call)
            if s.capture is not None:
                self._violation([s.capture], C.CAPTURE_UNSUPPORTED, "a capturing stream cannot be destroyed", call)
            del self._streams[s.handle]
            self._devices[s.device].executor.host_started.pop(s.handle, None)
            s.destroyed = True
            if s.idle():
                self._devices[s.device].streams.discard(s)
            self._charge(tls)

    def stream_synchronize(self, stream: int) -> None:
        call = "stream_synchronize"
        tls = self._enter(call)
        with self._lock:
            s = self._stream(stream, tls, call)
            if s.capture is not None:
                self._violation([s.capture], C.CAPTURE_UNSUPPORTED, f"stream {s.handle:#x} is capturing", call)
            last = s.last_op
            tail = s.tail_us
            vc = dict(s.vc) if s.vc else None
        self._wait(tls, [last] if last is not None else [], tail, call)
        if self._hz is not None and vc:
            with self._lock:
                self._hz.host_observe(vc)
        self._raise_async_error(s.device, call)

    def stream_query(self, stream: int) -> bool:
        """``True`` when everything enqueued on ``stream`` has really completed."""
        call = "stream_query"
        tls = self._enter(call)
        with self._lock:
            s = self._stream(stream, tls, call)
            if s.capture is not None:
                self._violation([s.capture], C.CAPTURE_UNSUPPORTED, f"stream {s.handle:#x} is capturing", call)
            done = s.idle()
            if done and self._hz is not None and s.vc:
                self._hz.host_observe(s.vc)
            return done

    def stream_wait_event(self, stream: int, event: int) -> None:
        """Later work on ``stream`` waits for ``event``'s latest record (joins a capture if it was captured)."""
        call = "stream_wait_event"
        tls = self._enter(call)
        with self._lock:
            s = self._stream(stream, tls, call)
            ev = self._event(event, call)
            if ev.state == CAPTURED:
                cap = ev.capture
                assert cap is not None
                if cap.ended:
                    fail(
                        C.CAPTURED_EVENT,
                        f"event {ev.handle:#x} was recorded in a capture that has ended; record it again",
                        call,
                    )
                if s.capture is None:
                    if s.handle == 0:
                        self._violation(
                            [cap],
                            C.CAPTURE_IMPLICIT,
                            "the null stream cannot join a capture (it could not on CUDA/HIP)",
                            call,
                        )
                    s.capture = cap
                    s.cap_deps = list(ev.cap_deps)
                    cap.streams.append(s)
                elif s.capture is cap:
                    self._check_capture_valid(cap, call)
                    for d in ev.cap_deps:
                        if d not in s.cap_deps:
                            s.cap_deps.append(d)
                else:
                    self._violation(
                        [s.capture, cap],
                        C.CAPTURE_MERGE,
                        "the event belongs to a different capture than the stream",
                        call,
                    )
                self._charge(tls)
                return
            if ev.state == UNRECORDED:
                self._charge(tls)  # waiting on a never-recorded event is a no-op, as on CUDA/HIP
                return
            if s.capture is not None:
                self._violation(
                    [s.capture],
                    C.CAPTURE_ISOLATION,
                    f"capturing stream {s.handle:#x} cannot wait on event {ev.handle:#x}, recorded outside the capture",
                    call,
                )
            if self._hz is not None and ev.vc:
                merge(self._hz.stream_clock(s), ev.vc)
            self._enqueue(
                tls, s, "wait_event", self._next_seq(), duration=0.0, work=False, wait_op=ev.op, wait_us=ev.time_us
            )

    # == events ===================================================================================
    def event_create(self, *, timing: bool, blocking_sync: bool = True) -> int:
        """Create an event; ``blocking_sync`` is accepted (waits always sleep on the simulator)."""
        call = "event_create"
        tls = self._enter(call)
        with self._lock:
            handle = self._new_handle(EVENT_BASE)
            self._events[handle] = EventState(handle, bool(timing), bool(blocking_sync), tls.device)
            self._charge(tls)
        return handle

    def event_destroy(self, event: int) -> None:
        """Destroy ``event``; a pending record still completes and waits on it still hold."""
        call = "event_destroy"
        tls = self._enter(call)
        with self._lock:
            ev = self._event(event, call)
            del self._events[ev.handle]
            self._charge(tls)

    def event_record(self, event: int, stream: int) -> None:
        call = "event_record"
        tls = self._enter(call)
        with self._lock:
            ev = self._event(event, call)
            s = self._stream(stream, tls, call)
            if ev.owner != s.device:
                fail(
                    C.INVALID_HANDLE,
                    f"event {ev.handle:#x} was created on device {ev.owner} and cannot be recorded on stream "
                    f"{s.handle:#x} of device {s.device} (CUDA and HIP refuse it too)",
                    call,
                )
            if s.capture is not None:
                self._check_capture_valid(s.capture, call)
                ev.state = CAPTURED
                ev.capture = s.capture
                ev.cap_deps = tuple(s.cap_deps)
                ev.op = None
                ev.vc = None
                self._charge(tls)
                return
            op = self._enqueue(
                tls, s, "event_record", self._next_seq(), duration=self._profile.event_record_us, work=False
            )
            ev.state = RECORDED
            ev.op = op
            ev.time_us = op.start_us
            ev.device = s.device
            ev.capture = None
            ev.cap_deps = ()
            ev.vc = dict(self._hz.stream_clock(s)) if self._hz is not None else None

    def _captured_event_error(self, ev: EventState, call: str) -> NoReturn:
        cap = ev.capture
        assert cap is not None
        message = f"event {ev.handle:#x} was last recorded in a capturing stream"
        if cap.ended:
            fail(C.CAPTURED_EVENT, message, call)
        self._violation([cap], C.CAPTURED_EVENT, message, call)

    def event_query(self, event: int) -> bool:
        """``True`` when the event's latest record has really completed (or it was never recorded)."""
        call = "event_query"
        self._enter(call)
        with self._lock:
            ev = self._event(event, call)
            if ev.state == CAPTURED:
                self._captured_event_error(ev, call)
            if ev.state == UNRECORDED:
                return True
            assert ev.op is not None
            done = ev.op.done
            if done and self._hz is not None:
                self._hz.host_observe(ev.vc)
            return done

    def event_synchronize(self, event: int) -> None:
        call = "event_synchronize"
        tls = self._enter(call)
        with self._lock:
            ev = self._event(event, call)
            if ev.state == CAPTURED:
                self._captured_event_error(ev, call)
            op, when, vc, device = ev.op, ev.time_us, ev.vc, ev.device
        if op is None:
            self._charge(tls)
            return
        self._wait(tls, [op], when, call)
        if self._hz is not None and vc:
            with self._lock:
                self._hz.host_observe(vc)
        self._raise_async_error(device, call)

    def event_elapsed_ms(self, start: int, end: int) -> float:
        """Virtual milliseconds from ``start``'s record to ``end``'s (both timing events, both completed)."""
        call = "event_elapsed_ms"
        self._enter(call)
        with self._lock:
            evs = (self._event(start, call), self._event(end, call))
            for ev in evs:
                if not ev.timing:
                    fail(C.INVALID_HANDLE, f"event {ev.handle:#x} was created without timing", call)
                if ev.state == CAPTURED:
                    fail(C.CAPTURED_EVENT, f"event {ev.handle:#x} was last recorded in a capturing stream", call)
                if ev.state == UNRECORDED:
                    fail(C.INVALID_HANDLE, f"event {ev.handle:#x} has not been recorded", call)
            for ev in evs:
                assert ev.op is not None
                if not ev.op.done:
                    fail(C.NOT_READY, f"event {ev.handle:#x} has not completed yet", call)
            if evs[0].device != evs[1].device:
                fail(
                    C.INVALID_HANDLE,
                    f"events recorded on devices {evs[0].device} and {evs[1].device}: devices have no common clock",
                    call,
                )
            return (evs[1].time_us - evs[0].time_us) / 1000.0

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

    # == errors and lifetime ========================================================================
    def error_name(self, code: int) -> str:
        return C.error_name(code)

    def error_string(self, code: int) -> str:
        return C.error_string(code)

    def close(self) -> None:
        """Drain (up to ``close_timeout`` s), stop and join the threads, drop every handle. Idempotent.

        Memory never freed stays mapped as long as this backend object lives (see ``MemoryMap.close``).
        """
        tls = self._tls
        if tls.role is not None:
            fail(C.NOT_PERMITTED, f"called from the simulator's {tls.role} thread", "close")
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._finalizer.detach()
        drained, stuck = self._sched.shutdown(self._close_timeout)
        with self._lock:
            self._streams.clear()
            self._events.clear()
            self._graphs.clear()
            self._execs.clear()
            self._modules.clear()
            self._functions.clear()
            self._captures.clear()
            self._mem.close()
        if not drained:
            names = ", ".join(t.name for t in stuck) or "none"
            warnings.warn(
                f"sim backend closed with work still pending after {self._close_timeout} s; ops not started were "
                f"abandoned (threads stuck in a host function: {names})",
                RuntimeWarning,
                stacklevel=2,
            )

    @property
    def closed(self) -> bool:
        return self._closed

    # == simulator tools =============================================================================
    @property
    def profile(self) -> SimProfile:
        """The cost model in use."""
        return self._profile

    def op_log(self) -> list[OpRecord]:
        """Records of completed ops (the last ``op_log_limit``), in enqueue (``seq``) order."""
        with self._lock:
            rows = list(self._sched.log or ())
        rows.sort(key=lambda row: row[0])
        return [OpRecord(*row) for row in rows]

    def clear_op_log(self) -> None:
        with self._lock:
            if self._sched.log is not None:
                self._sched.log.clear()

    def peer_access_enabled(self, device: int, peer: int) -> bool:
        """Whether :meth:`enable_peer_access` made ``peer``'s memory accessible from ``device``."""
        with self._lock:
            return (device, peer) in self._peer_access

    def device_time_us(self, device: int) -> float:
        """The virtual end of the latest work enqueued on ``device`` (its timeline's tail), µs.

        Each device has its own timeline: work on one device does not move another's,
        except through a cross-device event wait or a peer copy it runs.
        """
        call = "device_time_us"
        self._check_device(device, call)
        with self._lock:
            return self._devices[device].time_us

    def host_now_us(self) -> float:
        """The calling thread's host virtual time, µs (with ``charge_host_time``, its real work so far included)."""
        tls = self._tls
        if self._charge_host_time:
            self._charge_real(tls)
        return tls.host_us

    def advance_host_clock(self, us: float) -> float:
        """Model ``us`` of host work on the calling thread's virtual clock; returns the new time."""
        if not us >= 0:
            raise ValueError(f"us must be >= 0, got {us!r}")
        self._tls.host_us += float(us)
        return self._tls.host_us

    def hazards(self) -> tuple[Hazard, ...]:
        """Hazards recorded so far (empty unless created with ``check_hazards``)."""
        if self._hz is None:
            return ()
        with self._lock:
            return self._hz.found()

    def clear_hazards(self) -> None:
        if self._hz is not None:
            with self._lock:
                self._hz.clear()

    def check_host_access(self, ptr: int, nbytes: int, write: bool, *, stream: int | None = None) -> tuple[Hazard, ...]:
        """Report a host access of ``[ptr, ptr+nbytes)``; returns the hazards it causes (also recorded).

        Without ``stream`` the access is the host program's: it conflicts with
        enqueued work it has not synchronized with. With ``stream``, it is made on
        behalf of the latest host function of that stream that has started (for
        example by a runtime worker that the host function woke with ``sem_post``):
        it is ordered after the work before that host function on the stream and
        conflicts, like a device op, with unordered work on other streams.
        Pageable addresses are not tracked. A no-op returning ``()`` when hazard
        checking is off. Raises :class:`HazardError` in ``"raise"`` mode.
        """
        call = "check_host_access"
        tls = self._enter(call)
        n = check_count(nbytes, "nbytes", call)
        p = check_count(ptr, "ptr", call)
        hz = self._hz
        if hz is None or n == 0:
            return ()
        with self._lock:
            alloc = self._mem.find(p)
            if alloc is None:
                tomb = self._mem.find_freed(p)
                if tomb is None:
                    return ()
                found = [hz.freed_access(tomb, p, p + n, "host access")]
                hz.report(found, call)
                return tuple(found)
            if p + n > alloc.end:
                fail(C.INVALID_VALUE, f"{n} bytes at {p:#x} overrun the {alloc.describe()}", call)
            if stream is None:
                found = hz.host_access(alloc, p, p + n, bool(write), "host access")
                hz.report(found, call)
                return tuple(found)
            s = self._stream(stream, tls, call)
            running = self._devices[s.device].executor.host_started.get(s.handle)
            if running is None or running.hz is None:
                fail(C.INVALID_VALUE, f"no host function of stream {s.handle:#x} has started yet", call)
            key, vc, epoch = running.hz
            _, found = hz.device_access(
                key,
                vc,
                [(alloc, p, p + n, WRITE if write else READ)],
                f"host_func#{running.seq} on stream {s.handle:#x}",
                call,
                epoch=epoch,
            )
            return tuple(found)
