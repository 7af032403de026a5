"""The packages' type annotations are consistent: mypy over streamrt and allocators ([tool.mypy] in pyproject.toml)."""

from __future__ import annotations

from pathlib import Path

import pytest

# In the test dependency group; absent where only the GPU tests run (the lent GPU machine has no mypy).
api = pytest.importorskip("mypy.api", reason="mypy is not installed (make test installs it)")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_streamrt_and_allocators_type_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the config names the packages' folders
    stdout, stderr, status = api.run(["--cache-dir", str(tmp_path)])
    assert status == 0, stdout + stderr
