"""The trace analyzer: where the host blocked, where streams sat idle and why, overlap, critical path.

:func:`analyze` (``trace.report()``) reads a finished :class:`~streamrt._trace.Trace`
and returns a :class:`TraceReport`: ``print(report)`` shows tables,
``report.as_dict()`` is the same content as plain JSON-ready data.

Definitions (all times µs on the trace's axis):

* **work** is device work: copies, memsets, kernels (and, on a GPU, a graph
  replay seen as one span). memsets and kernels are *compute*.
* A stream's **window** runs from the start of its first work or host
  function to the end of its last op. Inside it, every interval without work
  is idle. A **bubble** is an idle interval of at least ``min_bubble_us``;
  shorter ones are counted as launch gaps.
* **Causes.** A host function's own span is a bubble caused by the host
  function (the GPU runs nothing of that stream while the stream is held).
  For a gap before an op, the op's start was held back by whichever came
  last: the previous op on the stream (then the gap is launch overhead,
  cause ``launch``), the host enqueueing the op (cause ``host``; the detail
  names a blocking call of the enqueuing thread that ended inside the gap),
  or an event the stream waited for (cause ``event``; the detail names the
  stream and op that recorded it).
* **Copy/compute overlap ratio** = time during which some copy and some
  compute ran at once (on any streams) / total time some copy ran.
* **Critical path**: walking back from the op that finished last, each op's
  binding predecessor is whichever of (previous op of its stream, the record
  its event wait waited for, the host's enqueue) was ready last; the host is
  followed back through the blocking call that preceded the enqueue. The path
  is the chain of device ops, host functions, event waits, host time and
  launch gaps that decided the end time.
* **Host blocked**: the total time spent in ``synchronize`` calls, by call.

Hazards the simulator's checker found during the trace are listed too.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ._extensions import provide

if TYPE_CHECKING:
    from ._trace import BlockingRecord, Trace, TraceRecord

__all__ = ["Bubble", "BlockingSummary", "OverlapSummary", "PathSegment", "StreamSummary", "TraceReport", "analyze"]

WORK = frozenset({"copy", "memset", "kernel", "graph", "other"})
COMPUTE = frozenset({"memset", "kernel"})
CAUSES = ("host_function", "event", "host", "launch")
_EPS = 1e-6


@dataclass(frozen=True)
class Bubble:
    """An idle interval of one stream. ``before`` is the seq of the op that ended it (or the host function)."""

    stream: str
    start_us: float
    end_us: float
    cause: str
    detail: str
    before: int

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class StreamSummary:
    """Per stream: its window, work time, host-function time, idle time and bubbles by cause."""

    stream: str
    start_us: float
    end_us: float
    busy_us: float
    idle_us: float
    bubble_us: float
    bubble_count: int
    launch_gaps_us: float
    by_cause: dict[str, float]

    @property
    def span_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class BlockingSummary:
    """Blocking calls of one kind: how many, and how long the host was blocked in them."""

    what: str
    count: int
    total_us: float
    max_us: float


@dataclass(frozen=True)
class OverlapSummary:
    """Copy and compute busy time (unions over all streams) and their overlap."""

    copy_us: float
    compute_us: float
    overlap_us: float

    @property
    def ratio(self) -> float | None:
        """overlap / copy time (``None`` when nothing was copied)."""
        return self.overlap_us / self.copy_us if self.copy_us > 0 else None


@dataclass(frozen=True)
class PathSegment:
    """One step of the critical path. ``kind``: device, host_function, event, host or launch."""

    kind: str
    label: str
    stream: str | None
    start_us: float
    end_us: float
    seq: int | None = None

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class TraceReport:
    """What :func:`analyze` found. Print it for tables; :meth:`as_dict` for machine-readable data."""

    name: str
    backend: str
    clock: str
    makespan_us: float
    host_blocked_us: float
    blocking: tuple[BlockingSummary, ...]
    streams: tuple[StreamSummary, ...]
    bubbles: tuple[Bubble, ...]
    overlap: OverlapSummary
    critical_path: tuple[PathSegment, ...]
    hazards: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    min_bubble_us: float = 5.0
    ops: int = 0
    completion_latency_us: dict[str, float] = field(default_factory=dict)

    @property
    def critical_path_us(self) -> float:
        if not self.critical_path:
            return 0.0
        return self.critical_path[-1].end_us - self.critical_path[0].start_us

    def bubbles_by_cause(self) -> dict[str, float]:
        """Total bubble time per cause, over all streams."""
        out = {c: 0.0 for c in CAUSES}
        for b in self.bubbles:
            out[b.cause] = out.get(b.cause, 0.0) + b.duration_us
        return out

    def critical_path_by_kind(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.critical_path:
            out[s.kind] = out.get(s.kind, 0.0) + s.duration_us
        return out

    def as_dict(self) -> dict[str, Any]:
        """Everything in the report as JSON-ready data (lists, dicts, numbers, strings)."""
        d = asdict(self)
        d["critical_path_us"] = self.critical_path_us
        d["overlap"]["ratio"] = self.overlap.ratio
        d["bubbles_by_cause"] = self.bubbles_by_cause()
        d["critical_path_by_kind"] = self.critical_path_by_kind()
        for b, src in zip(d["bubbles"], self.bubbles):
            b["duration_us"] = src.duration_us
        return d

    def __str__(self) -> str:
        lines = [
            f"trace {self.name!r} on {self.backend} ({'virtual clock' if self.clock == 'virtual' else 'GPU timing events'}): "
            f"{self.ops} ops, makespan {self.makespan_us:.1f} us"
        ]
        lines += ["", f"host blocked: {self.host_blocked_us:.1f} us"]
        if self.blocking:
            lines += _table(
                ["call", "count", "total us", "max us"],
                [[b.what, b.count, f"{b.total_us:.1f}", f"{b.max_us:.1f}"] for b in self.blocking],
            )
        lines += ["", f"streams (bubbles: idle >= {self.min_bubble_us:g} us)"]
        lines += _table(
            ["stream", "span us", "busy us", "idle us", "bubbles", "bubble us", *[f"{c} us" for c in CAUSES]],
            [
                [s.stream, f"{s.span_us:.1f}", f"{s.busy_us:.1f}", f"{s.idle_us:.1f}", s.bubble_count, f"{s.bubble_us:.1f}"]
                + [f"{s.by_cause.get(c, 0.0):.1f}" for c in CAUSES]
                for s in self.streams
            ],
        )
        if self.bubbles:
            lines += ["", "largest bubbles"]
            top = sorted(self.bubbles, key=lambda b: (-b.duration_us, b.start_us))[:10]
            lines += _table(
                ["stream", "start us", "us", "cause", "detail"],
                [[b.stream, f"{b.start_us:.1f}", f"{b.duration_us:.1f}", b.cause, b.detail] for b in top],
            )
        ov = self.overlap
        ratio = "n/a (no copies)" if ov.ratio is None else f"{ov.ratio:.0%}"
        lines += [
            "",
            f"copy/compute overlap: {ratio} (copy {ov.copy_us:.1f} us, compute {ov.compute_us:.1f} us, both at once {ov.overlap_us:.1f} us)",
        ]
        if self.completion_latency_us:
            c = self.completion_latency_us
            lines.append(
                f"host function -> Completion resolved (real time): median {c['median']:.1f} us, max {c['max']:.1f} us over {int(c['count'])}"
            )
        lines += ["", f"critical path: {self.critical_path_us:.1f} us"]
        by_kind = self.critical_path_by_kind()
        if by_kind:
            lines.append("  " + ", ".join(f"{k} {v:.1f} us" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])))
            shown: list[PathSegment | None] = [s for s in self.critical_path if s.duration_us > 0]
            if len(shown) > 12:
                shown = shown[:6] + [None] + shown[-5:]
            rows = []
            for s in shown:
                if s is None:
                    rows.append(["...", "", "", "", ""])
                else:
                    rows.append([f"{s.start_us:.1f}", f"{s.duration_us:.1f}", s.kind, s.stream or "host", s.label])
            lines += _table(["start us", "us", "kind", "where", "what"], rows)
        if self.hazards:
            lines += ["", f"hazards found by the simulator: {len(self.hazards)}"]
            lines += [f"  {h['kind']}: {h['message']}" for h in self.hazards[:10]]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = lambda cells: "  " + "  ".join(c.ljust(w) if i == 0 or i == len(cells) - 1 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return [fmt(list(header)).rstrip(), *(fmt(r).rstrip() for r in rows)]


# -- interval helpers --------------------------------------------------------------------------------


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def _length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _intersect(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out = []
    i = j = 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if b > a:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


# -- the analysis -----------------------------------------------------------------------------------------


def _timeline_records(trace: Trace) -> list[TraceRecord]:
    """Records with device times that stand for themselves (a graph launch with simulated nodes is
    represented by its nodes)."""
    parents = {r.parent for r in trace.records if r.parent is not None}
    return [r for r in trace.records if r.on_device and r.seq not in parents]


def _s(r: TraceRecord) -> float:
    """Device start of a timeline record (they all have device times)."""
    assert r.device_start_us is not None
    return r.device_start_us


def _e(r: TraceRecord) -> float:
    assert r.device_end_us is not None
    return r.device_end_us


def _describe(r: TraceRecord) -> str:
    where = f"{r.pipeline}/" if r.pipeline else ""
    return f"{where}{r.name}"


def analyze(trace: Trace, *, min_bubble_us: float = 5.0) -> TraceReport:
    """Analyze ``trace``; see the module docstring for the definitions."""
    if min_bubble_us < 0:
        raise ValueError(f"min_bubble_us must be >= 0, got {min_bubble_us}")
    recs = _timeline_records(trace)
    by_seq = {r.seq: r for r in trace.records}
    per_stream: dict[str, list[TraceRecord]] = {}
    for r in recs:
        per_stream.setdefault(r.stream, []).append(r)
    for items in per_stream.values():
        items.sort(key=lambda r: (_s(r), r.seq))

    blocks_by_thread: dict[str, list[BlockingRecord]] = {}
    for b in trace.blocking:
        blocks_by_thread.setdefault(b.thread, []).append(b)

    bubbles: list[Bubble] = []
    summaries: list[StreamSummary] = []
    order = [s for s in trace.streams if s in per_stream] + [s for s in per_stream if s not in trace.streams]
    for stream in order:
        items = per_stream[stream]
        s_bubbles, summary = _stream_bubbles(stream, items, by_seq, blocks_by_thread, min_bubble_us)
        bubbles += s_bubbles
        summaries.append(summary)

    copy_u = _union((_s(r), _e(r)) for r in recs if r.category == "copy")
    comp_u = _union((_s(r), _e(r)) for r in recs if r.category in COMPUTE)
    overlap = OverlapSummary(round(_length(copy_u), 3), round(_length(comp_u), 3), round(_length(_intersect(copy_u, comp_u)), 3))

    blocking: dict[str, list[float]] = {}
    for b in trace.blocking:
        blocking.setdefault(b.what, []).append(b.blocked_us)
    bsum = tuple(BlockingSummary(w, len(v), round(sum(v), 3), round(max(v), 3)) for w, v in blocking.items())

    makespan = (max(_e(r) for r in recs) - min(_s(r) for r in recs)) if recs else 0.0

    lat = sorted(r.wall_completion_latency_us for r in trace.records if r.wall_completion_latency_us is not None)
    latency = {}
    if lat:
        latency = {"count": float(len(lat)), "median": lat[len(lat) // 2], "max": lat[-1]}

    return TraceReport(
        name=trace.name,
        backend=trace.backend,
        clock=trace.clock,
        makespan_us=round(makespan, 3),
        host_blocked_us=round(sum(b.blocked_us for b in trace.blocking), 3),
        blocking=bsum,
        streams=tuple(summaries),
        bubbles=tuple(sorted(bubbles, key=lambda b: (b.start_us, b.stream))),
        overlap=overlap,
        critical_path=tuple(_critical_path(trace, recs, per_stream, by_seq, blocks_by_thread)),
        hazards=trace.hazards,
        notes=trace.notes,
        min_bubble_us=min_bubble_us,
        ops=sum(1 for r in trace.records if r.traced),
        completion_latency_us=latency,
    )


def _stream_bubbles(
    stream: str,
    items: list[TraceRecord],
    by_seq: dict[int, TraceRecord],
    blocks_by_thread: dict[str, list[BlockingRecord]],
    min_bubble_us: float,
) -> tuple[list[Bubble], StreamSummary]:
    active = [r for r in items if r.category in WORK or r.category == "host_function"]
    waits = [r for r in items if r.category == "event_wait"]
    if not active:
        return [], StreamSummary(stream, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0.0, {c: 0.0 for c in CAUSES})
    w0 = min(_s(r) for r in active)
    w1 = max(_e(r) for r in items)
    busy = _union((_s(r), _e(r)) for r in active if r.category in WORK)
    busy_us = _length(busy)
    out: list[Bubble] = []
    launch_gaps = 0.0

    def add(a: float, b: float, cause: str, detail: str, before: int) -> None:
        nonlocal launch_gaps
        if b - a <= _EPS:
            return
        if b - a < min_bubble_us:
            launch_gaps += b - a
            return
        out.append(Bubble(stream, round(a, 3), round(b, 3), cause, detail, before))

    cursor = w0
    prev: TraceRecord | None = None
    for r in active:
        start, end = _s(r), _e(r)
        if start > cursor + _EPS:
            cause, detail = _gap_cause(cursor, r, prev, waits, by_seq, blocks_by_thread)
            add(cursor, start, cause, detail, r.seq)
        if r.category == "host_function":
            a = max(start, cursor)
            add(a, end, "host_function", f"host function {_describe(r)!s}", r.seq)
        if end > cursor:
            cursor = end
            prev = r
    # Idle time inside the window (host functions count as idle: no device work runs).
    idle = max(0.0, (w1 - w0) - busy_us)
    by_cause = {c: 0.0 for c in CAUSES}
    for b in out:
        by_cause[b.cause] = round(by_cause.get(b.cause, 0.0) + b.duration_us, 3)
    summary = StreamSummary(
        stream,
        round(w0, 3),
        round(w1, 3),
        round(busy_us, 3),
        round(idle, 3),
        round(sum(b.duration_us for b in out), 3),
        len(out),
        round(launch_gaps, 3),
        by_cause,
    )
    return out, summary


def _gap_cause(
    gap_start: float,
    nxt: TraceRecord,
    prev: TraceRecord | None,
    waits: list[TraceRecord],
    by_seq: dict[int, TraceRecord],
    blocks_by_thread: dict[str, list[BlockingRecord]],
) -> tuple[str, str]:
    """Why ``nxt`` started only at its start: the host, an event, or nothing but launch overhead."""
    host_ready = nxt.enqueue_end_us if nxt.enqueue_end_us is not None else float("-inf")
    lo_seq = prev.seq if prev is not None else -1
    event_ready = float("-inf")
    event_wait: TraceRecord | None = None
    for w in waits:
        if lo_seq < w.seq < nxt.seq and w.device_end_us is not None and w.device_end_us > event_ready:
            event_ready, event_wait = w.device_end_us, w
    if max(host_ready, event_ready) <= gap_start + _EPS:
        return "launch", "launch / scheduling gap"
    if event_ready >= host_ready and event_wait is not None:
        rec = by_seq.get(event_wait.waits_for) if event_wait.waits_for is not None else None
        if rec is not None:
            return "event", f"waiting for an event recorded on {rec.stream} after {_preceding_name(rec, by_seq)}"
        return "event", "waiting for an event"
    detail = f"the host enqueued {_describe(nxt)} only at {host_ready:.1f} us"
    for b in blocks_by_thread.get(nxt.thread, ()):
        if gap_start - _EPS <= b.end_us <= host_ready + _EPS:
            detail = f"the host was blocked in {b.what} ({b.blocked_us:.1f} us) and enqueued {_describe(nxt)} at {host_ready:.1f} us"
    return "host", detail


def _preceding_name(rec: TraceRecord, by_seq: dict[int, TraceRecord]) -> str:
    """The name of the last op before ``rec`` on its stream (what the recorded event marks)."""
    best: TraceRecord | None = None
    for r in by_seq.values():
        if r.stream == rec.stream and r.seq < rec.seq and r.category not in ("marker", "event_wait") and r.traced:
            if best is None or r.seq > best.seq:
                best = r
    return _describe(best) if best is not None else "the start of the trace"


def _critical_path(
    trace: Trace,
    recs: list[TraceRecord],
    per_stream: dict[str, list[TraceRecord]],
    by_seq: dict[int, TraceRecord],
    blocks_by_thread: dict[str, list[BlockingRecord]],
) -> list[PathSegment]:
    if not recs:
        return []
    # Stream order: by start time, then seq.
    prev_on_stream: dict[int, TraceRecord | None] = {}
    for items in per_stream.values():
        last: TraceRecord | None = None
        for r in items:
            prev_on_stream[r.seq] = last
            if last is None or (r.device_end_us or 0.0) >= (last.device_end_us or 0.0):
                last = r
    block_ends = {t: sorted(bs, key=lambda b: b.end_us) for t, bs in blocks_by_thread.items()}
    cur: TraceRecord | None = max(recs, key=lambda r: (_e(r), r.seq))
    segments: list[PathSegment] = []
    seen: set[int] = set()
    while cur is not None and cur.seq not in seen:
        seen.add(cur.seq)
        start, end = _s(cur), _e(cur)
        kind = {"host_function": "host_function", "event_wait": "event", "marker": "device"}.get(cur.category, "device")
        if end > start or cur.category not in ("marker",):
            segments.append(PathSegment(kind, _describe(cur), cur.stream, start, end, cur.seq))
        cands: list[tuple[float, str, TraceRecord | None]] = []
        p = prev_on_stream.get(cur.seq)
        if p is not None and p.device_end_us is not None:
            cands.append((p.device_end_us, "stream", p))
        if cur.category == "event_wait" and cur.waits_for is not None:
            rec = by_seq.get(cur.waits_for)
            if rec is not None and rec.device_end_us is not None:
                cands.append((rec.device_end_us, "event", rec))
        if cur.enqueue_end_us is not None and cur.traced:
            cands.append((cur.enqueue_end_us, "host", None))
        if not cands:
            break
        ready, how, pred = max(cands, key=lambda c: (c[0], c[1] != "host"))
        if start > ready + _EPS:
            segments.append(PathSegment("launch", "launch gap", cur.stream, ready, start))
        if how != "host":
            cur = pred
            continue
        # The host was last: follow it back through the blocking call before the enqueue.
        anchor: BlockingRecord | None = None
        bs = block_ends.get(cur.thread, [])
        i = bisect.bisect_right([b.end_us for b in bs], (cur.enqueue_us or ready) + _EPS)
        if i:
            anchor = bs[i - 1]
        waited = by_seq.get(anchor.waits_for) if anchor is not None and anchor.waits_for is not None else None
        if waited is None and anchor is not None:
            # runtime/event synchronize: assume it waited for whatever ended last before it returned
            done = [r for r in recs if r.device_end_us is not None and r.device_end_us <= anchor.end_us + _EPS]
            waited = max(done, key=lambda r: (_e(r), r.seq)) if done else None
        if anchor is not None and waited is not None and waited.device_end_us is not None and waited.device_end_us < ready:
            label = f"host: blocked in {anchor.what}, then enqueued {_describe(cur)}"
            segments.append(PathSegment("host", label, None, waited.device_end_us, ready))
            cur = waited
            continue
        first = min((r.enqueue_us for r in recs if r.enqueue_us is not None), default=ready)
        if ready > first:
            segments.append(PathSegment("host", f"host: enqueueing up to {_describe(cur)}", None, first, ready))
        break
    segments.reverse()
    return [PathSegment(s.kind, s.label, s.stream, round(s.start_us, 3), round(s.end_us, 3), s.seq) for s in segments]


provide("analyze", analyze)  # Trace.report
