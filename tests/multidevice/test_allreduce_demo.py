"""demos/multi_gpu_allreduce.py: the simulated mode in CI, the GPU mode's exit without enough GPUs."""

from __future__ import annotations

import importlib.util
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "demos" / "multi_gpu_allreduce.py"


def _load_demo():
    spec = importlib.util.spec_from_file_location("multi_gpu_allreduce", DEMO)
    assert spec is not None and spec.loader is not None
    module = sys.modules.get(spec.name)
    if module is None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return module


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, str(DEMO), *args], capture_output=True, text=True, env=env, timeout=240, check=False)


def test_the_simulated_ring_all_reduce_moves_the_right_bytes_without_races_and_overlaps() -> None:
    demo = _load_demo()
    out = io.StringIO()
    status = demo.run_sim(3, 1, 2, 3, activation_mib=16, check_hazards=True, out=out)
    text = out.getvalue()
    assert status == 0, text
    assert "every device holds chunk c of rank c" in text
    assert "hazards found by the simulator: 0" in text
    assert "copy/compute overlap:" in text  # the study tools' report
    hidden = [line for line in text.splitlines() if "of the all-reduce hidden behind compute" in line]
    assert len(hidden) == 3
    for line in hidden:
        percent = int(line.rsplit("-> ", 1)[1].split("%")[0])
        assert percent > 0, line


def test_the_overlap_helper_measures_intersections() -> None:
    demo = _load_demo()
    assert demo._union([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]
    assert demo._intersection([(0, 3), (5, 8)], [(2, 6)]) == pytest.approx(2.0)
    assert demo.Overlap(10.0, 4.0, 2.5).hidden == pytest.approx(0.25)


def test_the_demo_runs_as_a_script_in_sim_mode() -> None:
    result = _run("--sim", "--steps", "1", "--buckets", "2", "--bucket-mib", "2", "--activation-mib", "8")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "every device holds chunk c of rank c" in result.stdout


def test_without_two_gpus_the_gpu_mode_says_why_and_exits_0() -> None:
    if os.environ.get("STREAMRT_DEMO_GPUS") == "1":
        pytest.skip("GPU runs of the demo are made by hand on multi-GPU machines")
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode == 0 and int(probe.stdout.strip() or 0) >= 2:
        pytest.skip("this machine has 2 or more GPUs: the GPU mode would run")
    result = _run("--steps", "1")
    assert result.returncode == 0, result.stderr
    assert "multi_gpu_allreduce:" in result.stdout
    assert "needs at least 2 GPUs" in result.stdout or "torch is not installed" in result.stdout


def test_multicast_stays_off_before_torch_is_imported() -> None:
    lines = DEMO.read_text().splitlines()
    first_torch = min(i for i, line in enumerate(lines) if "import torch" in line)
    nvls = lines.index('os.environ["NCCL_NVLS_ENABLE"] = "0"  # before torch (and NCCL) are imported: no NVLink SHARP / multicast')
    symm = lines.index('os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"')
    assert nvls < first_torch and symm < first_torch
