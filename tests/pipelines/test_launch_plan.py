"""Launch plans: compiled once per pipeline version and stream, re-checked only where things can change."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from pipeline_helpers import pinned

import streamrt as srt

ROOT = Path(__file__).resolve().parents[2]


def _count_calls_module():
    spec = importlib.util.spec_from_file_location("count_calls", ROOT / "demos" / "bench" / "count_calls.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["count_calls"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_streamrt_python_calls_per_warm_launch_meet_the_lean_core_goals() -> None:
    """The counting method of demos/bench/count_calls.py, on the simulator: deterministic."""
    counts = _count_calls_module()
    rows = counts.measure()
    for name, goal in counts.GOALS.items():
        assert len(rows[name]) <= goal, (name, len(rows[name]), rows[name])


def _pipeline(rt: srt.Runtime, s: srt.Stream) -> tuple[srt.Pipeline, srt.Buffer, srt.Buffer]:
    d = rt.device_allocator.allocate(64, stream=s)
    h = pinned(rt, 64)
    p = srt.Pipeline("plan")
    p.memset(d, 7)
    p.copy(dst=h, src=d)
    return p, d, h


def test_a_plan_is_reused_until_the_pipeline_changes(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    p, d, h = _pipeline(rt, s)
    p.launch(s).result(10)
    plan = p._plans[s]
    p.launch(s).result(10)
    assert p._plans[s] is plan
    p.memset(d.view(0, 8), 9, name="after")  # a new version: a new plan
    assert s not in p._plans
    p.launch(s).result(10)
    assert p._plans[s] is not plan
    assert (h.numpy() == 7).all()


def test_a_planned_launch_rechecks_released_buffers_and_closed_streams(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    p, d, h = _pipeline(rt, s)
    p.launch(s).result(10)
    d.release()
    with pytest.raises(ValueError, match="released"):
        p.launch(s)
    other = rt.create_stream()
    q, _, _ = _pipeline(rt, other)
    q.launch(other).result(10)
    other.close()
    with pytest.raises(srt.ClosedError):
        q.launch(other)


def test_a_planned_launch_fails_midway_names_the_node_and_leaves_the_stream_usable(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    h = pinned(rt, 16)
    box = {"fail": False}
    ran: list[int] = []

    def maybe_fail(stream: srt.Stream) -> None:
        if box["fail"]:
            raise RuntimeError("enqueue failed")

    p = srt.Pipeline("midway")
    p.host(lambda: ran.append(1), writes=[h], name="first")
    p.enqueue(maybe_fail, name="user")
    p.launch(s).result(10)
    box["fail"] = True
    with pytest.raises(RuntimeError, match="enqueue failed") as info:
        p.launch(s)
    assert any("'user'" in note for note in getattr(info.value, "__notes__", []))
    box["fail"] = False
    p.launch(s).result(10)
    s.synchronize()
    assert ran == [1, 1, 1]  # the host node enqueued before the failure ran
