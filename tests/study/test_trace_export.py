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
