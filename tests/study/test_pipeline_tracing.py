"""Tracing pipelines: every node's enqueue reaches the tracer with the pipeline's and the node's names.

On a GPU a pipeline's ops are seen only if they go through the tracer's hooks.
The simulator's op log would hide a missing hook (the tracer adds the ops
nobody traced, unlabelled), so each test either uses the events clock
(``start_trace(clock="events")``: only hooked ops are recorded, as on a GPU) or
checks, on the virtual clock, that no work op is left untraced and that the
records carry labels and host enqueue times only the hooks set.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

import streamrt as srt
from streamrt._pipeline._nodes import graph_node_names
from streamrt._trace import Trace, TraceRecord, start_trace, stop_trace

WORK = ("copy", "memset", "kernel", "host_function")
KIND = {  # node name -> the op kind its enqueue is traced as
    "zero": "memset",
    "d2h": "device_to_host",
    "pack": "host_python",
    "h2d": "host_to_device",
    "native": "host_native",
    "other": "memset",
    "enq": "memset",
    "rec": "record",
    "wt": "wait_event",
}
HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@contextmanager
def traced(rt: srt.Runtime, clock: str) -> Iterator[list[Trace]]:
    """Trace the block with ``clock`` ("auto": the simulator's virtual clock; "events": hooks only)."""
    out: list[Trace] = []
    start_trace(rt, clock=clock)
    try:
        yield out
    finally:
        out.append(stop_trace(rt))


def labelled(t: Trace, pipeline: str) -> dict[str, list[TraceRecord]]:
    """The records of ``pipeline`` by node name (records with no node label under ``""``)."""
    out: dict[str, list[TraceRecord]] = {}
    for r in t.records:
        if r.pipeline == pipeline:
            out.setdefault(r.node or "", []).append(r)
    return out


class Fixture:
    """A pipeline with every node kind, its buffers and what its host nodes saw."""

    def __init__(self, rt: srt.Runtime, s: srt.Stream, *, events: bool) -> None:
        n = 4096
        self.d = rt.device_allocator.allocate(n, stream=s)
        self.d2 = rt.device_allocator.allocate(1 << 16, stream=s)
        self.d3 = rt.device_allocator.allocate(256, stream=s)
        self.dmeta = rt.device_allocator.allocate(n, stream=s)
        self.h = rt.host_allocator.allocate(n)
        self.meta = rt.host_allocator.allocate(n)
        self.native_calls = 0

        def on_driver(_arg: int | None) -> None:
            self.native_calls += 1

        self.native = HOST_FN(on_driver)  # kept alive by the fixture and the pipeline

        def pack(src: srt.Buffer, dst: srt.Buffer) -> int:
            dst.numpy()[:] = src.numpy() + 1
            return int(src.numpy()[0])

        p = srt.Pipeline("prep")
        zero = p.memset(self.d, 7, name="zero")
        d2h = p.copy(dst=self.h, src=self.d, name="d2h", after=[zero])
        packed = p.host(pack, self.h, self.meta, reads=[self.h], writes=[self.meta], name="pack", after=[d2h])
        h2d = p.copy(dst=self.dmeta, src=self.meta, name="h2d", after=[packed])
        p.host(self.native, None, name="native", after=[h2d])
        p.memset(self.d2, 1, name="other")  # an independent branch: a side stream under "fork"
        if events:
            p.enqueue(lambda st, buf: st.memset(buf, 5), self.d3, writes=[self.d3], name="enq")
            self.ev_out = rt.create_event()
            self.ev_in = rt.create_event()
            p.record(self.ev_out, name="rec", after=[h2d])
            wt = p.wait(self.ev_in, name="wt")
            p.memset(self.d3.view(0, 128), 9, name="after_wt", after=[wt])
        self.pipeline = p

    def check_results(self, run: srt.Run) -> None:
        run.result(10)
        assert run.host_result("pack") == 7
        assert np.all(self.meta.numpy() == 8)
        assert self.native_calls >= 1


def node_names(p: srt.Pipeline) -> list[str]:
    return [n.name for n in p.nodes]


@pytest.mark.parametrize("clock", ["auto", "events"])
@pytest.mark.parametrize("policy", ["stream", "fork"])
def test_an_eager_launch_traces_every_node_with_the_pipeline_and_node_names(sim_rt: srt.Runtime, policy: str, clock: str) -> None:
    s = sim_rt.create_stream(name="main")
    f = Fixture(sim_rt, s, events=True)
    other = sim_rt.create_stream(name="other")
    other.record(f.ev_in)
    s.synchronize()
    with traced(sim_rt, clock) as got:
        run = f.pipeline.launch(s, policy=policy)
        run.wait(10)
    (t,) = got
    f.check_results(run)
    by_node = labelled(t, "prep")
    for name in node_names(f.pipeline):
        kind = KIND.get(name, "memset")
        mine = [r for r in by_node.get(name, ()) if r.kind == kind]
        # one op per node; under "fork" a record node may be followed by the plan's own record (same label)
        assert len(mine) == 1 or (kind == "record" and policy == "fork"), (name, by_node.get(name))
        r = mine[0]
        # only the hook path sets these: a traced record with host enqueue times
        assert r.traced and r.seq >= 0
        assert r.enqueue_us is not None and r.wall_enqueue_us is not None and r.wall_enqueue_dur_us is not None
        if r.category in WORK:
            assert r.on_device, r
    pack = by_node["pack"][0]
    assert pack.host_thread is not None and pack.wall_host_dur_us is not None and pack.error is None
    assert by_node["d2h"][0].nbytes == f.h.nbytes and by_node["zero"][0].nbytes == f.d.nbytes
    assert by_node["rec"][0].event is not None and by_node["wt"][0].event is not None
    # no work of the launch is left for the simulator's op log to fill in
    assert [r for r in t.records if not r.traced and r.category in WORK] == []
    streams = {r.stream for rs in by_node.values() for r in rs}
    if policy == "fork":
        assert len(streams) >= 2 and "main" in streams
        # the plan's ordering waits are traced, labelled, and linked to the plan's records
        waits = [r for r in t.records if r.pipeline == "prep" and r.kind == "wait_event" and r.node != "wt"]
        assert waits
        records = {r.seq: r for r in t.records if r.kind == "record"}
        for w in waits:
            assert w.waits_for is not None and w.waits_for in records, w
    else:
        assert streams == {"main"}


@pytest.mark.parametrize("policy", ["stream", "fork"])
def test_a_graph_replay_shows_each_graph_node_under_its_pipeline_node_name(sim_rt: srt.Runtime, policy: str) -> None:
    s = sim_rt.create_stream(name="main")
    f = Fixture(sim_rt, s, events=False)
    g = f.pipeline.capture(s, policy=policy)
    s.synchronize()
    with sim_rt.trace() as t:
        run = g.launch(s)
        run.wait(10)
    f.check_results(run)
    (launch,) = [r for r in t.records if r.kind == "graph_launch"]
    assert launch.traced and launch.pipeline == "prep" and launch.wall_enqueue_us is not None
    nodes = [r for r in t.records if r.parent == launch.seq]
    assert nodes and all(r.pipeline == "prep" and r.graph_node >= 0 for r in nodes)
    kinds: dict[str, set[str]] = {}
    for r in nodes:
        kinds.setdefault(r.node or "", set()).add(r.kind)
    # every node of the pipeline, under its own name; a Python host node is its slot's two native functions
    assert kinds == {
        "zero": {"memset"},
        "d2h": {"device_to_host"},
        "pack": {"host_native"},
        "h2d": {"host_to_device"},
        "native": {"host_native"},
        "other": {"memset"},
    }
    assert len([r for r in nodes if r.node == "pack"]) == 2
    g.close()


def test_a_graph_replay_is_one_labelled_op_on_the_events_clock(sim_rt: srt.Runtime) -> None:
    """What a GPU sees: the replay as one traced op of the pipeline, with device times."""
    s = sim_rt.create_stream(name="main")
    f = Fixture(sim_rt, s, events=False)
    g = f.pipeline.capture(s, policy="fork")
    s.synchronize()
    with traced(sim_rt, "events") as got:
        run = g.launch(s)
        run.wait(10)
    (t,) = got
    f.check_results(run)
    (launch,) = t.ops(kind="graph_launch")
    assert launch.pipeline == "prep" and launch.stream == "main" and launch.on_device
    assert launch.wall_enqueue_us is not None
    g.close()


@pytest.mark.parametrize("clock", ["auto", "events"])
def test_a_capture_while_tracing_is_traced_with_labels_and_the_graph_works(sim_rt: srt.Runtime, clock: str) -> None:
    s = sim_rt.create_stream(name="main")
    f = Fixture(sim_rt, s, events=False)
    s.synchronize()
    with traced(sim_rt, clock) as got:
        g = f.pipeline.capture(s, policy="fork")
    (t,) = got
    by_node = labelled(t, "prep")
    for name in node_names(f.pipeline):
        assert any(r.kind == KIND[name] for r in by_node.get(name, ())), name
    # captured work runs only on replay: no device times for the nodes
    assert all(r.device_end_us is None for rs in by_node.values() for r in rs if r.category in WORK)
    run = g.launch(s)
    f.check_results(run)
    g.close()


def test_host_node_errors_still_reach_the_run_while_tracing(sim_rt: srt.Runtime) -> None:
    s = sim_rt.create_stream()
    h = sim_rt.host_allocator.allocate(64)

    def boom() -> None:
        raise ValueError("bad pack")

    p = srt.Pipeline("failing")
    p.host(boom, writes=[h], name="boom")
    p.host(lambda: 3, reads=[h], name="after")
    with sim_rt.trace() as t:
        run = p.launch(s)
        assert isinstance(run.exception(10), ValueError)
    assert set(run.node_errors) == {"boom"} and run.host_result("after") == 3
    (r,) = [r for r in t.records if r.node == "boom"]
    assert r.pipeline == "failing" and r.error == "ValueError: bad pack"


def test_tracing_off_takes_no_traced_path(sim_rt: srt.Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """With tracing off the streams call the backend itself: no wrapper, no tracer call, no label."""
    from streamrt import _tracer
    from streamrt._pipeline import _nodes as nodes_mod
    from streamrt._trace_backend import TracingBackend

    s = sim_rt.create_stream()
    f = Fixture(sim_rt, s, events=False)

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("a traced path ran with tracing off")

    for name in ("op", "host_call_begin", "blocking"):
        monkeypatch.setattr(_tracer.Tracer, name, refuse)
    monkeypatch.setattr(nodes_mod, "label", refuse)
    assert sim_rt._tracer is None and not isinstance(s._backend, TracingBackend)
    f.check_results(f.pipeline.launch(s, policy="fork"))
    f.check_results(f.pipeline.launch(s))
    g = f.pipeline.capture(s, policy="fork")
    f.check_results(g.launch(s))
    g.close()


def test_a_trace_installs_its_backend_wrapper_and_removes_it(sim_rt: srt.Runtime) -> None:
    from streamrt._trace_backend import TracingBackend

    s = sim_rt.create_stream()
    raw = s._backend
    with sim_rt.trace() as t:
        assert isinstance(s._backend, TracingBackend) and sim_rt.backend is raw  # the escape hatch stays untraced
        late = sim_rt.create_stream()  # made while tracing: traced too
        assert late._backend is s._backend
        late.memset(sim_rt.device_allocator.allocate(64, stream=late), 1)
        s.synchronize()
    assert s._backend is raw and late._backend is raw
    trace = t.trace
    assert "memset" in [r.kind for r in trace.records if r.traced]
    assert any(b.what == "stream.synchronize" for b in trace.blocking)


def test_graph_node_names_follow_capture_order_and_stop_at_user_enqueue_code(sim_rt: srt.Runtime) -> None:
    s = sim_rt.create_stream()
    f = Fixture(sim_rt, s, events=False)
    p = f.pipeline
    order = [n.index for n in p.topological_order()]
    assert graph_node_names(list(p.nodes), order, None) == ("zero", "d2h", "pack", "pack", "h2d", "native", "other")
    q = srt.Pipeline("q")
    q.memset(f.d, 0, name="a")
    q.enqueue(lambda st: None, name="user")
    q.memset(f.d2, 0, name="b")
    q.memset(f.d3, 0, nbytes=0, name="empty")  # enqueues nothing: no graph node
    assert graph_node_names(list(q.nodes), [0, 1, 2, 3], None) == ("a",)
    assert graph_node_names(list(q.nodes), [0, 2, 3, 1], None) == ("a", "b")
