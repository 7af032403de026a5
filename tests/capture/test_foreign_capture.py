"""Recording into a capture another library began (played by the backend's own begin/end capture calls).

On the GPU backends this is a raw ``cudaStreamBeginCapture`` / ``hipStreamBeginCapture``
(through the HIP-on-CUDA forwarding library on NVIDIA machines); the graph's
lifetime is the test's, as it would be torch's or CuPy's.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from collections.abc import Iterator

import numpy as np
import pytest

import streamrt as srt
from streamrt import _graph_release

N = 64


def _wait_for_releases(rt: srt.Runtime, before: int, timeout: float = 10.0) -> None:
    """Until the destructors of destroyed graphs have come back (they run on a driver thread)."""
    deadline = time.monotonic() + timeout
    while _graph_release.pending_releases() > before:
        assert time.monotonic() < deadline, "a destroyed graph's user object was never released"
        time.sleep(0.005)
    rt.releaser.drain()
    gc.collect()


def _slot_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("streamrt-slot-") and t.is_alive())


class _Foreign:
    """Another library's capture on ``stream``: begun with the backend directly, ended into a graph it owns."""

    def __init__(self, rt: srt.Runtime, stream: srt.Stream, mode: srt.CaptureMode = srt.CaptureMode.THREAD_LOCAL) -> None:
        self.backend = rt.backend
        self.stream = stream
        self.graph = self.exec = 0
        self.backend.stream_begin_capture(stream.handle, mode)

    def end(self) -> None:
        self.graph = self.backend.stream_end_capture(self.stream.handle)
        self.exec = self.backend.graph_instantiate(self.graph)

    def replay(self) -> None:
        self.backend.graph_launch(self.exec, self.stream.handle)
        self.backend.stream_synchronize(self.stream.handle)

    def destroy(self) -> None:
        if self.exec:
            self.backend.graph_exec_destroy(self.exec)
        if self.graph:
            self.backend.graph_destroy(self.graph)
        self.graph = self.exec = 0


@pytest.fixture
def needs_release_queue() -> Iterator[None]:
    reason = _graph_release.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    yield


def _triple(rt: srt.Runtime, s: srt.Stream, marker: object) -> tuple[srt.Pipeline, srt.Buffer, srt.Buffer]:
    inp = rt.device_allocator.allocate(N * 4, stream=s)
    out = rt.device_allocator.allocate(N * 4, stream=s)
    stage_in, stage_out = rt.host_allocator.allocate(N * 4), rt.host_allocator.allocate(N * 4)
    p = srt.Pipeline("triple")
    p.copy(dst=stage_in, src=inp)
    p.host(lambda a, b, _m: np.multiply(a.numpy(np.int32), 3, out=b.numpy(np.int32)), stage_in, stage_out, marker, reads=[stage_in], writes=[stage_out], name="x3")
    p.copy(dst=out, src=stage_out)
    return p, inp, out


def test_a_foreign_capture_receives_a_pipeline_launch_and_a_host_function(rt: srt.Runtime, needs_release_queue: None) -> None:
    s = rt.create_stream()

    class Marker:
        pass

    marker = Marker()
    ref = weakref.ref(marker)
    p, inp, out = _triple(rt, s, marker)
    src, result = rt.host_allocator.allocate(N * 4), rt.host_allocator.allocate(N * 4)
    seen: list[int] = []
    pending = _graph_release.pending_releases()
    slots = _slot_threads()  # graphs of earlier tests may still hold theirs
    foreign = _Foreign(rt, s)
    try:
        s.copy(inp, src)
        run = p.launch(s)
        s.copy(result, out)
        done = s.launch_host_func(lambda buf: seen.append(int(buf.numpy(np.int32)[0])), result)
        foreign.end()
    except BaseException:
        foreign.destroy()
        raise
    for c in (run, done):
        assert c.is_done
        with pytest.raises(srt.CaptureError, match="another library is capturing"):
            c.result()
    assert _graph_release.pending_releases() == pending + 2  # one tie per recorded call
    del p, marker, run, done
    gc.collect()
    assert ref() is not None  # held for the foreign graph
    rng = np.random.default_rng(11)
    for i in range(20):
        values = rng.integers(-100, 100, N, dtype=np.int32)
        src.numpy(np.int32)[:] = values
        foreign.replay()
        assert np.array_equal(result.numpy(np.int32), values * 3), f"replay {i}"
        assert seen[-1] == values[0] * 3 and len(seen) == i + 1
    assert _slot_threads() == slots + 2  # the pipeline's host node and the host function
    foreign.destroy()
    _wait_for_releases(rt, pending)
    assert ref() is None
    assert _slot_threads() == slots  # both host slots stopped
    s.memset(inp, 0)  # the stream is an ordinary stream again
    s.synchronize()


def test_staging_released_inside_the_capture_returns_to_the_cache_once_the_graph_is_destroyed(
    rt: srt.Runtime, needs_release_queue: None
) -> None:
    s = rt.create_stream()
    dst = rt.device_allocator.allocate(N, stream=s)
    rt.host_allocator.allocate(N).release()  # a free block the capture's implicit pool can take
    s.synchronize()
    stats = rt.host_allocator.statistics
    pooled, cached = stats().capture_pool_bytes, stats().cached_bytes
    pending = _graph_release.pending_releases()
    foreign = _Foreign(rt, s)
    try:
        stage = rt.host_allocator.allocate(N, stream=s)  # an implicit capture pool (the stream is capturing)
        p = srt.Pipeline("stage")
        p.memset(stage, 7)
        p.copy(dst=dst, src=stage)
        p.launch(s)  # takes the stream's implicit pool for the foreign graph
        stage.release()
        foreign.end()
    except BaseException:
        foreign.destroy()
        raise
    assert stats().capture_pool_bytes > pooled
    foreign.replay()
    foreign.replay()
    foreign.destroy()
    _wait_for_releases(rt, pending)
    assert stats().capture_pool_bytes == pooled
    assert stats().cached_bytes == cached
    out = rt.host_allocator.allocate(N)
    s.copy(out, dst)
    s.synchronize()
    assert (out.numpy() == 7).all()


def test_without_the_c_extension_the_recording_is_refused_and_nothing_is_enqueued(
    rt: srt.Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    def missing() -> str:
        return "the optional C extension streamrt._graph_release_c is not available (test)"

    monkeypatch.setattr(_graph_release, "unavailable_reason", missing)
    monkeypatch.setattr("streamrt._pipeline._capture.unavailable_reason", missing)
    s = rt.create_stream()
    d = rt.device_allocator.allocate(N, stream=s)
    s.memset(d, 1)
    p = srt.Pipeline("refused")
    p.memset(d, 5)
    p.host(lambda: None)
    ran: list[int] = []
    slots = _slot_threads()
    foreign = _Foreign(rt, s)
    try:
        with pytest.raises(srt.CaptureError, match="C extension"):
            p.launch(s)
        with pytest.raises(srt.CaptureError, match="C extension"):
            s.launch_host_func(ran.append, 1)
        foreign.end()
        foreign.replay()
    finally:
        foreign.destroy()
    assert ran == [] and _slot_threads() == slots
    out = rt.host_allocator.allocate(N)
    s.copy(out, d)
    s.synchronize()
    assert (out.numpy() == 1).all()  # the refused memset was never captured


def test_an_error_in_a_foreign_replay_nobody_armed_is_logged(
    rt: srt.Runtime, needs_release_queue: None, caplog: pytest.LogCaptureFixture
) -> None:
    s = rt.create_stream()
    pending = _graph_release.pending_releases()

    def fail() -> None:
        raise RuntimeError("replayed and failed")

    foreign = _Foreign(rt, s)
    try:
        s.launch_host_func(fail)
        foreign.end()
        with caplog.at_level(logging.ERROR, logger="streamrt"):
            foreign.replay()
            foreign.replay()  # the stream goes on
    finally:
        foreign.destroy()
    assert sum("replayed and failed" in r.exc_text for r in caplog.records if r.exc_text) == 2
    _wait_for_releases(rt, pending)


def test_an_invalidated_foreign_capture_is_a_capture_error(rt: srt.Runtime, needs_release_queue: None) -> None:
    if not rt.capabilities.is_simulated:
        pytest.skip("invalidating a capture on purpose is simulated only (a GPU may fault differently)")
    s = rt.create_stream()
    d = rt.device_allocator.allocate(N, stream=s)
    p = srt.Pipeline("late")
    p.memset(d, 1)
    rt.backend.stream_begin_capture(s.handle, srt.CaptureMode.GLOBAL)
    try:
        with pytest.raises(srt.BackendError):
            rt.backend.malloc(64)  # prohibited in a global capture: invalidates it
        with pytest.raises(srt.CaptureError, match="invalidated"):
            p.launch(s)
    finally:
        with pytest.raises(srt.CaptureError):
            rt.backend.stream_end_capture(s.handle)
    p.launch(s).result(10)
