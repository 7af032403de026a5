"""Trace exports: Chrome trace-event / Perfetto JSON, and a PNG timeline (matplotlib).

JSON layout (:func:`chrome_trace`): the Chrome trace-event format's JSON object
form, ``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``,
which chrome://tracing and ui.perfetto.dev open. For trace ``k`` (several
traces, e.g. one per strategy, go side by side in one file):

* process ``2k+1`` is the device: one thread track per stream (``tid`` 1, 2, ...
  in order of first use), plus a ``"<stream> (concurrent n)"`` track when ops of
  one stream overlap (graph nodes), plus a ``"<stream> bubbles"`` track with the
  analyzer's bubbles and their causes;
* process ``2k+2`` is the host: one track per enqueuing thread (enqueue spans
  and blocking calls) and one per stream's host-function worker (when each
  Python host function ran).

Device ops are complete events (``ph: "X"``, ``ts``/``dur`` in µs); zero-length
markers (event records) are instant events (``ph: "i"``).

Arrows (flow events, ``ph: "s"`` then ``ph: "f"`` with ``bp: "e"``, one ``id``
per arrow, unique in the file): ``enqueue`` from each traced op's enqueue on
the host to the op on the device, and ``record → wait`` from an event record
to the wait on another stream that it satisfied. Each end's ``ts`` is the
middle of the slice it binds to.
Counter tracks (``ph: "C"``): ``pinned staging bytes in flight`` on the host
(bytes of host↔device copies enqueued and not yet finished on the device:
pinned memory the device still reads or writes) and ``queue depth: <stream>``
on the device (ops enqueued on the stream and not yet finished; graph nodes
count as their launch). Each counter's samples are in time order, one per
instant at which it changes. ``args`` carry
``seq`` (the same number on the device and the host side of one op), kind,
bytes, labels (``pipeline``, ``node``) and the op's own name (``op_name``: a
kernel's name, also under a node label). Values measured in real time are in ``args`` keys starting with
``wall_`` and only on host events; everything else on the simulator comes from
its virtual clock, so the same program gives byte-identical JSON apart from
those keys. Events are written one per line, sorted, with stable key order.

The PNG (:func:`save_timeline`) needs matplotlib (``pip install 'streamrt[plot]'``);
it is imported only when a timeline is drawn, and pyplot's global state is not
touched (the figure is rendered with the Agg canvas).
"""

from __future__ import annotations

import itertools
import json
import os
from typing import TYPE_CHECKING, Any, Iterator, Sequence, Union

from ._extensions import provide
from ._version import __version__

if TYPE_CHECKING:
    from ._trace import Trace, TraceRecord

__all__ = ["chrome_trace", "chrome_trace_json", "save_chrome", "save_timeline", "TIMELINE_COLORS"]

PathLike = Union[str, "os.PathLike[str]"]

TIMELINE_COLORS = {
    "copy": "#4C72B0",
    "memset": "#55A868",
    "kernel": "#8172B2",
    "graph": "#64B5CD",
    "host_function": "#C44E52",
    "event_wait": "#CCB974",
    "other": "#937860",
    "enqueue": "#8C8C8C",
    "blocking": "#DD8452",
}
BUBBLE_COLORS = {"host_function": "#C44E52", "event": "#CCB974", "host": "#DD8452", "launch": "#BBBBBB"}


def _r(v: float) -> float:
    return round(float(v), 3)


def _as_list(traces: Trace | Sequence[Trace]) -> list[Trace]:
    from ._trace import Trace

    if isinstance(traces, Trace):
        return [traces]
    out = list(traces)
    for t in out:
        if not isinstance(t, Trace):
            raise TypeError(f"expected Trace objects, got {type(t).__name__}")
    return out


def _device_args(r: TraceRecord) -> dict[str, Any]:
    args: dict[str, Any] = {"seq": r.seq, "kind": r.kind, "stream": r.stream}
    if r.nbytes:
        args["bytes"] = r.nbytes
        dur = r.device_us
        if r.category == "copy" and dur:
            args["GB/s"] = round(r.nbytes / (dur * 1e3), 3)
    if r.pipeline:
        args["pipeline"] = r.pipeline
    if r.node:
        args["node"] = r.node
    if r.op_name:
        args["op_name"] = r.op_name
    if r.event is not None:
        args["event"] = r.event
    if r.waits_for is not None:
        args["waits_for_seq"] = r.waits_for
    if not r.traced:
        args["traced"] = False
    if r.graph_node >= 0:
        args["graph_node"] = r.graph_node
    if r.parent is not None:
        args["graph_launch_seq"] = r.parent
    if r.error:
        args["error"] = r.error
    return args


def _lanes(events: list[tuple[float, float, int]]) -> dict[int, int]:
    """Lane per event (start, end, key): lane 0 unless it overlaps without nesting."""
    lanes: list[list[tuple[float, float]]] = []
    out: dict[int, int] = {}
    for start, end, key in sorted(events, key=lambda e: (e[0], -(e[1] - e[0]), e[2])):
        for i, stack in enumerate(lanes):
            while stack and stack[-1][1] <= start + 1e-9:
                stack.pop()
            if not stack or end <= stack[-1][1] + 1e-9:
                stack.append((start, end))
                out[key] = i
                break
        else:
            lanes.append([(start, end)])
            out[key] = len(lanes) - 1
    return out


def chrome_trace(traces: Trace | Sequence[Trace], *, bubbles: bool = True) -> dict[str, Any]:
    """The Chrome trace-event JSON object for one or several traces (see the module docstring)."""
    events: list[dict[str, Any]] = []
    other: list[dict[str, Any]] = []
    flow_ids = itertools.count(1)
    for k, t in enumerate(_as_list(traces)):
        dev_pid, host_pid = 2 * k + 1, 2 * k + 2
        prefix = f"{t.name}: " if len(_as_list(traces)) > 1 or t.name != "trace" else ""
        events.append(_meta(dev_pid, 0, "process_name", {"name": f"{prefix}device {t.meta.get('device', 0)}: {t.device_name} ({t.backend})"}))
        events.append(_meta(dev_pid, 0, "process_sort_index", {"sort_index": 2 * k}))
        events.append(_meta(host_pid, 0, "process_name", {"name": f"{prefix}host"}))
        events.append(_meta(host_pid, 0, "process_sort_index", {"sort_index": 2 * k + 1}))

        # -- device tracks ---------------------------------------------------------------------
        tids: dict[str, int] = {}
        for name in t.streams:
            tids[name] = len(tids) + 1
        on_device = [r for r in t.records if r.on_device]
        by_stream: dict[str, list[TraceRecord]] = {}
        for r in on_device:
            by_stream.setdefault(r.stream, []).append(r)
            if r.stream not in tids:
                tids[r.stream] = len(tids) + 1
        extra_tid = len(tids) + 1
        lane_tids: dict[tuple[str, int], int] = {}
        dev_tid: dict[int, int] = {}  # seq -> the device track its op is drawn on
        for stream in tids:
            recs = by_stream.get(stream, [])
            spans = [r for r in recs if (r.device_end_us or 0) > (r.device_start_us or 0)]
            lanes = _lanes([(r.device_start_us, r.device_end_us, r.seq) for r in spans])  # type: ignore[misc]
            for r in recs:
                lane = lanes.get(r.seq, 0)
                if lane == 0:
                    tid = tids[stream]
                else:
                    if (stream, lane) not in lane_tids:
                        lane_tids[(stream, lane)] = extra_tid
                        extra_tid += 1
                    tid = lane_tids[(stream, lane)]
                dev_tid[r.seq] = tid
                ev: dict[str, Any] = {
                    "name": r.name,
                    "cat": r.category,
                    "pid": dev_pid,
                    "tid": tid,
                    "ts": _r(r.device_start_us),  # type: ignore[arg-type]
                    "args": _device_args(r),
                }
                dur = _r(r.device_end_us - r.device_start_us)  # type: ignore[operator]
                if dur > 0:
                    ev["ph"] = "X"
                    ev["dur"] = dur
                else:
                    ev["ph"] = "i"
                    ev["s"] = "t"
                events.append(ev)
        for stream, tid in tids.items():
            events.append(_meta(dev_pid, tid, "thread_name", {"name": stream}))
            events.append(_meta(dev_pid, tid, "thread_sort_index", {"sort_index": tid}))
        for (stream, lane), tid in lane_tids.items():
            events.append(_meta(dev_pid, tid, "thread_name", {"name": f"{stream} (concurrent {lane + 1})"}))
            events.append(_meta(dev_pid, tid, "thread_sort_index", {"sort_index": tids[stream] * 1000 + lane}))
        report = t.report() if bubbles else None
        if report is not None:
            btids: dict[str, int] = {}
            for b in report.bubbles:
                if b.stream not in btids:
                    btids[b.stream] = extra_tid
                    extra_tid += 1
                events.append(
                    {
                        "name": b.cause,
                        "cat": "bubble",
                        "ph": "X",
                        "pid": dev_pid,
                        "tid": btids[b.stream],
                        "ts": _r(b.start_us),
                        "dur": _r(b.duration_us),
                        "args": {"cause": b.cause, "detail": b.detail, "before_seq": b.before},
                    }
                )
            for stream, tid in btids.items():
                events.append(_meta(dev_pid, tid, "thread_name", {"name": f"{stream} bubbles"}))
                events.append(_meta(dev_pid, tid, "thread_sort_index", {"sort_index": tids.get(stream, 0) * 1000 + 999}))
        for h in t.hazards:
            seqs = h.get("seqs") or []
            at = [t.records[s].device_start_us for s in seqs if s < len(t.records) and t.records[s].device_start_us is not None]
            events.append(
                {
                    "name": f"hazard: {h['kind']}",
                    "cat": "hazard",
                    "ph": "i",
                    "s": "p",
                    "pid": dev_pid,
                    "tid": 0,
                    "ts": _r(max(at) if at else 0.0),
                    "args": {"message": h["message"], "seqs": list(seqs)},
                }
            )

        # -- host tracks ----------------------------------------------------------------------------
        host_tids: dict[str, int] = {}

        def htid(name: str, tids: dict[str, int] = host_tids) -> int:
            if name not in tids:
                tids[name] = len(tids) + 1
            return tids[name]

        host_events: list[tuple[int, dict[str, Any]]] = []
        enqueue_tid: dict[int, int] = {}  # seq -> the host track of its enqueue
        for r in t.records:
            if not r.traced or r.enqueue_us is None:
                continue
            enqueue_tid[r.seq] = htid(r.thread)
            args: dict[str, Any] = {"seq": r.seq, "stream": r.stream}
            if r.wall_enqueue_us is not None:
                args["wall_enqueue_us"] = r.wall_enqueue_us
                args["wall_enqueue_dur_us"] = r.wall_enqueue_dur_us
            host_events.append(
                (
                    r.seq,
                    {
                        "name": f"enqueue {r.name}",
                        "cat": "enqueue",
                        "ph": "X",
                        "pid": host_pid,
                        "tid": htid(r.thread),
                        "ts": _r(r.enqueue_us),
                        "dur": _r((r.enqueue_end_us or r.enqueue_us) - r.enqueue_us),
                        "args": args,
                    },
                )
            )
        for blk in t.blocking:
            args = {"seq": blk.seq}
            if blk.stream is not None:
                args["stream"] = blk.stream
            if blk.waits_for is not None:
                args["waits_for_seq"] = blk.waits_for
            args["wall_start_us"] = blk.wall_start_us
            args["wall_dur_us"] = blk.wall_dur_us
            host_events.append(
                (
                    blk.seq,
                    {
                        "name": blk.what,
                        "cat": "blocking",
                        "ph": "X",
                        "pid": host_pid,
                        "tid": htid(blk.thread),
                        "ts": _r(blk.start_us),
                        "dur": _r(blk.blocked_us),
                        "args": args,
                    },
                )
            )
        for r in t.records:
            if r.host_start_us is None or r.host_end_us is None:
                continue
            args = {"seq": r.seq, "stream": r.stream}
            if r.error:
                args["error"] = r.error
            for key in ("wall_host_start_us", "wall_host_dur_us", "wall_completion_latency_us"):
                if getattr(r, key) is not None:
                    args[key] = getattr(r, key)
            host_events.append(
                (
                    r.seq,
                    {
                        "name": r.name,
                        "cat": "host_function",
                        "ph": "X",
                        "pid": host_pid,
                        "tid": htid(f"host functions of {r.stream}"),
                        "ts": _r(r.host_start_us),
                        "dur": _r(r.host_end_us - r.host_start_us),
                        "args": args,
                    },
                )
            )
        events += [e for _, e in sorted(host_events, key=lambda x: (x[1]["tid"], x[1]["ts"], x[0]))]
        for name, tid in host_tids.items():
            events.append(_meta(host_pid, tid, "thread_name", {"name": name}))
            events.append(_meta(host_pid, tid, "thread_sort_index", {"sort_index": tid}))
        events += _flows(t, dev_pid, host_pid, dev_tid, enqueue_tid, flow_ids)
        events += _counters(t, dev_pid, host_pid)
        other.append(
            {
                "name": t.name,
                "backend": t.backend,
                "device_name": t.device_name,
                "clock": t.clock,
                "device_pid": dev_pid,
                "host_pid": host_pid,
                "notes": list(t.notes),
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": f"streamrt {__version__}", "time_unit": "us", "traces": other},
    }


def _flow_pair(name: str, fid: int, src: tuple[int, int, float], dst: tuple[int, int, float]) -> list[dict[str, Any]]:
    """A flow arrow from ``src`` to ``dst`` (each ``(pid, tid, ts)``, ``ts`` inside the slice it binds to)."""
    (spid, stid, sts), (dpid, dtid, dts) = src, dst
    return [
        {"name": name, "cat": "flow", "ph": "s", "id": fid, "pid": spid, "tid": stid, "ts": _r(sts)},
        {"name": name, "cat": "flow", "ph": "f", "bp": "e", "id": fid, "pid": dpid, "tid": dtid, "ts": _r(dts)},
    ]


def _mid(start: float, end: float | None) -> float:
    """The middle of a slice: where a flow end binds to it and to nothing that merely touches it."""
    return start if end is None else (start + max(start, end)) / 2


def _flows(
    t: Trace,
    dev_pid: int,
    host_pid: int,
    dev_tid: dict[int, int],
    enqueue_tid: dict[int, int],
    ids: Iterator[int],
) -> list[dict[str, Any]]:
    """Arrows: host enqueue -> device op, and event record -> the wait on another stream it satisfied."""
    out: list[dict[str, Any]] = []
    by_seq = {r.seq: r for r in t.records}
    for r in t.records:
        if r.seq not in enqueue_tid or r.seq not in dev_tid or r.enqueue_us is None or r.device_start_us is None:
            continue
        host = (host_pid, enqueue_tid[r.seq], _mid(r.enqueue_us, r.enqueue_end_us))
        out += _flow_pair("enqueue", next(ids), host, (dev_pid, dev_tid[r.seq], _mid(r.device_start_us, r.device_end_us)))
    for r in t.records:
        rec = by_seq.get(r.waits_for) if r.kind == "wait_event" and r.waits_for is not None else None
        if rec is None or rec.stream == r.stream or r.seq not in dev_tid or rec.seq not in dev_tid:
            continue
        assert rec.device_start_us is not None and r.device_start_us is not None  # both drawn on the device
        src = (dev_pid, dev_tid[rec.seq], _mid(rec.device_start_us, rec.device_end_us))
        dst = (dev_pid, dev_tid[r.seq], _mid(r.device_start_us, r.device_end_us))
        out += _flow_pair("record → wait", next(ids), src, dst)
    return out


def _counter_track(name: str, pid: int, key: str, deltas: list[tuple[float, int]]) -> list[dict[str, Any]]:
    """Samples of a counter from ``(time, change)`` pairs: one per time at which the value changes, in order."""
    changes: dict[float, int] = {}
    for at, change in deltas:
        changes[_r(at)] = changes.get(_r(at), 0) + change
    out: list[dict[str, Any]] = []
    value = 0
    for ts in sorted(changes):
        if changes[ts]:
            value += changes[ts]
            out.append({"name": name, "cat": "counter", "ph": "C", "pid": pid, "tid": 0, "ts": ts, "args": {key: value}})
    return out


def _counters(t: Trace, dev_pid: int, host_pid: int) -> list[dict[str, Any]]:
    """Counter tracks: pinned staging bytes in flight (host) and each stream's queue depth (device)."""
    staging: list[tuple[float, int]] = []
    depth: dict[str, list[tuple[float, int]]] = {}
    for r in t.records:
        if r.enqueue_us is None or r.device_end_us is None or r.graph_node >= 0:
            continue
        end = max(r.device_end_us, r.enqueue_us)
        depth.setdefault(r.stream, []).extend(((r.enqueue_us, 1), (end, -1)))
        if r.kind in ("host_to_device", "device_to_host") and r.nbytes:
            staging.extend(((r.enqueue_us, r.nbytes), (end, -r.nbytes)))
    out = _counter_track("pinned staging bytes in flight", host_pid, "bytes", staging) if staging else []
    for stream in sorted(depth, key=lambda name: t.streams.index(name) if name in t.streams else len(t.streams)):
        out += _counter_track(f"queue depth: {stream}", dev_pid, "ops", depth[stream])
    return out


def _meta(pid: int, tid: int, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def chrome_trace_json(traces: Trace | Sequence[Trace], **options: Any) -> str:
    """:func:`chrome_trace` as text: one event per line, stable key order (diff-friendly)."""
    obj = chrome_trace(traces, **options)
    lines = ",\n".join(json.dumps(e, sort_keys=True, separators=(",", ":")) for e in obj["traceEvents"])
    rest = json.dumps({k: v for k, v in obj.items() if k != "traceEvents"}, sort_keys=True, separators=(",", ":"))
    return '{"traceEvents":[\n' + lines + "\n]," + rest[1:] + "\n"


def save_chrome(traces: Trace | Sequence[Trace], path: PathLike, **options: Any) -> None:
    """Write :func:`chrome_trace_json` to ``path``."""
    text = chrome_trace_json(traces, **options)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


# -- PNG timeline --------------------------------------------------------------------------------------------


def _import_matplotlib() -> tuple[Any, Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise ImportError("timeline PNGs need matplotlib: pip install 'streamrt[plot]'") from exc
    return Figure, FigureCanvasAgg, Patch


def save_timeline(
    traces: Trace | Sequence[Trace],
    path: PathLike,
    *,
    width_in: float = 12.0,
    dpi: int = 100,
    bubbles: bool = True,
    title: str | None = None,
) -> None:
    """Draw the traces as a PNG timeline: one panel per trace, one row per stream and host thread.

    Device ops are bars colored by category; bubbles (idle gaps with a cause)
    are hatched under each stream's bars; the host rows show enqueue calls,
    blocking calls and when Python host functions ran. Panels share the time
    axis (µs), so strategies can be compared by eye. Raises ``ImportError``
    without matplotlib.
    """
    Figure, FigureCanvasAgg, Patch = _import_matplotlib()
    tlist = _as_list(traces)
    if not tlist:
        raise ValueError("no traces to draw")
    rows_per = []
    for t in tlist:
        host_rows = _host_rows(t)
        rows_per.append((list(t.streams), host_rows))
    heights = [max(1, len(s) + len(h)) for s, h in rows_per]
    fig_h = sum(0.32 * n + 0.55 for n in heights) + 0.9
    fig = Figure(figsize=(width_in, fig_h), dpi=dpi)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(tlist), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    xmax = 0.0
    for ax, t, (streams, host_rows) in zip(axes, tlist, rows_per):
        labels = [f"{s}" for s in streams] + [f"host: {h}" for h in host_rows]
        y = {name: i for i, name in enumerate(labels)}
        report = t.report() if bubbles else None
        if report is not None:
            for b in report.bubbles:
                row = y.get(b.stream)
                if row is None:
                    continue
                ax.broken_barh(
                    [(b.start_us, b.duration_us)], (row - 0.42, 0.84), facecolors="none",
                    edgecolors=BUBBLE_COLORS.get(b.cause, "#BBBBBB"), hatch="////", linewidth=0.0,
                )  # fmt: skip
        for r in t.records:
            if not r.on_device:
                continue
            row = y.get(r.stream)
            if row is None:
                continue
            start, dur = r.device_start_us, r.device_us
            assert start is not None and dur is not None
            xmax = max(xmax, start + dur)
            if dur <= 0:
                if not r.traced:
                    continue  # the runtime's own event records: bookkeeping, not drawn
                ax.plot([start, start], [row - 0.4, row + 0.4], color="#333333", linewidth=0.6)
                continue
            ax.broken_barh([(start, dur)], (row - 0.35, 0.7), facecolors=TIMELINE_COLORS.get(r.category, "#937860"), edgecolors="white", linewidth=0.3)
        for name, spans in _host_spans(t).items():
            row = y.get(f"host: {name}")
            if row is None:
                continue
            for start, dur, cat in spans:
                xmax = max(xmax, start + dur)
                h = 0.3 if cat == "enqueue" else 0.7
                ax.broken_barh([(start, max(dur, 0.0))], (row - h / 2, h), facecolors=TIMELINE_COLORS[cat], linewidth=0)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=7)
        ax.set_ylim(len(labels) - 0.5, -0.5)
        ax.grid(axis="x", color="#DDDDDD", linewidth=0.5)
        ax.set_axisbelow(True)
        ax.set_title(f"{t.name} ({t.backend}, {'virtual' if t.clock == 'virtual' else 'measured'} time)", fontsize=8, loc="left")
        ax.tick_params(axis="x", labelsize=7)
    axes[-1].set_xlim(0, xmax * 1.01 if xmax > 0 else 1.0)
    axes[-1].set_xlabel("time (µs)", fontsize=8)
    handles = [Patch(color=TIMELINE_COLORS[k], label=k.replace("_", " ")) for k in ("copy", "memset", "kernel", "host_function", "blocking", "enqueue")]
    if bubbles:
        handles += [Patch(facecolor="none", edgecolor=BUBBLE_COLORS[c], hatch="////", label=f"bubble: {c.replace('_', ' ')}") for c in ("host_function", "event", "host")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=6.5, frameon=False)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.045, 1, 0.97 if title else 1))
    fig.savefig(path, format="png", dpi=dpi)


def _host_rows(t: Trace) -> list[str]:
    rows: list[str] = []
    for name in _host_spans(t):
        rows.append(name)
    return rows


def _host_spans(t: Trace) -> dict[str, list[tuple[float, float, str]]]:
    out: dict[str, list[tuple[float, float, str]]] = {}
    for r in t.records:
        if r.traced and r.enqueue_us is not None:
            out.setdefault(r.thread, []).append((r.enqueue_us, (r.enqueue_end_us or r.enqueue_us) - r.enqueue_us, "enqueue"))
    for b in t.blocking:
        out.setdefault(b.thread, []).append((b.start_us, b.blocked_us, "blocking"))
    for r in t.records:
        if r.host_start_us is not None and r.host_end_us is not None:
            out.setdefault(f"host functions of {r.stream}", []).append((r.host_start_us, r.host_end_us - r.host_start_us, "host_function"))
    return out


provide("chrome_trace", chrome_trace)  # Trace.to_chrome
provide("save_chrome", save_chrome)  # Trace.save_chrome
provide("save_timeline", save_timeline)  # Trace.save_timeline
