"""Tracing: what every stream op did, on the host and on the device.

Switch it on for a whole runtime with ``open_runtime(..., trace=True)``, or
for one region::

    with rt.trace() as t:
        run = pipeline.launch(stream)
        run.wait()
    print(t.report())             # bubbles, host blocking, overlap, critical path
    t.save_chrome("trace.json")   # chrome://tracing or ui.perfetto.dev
    t.save_timeline("timeline.png")

How it works. While tracing is on, ``Runtime._tracer`` is a :class:`Tracer`
and the runtime's backend is a wrapper that hands every enqueue, host
function and blocking call to it (``streamrt._trace_backend``); with tracing
off nothing of it runs: the streams call the backend itself. Each op records:

* the host enqueue time and the enqueuing thread;
* its device start and end: on a GPU from two pooled timing events recorded
  on the op's stream around it (so tracing adds two event records per op);
  on a device with a virtual clock (the simulator) from the backend's op log
  (``op_log()``: virtual start/end per op, matched to the traced call by the
  enqueuing thread's virtual host clock), which adds nothing to the schedule;
* its stream, pipeline and node labels (see :func:`label`) and bytes;
* for Python host functions: the thread and the time they ran, and the
  latency from their end to the resolution of their Completion;
* blocking calls (``synchronize``): the time the host was blocked.

Clocks. A :class:`Trace` uses one time axis, in microseconds from the start of
the trace (its first event). On a GPU it is the host's ``perf_counter``; device
event times are mapped onto it through an origin event synchronized at trace
start (error: a few µs). On the simulator it is the virtual clock, for the host
(each thread's virtual clock) and the device alike, so a program traced twice
gives the same trace. Real host durations are always kept too, in the fields
named ``wall_*``; those are the only fields that differ between two runs of
the same program on the simulator.

Thread rules: ops may be traced from any thread; :func:`start_trace` and
:func:`stop_trace` are called from one thread, not from host functions.
Blocking: :func:`stop_trace` (and leaving ``rt.trace()``) synchronizes the
device, because device times can only be read once the work has completed.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import TYPE_CHECKING, Any, Iterator

from ._trace_records import BlockingRecord, Trace, TraceRecord
from ._trace_backend import install, install_ranges, uninstall
from ._trace_labels import current_label, label
from ._tracer import Tracer

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = [
    "BlockingRecord",
    "StudySession",
    "Trace",
    "TraceRecord",
    "TraceRegion",
    "Tracer",
    "attach_on_open",
    "current_label",
    "finish_on_close",
    "label",
    "start_trace",
    "stop_trace",
    "study_session",
    "trace_region",
]

# -- switching tracing on and off ------------------------------------------------------------------------

_session_lock = threading.Lock()
_study_sessions: list[StudySession] = []  # open `streamrt study` sessions


class StudySession:
    """Traces collected while ``streamrt study`` runs a script (see :func:`study_session`).

    ``traces``: every trace finished meanwhile, in order. ``runtimes``: weak
    references to the runtimes traced because of the session, so traces still
    running when the script ends can be finished.
    """

    def __init__(self) -> None:
        self.traces: list[Trace] = []
        self.runtimes: list[weakref.ref[Runtime]] = []

    def finish_open(self) -> None:
        """Finish the traces of runtimes the script left open (their runtimes stay open)."""
        for ref in self.runtimes:
            rt = ref()
            if rt is not None and rt._tracer is not None and not rt.is_closed:
                stop_trace(rt)


def start_trace(rt: Runtime, *, name: str = "trace", clock: str = "auto") -> Tracer:
    """Switch tracing on for ``rt``. Raises ``RuntimeError`` if it is already on.

    ``clock="events"`` times device work with timing events even where the
    device has a virtual clock (the GPU method; on the simulator it mixes
    virtual device time with real host time, which is only useful to test it).
    """
    rt._check_open()
    if rt._tracer is not None:
        raise RuntimeError("tracing is already on for this runtime (one trace at a time)")
    tracer = Tracer(rt, name=name, clock=clock)
    rt._tracer = tracer
    install(rt, tracer)
    return tracer


def stop_trace(rt: Runtime) -> Trace:
    """Switch tracing off for ``rt``, wait for the device and return the finished :class:`Trace`.

    The trace is also kept as ``rt._last_trace``. Raises ``RuntimeError`` if tracing is off.
    """
    tracer = rt._tracer
    if tracer is None:
        raise RuntimeError("tracing is not on for this runtime")
    uninstall(rt)
    rt._tracer = None
    install_ranges(rt)  # STREAMRT_RANGES=1: back to ranges alone
    trace = tracer.finish()
    rt._last_trace = trace
    with _session_lock:
        for session in _study_sessions:
            session.traces.append(trace)
    return trace


class TraceRegion:
    """What ``with rt.trace() as t`` gives: the trace of the block, readable once the block is left.

    Attribute access before the end raises ``RuntimeError``; afterwards every
    :class:`Trace` attribute and method is available on it.
    """

    def __init__(self, rt: Runtime, name: str) -> None:
        self._rt = rt
        self._name = name
        self._trace: Trace | None = None

    @property
    def trace(self) -> Trace:
        if self._trace is None:
            raise RuntimeError("the trace is complete only when the `with rt.trace()` block has ended")
        return self._trace

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.trace, name)

    def __enter__(self) -> TraceRegion:
        start_trace(self._rt, name=self._name)
        return self

    def __exit__(self, *exc: object) -> None:
        self._trace = stop_trace(self._rt)

    def __repr__(self) -> str:
        return f"<TraceRegion {self._name!r} {'done' if self._trace is not None else 'running'}>"


def trace_region(rt: Runtime, *, name: str = "trace") -> TraceRegion:
    """``rt.trace()``: a context manager that traces its block; see :class:`TraceRegion`."""
    return TraceRegion(rt, name)


def attach_on_open(rt: Runtime, trace: bool | None) -> None:
    """Called by ``open_runtime``: start tracing when ``trace`` is true, or when ``trace`` is
    ``None`` and a ``streamrt study`` session is running."""
    install_ranges(rt)  # STREAMRT_RANGES=1: profiler ranges even with no trace open
    with _session_lock:
        sessions = list(_study_sessions)
    if trace or (trace is None and sessions):
        start_trace(rt, name=f"{rt.backend_name}:{rt.device}")
        for session in sessions:
            session.runtimes.append(weakref.ref(rt))


def finish_on_close(rt: Runtime) -> None:
    """Called by ``Runtime.close`` before it drains: finish a trace still running (kept as ``rt._last_trace``)."""
    if rt._tracer is not None:
        stop_trace(rt)


@contextlib.contextmanager
def study_session() -> Iterator[StudySession]:
    """Collect every trace finished while the block runs (``streamrt study``): runtimes opened
    with ``trace=None`` inside it are traced. Traces still running at the end are finished."""
    session = StudySession()
    with _session_lock:
        _study_sessions.append(session)
    try:
        yield session
    finally:
        try:
            session.finish_open()
        finally:
            with _session_lock:
                _study_sessions.remove(session)
