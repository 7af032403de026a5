"""The prepare benchmarks (train_step, enqueue_cost, device_prepare) run every variant on the simulator
and check the metadata each produced.

Not a timing test: the simulator's figures are virtual. What is asserted is that every variant
(Python and native packs, the raw floors) runs to the end and leaves the reference metadata.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from streamrt.recipes.fmha_bwd import native_pack_available

BENCH = Path(__file__).resolve().parents[2] / "demos" / "bench"


@pytest.fixture
def bench_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModuleType, ModuleType]]:
    monkeypatch.syspath_prepend(str(BENCH))
    import enqueue_cost
    import train_step

    yield train_step, enqueue_cost
    for name in ("train_step", "enqueue_cost", "device_prepare"):
        sys.modules.pop(name, None)


def test_train_step_runs_every_variant_and_the_metadata_matches(bench_modules: tuple[ModuleType, ModuleType], tmp_path: Path) -> None:
    train_step, _ = bench_modules
    out = tmp_path / "train_step.json"
    assert train_step.main(["--backend", "sim", "--rounds", "1", "--steps", "2", "--warmup", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["metadata_matches_reference"]
    expected = set(train_step.VARIANTS) | (set(train_step.NATIVE_VARIANTS) if native_pack_available() else set())
    assert set(result["summary"]) == expected


def test_enqueue_cost_runs_every_column(bench_modules: tuple[ModuleType, ModuleType], tmp_path: Path) -> None:
    _, enqueue_cost = bench_modules
    out = tmp_path / "enqueue.json"
    assert enqueue_cost.main(["--backend", "sim", "--rounds", "1", "--calls", "3", "--warmup", "1", "--split", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    native = [*enqueue_cost.NATIVE_COLUMNS, "raw fork native"] if native_pack_available() else []  # the native fork is compiled
    expected = list(enqueue_cost.COLUMNS) + native
    assert result["columns"] == expected
    assert all(result["summary_us"]["idle"][c] > 0 for c in expected)
    assert set(result["split_us"]) == {c for c in expected if not c.startswith("raw")}


@pytest.mark.parametrize("deterministic", [False, True])
def test_device_prepare_runs_every_variant_and_the_metadata_matches(
    bench_modules: tuple[ModuleType, ModuleType], tmp_path: Path, deterministic: bool
) -> None:
    import device_prepare

    out = tmp_path / "device_prepare.json"
    argv = ["--backend", "sim", "--rounds", "1", "--steps", "2", "--warmup", "1", "--latency-reps", "2", "--sleep-reps", "1"]
    assert device_prepare.main(argv + (["--deterministic"] if deterministic else []) + ["--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["metadata_matches_reference"]
    assert set(result["train_step"]["summary"]) == set(device_prepare.STEP_VARIANTS) - {"torch_standin"}  # no torch GPU here
    assert len(result["prepare_grids"]) == (2 if deterministic else 1)  # the prezero kernel when deterministic
