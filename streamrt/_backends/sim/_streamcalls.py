"""Stream and event calls of the sim backend.

See ``_backend`` for the behaviour, ``_graph`` for how records and waits join a capture.
"""

from __future__ import annotations

from typing import NoReturn

from ..protocol import priority_clamp
from . import _codes as C
from ._codes import fail
from ._core import CAPTURED, EVENT_BASE, RECORDED, STREAM_BASE, UNRECORDED, EventState, SimCore, StreamState
from ._hazards import merge

__all__ = ["StreamCalls"]


class StreamCalls(SimCore):
    """stream_create / stream_destroy / stream_synchronize / stream_query / stream_wait_event / event_*."""

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
