"""Exports: the Chrome trace-event JSON structure, several traces in one file, the PNG timeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from study_helpers import check_chrome_trace, png_size, seed_like_program

import streamrt as srt
from streamrt._trace_export import chrome_trace, save_chrome, save_timeline


def test_chrome_json_has_the_trace_event_structure(sim_rt: srt.Runtime, tmp_path: Path) -> None:
    t = seed_like_program(sim_rt)
    path = tmp_path / "trace.json"
    t.save_chrome(path)
    doc = json.loads(path.read_text())
    events = check_chrome_trace(doc)
    names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    # one track per stream on the device, one per host thread (and the host-function worker) on the host
    assert {(1, "main"), (1, "side"), (2, "MainThread"), (2, "host functions of main")} <= names
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert procs[1].startswith("device 0") and procs[2] == "host"
    # every traced op appears on the device with its seq, and its enqueue on the host under the same seq
    dev = {e["args"]["seq"] for e in events if e["pid"] == 1 and e["ph"] in ("X", "i") and "seq" in e["args"]}
    host = {e["args"]["seq"] for e in events if e["pid"] == 2 and e.get("cat") == "enqueue"}
    traced = {r.seq for r in t.records if r.traced}
    assert traced <= dev and traced == host
    copy = next(e for e in events if e["pid"] == 1 and e["args"].get("kind") == "device_to_host")
    assert copy["ph"] == "X" and copy["cat"] == "copy" and copy["args"]["bytes"] == 1 << 16 and copy["args"]["GB/s"] > 0
    blocking = [e for e in events if e.get("cat") == "blocking"]
    assert [e["name"] for e in blocking] == ["stream.synchronize", "stream.synchronize"]
    bubbles = [e for e in events if e.get("cat") == "bubble"]
    assert any(e["args"]["cause"] == "host_function" for e in bubbles)
    assert doc["otherData"]["traces"][0]["clock"] == "virtual"


def test_several_traces_go_side_by_side(sim_rt: srt.Runtime, tmp_path: Path) -> None:
    s = sim_rt.create_stream(name="main")
    d = sim_rt.device_allocator.allocate(1 << 20, stream=s)
    traces = []
    for name in ("first", "second"):
        with sim_rt.trace(name=name) as t:
            s.memset(d, 0)
        traces.append(t.trace)
    doc = chrome_trace(traces)
    check_chrome_trace(doc)
    procs = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert sorted(procs) == [1, 2, 3, 4]
    assert procs[1].startswith("first: device") and procs[3].startswith("second: device") and procs[4] == "second: host"
    save_chrome(traces, tmp_path / "two.json")
    assert json.loads((tmp_path / "two.json").read_text()) == json.loads(json.dumps(doc))


def test_the_timeline_png_is_an_image_of_sensible_size(sim_rt: srt.Runtime, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="timeline PNGs need the 'plot' extra (matplotlib)")
    t = seed_like_program(sim_rt)
    path = tmp_path / "timeline.png"
    t.save_timeline(path)
    data = path.read_bytes()
    w, h = png_size(data)
    assert 800 <= w <= 2400 and 150 <= h <= 1600
    assert 5_000 < len(data) < 400_000
    # several traces stack into one taller figure
    save_timeline([t, t], tmp_path / "two.png")
    w2, h2 = png_size((tmp_path / "two.png").read_bytes())
    assert w2 == w and h2 > h


# -- arrows (flow events) and counter tracks ------------------------------------------------------------


def _flows(events: list[dict]) -> dict[int, dict[str, dict]]:
    """Flow events by id: {"s": start, "f": finish}; asserts each id has exactly one of each."""
    by_id: dict[int, dict[str, dict]] = {}
    for e in events:
        if e["ph"] in ("s", "f"):
            ends = by_id.setdefault(e["id"], {})
            assert e["ph"] not in ends, f"flow id {e['id']} has two {e['ph']!r} events"
            ends[e["ph"]] = e
    for fid, ends in by_id.items():
        assert set(ends) == {"s", "f"}, f"flow id {fid} is unpaired: {ends}"
        assert ends["s"]["name"] == ends["f"]["name"] and ends["f"]["bp"] == "e"
    return by_id


def _slice_at(events: list[dict], pid: int, tid: int, ts: float) -> dict:
    """The event on track (pid, tid) that a flow end at ts binds to: the deepest one there, i.e. an instant
    event at ts (a zero-length slice, nested in a slice that starts at ts), else a complete event over
    [ts, ts + dur)."""
    hits = [
        e
        for e in events
        if e["pid"] == pid
        and e["tid"] == tid
        and ((e["ph"] == "X" and e["ts"] <= ts < e["ts"] + e["dur"]) or (e["ph"] == "i" and e["ts"] == ts))
    ]
    instants = [e for e in hits if e["ph"] == "i"]
    hits = instants or hits
    assert len(hits) == 1, f"{len(hits)} slices on ({pid}, {tid}) at {ts}: the flow end must bind to one"
    return hits[0]


def test_flow_arrows_join_enqueues_to_device_ops_and_records_to_waits(sim_rt: srt.Runtime, tmp_path: Path) -> None:
    t = seed_like_program(sim_rt)
    t.save_chrome(tmp_path / "trace.json")
    events = check_chrome_trace(json.loads((tmp_path / "trace.json").read_text()))
    flows = _flows(events)
    enqueue = [f for f in flows.values() if f["s"]["name"] == "enqueue"]
    waits = [f for f in flows.values() if f["s"]["name"] == "record → wait"]
    # one enqueue arrow per traced op that ran on the device, from its host enqueue to its device op
    assert len(enqueue) == len([r for r in t.records if r.traced and r.on_device])
    for f in enqueue:
        src = _slice_at(events, f["s"]["pid"], f["s"]["tid"], f["s"]["ts"])
        dst = _slice_at(events, f["f"]["pid"], f["f"]["tid"], f["f"]["ts"])
        assert src["cat"] == "enqueue" and src["pid"] == 2 and dst["pid"] == 1
        assert src["args"]["seq"] == dst["args"]["seq"]
    # the side stream's wait on main's event: one arrow, from main's record to side's wait, which ended
    # when the record completed
    assert len(waits) == 1
    (f,) = waits
    src = _slice_at(events, 1, f["s"]["tid"], f["s"]["ts"])
    dst = _slice_at(events, 1, f["f"]["tid"], f["f"]["ts"])
    assert (src["args"]["kind"], src["args"]["stream"]) == ("record", "main")
    assert (dst["args"]["kind"], dst["args"]["stream"]) == ("wait_event", "side")
    assert dst["args"]["waits_for_seq"] == src["args"]["seq"]
    assert dst["ts"] + dst.get("dur", 0.0) == pytest.approx(src["ts"] + src.get("dur", 0.0), abs=1e-3)


def test_flow_ids_are_unique_across_several_traces(sim_rt: srt.Runtime) -> None:
    first, second = seed_like_program(sim_rt), seed_like_program(sim_rt)
    events = check_chrome_trace(chrome_trace([first, second]))
    flows = _flows(events)
    per_trace = len(_flows(check_chrome_trace(chrome_trace(first))))
    assert len(flows) == 2 * per_trace
    assert {f["s"]["pid"] for f in flows.values()} == {1, 2, 3, 4}


def _counter(events: list[dict], name: str) -> list[tuple[float, float]]:
    samples = [e for e in events if e["ph"] == "C" and e["name"] == name]
    assert samples, f"no counter {name!r}"
    (key,) = {k for e in samples for k in e["args"]}
    return [(e["ts"], e["args"][key]) for e in samples]


def test_counter_tracks_for_staging_bytes_and_queue_depth(sim_rt: srt.Runtime) -> None:
    t = seed_like_program(sim_rt)
    events = check_chrome_trace(t.to_chrome())
    names = {e["name"] for e in events if e["ph"] == "C"}
    assert names == {"pinned staging bytes in flight", "queue depth: main", "queue depth: side"}
    for name in names:
        samples = _counter(events, name)
        times = [ts for ts, _ in samples]
        assert times == sorted(times) and len(set(times)) == len(times)  # monotone in time, one per instant
        assert all(v >= 0 for _, v in samples) and samples[-1][1] == 0  # never negative; drained at the end
    staging = _counter(events, "pinned staging bytes in flight")
    copies = [r for r in t.records if r.kind in ("host_to_device", "device_to_host")]
    # the first D2H of 64 KiB is in flight from its enqueue until the device finished it
    first = copies[0]
    assert staging[0] == (first.enqueue_us, first.nbytes) and (first.device_end_us, 0) in staging
    assert max(v for _, v in staging) <= sum(r.nbytes for r in copies)
    # main queued three ops at once (memset, D2H, host function) before the device caught up
    assert max(v for _, v in _counter(events, "queue depth: main")) >= 3


def test_flows_and_counters_are_deterministic_on_the_simulator(tmp_path: Path) -> None:
    texts = []
    for _ in range(2):
        with srt.open_runtime("sim") as rt:
            doc = seed_like_program(rt).to_chrome()
        texts.append([e for e in doc["traceEvents"] if e["ph"] in ("s", "f", "C")])
    assert texts[0] == texts[1] and texts[0]
