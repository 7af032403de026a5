"""Helpers for the study-tool tests: small traced programs on the simulator, JSON and PNG checks."""

from __future__ import annotations

import struct
from typing import Any

import streamrt as srt
from streamrt._trace import Trace

PH_ALLOWED = {"X", "B", "E", "i", "M", "s", "f", "C"}


def seed_like_program(rt: srt.Runtime) -> Trace:
    """A small program with every kind of op: memset, both copy directions, a Python host
    function, a cross-stream event wait, a synchronize, a native-free pipeline-free sequence."""
    s = rt.create_stream(name="main")
    side = rt.create_stream(name="side")
    d = rt.device_allocator.allocate(1 << 20, stream=s)
    h = rt.host_allocator.allocate(1 << 16)
    meta = rt.host_allocator.allocate(1 << 12)
    dmeta = rt.device_allocator.allocate(1 << 12, stream=s)

    def pack() -> int:
        meta.numpy()[:] = h.numpy()[: meta.nbytes] + 1
        return 7

    with rt.trace() as t:
        s.memset(d, 0)
        s.copy(h, d.view(0, h.nbytes))
        done = s.launch_host_func(pack)
        s.copy(dmeta, meta)
        ev = s.record()
        side.wait(ev)
        side.memset(d.view(1 << 19, 1 << 16), 3)
        s.synchronize()
        s.copy(h, d.view(0, h.nbytes))
        side.synchronize()
    assert done.result() == 7
    return t.trace


def strip_wall(obj: Any) -> Any:
    """``obj`` without the keys that hold real (wall-clock) host measurements."""
    if isinstance(obj, dict):
        return {k: strip_wall(v) for k, v in obj.items() if not k.startswith("wall_")}
    if isinstance(obj, list):
        return [strip_wall(v) for v in obj]
    return obj


def check_chrome_trace(doc: Any) -> list[dict[str, Any]]:
    """Assert the Chrome trace-event JSON object structure; return the events."""
    assert isinstance(doc, dict), "the JSON object form has a top-level object"
    events = doc["traceEvents"]
    assert isinstance(events, list) and events
    for ev in events:
        assert isinstance(ev, dict)
        assert ev["ph"] in PH_ALLOWED, ev
        assert isinstance(ev["name"], str) and ev["name"]
        assert isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        if ev["ph"] == "M":
            assert ev["name"] in {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}
            assert isinstance(ev["args"], dict)
            continue
        assert isinstance(ev["ts"], (int, float)) and not isinstance(ev["ts"], bool)
        if ev["ph"] == "X":
            assert isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0
        if ev["ph"] == "i":
            assert ev.get("s", "t") in {"g", "p", "t"}
        if ev["ph"] in ("s", "f"):  # flow events (arrows): an id shared by the two ends
            assert isinstance(ev["id"], int) and not isinstance(ev["id"], bool)
        if ev["ph"] == "C":  # counter samples: numeric series
            assert ev["args"] and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in ev["args"].values())
        if "args" in ev:
            assert isinstance(ev["args"], dict)
    return events


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; asserts the signature."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height
