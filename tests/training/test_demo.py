"""demos/train_loop.py: the four variants train the same model to the same losses."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (make test installs torch==2.13.0, the CPU build)")

DEMO = Path(__file__).resolve().parents[2] / "demos" / "train_loop.py"


@pytest.fixture(scope="module")
def demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_loop_demo", DEMO)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_reduced_cpu_variants_agree(demo: ModuleType) -> None:
    """CI form: (a) plain torch and (b) streamrt on the simulator log the same loss at every step, and
    (b)'s stream-async workspace metadata matches the numpy oracle at every checked step."""
    cfg = demo.REDUCED
    device = torch.device("cpu")
    a = demo.run_plain(cfg, device)
    with demo.open_runtime_for(device) as rt:
        b = demo.run_streamrt(cfg, device, rt)
    assert len(a.losses) == len(b.losses) == cfg.steps
    assert all(math.isfinite(x) for x in a.losses)
    assert demo.compare([a, b], rtol=1e-5, atol=1e-6) == []
    assert b.verified_steps == list(range(0, cfg.steps, cfg.verify_every))
    assert b.stats["prefetch"]["max_in_flight"] <= cfg.depth - 1 + cfg.prefetch_group
    assert b.stats["metrics"]["blocking_waits"] <= 1  # only the final flush may wait


def test_compare_reports_a_difference(demo: ModuleType) -> None:
    a = demo.Result("a", [1.0, 2.0, 3.0], 0.0)
    b = demo.Result("b", [1.0, 2.5, 3.0], 0.0)
    assert "step 1" in demo.compare([a, b], rtol=1e-5, atol=1e-6)[0]
    assert "logged 2 losses" in demo.compare([a, demo.Result("c", [1.0, 2.0], 0.0)], rtol=1e-5, atol=1e-6)[0]


def test_cli_reduced_cpu(demo: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--device", "cpu", "--reduced", "--steps", "5"]) == 0
    out = capsys.readouterr().out
    assert "(c) skipped" in out and "(d) skipped" in out and "all variants agree" in out


def test_the_whole_step_graph_needs_cuda(demo: ModuleType) -> None:
    with demo.open_runtime_for(torch.device("cpu")) as rt, pytest.raises(ValueError, match="needs --device cuda"):
        demo.run_whole_graph(demo.REDUCED, torch.device("cpu"), rt)


@pytest.mark.gpu
@pytest.mark.slow
def test_full_variants_agree_on_gpu(demo: ModuleType) -> None:
    """H200 form: the full model, (a), (b) and (c) (the captured step), same losses within tolerance."""
    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    cfg = demo.FULL
    device = torch.device("cuda", 0)
    results = [demo.run_plain(cfg, device)]
    for graph in (False, True):
        with demo.open_runtime_for(device) as rt:
            results.append(demo.run_streamrt(cfg, device, rt, graph=graph))
    rtol, atol = demo.tolerances(device)
    assert demo.compare(results, rtol=rtol, atol=atol) == []
    assert results[1].verified_steps and results[2].verified_steps
    first, last = results[0].losses[:10], results[0].losses[-10:]
    assert sum(last) / 10 < sum(first) / 10 - 0.5  # it learns


@pytest.mark.gpu
@pytest.mark.parametrize(("backend", "pack"), [("cuda", "native"), ("cuda", "python"), ("hip", "native")])
def test_the_whole_step_in_one_torch_graph_matches_plain_torch(demo: ModuleType, backend: str, pack: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """(d): the step, prepare and host functions included, replayed from one torch.cuda.graph; the
    losses agree with (a) at every step and the replayed metadata matches the oracle at every check."""
    from streamrt import _graph_release
    from streamrt._backends import probe_backend

    if not torch.cuda.is_available():
        pytest.skip("needs torch with CUDA")
    for reason in (probe_backend(backend), _graph_release.unavailable_reason()):
        if reason is not None:
            pytest.skip(reason)
    if pack == "native" and demo.PACK != "native":
        pytest.skip("the recipe's C pack is not built")
    monkeypatch.setattr(demo, "PACK", pack)
    cfg = dataclasses.replace(demo.FULL, steps=41, verify_every=5)
    device = torch.device("cuda", 0)
    a = demo.run_plain(cfg, device)
    ties = _graph_release.pending_releases()
    with demo.open_runtime_for(device, backend) as rt:
        d = demo.run_whole_graph(cfg, device, rt)
    deadline = time.monotonic() + 10
    while _graph_release.pending_releases() > ties:  # torch destroyed the graph when the demo let it go
        assert time.monotonic() < deadline, "(d)'s graph outlived the run: a reference cycle through its host functions?"
        time.sleep(0.01)
    assert len(d.losses) == cfg.steps
    rtol, atol = demo.tolerances(device)
    assert demo.compare([a, d], rtol=rtol, atol=atol) == []
    assert d.verified_steps == list(range(0, cfg.steps, cfg.verify_every))  # 3 eager steps, then replays
    assert d.stats["host_us_per_step"]["replay"] > 0


class _CountedFetch:
    """A stand-in FetchFuture: counts the polls of ``is_done``; lands when told."""

    def __init__(self) -> None:
        self.polls = 0
        self.landed = False

    @property
    def is_done(self) -> bool:
        self.polls += 1
        return self.landed

    def result(self) -> Any:
        return b"metadata"


def test_the_metadata_check_polls_only_past_its_depth(demo: ModuleType) -> None:
    """The loop's verification never polls while few copies are pending, then collects the landed ones, oldest first."""
    check = demo.MetadataCheck(params=None, depth=2)
    futs = [_CountedFetch() for _ in range(4)]
    check.add(0, None, futs[0])
    check.add(10, None, futs[1])
    assert [f.polls for f in futs] == [0, 0, 0, 0]  # two pending: nothing polled
    futs[0].landed = True
    check.add(20, None, futs[2])  # three pending: the oldest is polled and collected, the next one polled
    assert [step for step, _cu, _got in check.landed] == [0]
    assert [f.polls for f in futs] == [1, 1, 0, 0] and len(check.pending) == 2
    check.add(30, None, futs[3])  # the oldest pending has not landed: one poll, nothing collected
    assert [f.polls for f in futs] == [1, 2, 0, 0] and len(check.pending) == 3
