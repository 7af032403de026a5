"""The command line fails like a tool: a user's mistake is one ``streamrt <command>: error:`` line and exit 2.

Internal errors are one line with exit status 1 and a pointer to ``--debug``,
which prints the traceback. Most cases run through ``main(argv)``; a few run
``python -m streamrt`` in a subprocess to check what the interpreter prints.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import REPO, assert_user_error, run_cli

import streamrt
from streamrt._backends import probe_backend
from streamrt._cli import doctor, main


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """Inputs for the cases: a plain file (a folder cannot be made under it), bad JSON, and more."""
    paths = {
        "file": tmp_path / "a-file",
        "bad_json": tmp_path / "bad.json",
        "list_json": tmp_path / "list.json",
        "not_profile": tmp_path / "not-profile.json",
        "gpu_demo": tmp_path / "gpu.json",
        "sim_demo": tmp_path / "sim.json",
        "suite": tmp_path / "suite",
    }
    paths["file"].write_text("x")
    paths["bad_json"].write_text("{")
    paths["list_json"].write_text("[1]")
    paths["not_profile"].write_text('{"h2d_gbps": "fast"}')
    rows = [{"name": "none", "step_us": 100.0, "added_us": 0.0}, {"name": "sync", "step_us": 150.0, "added_us": 50.0}]
    paths["gpu_demo"].write_text(json.dumps({"clock": "events", "results": rows}))
    paths["sim_demo"].write_text(json.dumps({"clock": "virtual", "results": [{"name": "none"}]}))  # rows without figures
    paths["suite"].mkdir()
    (paths["suite"] / "only_one.py").write_text("raise SystemExit(0)\n")
    out = {k: str(v) for k, v in paths.items()}
    out["tmp"] = str(tmp_path)
    return out


# (argv with {placeholders} from `files`, the command, a part of the error line)
CASES = [
    # the cases of the issue
    ("demo --backend bogus", "demo", "argument --backend: invalid choice: 'bogus' (choose from 'auto', 'hip', 'cuda', 'sim')"),
    ("demo --steps -1", "demo", "argument --steps: must be a positive integer, got -1"),
    ("demo --steps 0", "demo", "argument --steps: must be a positive integer, got 0"),
    ("demo --compute-ops 0", "demo", "argument --compute-ops: must be a positive integer, got 0"),
    ("demo --profile {tmp}/missing.json", "demo", "missing.json': no such file"),
    ("demo --out-dir {file}/sub", "demo", "--out-dir '{file}/sub' cannot be created: Not a directory"),
    ("fidelity {tmp}/nope.json {sim_demo}", "fidelity", "the GPU result '{tmp}/nope.json': no such file"),
    ("bench --only nosuch", "bench", "--only: no benchmark named 'nosuch' in"),
    # found by trying each command with bad input
    ("demo --rounds 0", "demo", "argument --rounds: must be a positive integer, got 0"),
    ("demo --warmup -1", "demo", "argument --warmup: must be an integer >= 0, got -1"),
    ("demo --trace-steps 0", "demo", "argument --trace-steps: must be a positive integer, got 0"),
    ("demo --compute-mib 0", "demo", "argument --compute-mib: must be a positive integer, got 0"),
    ("demo --compute-us -1", "demo", "argument --compute-us: must be a number >= 0, got '-1'"),
    ("demo --compute-us nan", "demo", "argument --compute-us: must be a number >= 0, got 'nan'"),
    ("demo --steps many", "demo", "argument --steps: must be a positive integer, got 'many'"),
    ("demo --profile {bad_json}", "demo", "is not a JSON file"),
    ("demo --profile {not_profile}", "demo", "is not a simulator profile: SimProfile.h2d_gbps must be a finite number"),
    ("demo --profile {tmp}", "demo", "is a directory, not a file"),
    ("demo --backend hip --profile {not_profile}", "demo", "--profile configures the simulator: use it with --backend sim, not hip"),
    ("demo --out-dir {file}", "demo", "--out-dir '{file}' is a file, not a folder"),
    ("demo --json {file}/x.json", "demo", "--json '{file}/x.json': the folder '{file}' is a file, not a folder"),
    ("demo --json {tmp}", "demo", "--json '{tmp}' is a directory, not a file"),
    ("study {tmp}/nope.py", "study", "'{tmp}/nope.py': no such file"),
    ("study {tmp}", "study", "'{tmp}' is not a file"),
    ("study --out-dir {file}/x {file}", "study", "--out-dir '{file}/x' cannot be created"),
    ("calibrate --backend sim --device 3", "calibrate", "device 3 does not exist: the sim backend has 1 device(s)"),
    ("calibrate --device -1", "calibrate", "argument --device: must be an integer >= 0, got -1"),
    ("calibrate --repeats 0", "calibrate", "argument --repeats: must be a positive integer, got 0"),
    ("calibrate --backend sim --out {file}/p.json", "calibrate", "--out '{file}/p.json': the folder '{file}' is a file, not a folder"),
    ("bench --suite {tmp}/none", "bench", "--suite '{tmp}/none' is not a folder"),
    ("bench --suite {suite} --only nosuch --only other", "bench", "no benchmark named 'nosuch', 'other' in {suite} (have: only_one)"),
    ("bench --timeout 0", "bench", "argument --timeout: must be a positive number, got '0'"),
    ("bench --suite {suite} --out-dir {file}", "bench", "--out-dir '{file}' is a file, not a folder"),
    ("fidelity {bad_json} {sim_demo}", "fidelity", "the GPU result '{bad_json}' is not a JSON file"),
    ("fidelity {list_json} {sim_demo}", "fidelity", "the GPU file is not a `streamrt demo --json` result (a JSON list, not an object)"),
    ("fidelity {sim_demo} {sim_demo}", "fidelity", "the GPU file comes from the simulator"),
    ("fidelity {gpu_demo} {sim_demo}", "fidelity", "the simulator file is not a `streamrt demo --json` result"),
    ("fidelity {gpu_demo} {sim_demo} --tolerance 0", "fidelity", "argument --tolerance: must be a positive number, got '0'"),
]


@pytest.mark.parametrize(("argv", "command", "message"), CASES, ids=[c[0] for c in CASES])
def test_a_mistake_is_one_error_line_and_exit_status_2(
    argv: str, command: str, message: str, files: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    status = main([part.format(**files) for part in argv.split()])
    captured = capsys.readouterr()
    assert_user_error(status, captured.err, f"streamrt {command}", message.format(**files))
    assert "Traceback" not in captured.out


def test_a_calibration_with_an_unwritable_profile_stops_before_it_measures(files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--backend", "sim", "--out", f"{files['file']}/p.json"]) == 2
    assert "calibrating" not in capsys.readouterr().out


def test_no_command_or_an_unknown_one_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert_user_error(main([]), capsys.readouterr().err, "streamrt", "the following arguments are required: command")
    assert_user_error(main(["nosuch"]), capsys.readouterr().err, "streamrt", "invalid choice: 'nosuch'")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"streamrt {streamrt.__version__}"
    proc = run_cli(["--version"])
    assert proc.returncode == 0 and proc.stdout.strip() == f"streamrt {streamrt.__version__}", proc.stderr
    script = Path(sys.executable).parent / "streamrt"  # the console script, where pip installed streamrt
    if script.exists():
        proc = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0 and proc.stdout.strip() == f"streamrt {streamrt.__version__}", proc.stderr


@pytest.mark.parametrize("backend", ["cuda", "hip"])
def test_a_backend_without_its_bindings_says_what_is_missing_and_how_to_install_it(backend: str, tmp_path: Path) -> None:
    """The bindings are made unimportable in the subprocess, so the case is the same on every machine."""
    block = ["cuda", "cuda.bindings"] if backend == "cuda" else ["hip", "rocm"]
    library = "cuda-bindings" if backend == "cuda" else "hip-python"
    never = tmp_path / "never-made"
    for command, out in (("demo", "--out-dir"), ("calibrate", "--out"), ("bench", "--out-dir")):
        proc = run_cli([command, "--backend", backend, out, str(never)], block=block)
        assert_user_error(proc.returncode, proc.stderr, f"streamrt {command}", f"backend {backend!r} is not available: {library} is not installed")
        assert f"pip install 'streamrt[{backend}]'" in proc.stderr
        assert not never.exists()  # nothing was made before the backend was found missing


@pytest.mark.skipif(probe_backend("cuda") is None, reason="cuda is usable here: `--backend cuda` is no mistake")
def test_backend_cuda_where_it_cannot_run_is_a_user_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert_user_error(main(["demo", "--backend", "cuda", "--out-dir", str(tmp_path)]), capsys.readouterr().err, "streamrt demo", "backend 'cuda' is not available")


def test_the_interpreter_prints_no_traceback_for_a_mistake(tmp_path: Path) -> None:
    for argv, command, message in (
        (["demo", "--backend", "bogus"], "demo", "invalid choice: 'bogus'"),
        (["demo", "--steps", "0"], "demo", "must be a positive integer, got 0"),
        (["fidelity", "nope.json", "nope.json"], "fidelity", "'nope.json': no such file"),
    ):
        proc = run_cli(argv, cwd=tmp_path)
        assert_user_error(proc.returncode, proc.stderr, f"streamrt {command}", message)


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_of_a_mistake(where: str, tmp_path: Path) -> None:
    argv = ["fidelity", "nope.json", "nope.json"]
    proc = run_cli(["--debug", *argv] if where == "before" else [*argv, "--debug"], cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback (most recent call last)" in proc.stderr and "FileNotFoundError" in proc.stderr
    assert proc.stderr.rstrip().endswith("streamrt fidelity: error: the GPU result 'nope.json': no such file")


def _bug(**_kwargs: object) -> int:
    return 1 // 0


def test_an_internal_error_is_one_line_with_exit_status_1(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(doctor, "run_doctor", _bug)
    assert main(["doctor"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip() == (
        "streamrt doctor: internal error: ZeroDivisionError: integer division or modulo by zero "
        "(a bug in streamrt; run with --debug for the traceback)"
    )
    assert main(["doctor", "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "in _bug" in err
    assert err.rstrip().endswith("streamrt doctor: internal error: ZeroDivisionError: integer division or modulo by zero")


def test_an_operating_system_error_on_the_way_is_an_error_with_exit_status_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def full(**_kwargs: object) -> int:
        raise OSError(28, "No space left on device", "trace.json")

    monkeypatch.setattr(doctor, "run_doctor", full)
    assert main(["doctor"]) == 1
    assert capsys.readouterr().err.strip() == "streamrt doctor: error: [Errno 28] No space left on device: 'trace.json'"


def test_ctrl_c_ends_quietly_with_status_130(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(**_kwargs: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(doctor, "run_doctor", interrupted)
    assert main(["doctor"]) == 130
    assert capsys.readouterr().err.strip() == "streamrt doctor: interrupted"


def test_a_reader_that_goes_away_is_no_error() -> None:
    """``streamrt doctor | head -1``: the pipe closes before doctor writes; no traceback, no 'Exception ignored'."""
    env_cmd = [sys.executable, "-m", "streamrt", "doctor"]
    proc = subprocess.Popen(env_cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 1
    assert "Traceback" not in err and "Exception ignored" not in err, err
