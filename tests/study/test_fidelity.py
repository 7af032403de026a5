"""``streamrt fidelity``: the simulator's demo figures against a GPU's, per strategy and by ranking."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streamrt._cli import main
from streamrt._cli.fidelity import compare_demos


def _demo(clock: str, added: dict[str, float], step: float = 1000.0) -> dict[str, Any]:
    rows = [{"name": "none", "added_us": 0.0, "step_us": step}]
    rows += [{"name": n, "added_us": a, "step_us": step + a} for n, a in added.items()]
    return {"backend": "sim" if clock == "virtual" else "cuda", "device_name": "X", "clock": clock, "results": rows}


def test_within_tolerance_and_same_ranking_meets_the_goal() -> None:
    gpu = _demo("events", {"sync": 400.0, "stream": 250.0, "fork": 50.0})
    sim = _demo("virtual", {"sync": 460.0, "stream": 210.0, "fork": 60.0})
    rep = compare_demos(gpu, sim)
    assert [r.strategy for r in rep.rows] == ["sync", "stream", "fork"]
    assert rep.rows[0].error == pytest.approx(0.15)
    assert rep.all_within and rep.same_ranking and rep.met
    assert rep.gpu_ranking == ("fork", "stream", "sync")


def test_a_row_off_by_more_than_the_tolerance_fails() -> None:
    rep = compare_demos(_demo("events", {"sync": 400.0, "fork": 50.0}), _demo("virtual", {"sync": 520.0, "fork": 50.0}))
    assert not rep.rows[0].within and rep.rows[1].within
    assert rep.same_ranking and not rep.met
    assert "NO" in rep.table()


def test_a_different_ranking_fails_even_when_each_row_is_close() -> None:
    rep = compare_demos(_demo("events", {"a": 100.0, "b": 130.0}), _demo("virtual", {"a": 120.0, "b": 110.0}))
    assert rep.all_within and not rep.same_ranking and not rep.met
    assert rep.misordered == (("a", "b"),)
    assert "misordered" in rep.table()


def test_strategies_within_the_tolerance_of_each_other_on_the_gpu_are_tied() -> None:
    """100 and 120 differ by less than 25 %: either order passes. Near zero the floor (50 us) applies."""
    rep = compare_demos(_demo("events", {"a": 100.0, "b": 120.0}), _demo("virtual", {"a": 115.0, "b": 100.0}))
    assert rep.same_ranking and rep.met
    rep = compare_demos(_demo("events", {"a": 2.0, "b": 12.0}), _demo("virtual", {"a": 10.0, "b": 5.0}))
    assert rep.same_ranking  # 10 us apart: under 25 % of the 50 us floor


def test_a_near_zero_figure_is_judged_against_the_floor() -> None:
    """Under 5 % of the baseline step (50 us here), the allowed error is 25 % of that floor (12.5 us)."""
    rep = compare_demos(_demo("events", {"fork": 3.0}), _demo("virtual", {"fork": 15.0}))
    (row,) = rep.rows
    assert row.error is None and row.within and row.basis == "near zero"
    rep = compare_demos(_demo("events", {"fork": 3.0}), _demo("virtual", {"fork": 16.0}))
    assert not rep.rows[0].within


@pytest.mark.parametrize(
    ("gpu", "sim", "match"),
    [
        (_demo("virtual", {"a": 1.0}), _demo("virtual", {"a": 1.0}), "GPU file comes from the simulator"),
        (_demo("events", {"a": 1.0}), _demo("events", {"a": 1.0}), "not measured on the simulator"),
        (_demo("events", {"a": 1.0}), _demo("virtual", {"b": 1.0}), "share no strategy"),
        ({"clock": "events"}, _demo("virtual", {"a": 1.0}), "not a `streamrt demo --json`"),
    ],
)
def test_bad_inputs_are_rejected(gpu: dict[str, Any], sim: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        compare_demos(gpu, sim)


def test_command_compares_two_demo_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """End to end on real demo output: two simulator runs, one relabelled as the reference, agree exactly."""
    sim_path = tmp_path / "sim.json"
    assert main(["demo", "--backend", "sim", "--out-dir", str(tmp_path), "--no-plot", "--json", str(sim_path)]) == 0
    capsys.readouterr()
    gpu = json.loads(sim_path.read_text())
    gpu["clock"] = "events"
    gpu_path = tmp_path / "gpu.json"
    gpu_path.write_text(json.dumps(gpu))
    assert main(["fidelity", str(gpu_path), str(sim_path)]) == 0
    out = capsys.readouterr().out
    assert "same ranking (pairs within" in out and "tied): yes;" in out
    for name in ("sync", "stream", "fork", "graph"):
        assert name in out
