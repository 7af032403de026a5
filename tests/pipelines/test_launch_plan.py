"""Launch plans: compiled once per pipeline version and stream, re-checked only where things can change."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from pipeline_helpers import pinned

import streamrt as srt
from streamrt.recipes.fmha_bwd import native_pack_available

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
    if not native_pack_available():  # the prepare's Python pack is a Python host node: no deferred launch to count
        rows["deferred prepare"] = rows["deferred prepare, seqstart given"] = []
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


def _driver_calls_only(rt: srt.Runtime, s: srt.Stream) -> tuple[srt.Pipeline, srt.Buffer, srt.Buffer, srt.Event]:
    """memset ∥ D2H(src → staging) → H2D(staging → dst) → D2H(dst → out), with a record and a wait."""
    src, dst = (rt.device_allocator.allocate(256, stream=s) for _ in range(2))
    staging, out = pinned(rt, 256), pinned(rt, 256)
    ready, done = rt.create_event(), rt.create_event()
    s.record(ready)
    p = srt.Pipeline("driver-calls")
    p.wait(ready, name="ready")
    p.memset(dst, 0, name="clear")
    down = p.copy(dst=staging, src=src, name="down")
    up = p.copy(dst=dst, src=staging, after=[down], name="up")
    back = p.copy(dst=out, src=dst, after=[up], name="back")
    p.record(done, after=[back], name="done")
    return p, src, out, done


def test_a_plan_of_driver_calls_is_one_native_program_where_the_backend_has_one(rt: srt.Runtime) -> None:
    """On cuda and hip (the executor built) the launch is one native call; everywhere the results are the same."""
    from streamrt._backends import _native_ops

    s = rt.create_stream()
    p, src, out, done = _driver_calls_only(rt, s)
    fill = pinned(rt, 256)
    native = rt.backend.native_ops is not None
    assert native == (rt.backend.name != "sim" and _native_ops.available())
    for i in range(5):
        fill.numpy()[:] = i + 1
        s.copy(dst=src, src=fill)
        p.launch(s).result(10)
        assert (out.numpy() == i + 1).all()
        assert done.is_done
    plan = p._plans[s]
    assert (plan.program is not None) == native
    assert plan.program is None or len(plan.program) == 1 + len(plan.steps)  # the capture check, then each step
    q = srt.Pipeline("with-python-host")
    q.host(lambda: None)
    q.launch(s).result(10)
    assert q._plans[s].program is None  # a Python host node: the Python path


def test_a_kernel_node_is_part_of_the_native_program(rt: srt.Runtime) -> None:
    """memset -> kernel -> D2H: one native program on cuda and hip (the launch's calls, the kernel's too)."""
    from streamrt._kernel._reference import fill_words

    n = 1000
    s = rt.create_stream()
    d = rt.device_allocator.allocate(4 * n, stream=s)
    h = pinned(rt, 4 * n)
    p = srt.Pipeline("with-kernel")
    p.memset(d, 0)
    p.kernel(rt.kernels.get("fill_u32"), 4, 256, [d, n, 9, 3])
    p.copy(dst=h, src=d)
    for _ in range(3):
        h.numpy()[:] = 0
        p.launch(s).result(10)
        assert (h.numpy(np.uint32) == fill_words(n, 9, 3)).all()
    plan = p._plans[s]
    assert (plan.program is not None) == (rt.backend.native_ops is not None)
    assert plan.program is None or len(plan.program) == 4  # the capture check, memset, kernel, copy


def test_plans_and_replays_run_from_a_thread_that_never_used_the_device(rt: srt.Runtime) -> None:
    """A fresh thread has no current context: the executor makes the device's current and retries (CUDA)."""
    import threading

    s = rt.create_stream()
    p, src, out, _ = _driver_calls_only(rt, s)
    p.launch(s).result(10)  # compiled on this thread
    graph = srt.Pipeline("replayed")
    graph.copy(dst=out, src=src)
    g = graph.capture(s)
    fill = pinned(rt, 256, fill=42)
    s.copy(dst=src, src=fill)
    s.synchronize()
    errors: list[BaseException] = []

    def launch() -> None:
        try:
            p.launch(s).result(10)
            assert (out.numpy() == 42).all()
            out.numpy()[:] = 0
            g.launch(s).result(10)
            assert (out.numpy() == 42).all()
        except BaseException as exc:  # noqa: BLE001 - reported on the test's thread
            errors.append(exc)

    t = threading.Thread(target=launch)
    t.start()
    t.join(30)
    assert not t.is_alive() and errors == []
    g.close()


def _two_branches(rt: srt.Runtime, s: srt.Stream) -> tuple[srt.Pipeline, srt.Buffer, srt.Buffer]:
    a, b = (rt.device_allocator.allocate(64, stream=s) for _ in range(2))
    ha, hb = pinned(rt, 64), pinned(rt, 64)
    p = srt.Pipeline("branches")
    p.copy(dst=ha, src=a, after=[p.memset(a, 1)])
    p.copy(dst=hb, src=b, after=[p.memset(b, 2)])
    return p, ha, hb


@pytest.mark.parametrize("join", [True, False])
@pytest.mark.parametrize("wait_for", ["stream", None])
def test_a_fork_launch_is_compiled_once_and_keeps_its_side_streams(rt: srt.Runtime, wait_for: str | None, join: bool) -> None:
    from streamrt._pipeline._fork_plan import ForkLaunchPlan

    s = rt.create_stream()
    p, ha, hb = _two_branches(rt, s)
    runs = []
    for _ in range(3):
        run = p.launch(s, policy="fork", wait_for=wait_for, join=join)
        run.join(s)
        run.result(10)
        runs.append(run)
        assert (ha.numpy() == 1).all() and (hb.numpy() == 2).all()
    plan = p._plans[(s, wait_for, join, False)]
    assert isinstance(plan, ForkLaunchPlan)
    assert all(r.streams == plan.streams for r in runs) and len(plan.streams) == 2 and plan.streams[0] is s
    assert (plan.program is not None) == (rt.backend.native_ops is not None)


def test_a_fork_launch_waits_for_the_callers_stream_unless_told_not_to(rt: srt.Runtime) -> None:
    from pipeline_helpers import Gate

    s = rt.create_stream()
    p, ha, hb = _two_branches(rt, s)
    for wait_for in ("stream", None):
        p.launch(s, policy="fork", wait_for=wait_for).result(10)  # compiled
        ha.numpy()[:] = hb.numpy()[:] = 0
        gate = Gate()
        s.launch_host_func(gate)
        try:
            run = p.launch(s, policy="fork", wait_for=wait_for, join=False)
            side = run.streams[1]
            if wait_for is None:  # the side branch runs at once
                side.synchronize()
                assert (hb.numpy() == 2).all() or (ha.numpy() == 1).all()
            else:
                assert not run.is_done and not side.is_idle
        finally:
            gate.open()
        run.result(10)
        assert (ha.numpy() == 1).all() and (hb.numpy() == 2).all()


def test_a_dropped_fork_plan_gives_its_side_streams_back_to_the_pool(rt: srt.Runtime) -> None:
    import gc

    from streamrt._streampool import pool_for

    s = rt.create_stream()
    p, ha, _ = _two_branches(rt, s)
    p.launch(s, policy="fork").result(10)
    side = p._plans[(s, "stream", True, False)].sides[0]
    p.memset(ha, 0, name="changed")  # a new version: the plan is dropped
    assert not p._plans
    gc.collect()
    (again,) = pool_for(rt).acquire_streams(1, s.priority)
    assert again is side
