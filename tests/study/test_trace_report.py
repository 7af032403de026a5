"""The analyzer finds what was planted on the simulator: host-function gaps, synchronous copies,
event waits, missing event waits (hazards), overlap and the critical path."""

from __future__ import annotations

import json
from typing import Iterator

import pytest

import streamrt as srt
from streamrt._pipeline import Pipeline
from streamrt._trace_report import TraceReport


@pytest.fixture
def hz_rt() -> Iterator[srt.Runtime]:
    rt = srt.open_runtime("sim", check_hazards=True)
    try:
        yield rt
    finally:
        rt.close()


def _buffers(rt: srt.Runtime, s: srt.Stream, n: int = 1 << 20) -> tuple[srt.Buffer, srt.Buffer]:
    return rt.device_allocator.allocate(n, stream=s), rt.host_allocator.allocate(n)


def test_a_host_function_between_copies_is_a_host_function_bubble(sim_rt: srt.Runtime) -> None:
    s = sim_rt.create_stream(name="main")
    d, h = _buffers(sim_rt, s)

    def pack() -> None:
        pass

    with sim_rt.trace() as t:
        s.copy(h, d)
        s.launch_host_func(pack)
        s.copy(d, h)
    rep = t.report()
    (b,) = [b for b in rep.bubbles if b.stream == "main"]
    assert b.cause == "host_function" and "pack" in b.detail
    assert b.duration_us == pytest.approx(2 * 48.0)  # the stream is held for both halves of the Python host call
    (st,) = rep.streams
    assert st.by_cause["host_function"] == pytest.approx(96.0) and st.bubble_count == 1
    assert rep.host_blocked_us == 0.0
    kinds = [seg.kind for seg in rep.critical_path if seg.duration_us > 0]
    assert "host_function" in kinds and kinds.count("device") == 2


def test_a_synchronous_copy_blocks_the_host_and_starves_the_stream(sim_rt: srt.Runtime) -> None:
    s = sim_rt.create_stream(name="main")
    d, h = _buffers(sim_rt, s)
    with sim_rt.trace() as t:
        s.copy(h, d)
        s.synchronize()  # the old path: wait for the D2H before using the data
        s.copy(d, h)
    rep = t.report(min_bubble_us=1.0)
    assert rep.host_blocked_us > 20.0  # at least the copy's 20 us
    (blk,) = rep.blocking
    assert blk.what == "stream.synchronize" and blk.count == 1
    (b,) = rep.bubbles
    assert b.cause == "host" and "stream.synchronize" in b.detail
    prof = sim_rt.backend.profile
    # the device sat idle while the host woke up, returned and enqueued the next copy
    assert b.duration_us == pytest.approx(prof.sync_wake_us + prof.api_call_us + prof.launch_latency_us)
    assert any(seg.kind == "host" and "stream.synchronize" in seg.label for seg in rep.critical_path)


def test_a_stream_waiting_for_another_streams_event_is_an_event_bubble(sim_rt: srt.Runtime) -> None:
    a = sim_rt.create_stream(name="producer")
    b = sim_rt.create_stream(name="consumer")
    d, h = _buffers(sim_rt, a, 8 << 20)
    d2, h2 = _buffers(sim_rt, b)
    with sim_rt.trace() as t:
        b.copy(h2, d2)  # the consumer has some work first
        a.copy(d, h)  # a long upload on the producer (8 MiB)
        ev = a.record()
        b.wait(ev)
        b.copy(d2, d.view(0, d2.nbytes))
    rep = t.report()
    (bub,) = [x for x in rep.bubbles if x.stream == "consumer"]
    assert bub.cause == "event" and "producer" in bub.detail and "host_to_device" in bub.detail
    assert bub.duration_us > 100.0
    cons = next(s for s in rep.streams if s.stream == "consumer")
    assert cons.by_cause["event"] == pytest.approx(bub.duration_us)
    # the critical path runs through the producer's upload and the event
    path = [(seg.kind, seg.stream) for seg in rep.critical_path if seg.duration_us > 0]
    assert ("device", "producer") in path and path[-1] == ("device", "consumer")


def test_a_missing_event_wait_is_reported_as_a_hazard(hz_rt: srt.Runtime) -> None:
    a = hz_rt.create_stream(name="producer")
    b = hz_rt.create_stream(name="consumer")
    d, h = _buffers(hz_rt, a)
    h2 = hz_rt.host_allocator.allocate(1 << 20)
    a.synchronize()
    with hz_rt.trace() as t:
        a.copy(d, h)  # writes d on the producer...
        b.copy(h2, d)  # ...and the consumer reads d with no event between them
    rep = t.report()
    assert len(rep.hazards) == 1
    (hz,) = rep.hazards
    assert hz["kind"] == "race" and "no event between them" in hz["message"]
    seqs = [r.seq for r in t.records if r.traced]
    assert sorted(hz["seqs"]) == seqs
    assert "hazards found by the simulator: 1" in str(rep)


def test_the_same_program_with_the_wait_has_no_hazard(hz_rt: srt.Runtime) -> None:
    a = hz_rt.create_stream(name="producer")
    b = hz_rt.create_stream(name="consumer")
    d, h = _buffers(hz_rt, a)
    h2 = hz_rt.host_allocator.allocate(1 << 20)
    a.synchronize()
    with hz_rt.trace() as t:
        a.copy(d, h)
        b.wait(a.record())
        b.copy(h2, d)
    assert t.report().hazards == ()


def test_copy_compute_overlap_ratio(sim_rt: srt.Runtime) -> None:
    a = sim_rt.create_stream(name="copies")
    c = sim_rt.create_stream(name="compute")
    d, h = _buffers(sim_rt, a)
    big = sim_rt.device_allocator.allocate(256 << 20, stream=c)
    with sim_rt.trace() as par:
        c.memset(big, 0)  # ~128 us of "compute"
        a.copy(h, d)  # ~20 us copy, concurrently
    with sim_rt.trace() as ser:
        c.memset(big, 0)
        c.copy(h, d)  # the same copy after the compute, on one stream
    p, s = par.report().overlap, ser.report().overlap
    assert p.ratio == pytest.approx(1.0) and p.overlap_us == pytest.approx(p.copy_us)
    assert s.ratio == 0.0 and s.copy_us == pytest.approx(p.copy_us)
    assert p.compute_us == pytest.approx(sim_rt.backend.profile.memset_us(256 << 20), abs=1e-3)


def test_untraced_pipeline_work_appears_with_its_side_streams(sim_rt: srt.Runtime) -> None:
    """Ops a pipeline enqueues on pool streams show up (from the simulator's op log) with stream names."""
    s = sim_rt.create_stream(name="main")
    d, h = _buffers(sim_rt, s)
    big = sim_rt.device_allocator.allocate(64 << 20, stream=s)
    p = Pipeline("demo")
    p.memset(big, 0)
    cp = p.copy(dst=h, src=d)
    p.host(lambda: None, reads=[h], after=[cp])
    with sim_rt.trace() as t:
        p.launch(s, policy="fork").wait()
    streams = {r.stream for r in t.records if r.on_device and r.category != "marker"}
    assert "main" in streams and any(x.startswith("streamrt-side") for x in streams)
    rep = t.report()
    assert rep.overlap.overlap_us > 0  # the memset and the copy ran side by side


def test_report_is_printable_and_machine_readable(sim_rt: srt.Runtime) -> None:
    s = sim_rt.create_stream(name="main")
    d, h = _buffers(sim_rt, s)
    with sim_rt.trace() as t:
        s.copy(h, d)
        s.launch_host_func(lambda: None)
        s.synchronize()
        s.copy(d, h)
    rep = t.report()
    assert isinstance(rep, TraceReport)
    text = str(rep)
    for heading in ("host blocked:", "streams (bubbles", "largest bubbles", "copy/compute overlap", "critical path:"):
        assert heading in text
    d_ = rep.as_dict()
    json.dumps(d_)  # plain data only
    assert d_["host_blocked_us"] == rep.host_blocked_us
    assert {b["cause"] for b in d_["bubbles"]} == {"host_function", "host"}
    assert d_["bubbles_by_cause"]["host_function"] == pytest.approx(96.0)
    assert d_["critical_path_us"] == pytest.approx(rep.critical_path_us) and rep.critical_path_us > 0
    with pytest.raises(ValueError):
        t.report(min_bubble_us=-1)
