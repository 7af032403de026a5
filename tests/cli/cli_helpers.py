"""Running ``python -m streamrt`` in a subprocess, optionally with some modules made unimportable."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Runs `python -m streamrt ARGS` after making the modules in BLOCK unimportable (as if not installed).
_BOOT = (
    "import runpy, sys\n"
    "for name in sys.argv[1].split(','):\n"
    "    if name: sys.modules[name] = None\n"
    "sys.argv = ['streamrt', *sys.argv[2:]]\n"
    "runpy.run_module('streamrt', run_name='__main__', alter_sys=True)\n"
)


def run_cli(args: Sequence[str], *, block: Sequence[str] = (), cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m streamrt *args`` with the modules in ``block`` unimportable; output captured as text."""
    env = {**os.environ, "STREAMRT_PROGRESS": "0", "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-c", _BOOT, ",".join(block), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env, check=False)


def assert_user_error(status: int, err: str, prog: str, message: str) -> None:
    """Exit status 2, one line ``<prog>: error: ...`` (``prog``: ``streamrt <command>``) containing ``message``, no traceback."""
    assert status == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith(f"{prog}: error: ")]
    assert len(lines) == 1, err
    assert message in lines[0], err
