"""Trace records: what a finished trace holds (:class:`Trace`, :class:`TraceRecord`, :class:`BlockingRecord`).

Frozen dataclasses, built by :class:`streamrt._tracer.Tracer` when a trace ends
and read by the analyzer (:mod:`streamrt._trace_report`) and the exports
(:mod:`streamrt._trace_export`). Times are µs on the trace's one time axis
(see :mod:`streamrt._trace`); fields named ``wall_*`` are real host time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._extensions import hook

if TYPE_CHECKING:
    from ._trace_report import TraceReport

__all__ = ["BlockingRecord", "CATEGORY", "Trace", "TraceRecord", "category_of"]


#: op kind -> category. Categories: copy, memset, kernel (memset and kernel are "compute"),
#: host_function, event_wait, marker (zero-length), graph (a graph replay seen as one span).
CATEGORY = {
    "memset": "memset",
    "host_to_device": "copy",
    "device_to_host": "copy",
    "device_to_device": "copy",
    "host_to_host": "copy",
    "kernel": "kernel",
    "host_native": "host_function",
    "host_python": "host_function",
    "record": "marker",
    "wait_event": "event_wait",
    "wait_signal": "event_wait",
    "graph_launch": "graph",
    "malloc_async": "marker",
    "free_async": "marker",
}

def category_of(kind: str) -> str:
    """The category of an op kind (``"other"`` for kinds unknown to the tracer)."""
    return CATEGORY.get(kind, "other")


@dataclass(frozen=True)
class TraceRecord:
    """One traced op. Times are µs on the trace's time axis (see the module docstring).

    Attributes:
        seq: enqueue order within the trace (0, 1, ...).
        kind: ``memset``, ``host_to_device``, ``device_to_host``, ``device_to_device``,
            ``host_to_host``, ``kernel``, ``host_native``, ``host_python``, ``record``,
            ``wait_event``, ``wait_signal`` (a stream waiting for a host-written signal),
            ``graph_launch``, ...
        category: see :data:`CATEGORY`.
        stream: the stream's label (its name, or ``"stream N"`` for unnamed streams).
        nbytes: bytes moved or set (0 where it does not apply).
        pipeline, node: labels in effect when it was enqueued (see :func:`label`); without a
            node label, ``node`` is the op's own name (a kernel's), if it has one.
        op_name: the op's own name, kept whatever the labels: a kernel's name (a kernel node
            of a pipeline keeps both its node label in ``node`` and the kernel's name here),
            a ``trace_torch`` span's name; ``None`` for ops without one.
        thread: name of the enqueuing thread.
        enqueue_us, enqueue_end_us: the enqueue call, on the host.
        device_start_us, device_end_us: when the device ran it (``None``: unknown, e.g. captured).
        host_thread, host_start_us, host_end_us: for Python host functions, where and when they ran.
        event: for ``record``/``wait_event``, a small id of the event (same id = same event).
        waits_for: for ``wait_event``, the ``seq`` of the traced record it waits for.
        traced: ``False`` for ops the simulator ran that no traced call enqueued (pipeline
            internals, graph nodes); those carry the simulator's kind.
        graph_node: for a replayed graph node (simulator), its node index; else -1.
        parent: for a replayed graph node, the seq of the traced graph launch.
        error: the exception a host function raised, as text.
        wall_enqueue_us: real host time of the enqueue, µs from the trace start.
        wall_enqueue_dur_us: real duration of the enqueue call.
        wall_host_start_us, wall_host_dur_us: real run of a Python host function.
        wall_completion_latency_us: host function end -> its Completion resolved (real time).
    """

    seq: int
    kind: str
    category: str
    stream: str
    nbytes: int = 0
    pipeline: str | None = None
    node: str | None = None
    op_name: str | None = None
    thread: str = ""
    enqueue_us: float | None = None
    enqueue_end_us: float | None = None
    device_start_us: float | None = None
    device_end_us: float | None = None
    host_thread: str | None = None
    host_start_us: float | None = None
    host_end_us: float | None = None
    event: int | None = None
    waits_for: int | None = None
    traced: bool = True
    graph_node: int = -1
    parent: int | None = None
    error: str | None = None
    wall_enqueue_us: float | None = None
    wall_enqueue_dur_us: float | None = None
    wall_host_start_us: float | None = None
    wall_host_dur_us: float | None = None
    wall_completion_latency_us: float | None = None

    @property
    def name(self) -> str:
        """What to call it in a timeline: the node label, else the op's own name, else the kind."""
        return self.node or self.op_name or self.kind

    @property
    def device_us(self) -> float | None:
        """Device duration, µs (``None`` when unknown)."""
        if self.device_start_us is None or self.device_end_us is None:
            return None
        return self.device_end_us - self.device_start_us

    @property
    def on_device(self) -> bool:
        return self.device_start_us is not None and self.device_end_us is not None


@dataclass(frozen=True)
class BlockingRecord:
    """A call that blocked the host (``stream.synchronize``, ``event.synchronize``, ``runtime.synchronize``).

    ``start_us``/``end_us`` are on the trace's time axis; ``wall_*`` are real time.
    ``stream`` is the synchronized stream's label, or ``None`` (an event or the whole device).
    ``waits_for`` is the ``seq`` of the last traced op the call waited for, when known.
    """

    seq: int
    what: str
    stream: str | None
    thread: str
    start_us: float
    end_us: float
    waits_for: int | None = None
    wall_start_us: float | None = None
    wall_dur_us: float | None = None

    @property
    def blocked_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class Trace:
    """A finished trace: the records of one traced region of one runtime.

    Attributes:
        name: a title (``"trace"`` unless given).
        backend, device_name: where it ran.
        clock: ``"virtual"`` (simulator: deterministic) or ``"events"`` (GPU timing events on host time).
        records: traced ops in ``seq`` order.
        blocking: blocking calls in order.
        streams: stream labels in order of first use (the track order of exports).
        hazards: hazards the simulator's checker found during the trace (``open_runtime("sim",
            check_hazards=True)``): dicts with ``kind``, ``message`` and ``seqs`` (traced ops involved).
        notes: anything the tracer could not do (ops missing from a bounded op log, ...).
    """

    name: str
    backend: str
    device_name: str
    clock: str
    records: tuple[TraceRecord, ...]
    blocking: tuple[BlockingRecord, ...]
    streams: tuple[str, ...]
    hazards: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)

    def report(self, *, min_bubble_us: float = 5.0) -> TraceReport:
        """Analyze: host blocking, bubbles per stream with causes, copy/compute overlap, critical path."""
        return hook("analyze")(self, min_bubble_us=min_bubble_us)  # type: ignore[no-any-return]

    def to_chrome(self) -> dict[str, Any]:
        """The trace as a Chrome trace-event / Perfetto JSON object (see :mod:`streamrt._trace_export`)."""
        return hook("chrome_trace")([self])  # type: ignore[no-any-return]

    def save_chrome(self, path: Any) -> None:
        """Write :meth:`to_chrome` to ``path`` (open it in chrome://tracing or ui.perfetto.dev)."""
        hook("save_chrome")([self], path)

    def save_timeline(self, path: Any, **options: Any) -> None:
        """Draw a PNG timeline with matplotlib (``pip install 'streamrt[plot]'``)."""
        hook("save_timeline")([self], path, **options)

    def ops(self, *, stream: str | None = None, kind: str | None = None, category: str | None = None) -> list[TraceRecord]:
        """Records filtered by stream label, kind and/or category."""
        return [
            r
            for r in self.records
            if (stream is None or r.stream == stream) and (kind is None or r.kind == kind) and (category is None or r.category == category)
        ]

    @property
    def host_blocked_us(self) -> float:
        """Total time the host spent in blocking calls."""
        return sum(b.blocked_us for b in self.blocking)


