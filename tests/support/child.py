"""Running a risky case in a child interpreter, so that a hang or a crash fails the test instead of CI."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ChildResult:
    returncode: int
    stdout: str
    stderr: str

    def describe(self) -> str:
        return f"exit status {self.returncode}\n--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-4000:]}"


def run_child(code: str, *, timeout: float = 120.0, env: dict[str, str] | None = None) -> ChildResult:
    """Run ``code`` (dedented) in a fresh interpreter from the repository root; ``faulthandler`` is on.

    A child still running after ``timeout`` seconds is killed (its tracebacks are dumped first) and
    reported as exit status ``-9``. Never raises for what the child did.
    """
    source = "import faulthandler, sys\nfaulthandler.enable()\n" + textwrap.dedent(code)
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    child_env.update(env or {})
    proc = subprocess.Popen(
        [sys.executable, "-X", "faulthandler", "-c", source],
        cwd=ROOT,
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return ChildResult(proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        if hasattr(proc, "send_signal"):
            import signal

            proc.send_signal(signal.SIGABRT)  # faulthandler dumps every thread's stack
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        return ChildResult(-9, out, err + f"\n[killed: still running after {timeout} s]")


def assert_clean(result: ChildResult, *, marker: str = "OK") -> None:
    """The child exited 0, printed ``marker`` on its last line and logged no error."""
    assert result.returncode == 0, result.describe()
    lines = result.stdout.strip().splitlines()
    assert lines and lines[-1] == marker, result.describe()
    for bad in ("Traceback", "Fatal Python error", "never retrieved", "never ran"):
        assert bad not in result.stderr, result.describe()
