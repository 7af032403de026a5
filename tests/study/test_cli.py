"""The ``streamrt`` command, run in-process: demo, study, doctor, bench, calibrate (errors and the progress bar: tests/cli)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from study_helpers import check_chrome_trace, png_size

import streamrt as srt
from streamrt._backends.sim import SimProfile
from streamrt._cli import doctor as _doctor
from streamrt._cli import main
from streamrt._cli.calibrate import calibrate
from streamrt._errors import BackendUnavailableError
from streamrt.recipes.fmha_bwd import native_pack_available


def test_demo_runs_end_to_end_on_sim(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["demo", "--backend", "sim", "--out-dir", str(tmp_path), "--json", str(tmp_path / "demo.json")])
    out = capsys.readouterr().out
    assert status == 0, out
    for name in ("none", "sync", "stream", "fork", "graph"):
        assert any(line.startswith(name) for line in out.splitlines()), name
    assert "skipping" in out or "device" in out  # device-pack runs or says why it cannot
    assert "ui.perfetto.dev" in out and "chrome://tracing" in out
    doc = json.loads((tmp_path / "trace.json").read_text())
    check_chrome_trace(doc)
    assert len(doc["otherData"]["traces"]) >= 5
    res = json.loads((tmp_path / "demo.json").read_text())
    rows = {r["name"]: r for r in res["results"]}
    assert all(r["correct"] for r in rows.values())
    # what the strategies are known for: sync blocks the host; a host function on the
    # stream costs it GPU time; the side stream hides the round trip
    assert rows["sync"]["host_blocked_us"] > 50 and rows["stream"]["host_blocked_us"] == 0
    assert rows["stream"]["added_us"] > rows["fork"]["added_us"] + 40
    assert rows["stream"]["bubble_causes"]["host_function"] > 0
    assert rows["sync"]["bubble_causes"]["host"] > 0
    if native_pack_available():  # one native host function costs the stream less than a Python one's two
        assert rows["stream_native"]["added_us"] < rows["stream"]["added_us"] - 20
        assert rows["graph_native"]["added_us"] < rows["graph"]["added_us"] - 20
        assert rows["stream_native"]["host_blocked_us"] == 0
    if png_ok():
        w, h = png_size((tmp_path / "timeline.png").read_bytes())
        assert w > 800 and h > 400


def png_ok() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_doctor_on_a_machine_without_a_gpu(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """With both GPU backends unavailable, doctor says why and how for each, and that sim works."""
    real_probe, real_load = _doctor.probe_backend, _doctor.load_backend
    reasons = {"cuda": "no CUDA device: cudaErrorNoDevice", "hip": "hip-python is not installed"}

    def probe(name: str) -> str | None:
        return reasons.get(name) if name in reasons else real_probe(name)

    def load(name: str, **kw: object) -> object:
        if name in reasons:
            raise BackendUnavailableError(f"backend {name!r} is not available: {reasons[name]}. Install the thing for {name}")
        return real_load(name, **kw)

    monkeypatch.setattr(_doctor, "probe_backend", probe)
    monkeypatch.setattr(_doctor, "load_backend", load)
    monkeypatch.setattr(_doctor, "select_auto", lambda: "sim")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "cuda   missing  why: no CUDA device: cudaErrorNoDevice" in out
    assert "how: Install the thing for cuda" in out and "how: Install the thing for hip" in out
    assert "sim    ok" in out and "no GPU backend is usable here" in out
    assert "open_runtime('auto') picks: sim" in out
    assert main(["doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    by_name = {b["name"]: b for b in data["backends"]}
    assert not by_name["cuda"]["usable"] and by_name["cuda"]["how"] and by_name["sim"]["usable"]
    assert by_name["sim"]["devices"][0]["is_simulated"]


def test_doctor_real_probe_lists_every_backend_and_library() -> None:
    report = _doctor.diagnose()
    assert [b.name for b in report.backends] == ["hip", "cuda", "sim"]
    for b in report.backends:
        assert b.usable or (b.why and b.how), b
    assert any(lib.name == "matplotlib" for lib in report.libraries)
    assert "optional libraries" in str(report)


@pytest.mark.parametrize("native", [True, False])
def test_doctor_says_when_the_allocators_hot_path_is_not_built(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    from allocators import _fastpath

    monkeypatch.setattr(_fastpath, "NATIVE", native)
    text = str(_doctor.diagnose(backends=("sim",)))
    assert ("the caching allocators run their hot path in Python" in text) is not native


def test_demo_skips_the_native_strategies_without_the_c_pack(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamrt._cli import demo as _demo
    from streamrt.recipes.fmha_bwd import native

    monkeypatch.setattr(native, "native_pack_unavailable_reason", lambda: "_pack_c was not built (test)")
    infos = {i.name: i for i in _demo.discover_strategies()}
    for name in ("stream_native", "graph_native"):
        assert not infos[name].available and "_pack_c was not built (test)" in infos[name].note
    assert infos["stream"].available and infos["graph"].available


@pytest.mark.parametrize("reason", [None, "streamrt.recipes.fmha_bwd._pack_c was not built (test)"])
def test_doctor_says_when_the_native_fmha_pack_is_not_built(monkeypatch: pytest.MonkeyPatch, reason: str | None) -> None:
    from streamrt.recipes.fmha_bwd import native

    monkeypatch.setattr(native, "native_pack_unavailable_reason", lambda: reason)
    text = str(_doctor.diagnose(backends=("sim",)))
    assert ("has no native pack" in text) is (reason is not None)
    assert reason is None or reason in text


def test_study_runs_a_script_traced_and_writes_the_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "user_script.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import streamrt as srt
            assert sys.argv[1:] == ["--steps", "2"]
            rt = srt.open_runtime("sim")
            s = rt.create_stream(name="mine")
            d = rt.device_allocator.allocate(1 << 20, stream=s)
            h = rt.host_allocator.allocate(1 << 20)
            for _ in range(2):
                s.copy(h, d)
                s.synchronize()
            # the runtime is left open: study finishes its trace
            """
        )
    )
    status = main(["study", "--out-dir", str(tmp_path), str(script), "--steps", "2"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "stream.synchronize" in out and "mine" in out
    doc = json.loads((tmp_path / "trace.json").read_text())
    check_chrome_trace(doc)
    assert any(e["name"] == "thread_name" and e["args"]["name"] == "mine" for e in doc["traceEvents"])
    if png_ok():
        png_size((tmp_path / "timeline.png").read_bytes())


def test_study_of_a_failing_script_still_writes_what_was_traced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "failing.py"
    script.write_text(
        "import streamrt as srt\n"
        "with srt.open_runtime('sim') as rt:\n"
        "    s = rt.create_stream()\n"
        "    s.memset(rt.device_allocator.allocate(64, stream=s), 0)\n"
        "raise RuntimeError('user bug')\n"
    )
    assert main(["study", "--out-dir", str(tmp_path), "--no-plot", str(script)]) == 1
    assert "RuntimeError: user bug" in capsys.readouterr().err
    assert (tmp_path / "trace.json").exists()


def test_calibrate_recovers_the_simulators_own_profile(tmp_path: Path) -> None:
    """Calibrating the simulator must give back the profile it runs with: the procedure is right."""
    target = SimProfile(h2d_gbps=40.0, d2h_gbps=30.0, memset_gbps=1500.0, host_func_us=35.0, op_gap_us=3.0, op_fixed_us=1.5,
                        launch_latency_us=8.0, sync_wake_us=6.0, api_call_us=1.5, python_host_call_us=30.0)  # fmt: skip
    with srt.open_runtime("sim", profile=target) as rt:
        cal = calibrate(rt, repeats=1)
    got = cal.profile
    for name in ("h2d_gbps", "d2h_gbps", "memset_gbps", "d2d_gbps", "h2h_gbps", "host_func_us", "op_gap_us", "op_fixed_us",
                 "launch_latency_us", "sync_wake_us", "api_call_us", "event_record_us"):  # fmt: skip
        assert getattr(got, name) == pytest.approx(getattr(target, name), rel=0.02, abs=1e-3), name
    assert "calibrated" in got.name
    # a no-op Python function also takes a few real microseconds, which the simulator charges
    assert target.python_host_call_us <= got.python_host_call_us < target.python_host_call_us + 20.0
    assert got.charge_host_time is False  # calibrating a simulator keeps its times deterministic


def test_calibrate_command_writes_a_profile_the_simulator_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "h.json"
    assert main(["calibrate", "--backend", "sim", "--quick", "--out", str(path)]) == 0
    assert "h2d_gbps" in capsys.readouterr().out
    loaded = SimProfile.from_json(str(path))
    assert loaded.h2d_gbps == pytest.approx(55.0, rel=0.02)
    with srt.open_runtime("sim", profile=str(path)) as rt:
        assert rt.backend.profile == loaded


def test_bench_runs_the_suite_and_writes_json_and_markdown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "good.py").write_text(
        "import argparse, json\n"
        "ap = argparse.ArgumentParser(); ap.add_argument('--backend'); ap.add_argument('--out')\n"
        "a = ap.parse_args()\n"
        "json.dump({'backend': a.backend, 'results': {'memset': {'raw_us': 1.5, 'streamrt_us': 2.0}}}, open(a.out, 'w'))\n"
    )
    (suite / "bad.py").write_text("raise SystemExit('broken benchmark')\n")
    out_dir = tmp_path / "out"
    assert main(["bench", "--backend", "sim", "--suite", str(suite), "--out-dir", str(out_dir)]) == 1
    report = json.loads((out_dir / "bench.json").read_text())
    assert report["benchmarks"]["good"]["status"] == "ok"
    assert report["benchmarks"]["good"]["result"]["backend"] == "sim"
    assert report["benchmarks"]["bad"]["status"] == "failed" and "broken benchmark" in report["benchmarks"]["bad"]["output"]
    md = (out_dir / "bench.md").read_text()
    assert "## good" in md and "| results.memset | 1.500 | 2.000 |" in md
    capsys.readouterr()
    assert main(["bench", "--backend", "sim", "--suite", str(suite), "--out-dir", str(out_dir), "--only", "good"]) == 0
    capsys.readouterr()
    assert main(["bench", "--suite", str(suite), "--out-dir", str(out_dir), "--only", "missing"]) == 2
    assert "streamrt bench: error: --only: no benchmark named 'missing'" in capsys.readouterr().err
