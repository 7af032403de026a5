"""Tracing on the simulator: what each op records, determinism, labels, switching on and off."""

from __future__ import annotations

import json

import pytest
from study_helpers import seed_like_program, strip_wall

import streamrt as srt
from streamrt._trace import TraceRecord, label, start_trace, stop_trace
from streamrt._trace_export import chrome_trace_json


def test_each_op_records_host_enqueue_device_times_stream_and_bytes(sim_rt: srt.Runtime) -> None:
    t = seed_like_program(sim_rt)
    assert t.clock == "virtual" and t.backend == "sim"
    kinds = [r.kind for r in t.records if r.traced]
    assert kinds == [
        "memset", "device_to_host", "host_python", "host_to_device", "record", "wait_event", "memset", "device_to_host",
    ]  # fmt: skip
    for r in t.records:
        if not r.traced:
            continue
        assert r.thread == "MainThread"
        assert r.enqueue_us is not None and r.enqueue_end_us is not None and r.enqueue_end_us >= r.enqueue_us
        assert r.wall_enqueue_us is not None and r.wall_enqueue_dur_us is not None and r.wall_enqueue_dur_us >= 0
        assert r.on_device and r.device_end_us >= r.device_start_us  # type: ignore[operator]
        # a device op cannot start before the host enqueued it
        assert r.device_start_us >= r.enqueue_us  # type: ignore[operator]
    by_kind: dict[str, TraceRecord] = {}
    for r in t.records:
        if r.traced:
            by_kind.setdefault(r.kind, r)  # the first of each kind
    assert by_kind["memset"].stream == "main" and by_kind["memset"].nbytes == 1 << 20
    assert by_kind["device_to_host"].nbytes == 1 << 16 and by_kind["device_to_host"].category == "copy"
    host = by_kind["host_python"]
    assert host.node == "seed_like_program.<locals>.pack" and host.host_thread is not None
    assert host.wall_host_dur_us is not None and host.wall_completion_latency_us is not None
    assert host.device_us == pytest.approx(2 * 48.0)  # sem_post + sem_wait host functions, 48 us each on the default profile
    # the wait on "side" is linked to the record on "main"
    wait = by_kind["wait_event"]
    rec = by_kind["record"]
    assert wait.stream == "side" and wait.waits_for == rec.seq and wait.event == rec.event
    assert t.streams[:2] == ("main", "side")
    # stream order holds on each stream
    for stream in ("main", "side"):
        ops = [r for r in t.records if r.traced and r.stream == stream]
        assert all(a.device_end_us <= b.device_start_us + 1e-9 for a, b in zip(ops, ops[1:]))  # type: ignore[operator]


def test_blocking_calls_record_the_host_time_blocked(sim_rt: srt.Runtime) -> None:
    t = seed_like_program(sim_rt)
    whats = [b.what for b in t.blocking]
    assert whats == ["stream.synchronize", "stream.synchronize"]
    first = t.blocking[0]
    assert first.stream == "main" and first.blocked_us > 48.0  # waited through the host function
    assert first.waits_for == next(r.seq for r in t.records if r.kind == "record" and r.traced)
    assert t.host_blocked_us == pytest.approx(sum(b.blocked_us for b in t.blocking))


def test_same_program_twice_gives_the_same_trace_apart_from_wall_clock_fields() -> None:
    texts = []
    for _ in range(2):
        with srt.open_runtime("sim") as rt:
            texts.append(chrome_trace_json(seed_like_program(rt)))
    a, b = (json.loads(x) for x in texts)
    assert a != b, "the wall-clock fields are real measurements and should differ"
    assert strip_wall(a) == strip_wall(b)
    # the device processes carry no wall-clock fields at all: byte-identical lines
    dev_a = [line for line in texts[0].splitlines() if '"pid":1,' in line]
    dev_b = [line for line in texts[1].splitlines() if '"pid":1,' in line]
    assert dev_a and dev_a == dev_b


def test_labels_name_the_ops_enqueued_inside_them(sim_rt: srt.Runtime) -> None:
    s = sim_rt.create_stream()
    d = sim_rt.device_allocator.allocate(4096, stream=s)
    with sim_rt.trace() as t:
        with label("prep", "zero"):
            s.memset(d, 0)
            with label(None, "inner"):
                s.memset(d, 1)
        s.memset(d, 2)
    ops = [r for r in t.records if r.traced]
    assert [(r.pipeline, r.node) for r in ops] == [("prep", "zero"), ("prep", "inner"), (None, None)]
    assert ops[0].name == "zero" and ops[2].name == "memset"


def test_tracing_switches_on_and_off_and_one_trace_at_a_time(sim_rt: srt.Runtime) -> None:
    assert sim_rt._tracer is None
    region = sim_rt.trace()
    with pytest.raises(RuntimeError, match="complete only when"):
        region.report()
    with region:
        assert sim_rt._tracer is not None
        with pytest.raises(RuntimeError, match="already on"):
            start_trace(sim_rt)
    assert sim_rt._tracer is None
    assert region.records == () and sim_rt.last_trace is region.trace
    with pytest.raises(RuntimeError, match="not on"):
        stop_trace(sim_rt)


def test_open_runtime_trace_true_traces_until_close() -> None:
    rt = srt.open_runtime("sim", trace=True)
    s = rt.create_stream()
    d = rt.device_allocator.allocate(4096, stream=s)
    s.memset(d, 7)
    d.release()
    rt.close()
    t = rt.last_trace
    assert t is not None and [r.kind for r in t.records if r.traced] == ["memset"]


def test_stop_trace_returns_the_runtime_long_trace_and_tracing_is_off_afterwards() -> None:
    with srt.open_runtime("sim", trace=True) as rt:
        s = rt.create_stream()
        d = rt.device_allocator.allocate(64, stream=s)
        s.memset(d, 1)
        t = rt.stop_trace()
        s.memset(d, 2)
        assert rt._tracer is None
        assert [r.kind for r in t.records if r.traced] == ["memset"]


def test_a_failing_enqueue_records_nothing_and_raises(sim_rt: srt.Runtime) -> None:
    s = sim_rt.create_stream()
    d = sim_rt.device_allocator.allocate(64, stream=s)
    start_trace(sim_rt)
    try:
        s.close()
        with pytest.raises(srt.ClosedError):
            s.memset(d, 0)
    finally:
        t = stop_trace(sim_rt)
    assert [r for r in t.records if r.traced] == []


def test_host_function_errors_are_recorded_and_still_reach_the_completion(sim_rt: srt.Runtime) -> None:
    s = sim_rt.create_stream()

    def boom() -> None:
        raise ValueError("bad pack")

    with sim_rt.trace() as t:
        c = s.launch_host_func(boom)
        s.synchronize()
    with pytest.raises(ValueError, match="bad pack"):
        c.result()
    (r,) = [r for r in t.records if r.kind == "host_python"]
    assert r.error == "ValueError: bad pack"


def test_event_clock_times_device_work_with_timing_events(sim_rt: srt.Runtime) -> None:
    """The GPU method (two timing events around each op), exercised on the simulator."""
    s = sim_rt.create_stream()
    d = sim_rt.device_allocator.allocate(1 << 20, stream=s)
    h = sim_rt.host_allocator.allocate(1 << 20)
    start_trace(sim_rt, clock="events")
    s.memset(d, 0)
    s.copy(h, d)
    s.launch_host_func(lambda: None)
    t = stop_trace(sim_rt)
    assert t.clock == "events"
    ops = [r for r in t.records if r.traced]
    assert [r.kind for r in ops] == ["memset", "device_to_host", "host_python"]
    for a, b in zip(ops, ops[1:]):
        assert a.on_device and b.on_device
        assert a.device_end_us <= b.device_start_us + 1e-6  # type: ignore[operator]
    # on the simulator the events carry virtual time: the span from the event before the copy to
    # the one after it is the launch gap after the memset plus the copy's modelled duration
    profile = sim_rt.backend.profile
    assert ops[1].device_us == pytest.approx(profile.op_gap_us + profile.copy_us("d2h", 1 << 20), rel=1e-3)
    assert ops[2].host_start_us is not None  # real time of the Python function


def test_a_traced_graph_launch_shows_its_nodes_on_the_simulator(sim_rt: srt.Runtime) -> None:
    """``tracer.op(stream, "graph_launch", ...)`` (what Graph.launch calls) expands into the replayed nodes."""
    from streamrt._backends.protocol import CaptureMode

    be = sim_rt.backend
    s = sim_rt.create_stream(name="main")
    d = sim_rt.device_allocator.allocate(1 << 20, stream=s)
    h = sim_rt.host_allocator.allocate(1 << 20)
    s.synchronize()
    be.stream_begin_capture(s.handle, CaptureMode.THREAD_LOCAL)
    be.memset_async(d.ptr, 0, d.nbytes, s.handle)
    be.memcpy_async(h.ptr, d.ptr, d.nbytes, 2, s.handle)
    graph = be.stream_end_capture(s.handle)
    exe = be.graph_instantiate(graph)
    try:
        with sim_rt.trace() as t:
            tracer = sim_rt._tracer
            assert tracer is not None
            tracer.op(s, "graph_launch", 0, lambda: be.graph_launch(exe, s.handle), pipeline="prep", node_names=["zero", "d2h"])
    finally:
        s.synchronize()
        be.graph_exec_destroy(exe)
        be.graph_destroy(graph)
    (launch,) = [r for r in t.records if r.kind == "graph_launch"]
    nodes = [r for r in t.records if r.parent == launch.seq]
    assert [(r.node, r.kind, r.graph_node, r.pipeline) for r in nodes] == [
        ("zero", "memset", 0, "prep"),
        ("d2h", "device_to_host", 1, "prep"),
    ]
    assert launch.device_start_us == nodes[0].device_start_us and launch.device_end_us == nodes[1].device_end_us
    rep = t.report()
    (st,) = rep.streams
    # the launch's span is not counted on top of its nodes
    assert st.busy_us == pytest.approx(sum(r.device_us or 0 for r in nodes), abs=1e-3)


def test_a_python_host_call_held_by_a_signal_spans_its_host_function_and_the_wait() -> None:
    with srt.open_runtime("sim", stream_signals=True) as rt:
        t = seed_like_program(rt)
    host = next(r for r in t.records if r.traced and r.kind == "host_python")
    # the sem_post host function (48 us on the default profile) and the signal wait (0 by default)
    assert host.device_us == pytest.approx(48.0)
    assert not any(r.kind == "wait_signal" for r in t.records if not r.traced)  # claimed by the host call
