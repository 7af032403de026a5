"""The tracer: the object behind ``Runtime._tracer`` while tracing is on.

The core's hooks call :meth:`Tracer.op`, :meth:`Tracer.host_call` and
:meth:`Tracer.blocking` (signatures in ``_stream.py``); :meth:`Tracer.finish`
reads device times and builds the :class:`~streamrt._trace_records.Trace`.

Device times (:mod:`streamrt._trace_clocks`): ``_EventClock`` brackets each
op with two pooled timing events (GPUs); ``_VirtualClock`` reads the
simulator's op log instead, matching each traced call to the ops it enqueued
by thread, stream and the thread's virtual host clock, and adds the ops nobody
traced (pipeline internals, graph nodes, the runtime's own markers) as
untraced records. What is kept of each op while the trace runs:
:mod:`streamrt._trace_pending`.

Several devices: a tracer belongs to one runtime, so to one device. On a
backend with several devices its timing events and calibration stream are
made, and :meth:`Tracer.finish` synchronizes, with the runtime's device
current on the calling thread; on a simulator shared by several devices only
the op log's ops of the runtime's device (``OpRecord.device``) become records.

Labels: :func:`~streamrt._trace_labels.label` sets the ``(pipeline, node)``
names the tracer attaches to the ops enqueued in its block.

Thread rules: the hooks may be called from any thread; ``finish`` once, from
one thread, not from a host function.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ._ranges import for_runtime
from ._trace_clocks import _SIM_KIND, _SIM_WORK, _EventClock, _VirtualClock, _has_virtual_clock
from ._trace_labels import _label, range_name
from ._trace_pending import _HostTiming, _Pending, _PendingBlock
from ._trace_records import BlockingRecord, Trace, TraceRecord, category_of

if TYPE_CHECKING:
    from ._runtime import Runtime
    from ._stream import Stream

__all__ = ["Tracer"]


def _completion_latency_us(completion: Any, host_end_ns: int | None) -> float | None:
    """Host function end -> its Completion resolved, µs (``None`` when either is unknown)."""
    if completion is None or host_end_ns is None or not completion.is_done:
        return None
    return max(0.0, (completion._resolved_ns - host_end_ns) / 1000.0)


def _closure_value(fn: Callable[..., Any], name: str) -> Any:
    """The value of free variable ``name`` of ``fn`` (the core's enqueue lambdas close over their event)."""
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None)
    if code is None or not cells:
        return None
    try:
        return cells[code.co_freevars.index(name)].cell_contents
    except (ValueError, IndexError):
        return None


class Tracer:
    """Records ops while ``runtime._tracer`` is set to it. Created by :func:`start_trace`.

    The hook methods (:meth:`op`, :meth:`host_call`, :meth:`blocking`) are
    called by the core with the signatures documented in ``_stream.py``; they
    may be called from any thread.
    """

    def __init__(self, runtime: Runtime, *, name: str = "trace", clock: str = "auto") -> None:
        if clock not in ("auto", "events"):
            raise ValueError(f"clock must be 'auto' or 'events', got {clock!r}")
        self.name = name
        self._runtime = runtime
        self._backend = runtime.backend
        self._t0 = time.perf_counter_ns()
        self._virtual = clock == "auto" and _has_virtual_clock(runtime)
        # several devices on the backend: this runtime's device is made current where it matters
        self._device: int | None = runtime.device if runtime._multi_device else None
        self._clock: Any = (
            _VirtualClock(self._backend) if self._virtual else _EventClock(self._backend, self._t0, self._device)
        )
        self._seq = itertools.count()
        self._ops: list[_Pending] = []
        self._blocks: list[_PendingBlock] = []
        self._streams: dict[int, str] = {}
        self._stream_lock = threading.Lock()
        self._events: dict[int, int] = {}  # event handle -> small id
        self._last_on_stream: dict[int, int] = {}  # stream handle -> seq of its last traced op
        self._log_start = 0
        if self._virtual:
            log = getattr(self._backend, "op_log")()
            self._log_start = log[-1].seq if log else 0
        self._finished = False
        self._ranges = for_runtime(runtime)  # NVTX/roctx ranges too, with STREAMRT_RANGES=1 (None otherwise)

    # -- labels --------------------------------------------------------------------------------
    def _stream_label(self, stream: Stream) -> str:
        handle = stream.handle
        got = self._streams.get(handle)
        if got is not None:
            return got
        with self._stream_lock:
            got = self._streams.get(handle)
            if got is None:
                name = stream.name
                if name == f"stream-0x{handle:x}":  # unnamed: number streams in order of first use
                    name = f"stream {len(self._streams) + 1}"
                taken = set(self._streams.values())
                base, n = name, 2
                while name in taken:
                    name = f"{base} ({n})"
                    n += 1
                self._streams[handle] = got = name
        return got

    def _event_id(self, handle: int) -> int:
        got = self._events.get(handle)
        if got is None:
            with self._stream_lock:
                got = self._events.setdefault(handle, len(self._events) + 1)
        return got

    def _new(self, stream: Stream, kind: str, nbytes: int) -> _Pending:
        p = _Pending(next(self._seq), kind, self._stream_label(stream), stream.handle, nbytes)
        p.pipeline, p.node = _label.get()
        p.thread = threading.current_thread().name
        return p

    # -- hooks --------------------------------------------------------------------------------------
    def op(
        self,
        stream: Stream,
        kind: str,
        nbytes: int,
        enqueue: Callable[[], None],
        *,
        event: Any = None,
        name: str | None = None,
        pipeline: str | None = None,
        node: str | None = None,
        node_names: Sequence[str] | None = None,
    ) -> Any:
        """Trace one enqueue: calls ``enqueue()`` once, timing it on the host and the device,
        and returns what it returned.

        ``event`` (the Event, or its handle, recorded or waited on) is found in
        ``enqueue``'s closure when not given. ``pipeline``/``node`` label the op
        (overriding :func:`~streamrt._trace_labels.label`); ``name`` is the
        op's own name (a kernel's name): always kept as the record's
        ``op_name``, and its ``node`` too when no node label is set; ``node_names`` names a graph's nodes by index (for
        ``kind="graph_launch"``). If ``enqueue`` raises, nothing is recorded and
        the exception propagates.
        """
        p = self._new(stream, kind, nbytes)
        if pipeline is not None:
            p.pipeline = pipeline
        if node is not None:
            p.node = node
        if name:
            p.op_name = name
            if p.node is None:
                p.node = name
        if node_names is not None:
            p.node_names = tuple(node_names)
        if kind == "record" or kind == "wait_event":
            ev = event if event is not None else _closure_value(enqueue, "event")
            handle = getattr(ev, "handle", ev)
            if isinstance(handle, int):
                p.event = handle
        return self._enqueue(p, stream.handle, enqueue)

    def _enqueue(self, p: _Pending, handle: int, enqueue: Callable[[], Any]) -> Any:
        ranges = self._ranges
        self._begin(p, handle)
        if ranges is not None:
            ranges.push(range_name(p.pipeline, p.node, p.op_name or p.kind))
        try:
            result = enqueue()
        except BaseException:
            if not self._virtual:
                self._clock.release(p.ev0)
            raise
        finally:
            if ranges is not None:
                ranges.pop()
        self._end(p, handle)
        return result

    def _begin(self, p: _Pending, handle: int) -> None:
        """The op's enqueue starts: host times, and on a GPU a timing event before it."""
        if self._virtual:
            p.v0 = self._clock.host_now()
        else:
            p.ev0 = self._clock.mark(handle)
        p.w0 = time.perf_counter_ns()

    def _end(self, p: _Pending, handle: int) -> None:
        """The op's enqueue ended: host times, a timing event after it; the op is recorded."""
        p.w1 = time.perf_counter_ns()
        if self._virtual:
            p.v1 = self._clock.host_now()
        else:
            p.ev1 = self._clock.mark(handle) if p.ev0 is not None else None
            p.v0, p.v1 = (p.w0 - self._t0) / 1000.0, (p.w1 - self._t0) / 1000.0
        self._ops.append(p)
        self._last_on_stream[handle] = p.seq

    def host_call_begin(self, stream: Stream, worker: Any) -> _Pending:
        """A Python host function's enqueue starts: its first host function is next on ``stream``.

        ``worker`` (its stream's channel, or a graph's host slot) has just
        queued the call's request: the request's ``trace`` then makes the
        worker record the thread and the (real) time the function ran and the
        exception it raised; its resolution stamp is read when the trace
        finishes. Labelled by :func:`~streamrt._trace_labels.label`, else by
        the function's name. Pass the result to :meth:`host_call_end` once its hold is enqueued.
        """
        p = self._new(stream, "host_python", 0)
        queue = worker._queue
        req = queue[-1] if queue else None
        fn = (req.fn if req is not None else None) or getattr(worker, "fn", None)
        if p.node is None:
            p.node = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or "host function"
        if req is not None and req.trace is None:
            req.trace = _HostTiming(p, self._ranges)
            p.completion = req
        self._begin(p, stream.handle)
        return p

    def host_call_end(self, p: _Pending) -> None:
        """The Python host function's second half (the hold of its stream) is enqueued: the op is recorded."""
        self._end(p, p.handle)

    def blocking(self, stream: Stream | None, what: str, call: Callable[[], None]) -> None:
        """Trace a blocking call: runs ``call()`` and records how long the host was blocked."""
        if stream is None:
            b = _PendingBlock(next(self._seq), what, None, None, threading.current_thread().name)
        else:
            b = _PendingBlock(next(self._seq), what, self._stream_label(stream), stream.handle, threading.current_thread().name)
            b.last_seq = self._last_on_stream.get(stream.handle)
        clock = self._clock
        ranges = self._ranges
        b.v0 = clock.host_now()
        b.w0 = time.perf_counter_ns()
        if ranges is not None:
            ranges.push(what)
        try:
            call()
        finally:
            if ranges is not None:
                ranges.pop()
            b.w1 = time.perf_counter_ns()
            b.v1 = clock.host_now()
            self._blocks.append(b)

    # -- the end --------------------------------------------------------------------------------------
    def finish(self) -> Trace:
        """Wait for the device, read device times, and build the :class:`Trace`. Called once."""
        if self._finished:
            raise RuntimeError("this tracer has already finished")
        self._finished = True
        backend = self._backend
        try:
            if self._device is not None:  # device_synchronize acts on the calling thread's current device
                backend.ensure_device(self._device)
            backend.device_synchronize()
        except Exception as exc:  # a device error must not lose the trace; times of failed work are unknown
            warnings.warn(f"tracing: device_synchronize failed at the end of the trace ({exc!r})", RuntimeWarning, stacklevel=3)
        self._await_host_completions(deadline=time.monotonic() + 2.0)
        notes: list[str] = []
        try:
            if self._virtual:
                records, hazards = self._resolve_virtual(notes)
            else:
                records, hazards = self._resolve_events(notes)
        finally:
            if not self._virtual:
                self._clock.close()
        return self._build(records, hazards, notes)

    def _await_host_completions(self, deadline: float) -> None:
        """Host calls' Completions resolve on a lane just after the device passes them: give
        them until ``deadline`` so their completion latency is known (one that never resolves,
        a host function still blocked, keeps an unknown latency)."""
        for p in list(self._ops):
            c = p.completion
            if c is not None and not c.is_done:
                try:
                    c.wait(max(0.0, deadline - time.monotonic()))
                except TimeoutError:
                    return

    def _wall(self, ns: int | None) -> float | None:
        return None if ns is None else (ns - self._t0) / 1000.0

    def _record_fields(self, p: _Pending) -> dict[str, Any]:
        wh0, wh1 = p.wh0, p.wh1
        return dict(
            seq=p.seq,
            kind=p.kind,
            category=category_of(p.kind),
            stream=p.stream,
            nbytes=p.nbytes,
            pipeline=p.pipeline,
            node=p.node,
            op_name=p.op_name,
            thread=p.thread,
            enqueue_us=p.v0,
            enqueue_end_us=p.v1,
            event=self._event_id(p.event) if p.event is not None else None,
            error=p.error,
            host_thread=p.host_thread,
            wall_enqueue_us=self._wall(p.w0),
            wall_enqueue_dur_us=(p.w1 - p.w0) / 1000.0,
            wall_host_start_us=self._wall(wh0),
            wall_host_dur_us=None if wh0 is None or wh1 is None else (wh1 - wh0) / 1000.0,
            wall_completion_latency_us=_completion_latency_us(p.completion, wh1),
        )

    def _resolve_events(self, notes: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        clock = self._clock
        out = []
        captured = 0
        for p in self._ops:
            f = self._record_fields(p)
            f["_key"] = (p.seq, 0, 0)
            f["device_start_us"] = clock.device_time(p.ev0)
            f["device_end_us"] = clock.device_time(p.ev1)
            if p.ev0 is None:
                captured += 1
            if p.kind == "host_python" and p.wh0 is not None:
                f["host_start_us"] = f["wall_host_start_us"]
                f["host_end_us"] = f["wall_host_start_us"] + (f["wall_host_dur_us"] or 0.0)
            out.append(f)
        for b in self._blocks:
            out.append(self._block_fields(b, (b.seq, 0, 0)))
        if captured:
            notes.append(f"{captured} op(s) were enqueued on capturing streams: no device times (they run when the graph is launched)")
        return out, []

    def _block_fields(self, b: _PendingBlock, key: tuple[float, int, int]) -> dict[str, Any]:
        return {
            "_block": True,
            "_key": key,
            "_old": b.seq,
            "what": b.what,
            "stream": b.stream,
            "thread": b.thread,
            "start_us": b.v0,
            "end_us": b.v1,
            "waits_for": b.last_seq,
            "wall_start_us": (b.w0 - self._t0) / 1000.0,
            "wall_dur_us": (b.w1 - b.w0) / 1000.0,
        }

    def _sim_label(self, handle: int) -> str:
        got = self._streams.get(handle)
        if got is not None:
            return got
        for s in list(self._runtime._streams):
            if s.handle == handle:
                return self._stream_label(s)
        return f"stream {handle:#x}"

    def _resolve_virtual(self, notes: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Match each traced call to the simulator ops it enqueued: same thread and stream,
        enqueued (virtual host time) inside the call. Ops of the log that no traced call
        claims become untraced records. Everything is ordered by the simulator's enqueue order.
        On a simulator with several devices only the ops of the runtime's device are read."""
        backend = self._backend
        log = [r for r in getattr(backend, "op_log")() if r.seq > self._log_start]
        if self._log_start and (not log or log[0].seq != self._log_start + 1) and self._ops:
            notes.append("the simulator's op log was full: early ops of the trace are missing (raise op_log_limit)")
        elsewhere: set[int] = set()  # ops of the log that other devices ran
        device = self._device
        if device is not None:
            elsewhere = {r.seq for r in log if r.device != device}
            log = [r for r in log if r.device == device]
        by_key: dict[tuple[str, int], list[Any]] = {}
        for r in log:
            by_key.setdefault((r.thread, r.stream), []).append(r)
        claimed: set[int] = set()
        out: list[dict[str, Any]] = []
        missing = 0
        running = float(self._log_start)
        items: list[Any] = sorted([*self._ops, *self._blocks], key=lambda x: x.seq)
        for p in items:
            if isinstance(p, _PendingBlock):
                out.append(self._block_fields(p, (running, 1, p.seq)))
                continue
            f = self._record_fields(p)
            rows = by_key.get((p.thread, p.handle), ())
            mine = [r for r in rows if p.v0 < r.enqueue_us <= p.v1 + 1e-9 and r.seq not in claimed]
            for r in mine:
                claimed.add(r.seq)
            f["_sims"] = [r.seq for r in mine]
            if not mine:
                if p.kind != "wait_event":  # waiting on a never-recorded event enqueues nothing
                    missing += 1
                f["_key"] = (running, 1, p.seq)
                f["device_start_us"] = f["device_end_us"] = None
                out.append(f)
                continue
            first = min(r.seq for r in mine)
            running = max(running, max(r.seq for r in mine))
            f["_key"] = (first, 0, 0)
            graph_nodes = [r for r in mine if r.graph_exec and r.node >= 0]
            if p.kind == "host_python":  # its sem_post and what holds the stream: sem_wait or a signal wait
                body = [r for r in mine if r.kind in _SIM_WORK or r.kind == "wait_signal"]
            else:
                body = [r for r in mine if r.kind in _SIM_WORK] or [r for r in mine if r.kind == "wait_event"] or mine
            f["device_start_us"] = min(r.start_us for r in body)
            f["device_end_us"] = max(r.end_us for r in body)
            if p.kind == "host_python":
                f["host_start_us"], f["host_end_us"] = f["device_start_us"], f["device_end_us"]
            if graph_nodes:
                f["device_start_us"] = min(r.start_us for r in mine)
                f["device_end_us"] = max(r.end_us for r in mine)
            out.append(f)
            names = p.node_names or ()
            for r in graph_nodes:
                g = self._untraced(r, p.stream)
                g["pipeline"] = p.pipeline
                if r.node < len(names):
                    g["node"] = names[r.node]
                g["_parent"] = p.seq
                out.append(g)
        if missing:
            notes.append(f"{missing} traced op(s) were not found in the simulator's op log (captured, or beyond op_log_limit)")
        # Ops nobody traced: work, waits and records the runtime enqueued directly (pipeline
        # internals, graph replays, the completion engine's markers).
        for r in log:
            if r.seq in claimed or r.kind == "graph_launch":
                continue
            out.append(self._untraced(r, self._sim_label(r.stream)))
        hazards = []
        hazard_fn = getattr(backend, "hazards", None)
        if callable(hazard_fn):
            for h in hazard_fn():
                sims = [int(m) for desc in h.ops for m in re.findall(r"#(\d+)", desc)]
                if sims and max(sims) <= self._log_start:
                    continue  # found before this trace began
                if sims and elsewhere.issuperset(sims):
                    continue  # only ops of other devices are involved: their runtimes' traces report it
                hazards.append({"kind": h.kind, "message": h.message, "_sims": sims})
        return out, hazards

    def _untraced(self, r: Any, stream: str) -> dict[str, Any]:
        kind = _SIM_KIND.get(r.kind, r.kind)
        node = r.name or None
        if r.graph_exec and r.node >= 0 and node is None:
            node = f"graph node {r.node} ({kind})"
        return dict(
            _key=(r.seq, 0, 0),
            _sims=[r.seq],
            seq=-1,
            kind=kind,
            category=category_of(kind),
            stream=stream,
            nbytes=r.nbytes,
            node=node,
            op_name=r.name or None,
            thread=r.thread,
            enqueue_us=r.enqueue_us,
            enqueue_end_us=r.enqueue_us,
            device_start_us=r.start_us,
            device_end_us=r.end_us,
            traced=False,
            graph_node=r.node if r.graph_exec else -1,
        )

    def _build(self, fields: list[dict[str, Any]], hazards: list[dict[str, Any]], notes: list[str]) -> Trace:
        """Order everything (ops and blocking calls) into one ``seq`` numbering, shift times to
        start at 0, link waits to records, and freeze."""
        fields.sort(key=lambda f: f["_key"])
        new_of_old: dict[int, int] = {}
        new_of_sim: dict[int, int] = {}
        for i, f in enumerate(fields):
            if f.get("traced", True) or f.get("_block"):
                old = f.get("_old", f.get("seq"))
                if old is not None and old >= 0:
                    new_of_old[old] = i
            for s in f.get("_sims", ()):
                new_of_sim[s] = i
            f["_new"] = i
        ops = [f for f in fields if not f.get("_block")]
        blocks = [f for f in fields if f.get("_block")]
        # One time axis from 0: shift by the earliest time seen.
        times = [t for f in ops for t in (f.get("enqueue_us"), f.get("device_start_us")) if t is not None]
        times += [b["start_us"] for b in blocks]
        origin = min(times) if times else 0.0
        walls = [f["wall_enqueue_us"] for f in ops if f.get("wall_enqueue_us") is not None]
        walls += [b["wall_start_us"] for b in blocks]
        wall_origin = min(walls) if walls else 0.0

        def shift(v: float | None) -> float | None:
            return None if v is None else round(v - origin, 3)

        def wshift(v: float | None) -> float | None:
            return None if v is None else round(v - wall_origin, 3)

        last_record: dict[int, int] = {}
        records: list[TraceRecord] = []
        brecs: list[BlockingRecord] = []
        records_at: dict[float, list[TraceRecord]] = {}
        for f in fields:
            seq = f["_new"]
            if f.get("_block"):
                old_wait = f["waits_for"]
                brecs.append(
                    BlockingRecord(
                        seq=seq,
                        what=f["what"],
                        stream=f["stream"],
                        thread=f["thread"],
                        start_us=shift(f["start_us"]) or 0.0,
                        end_us=shift(f["end_us"]) or 0.0,
                        waits_for=new_of_old.get(old_wait) if old_wait is not None else None,
                        wall_start_us=wshift(f["wall_start_us"]),
                        wall_dur_us=round(f["wall_dur_us"], 3),
                    )
                )
                continue
            parent = f.pop("_parent", None)
            for key in [k for k in f if k.startswith("_")]:
                del f[key]
            f["seq"] = seq
            if parent is not None:
                f["parent"] = new_of_old.get(parent)
            if f["kind"] == "record":
                if f.get("event") is not None:
                    last_record[f["event"]] = seq
            elif f["kind"] == "wait_event":
                if f.get("event") is not None:
                    f["waits_for"] = last_record.get(f["event"])
                elif f.get("device_end_us") is not None:
                    # An untraced wait: the record it waited for completed exactly when it was satisfied.
                    cands = records_at.get(shift(f["device_end_us"]), ())  # type: ignore[arg-type]
                    cands = [u for u in cands if u.stream != f["stream"]]
                    if cands:
                        f["waits_for"] = cands[-1].seq
            for key in ("enqueue_us", "enqueue_end_us", "device_start_us", "device_end_us", "host_start_us", "host_end_us"):
                if key in f:
                    f[key] = shift(f[key])
            for key in ("wall_enqueue_us", "wall_host_start_us"):
                if f.get(key) is not None:
                    f[key] = wshift(f[key])
            for key in ("wall_enqueue_dur_us", "wall_host_dur_us", "wall_completion_latency_us"):
                if f.get(key) is not None:
                    f[key] = round(f[key], 3)
            rec = TraceRecord(**f)
            records.append(rec)
            if rec.kind == "record" and rec.device_end_us is not None:
                records_at.setdefault(rec.device_end_us, []).append(rec)
        out_hazards = []
        for h in hazards:
            sims = h.pop("_sims", [])
            out_hazards.append({**h, "seqs": sorted({new_of_sim[s] for s in sims if s in new_of_sim})})
        caps = self._runtime.capabilities
        streams = list(self._streams.values())
        for r in records:
            if r.stream not in streams and r.on_device:
                streams.append(r.stream)
        return Trace(
            name=self.name,
            backend=self._runtime.backend_name,
            device_name=caps.device_name,
            clock=self._clock.clock,
            records=tuple(records),
            blocking=tuple(brecs),
            streams=tuple(streams),
            hazards=tuple(out_hazards),
            notes=tuple(notes),
            meta={"device": self._runtime.device, "architecture": caps.architecture},
        )


