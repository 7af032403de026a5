"""Profiler ranges (streamrt._ranges): the switch, the nvtx package, roctx loaded with ctypes, nothing when absent."""

from __future__ import annotations

import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import streamrt as srt
from streamrt import _ranges


@pytest.fixture(autouse=True)
def fresh_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test loads the libraries anew (they are looked for once per process)."""
    monkeypatch.setattr(_ranges, "_loaded", {})


def test_the_switch_is_the_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, on in (("1", True), ("on", True), ("TRUE", True), ("0", False), ("", False), ("no", False)):
        monkeypatch.setenv(_ranges.ENV, value)
        assert _ranges.enabled() is on
    monkeypatch.delenv(_ranges.ENV)
    assert not _ranges.enabled()


def test_nothing_on_the_simulator_or_without_the_switch(monkeypatch: pytest.MonkeyPatch, sim_rt: srt.Runtime) -> None:
    monkeypatch.setenv(_ranges.ENV, "1")
    assert sim_rt.capabilities.profiler_ranges is None and _ranges.for_runtime(sim_rt) is None
    assert _ranges.load(None) is None and _ranges.load("itt") is None
    monkeypatch.delenv(_ranges.ENV)
    assert _ranges.for_runtime(sim_rt) is None


class FakeDomain:
    def __init__(self) -> None:
        self.log: list[Any] = []

    def get_event_attributes(self, *, message: str) -> tuple[str, str]:
        self.log.append(("attributes", message))
        return ("attr", message)

    def push_range(self, attributes: Any) -> None:
        self.log.append(("push", attributes[1]))

    def pop_range(self) -> None:
        self.log.append(("pop",))

    def mark(self, attributes: Any) -> None:
        self.log.append(("mark", attributes[1]))


def test_nvtx_package_ranges_in_the_streamrt_domain(monkeypatch: pytest.MonkeyPatch) -> None:
    domain = FakeDomain()
    asked: list[str] = []
    fake = types.ModuleType("nvtx")
    fake.get_domain = lambda name: asked.append(name) or domain  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nvtx", fake)
    ranges = _ranges.load("nvtx")
    assert ranges is not None and ranges.library == "nvtx" and asked == ["streamrt"]
    with ranges.range("memset"):
        ranges.mark("record")
    with pytest.raises(RuntimeError), ranges.range("memset"):  # closed on errors too
        raise RuntimeError
    # one attributes object per name, reused
    assert domain.log == [
        ("attributes", "memset"), ("push", "memset"), ("attributes", "record"), ("mark", "record"), ("pop",),
        ("push", "memset"), ("pop",),
    ]  # fmt: skip
    assert _ranges.load("nvtx") is ranges  # looked for once


def test_the_real_nvtx_package_works_without_a_profiler() -> None:
    pytest.importorskip("nvtx", reason="the nvtx package is not installed")
    ranges = _ranges.load("nvtx")
    assert ranges is not None
    with ranges.range("streamrt test range"):
        ranges.mark("streamrt test mark")


FAKE_ROCTX = r"""
#include <string.h>
static char last[256];
static int depth, marks;
int roctxRangePushA(const char *m) { strncpy(last, m, sizeof last - 1); return depth++; }
int roctxRangePop(void) { return --depth; }
void roctxMarkA(const char *m) { (void)m; marks++; }
const char *fake_last(void) { return last; }
int fake_depth(void) { return depth; }
int fake_marks(void) { return marks; }
"""


def test_roctx_is_loaded_lazily_from_rocm_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import ctypes

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler to build a stand-in libroctx64.so")
    (tmp_path / "lib").mkdir()
    src = tmp_path / "roctx.c"
    src.write_text(FAKE_ROCTX)
    lib_path = tmp_path / "lib" / "libroctx64.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib_path), str(src)], check=True)
    monkeypatch.setenv("ROCM_PATH", str(tmp_path))
    ranges = _ranges.load("roctx")
    assert ranges is not None and ranges.library == "roctx"
    probe = ctypes.CDLL(str(lib_path))
    probe.fake_last.restype = ctypes.c_char_p
    ranges.push("pipeline prepare: pack")
    assert probe.fake_depth() == 1 and probe.fake_last() == b"pipeline prepare: pack"
    ranges.mark("record")
    ranges.pop()
    assert probe.fake_depth() == 0 and probe.fake_marks() == 1


def test_absent_roctx_gives_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import ctypes.util

    if ctypes.util.find_library("roctx64") or Path("/opt/rocm/lib/libroctx64.so").exists():
        pytest.skip("a real roctx is installed here")
    monkeypatch.setenv("ROCM_PATH", str(tmp_path))  # nothing there
    assert _ranges.load("roctx") is None
    assert _ranges._loaded == {"roctx": None}  # looked for once: later calls cost a dict lookup


class _Recorder:
    """A Ranges stand-in: records (thread, "push"/"pop", name)."""

    def __init__(self) -> None:
        import threading

        self.events: list[tuple[str, str, str | None]] = []
        self._threading = threading

    def push(self, name: str) -> None:
        self.events.append((self._threading.current_thread().name, "push", name))

    def pop(self) -> None:
        self.events.append((self._threading.current_thread().name, "pop", None))

    import contextlib as _contextlib

    @_contextlib.contextmanager
    def range(self, name: str):  # type: ignore[no-untyped-def]
        self.push(name)
        try:
            yield
        finally:
            self.pop()

    def names(self) -> list[str]:
        return [n for _, kind, n in self.events if kind == "push" and n is not None]

    def balanced(self) -> bool:
        depth: dict[str, int] = {}
        for thread, kind, _ in self.events:
            depth[thread] = depth.get(thread, 0) + (1 if kind == "push" else -1)
            if depth[thread] < 0:
                return False
        return all(d == 0 for d in depth.values())


@pytest.mark.parametrize("traced", [False, True], ids=["ranges-only", "with-a-trace"])
def test_ranges_mark_ops_pipeline_nodes_and_host_functions(monkeypatch: pytest.MonkeyPatch, traced: bool) -> None:
    import streamrt as srt
    from streamrt import _trace_backend, _tracer

    recorder = _Recorder()
    monkeypatch.setattr(_trace_backend, "for_runtime", lambda rt: recorder)
    monkeypatch.setattr(_tracer, "for_runtime", lambda rt: recorder)
    with srt.open_runtime("sim", trace=traced) as rt:
        s = rt.create_stream()
        d = rt.device_allocator.allocate(64, stream=s)
        h = rt.host_allocator.allocate(64)
        s.memset(d, 1)
        p = srt.Pipeline("prep")
        p.copy(dst=h, src=d, name="d2h")

        def pack() -> None:
            pass

        p.host(pack, reads=[h], name="pack")
        p.launch(s).result(10)
        s.synchronize()
    names = recorder.names()
    assert "memset" in names and "stream.synchronize" in names
    assert "prep: d2h" in names  # a launch labels its nodes ops
    assert "prep: host pack" in names  # the Python function's run, on its worker thread
    assert recorder.balanced()
