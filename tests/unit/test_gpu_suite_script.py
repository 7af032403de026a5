"""tools/gpu_suite.sh exits with pytest's status: a suite that failed, or never ran, is not a success."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "gpu_suite.sh"


def _run(tmp_path: Path, *pytest_args: str) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: fake'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable) if not (bin_dir / "python3").exists() else None
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    work = tmp_path / "work"  # not the checkout: a .whl/ folder there would be installed first
    work.mkdir(exist_ok=True)
    return subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out"), "tests", *pytest_args],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )


@pytest.fixture
def cases(tmp_path: Path) -> Path:
    d = tmp_path / "cases"
    d.mkdir()
    (d / "test_pass.py").write_text("def test_ok():\n    assert True\n")
    (d / "test_fail.py").write_text("def test_bad():\n    assert False\n")
    return d


def test_exit_status_is_zero_when_the_tests_pass(tmp_path: Path, cases: Path) -> None:
    result = _run(tmp_path, str(cases / "test_pass.py"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_exit_status_is_pytests_when_a_test_fails(tmp_path: Path, cases: Path) -> None:
    result = _run(tmp_path, str(cases / "test_fail.py"))
    assert result.returncode == 1, result.stdout + result.stderr


def test_exit_status_is_nonzero_when_pytest_cannot_start(tmp_path: Path, cases: Path) -> None:
    result = _run(tmp_path, "-p", "no_such_plugin_anywhere", str(cases / "test_pass.py"))
    assert result.returncode != 0, result.stdout + result.stderr
