"""What the per-step helpers cost, in deterministic counts: calls per warm call, plans, runtime-thread wake-ups."""

from __future__ import annotations

import importlib.util
import sys
import time
from collections import Counter
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import streamrt as srt

torch = pytest.importorskip("torch", reason="torch is not installed (make test installs torch==2.13.0, the CPU build)")
from training_helpers import on_device, wait_until

import streamrt.torch as st

ROOT = Path(__file__).resolve().parents[2]


def _helper_calls() -> ModuleType:
    bench = str(ROOT / "demos" / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    spec = importlib.util.spec_from_file_location("helper_calls", ROOT / "demos" / "bench" / "helper_calls.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["helper_calls"] = module
    spec.loader.exec_module(module)
    return module


def test_calls_per_warm_helper_call_stay_within_their_goals() -> None:
    """demos/bench/helper_calls.py's counts on the simulator (deterministic): streamrt's Python calls, backend
    calls and torch calls per warm Prefetcher.__next__, fetch and MetricsLogger.log stay under GOALS."""
    calls = _helper_calls()
    rows = calls.measure("sim")
    assert calls.over_goals(rows) == []
    # one copy each outside the sim variant; the grouped rows: one for eight calls
    grouped = (f"Prefetcher, group={calls.GROUP} ({calls.GROUP} calls)", f"log, group={calls.GROUP} ({calls.GROUP} calls)")
    for name in ("Prefetcher.__next__", "fetch", "MetricsLogger.log", *grouped):
        common = Counter(rows[name].backend) - Counter(rows[name].sim["backend"])
        assert common["MemoryCalls.memcpy_async"] == 1, (name, common)


def test_a_logged_step_wakes_no_runtime_thread(sim_rt: srt.Runtime) -> None:
    """MetricsLogger polls its copies' events from the logging thread: logging retires nothing on a lane
    (no lane thread takes the GIL for it), while every fetch is retired by its stream's lane."""
    engine = sim_rt._engine
    logger = st.MetricsLogger(sim_rt, lag=0, sink=None)
    loss = on_device(sim_rt, torch.tensor(0.5))
    sim_rt.synchronize()
    before = engine.statistics().retired
    for step in range(20):
        logger.log(step, loss)
    assert wait_until(lambda: logger.poll() >= 0 and logger.pending == 0)
    assert [v for _s, v in logger.records] == [0.5] * 20
    assert engine.statistics().retired == before
    futures = [st.fetch(sim_rt, loss) for _ in range(3)]
    assert [f.item(30) for f in futures] == [0.5] * 3
    assert wait_until(lambda: engine.statistics().retired == before + 3)


def test_batches_of_one_structure_share_a_plan(trt: srt.Runtime) -> None:
    """A Prefetcher works out a batch's layout once per structure and leaf dtypes/shapes."""

    def batches(shapes: list[int]):  # type: ignore[no-untyped-def]
        for i, n in enumerate(shapes):
            yield {"tokens": torch.full((n,), i, dtype=torch.int64), "cu": torch.tensor([0, n], dtype=torch.int32), "w": np.full(3, i, np.float32)}

    with st.Prefetcher(batches([64] * 6), trt, depth=2) as pf:
        got = [int(b["tokens"].cpu()[0]) + int(b["w"].cpu()[2]) for b in pf]
        assert got == [2 * i for i in range(6)]
        assert pf.statistics().plans == 1
    with st.Prefetcher(batches([64, 32, 64, 32]), trt, depth=2) as pf:
        assert [b["tokens"].numel() for b in pf] == [64, 32, 64, 32]
        assert pf.statistics().plans == 2


def test_a_bad_leaf_raises_before_anything_is_allocated(trt: srt.Runtime) -> None:
    """A batch the Prefetcher cannot stage raises TypeError from next() and takes no staging memory."""
    alloc = trt.host_allocator
    before = alloc.statistics().in_use_bytes
    pf = st.Prefetcher(iter([{"ok": torch.ones(4), "bad": torch.ones(4, device="meta")}]), trt, depth=1)
    with pytest.raises(TypeError, match="meta"):
        next(pf)
    assert alloc.statistics().in_use_bytes == before
    pf.close()


@pytest.mark.parametrize("group", [1, 2])
def test_a_dropped_logger_gives_its_staging_back(sim_rt: srt.Runtime, group: int) -> None:
    """Copies still pending when a logger is closed, or dropped without closing, return their staging
    blocks once the stream has passed them (with group=2: a group sent, and a step still held)."""
    alloc = sim_rt.host_allocator
    base = alloc.statistics().in_use_bytes
    loss = on_device(sim_rt, torch.tensor(1.0))
    logger = st.MetricsLogger(sim_rt, lag=5, sink=None, group=group)
    for step in range(3):
        logger.log(step, loss)
    assert alloc.statistics().in_use_bytes > base
    logger.close()
    assert alloc.statistics().in_use_bytes == base
    logger = st.MetricsLogger(sim_rt, lag=5, sink=None, group=group)
    for step in range(3):
        logger.log(step, loss)
    del logger
    sim_rt.releaser.drain()
    assert alloc.statistics().in_use_bytes == base


def test_a_cold_sample_times_each_call_alone_after_the_stand_in_step() -> None:
    """``helper_costs.py --cold``: the stand-in step runs before every timed call, and only the call is timed."""
    _helper_calls()  # (puts demos/bench on the path)
    spec = importlib.util.spec_from_file_location("helper_costs", ROOT / "demos" / "bench" / "helper_costs.py")
    assert spec is not None and spec.loader is not None
    costs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(costs)
    order: list[str] = []
    settled: list[bool] = []

    def slow_evict() -> None:
        order.append("evict")
        time.sleep(0.002)

    us = costs.sample(lambda: order.append("call"), 5, lambda: settled.append(True), slow_evict)
    assert order == ["evict", "call"] * 5 and settled == [True]
    assert us < 1000  # the 2 ms stand-in is not in the figure
    step = costs.evictor()
    step()  # a CPU torch forward and backward
