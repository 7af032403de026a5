"""``streamrt bench``: skipped benchmarks (exit status 77 and a reason) do not fail the run; the suite passes on a CPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cli_helpers import REPO

from streamrt._cli import main
from streamrt._cli.bench import SKIP_STATUS

SUITE = REPO / "demos" / "bench"
TORCH_BENCHMARKS = ("train_loop_bench", "train_loop_breakdown", "helper_calls", "helper_costs", "prepare_in_loop")

GOOD = """
import argparse, json
ap = argparse.ArgumentParser(); ap.add_argument('--backend'); ap.add_argument('--out')
a = ap.parse_args()
json.dump({'backend': a.backend, 'n': 1}, open(a.out, 'w'))
"""


def _suite(tmp_path: Path, scripts: dict[str, str]) -> Path:
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, text in scripts.items():
        (suite / f"{name}.py").write_text(textwrap.dedent(text))
    return suite


def test_a_skipped_benchmark_is_reported_with_its_reason_and_does_not_fail_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    suite = _suite(
        tmp_path,
        {
            "good": GOOD,
            "needs_moon": "import sys\nprint('looking', file=sys.stderr)\nprint('needs the moon: go there', file=sys.stderr)\nsys.exit(77)\n",
            "silent_skip": "raise SystemExit(77)\n",
        },
    )
    out_dir = tmp_path / "out"
    assert main(["bench", "--backend", "sim", "--suite", str(suite), "--out-dir", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert "needs_moon: skipped (" in out and "s): needs the moon: go there" in out
    assert "silent_skip: skipped (" in out and "(the script gave no reason)" in out
    assert "1 ok, 2 skipped, 0 failed on sim" in out
    report = json.loads((out_dir / "bench.json").read_text())["benchmarks"]
    assert report["good"]["status"] == "ok"
    assert report["needs_moon"]["status"] == "skipped" and report["needs_moon"]["reason"] == "needs the moon: go there"
    assert "## needs_moon\n\nstatus: skipped" in (out_dir / "bench.md").read_text()
    assert "skipped: needs the moon: go there" in (out_dir / "bench.md").read_text()
    assert SKIP_STATUS == 77


def test_a_benchmark_past_its_timeout_fails_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    suite = _suite(tmp_path, {"good": GOOD, "slow": "import time\nprint('started', flush=True)\ntime.sleep(60)\n"})
    assert main(["bench", "--backend", "sim", "--suite", str(suite), "--out-dir", str(tmp_path / "o"), "--timeout", "1"]) == 1
    assert "1 ok, 0 skipped, 1 failed on sim" in capsys.readouterr().out
    entry = json.loads((tmp_path / "o" / "bench.json").read_text())["benchmarks"]["slow"]
    assert entry["status"] == "timeout" and "started" in entry["output"]


def _run_script(name: str, *args: str, block_torch: bool = False) -> subprocess.CompletedProcess[str]:
    boot = (
        "import runpy, sys\n"
        f"if {block_torch}: sys.modules['torch'] = None\n"
        f"sys.path.insert(0, {str(SUITE)!r})\n"
        f"sys.argv = [{name!r}, *sys.argv[1:]]\n"
        f"runpy.run_path({str(SUITE / (name + '.py'))!r}, run_name='__main__')\n"
    )
    return subprocess.run([sys.executable, "-c", boot, *args], capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("name", TORCH_BENCHMARKS)
def test_the_torch_benchmarks_skip_without_torch(name: str, tmp_path: Path) -> None:
    proc = _run_script(name, "--backend", "sim", "--out", str(tmp_path / "r.json"), block_torch=True)
    assert proc.returncode == SKIP_STATUS, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "needs torch: pip install 'streamrt[torch]'"


@pytest.mark.slow
@pytest.mark.parametrize("name", TORCH_BENCHMARKS)
def test_the_torch_benchmarks_skip_on_cuda_without_a_cuda_torch(name: str, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("torch has a CUDA device here")
    proc = _run_script(name, "--device", "cuda", "--out", str(tmp_path / "r.json"))
    assert proc.returncode == SKIP_STATUS, proc.stderr
    assert "has no CUDA device here" in proc.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_the_suite_passes_on_the_simulator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The two torch benchmarks run on torch's CPU with the simulator (a functional run) next to a plain one."""
    has_torch = importlib.util.find_spec("torch") is not None
    only = [arg for name in (*TORCH_BENCHMARKS, "core_ops") for arg in ("--only", name)]
    assert main(["bench", "--backend", "sim", "--out-dir", str(tmp_path), *only]) == 0, capsys.readouterr().out
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["backend"] == "sim"
    entries = report["benchmarks"]
    assert entries["core_ops"]["status"] == "ok"
    for name in TORCH_BENCHMARKS:
        if has_torch:
            assert entries[name]["status"] == "ok", entries[name]
        else:
            assert entries[name]["status"] == "skipped", entries[name]
            assert entries[name]["reason"] == "needs torch: pip install 'streamrt[torch]'"
    if has_torch:
        assert entries["train_loop_bench"]["result"]["machine"]["device"] == "cpu (simulator)"
        assert entries["train_loop_bench"]["result"]["sizes"]["xs"]["losses_agree"] is True
        assert entries["train_loop_breakdown"]["result"]["device"] == "cpu (sim)"


def test_completion_bench_measures_only_the_parts_asked_for(tmp_path: Path) -> None:
    out = tmp_path / "stall.json"
    run = _run_script("completion_bench", "--backend", "sim", "--rounds", "1", "--parts", "stall", "--out", str(out))
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert "await_latency" not in report and "sustained_completions_per_s" not in report
    rows = report["host_function_stall"]
    assert "native no-op (sem_post) [switch 10us]" in rows and "python fn on worker (streamrt) [switch 10us]" in rows
    bad = _run_script("completion_bench", "--backend", "sim", "--parts", "stall,bogus")
    assert bad.returncode == 2 and "unknown ['bogus']" in bad.stderr
    picked = tmp_path / "picked.json"
    run = _run_script("completion_bench", "--backend", "sim", "--rounds", "1", "--parts", "stall", "--switch-us", "5,off", "--out", str(picked))
    assert run.returncode == 0, run.stderr
    rows = json.loads(picked.read_text())["host_function_stall"]
    assert "native no-op (sem_post) [switch 5us]" in rows and "native no-op (sem_post) [switch 5ms (not lowered)]" in rows
    assert not any("[switch 10us" in name for name in rows)
    bad = _run_script("completion_bench", "--backend", "sim", "--parts", "stall", "--switch-us", "0")
    assert bad.returncode == 2 and "must be positive" in bad.stderr


def test_train_loop_bench_times_the_variants_in_turns(tmp_path: Path) -> None:
    """By default a round runs the variants at once in turns of --turn steps, each timed from the end of its
    first step to the end of its last: the step time weighs each turn by the steps between those ends (a turn
    of one step has none). --turn 0 times one whole run after another (no turns); --turn 1 is refused."""
    pytest.importorskip("torch", reason="torch is not installed (make test installs torch==2.13.0, the CPU build)")
    out = tmp_path / "turns.json"
    run = _run_script("train_loop_bench", "--device", "cpu", "--variants", "a,b", "--rounds", "1", "--steps", "8", "--turn", "3", "--out", str(out))
    assert run.returncode == 0, run.stderr
    xs = json.loads(out.read_text())["sizes"]["xs"]
    assert xs["losses_agree"] is True
    for v in ("a", "b"):
        turns = xs[v]["turn_ms"]
        assert len(turns) == 3  # 3 + 3 + 2 steps: 2 + 2 + 1 between the marks
        assert xs[v]["step_ms"] == pytest.approx((2 * turns[0] + 2 * turns[1] + turns[2]) / 5)
        assert len(xs[v]["losses"]) == 2 + 8  # the warm-up and the timed steps, from one loop
    assert _run_script("train_loop_bench", "--device", "cpu", "--turn", "1").returncode == 2
    whole = tmp_path / "whole.json"
    run = _run_script("train_loop_bench", "--device", "cpu", "--variants", "a,b", "--rounds", "1", "--steps", "3", "--turn", "0", "--out", str(whole))
    assert run.returncode == 0, run.stderr
    xs = json.loads(whole.read_text())["sizes"]["xs"]
    assert xs["losses_agree"] is True and "turn_ms" not in xs["b"]


def test_train_loop_bench_times_b_star_with_changed_config_fields(tmp_path: Path) -> None:
    """--b-star runs (b) again with demo Config fields changed, interleaved, and reports it against (a) and (b);
    given twice, (b*) and (b**)."""
    pytest.importorskip("torch", reason="torch is not installed (make test installs torch==2.13.0, the CPU build)")
    out = tmp_path / "loop.json"
    stars = ("--b-star", "prefetch_group=4,prepare_strategy=fork_graph,log_group=2", "--b-star", "log_group=1")
    run = _run_script("train_loop_bench", "--device", "cpu", "--variants", "a,b", "--rounds", "1", *stars, "--out", str(out))
    assert run.returncode == 0, run.stderr
    xs = json.loads(out.read_text())["sizes"]["xs"]
    assert xs["losses_agree"] is True and {"speedup_b*_over_b", "speedup_b**_over_b", "speedup_b**_over_a"} <= set(xs)
    assert xs["b*"]["stats"]["metrics"] != xs["b**"]["stats"]["metrics"]  # each ran its own Config
    # Each variant's syncs are counted in a run of its own. On the simulator with CPU torch, (b) may wait on
    # the host for a prepare still running (streamrt.torch.order_after's host order); (a) makes no such call.
    assert xs["a"]["host_syncs_per_step"] == 0
    assert all(set(xs[v]["sync_kinds"]) <= {"Completion.wait"} for v in ("b", "b*", "b**"))
    assert "(b**) vs (b):" in run.stdout
    bad = _run_script("train_loop_bench", "--device", "cpu", "--b-star", "prefetch_groups=4")
    assert bad.returncode != 0 and "prefetch_groups" in bad.stderr


def test_the_loop_probe_names_the_gpu_idle_gaps_by_the_ops_around_them() -> None:
    """train_loop_bench's profile: each idle gap is charged to (the op that ended last before it -> the op that
    starts it), summed per pair over the window and divided by the steps, largest first."""
    pytest.importorskip("torch", reason="torch is not installed (make test installs torch==2.13.0, the CPU build)")
    sys.path.insert(0, str(SUITE))
    try:
        from _loop_probes import _idle_gaps
    finally:
        sys.path.remove(str(SUITE))
    ops = [(0.0, 10.0, "gemm"), (5.0, 12.0, "copy"), (20.0, 30.0, "softmax"), (31.0, 40.0, "gemm"), (50.0, 60.0, "softmax")]
    assert _idle_gaps(ops, steps=2) == [(5.0, 0.5, "gemm -> softmax"), (4.0, 0.5, "copy -> softmax"), (0.5, 0.5, "softmax -> gemm")]
    assert _idle_gaps([(0.0, 5.0, "a"), (1.0, 4.0, "b")], steps=1) == []  # no gap


def test_the_turns_reverse_their_order_every_cycle_and_the_last_takes_what_is_left() -> None:
    """train_loop_bench.turn_order: each variant ``turn`` steps at a time, a b c then c b a, so a drift of the host's
    speed during the round weighs on every variant alike; the breakdown takes its turns from it too."""
    pytest.importorskip("torch", reason="torch is not installed (make test installs torch==2.13.0, the CPU build)")
    sys.path.insert(0, str(SUITE))
    try:
        from train_loop_bench import turn_order
    finally:
        sys.path.remove(str(SUITE))
    assert list(turn_order("abc", 7, 3)) == [("a", 3), ("b", 3), ("c", 3), ("c", 3), ("b", 3), ("a", 3), ("a", 1), ("b", 1), ("c", 1)]
    assert list(turn_order(["a", "b"], 0, 10)) == []


def test_host_handover_times_a_python_host_calls_hand_over_beside_a_native_no_op(tmp_path: Path) -> None:
    out = tmp_path / "handover.json"
    run = _run_script("host_handover", "--backend", "sim", "--n", "6", "--rounds", "2", "--switch-us", "2,10", "--out", str(out))
    if run.returncode == 77:
        pytest.skip(run.stderr.strip().splitlines()[-1])
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text())["handover"]
    assert set(rows) == {
        "native no-op [main thread busy]",
        "worker, switch 2us [main thread busy]",
        "worker, switch 10us [main thread busy]",
        "worker, switch 5ms (not lowered) [main thread busy]",
        "native no-op [main thread asleep]",
        "worker, switch 2us [main thread asleep]",
        "worker, switch 10us [main thread asleep]",
    }
    assert all(row["n"] == 6 for row in rows.values())
    assert all(row["median_us"] > 0 for name, row in rows.items() if name.startswith("worker"))
    bad = _run_script("host_handover", "--backend", "sim", "--n", "7", "--rounds", "2")
    assert bad.returncode == 2 and "--n must be a positive multiple of --rounds" in bad.stderr
    bad = _run_script("host_handover", "--backend", "sim", "--switch-us", "0")
    assert bad.returncode == 2 and "must be positive" in bad.stderr


def test_prepare_in_loop_times_the_launch_pieces_per_variant_and_checks_the_metadata(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "prepare_in_loop.json"
    run = _run_script("prepare_in_loop", "--backend", "sim", "--device", "cpu", "--size", "xs", "--rounds", "1", "--turn", "3", "--out", str(out))
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert set(result["samples"]) == {"none", "fork", "deferred"}  # no native ops on the simulator: no "raw"
    assert all(len(xs) == 1 for pieces in result["samples"].values() for xs in pieces.values())
    assert result["verified"] == 4 and result["samples"]["none"]["prepare"][0] < result["samples"]["fork"]["prepare"][0]
    bad = _run_script("prepare_in_loop", "--backend", "sim", "--device", "cpu", "--turn", "1")
    assert bad.returncode == 2 and "--turn must be at least 2" in bad.stderr
