"""``with stream.capture() as graph:``: any streamrt work recorded, replayed with Pipeline.capture's guarantees."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import numpy as np
import pytest
from support.transfer import download, upload

import streamrt as srt

N = 64


def _triple_pipeline(rt: srt.Runtime, s: srt.Stream) -> tuple[srt.Pipeline, srt.Buffer, srt.Buffer]:
    """D2H inp -> host (x3) -> H2D out."""
    inp = rt.device_allocator.allocate(N * 4, stream=s)
    out = rt.device_allocator.allocate(N * 4, stream=s)
    stage_in, stage_out = rt.host_allocator.allocate(N * 4), rt.host_allocator.allocate(N * 4)
    p = srt.Pipeline("triple")
    p.copy(dst=stage_in, src=inp)
    p.host(lambda a, b: np.multiply(a.numpy(np.int32), 3, out=b.numpy(np.int32)), stage_in, stage_out, reads=[stage_in], writes=[stage_out], name="x3")
    p.copy(dst=out, src=stage_out)
    return p, inp, out


def test_stream_ops_a_pipeline_and_a_host_function_replay_100_times_with_changing_inputs(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    p, inp, out = _triple_pipeline(rt, s)
    src, result = rt.host_allocator.allocate(N * 4), rt.host_allocator.allocate(N * 4)
    seen: list[int] = []
    with s.capture() as g:
        s.copy(inp, src)  # stream op: the replay's input
        p.launch(s)  # pipeline launch: D2H, Python host node, H2D
        s.copy(result, out)
        s.launch_host_func(lambda buf: seen.append(int(buf.numpy(np.int32)[1])), result)  # reads what the replay produced
        s.memset(out, 0)  # stream op after it
    assert seen == [] and g.host_slots == 2
    rng = np.random.default_rng(3)
    for i in range(100):
        values = rng.integers(-1000, 1000, N, dtype=np.int32)
        src.numpy(np.int32)[:] = values
        g.launch(s).result(10)
        assert np.array_equal(result.numpy(np.int32), values * 3), f"replay {i}"
        assert seen[-1] == values[1] * 3
    assert len(seen) == 100 and g.replays == 100
    assert (download(rt, s, out) == 0).all()
    g.close()


def test_calls_recorded_in_the_block_are_done_at_once_with_a_capture_error(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    p, _inp, _out = _triple_pipeline(rt, s)
    with s.capture(name="step") as g:
        run = p.launch(s)
        done = s.launch_host_func(lambda: None)
        assert run.is_done and done.is_done and run.policy == "captured"
        with pytest.raises(srt.CaptureError, match="recorded into graph 'step'"):
            run.result()
        with pytest.raises(srt.CaptureError, match="await graph.launch"):
            done.result()
        with pytest.raises(srt.CaptureError, match="still being captured"):
            g.launch(s)
        for call in (s.synchronize, s.wait_idle, lambda: s.is_idle):
            with pytest.raises(srt.CaptureError, match="inside"):
                call()
    g.launch(s).result(10)
    g.close()


def test_a_host_functions_error_reaches_the_replays_awaiter_and_later_replays_go_on(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    box = rt.host_allocator.allocate(4)

    def check(buf: srt.Buffer) -> int:
        value = int(buf.numpy(np.int32)[0])
        if value < 0:
            raise ValueError(f"negative {value}")
        return value

    with s.capture() as g:
        s.launch_host_func(check, box)
    box.numpy(np.int32)[0] = -5
    run = g.launch(s)
    with pytest.raises(ValueError, match="negative -5"):
        run.result(10)
    assert list(run.node_errors) == ["0:check"]
    box.numpy(np.int32)[0] = 7
    ok = g.launch(s)
    ok.result(10)
    assert ok.host_result("0:check") == 7
    g.close()


def test_the_graph_keeps_callables_and_buffers_until_closed_and_its_capture_pools_then_return(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    dst = rt.device_allocator.allocate(N, stream=s)

    class Marker:
        pass

    marker = Marker()
    ref = weakref.ref(marker)
    rt.host_allocator.allocate(N).release()  # a free block in the cache: the capture pool takes it (no allocation while capturing)
    s.synchronize()
    pooled_before = rt.host_allocator.statistics().capture_pool_bytes
    with s.capture() as g:
        stage = rt.host_allocator.allocate(N, stream=s)  # from the capture pool entered for the block
        s.memset(stage, 9)
        s.launch_host_func(lambda _m: None, marker)
        s.copy(dst, stage)
        stage.release()  # the graph still holds the block
    del marker
    gc.collect()
    assert ref() is not None
    held = rt.host_allocator.statistics().capture_pool_bytes
    assert held > pooled_before
    g.launch(s).result(10)
    assert (download(rt, s, dst) == 9).all()
    g.close()
    s.synchronize()
    rt.releaser.drain()
    gc.collect()
    assert ref() is None
    assert rt.host_allocator.statistics().capture_pool_bytes == pooled_before
    assert rt._engine.statistics().host_slots == 0


def test_an_exception_in_the_block_ends_the_capture_and_leaves_the_stream_usable(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    d = rt.device_allocator.allocate(N, stream=s)
    ran: list[int] = []
    with pytest.raises(KeyError, match="boom"):
        with s.capture() as g:
            s.memset(d, 1)
            s.launch_host_func(ran.append, 1)
            raise KeyError("boom")
    assert g.is_closed and ran == []
    assert not rt.backend.stream_is_capturing(s.handle)
    assert rt._engine.statistics().host_slots == 0
    with pytest.raises(srt.ClosedError):
        g.launch(s)
    s.memset(d, 2)
    assert (download(rt, s, d) == 2).all()
    with s.capture() as again:  # and it can capture again
        s.memset(d, 3)
    again.launch(s).result(10)
    assert (download(rt, s, d) == 3).all()
    again.close()


def test_bad_input_is_refused_before_anything_is_captured(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    with pytest.raises(ValueError, match="CaptureMode"):
        s.capture(mode=7)
    with pytest.raises(TypeError, match="name"):
        s.capture(name=3)  # type: ignore[arg-type]
    with s.capture() as g:
        with pytest.raises(srt.CaptureError, match="already capturing"):
            s.capture().__enter__()
    with pytest.raises(ValueError, match="captured from a stream"):
        g.update({})
    g.close()
    rt.backend.stream_begin_capture(s.handle, srt.CaptureMode.THREAD_LOCAL)
    try:
        with pytest.raises(srt.CaptureError, match="already capturing"):
            s.capture().__enter__()
    finally:
        rt.backend.graph_destroy(rt.backend.stream_end_capture(s.handle))
    s.close()
    with pytest.raises(srt.ClosedError):
        s.capture().__enter__()


def test_close_inside_the_block_drops_the_graph_at_its_end(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    d = upload(rt, s, np.zeros(N, np.uint8))
    with s.capture() as g:
        s.memset(d, 1)
        g.close()
    assert g.is_closed
    with pytest.raises(srt.ClosedError):
        g.launch(s)
    assert (download(rt, s, d) == 0).all()


def test_the_releasers_device_wide_wait_waits_for_a_capture_in_progress(rt: srt.Runtime) -> None:
    """A release after a closed stream waits for the whole device; begun mid-capture, it would invalidate it."""
    s, gone = rt.create_stream(), rt.create_stream()
    gone.close()
    buf = rt.device_allocator.allocate(64, stream=s)
    host = rt.host_allocator.allocate(64)
    released = threading.Event()
    with s.capture() as graph:
        s.memset(buf, 1)
        srt.release_after_streams(rt, {gone}, released.set)  # a closed stream: a whole-device wait
        time.sleep(0.05)  # time for the releaser to reach its wait
        assert not released.is_set()
        s.copy(dst=host, src=buf)  # still a valid capture
    assert released.wait(10)
    graph.launch(s).result(10)
    assert (host.numpy() == 1).all()
    graph.close()


def test_a_block_released_after_a_closed_stream_mid_capture_leaves_the_capture_valid(rt: srt.Runtime) -> None:
    """The caching allocator's fence for a closed stream is a whole-device wait: it waits for the capture too."""
    s, other = rt.create_stream(), rt.create_stream()
    buf = rt.device_allocator.allocate(64, stream=s)
    used = rt.device_allocator.allocate(4096)  # no home stream: its release records a fence on each noted stream
    other.memset(used, 0)
    other.synchronize()
    other.close()
    host = rt.host_allocator.allocate(64)
    with s.capture() as graph:
        s.memset(buf, 2)
        used.release()  # noted on a closed stream: a device-wide fence, on the releaser thread
        time.sleep(0.05)  # time for the releaser to reach its wait
        s.copy(dst=host, src=buf)
    graph.launch(s).result(10)
    assert (host.numpy() == 2).all()
    graph.close()


def test_captures_and_device_wide_waits_exclude_each_other() -> None:
    """A device-wide wait waits for the captures in progress; a capture begun during one waits for it."""
    from streamrt._releaser import Captures

    captures = Captures()
    syncing, finish, begun = threading.Event(), threading.Event(), threading.Event()

    def wait() -> None:
        syncing.set()
        finish.wait(10)

    sync = threading.Thread(target=captures.device_wide, args=(wait,))
    sync.start()
    assert syncing.wait(10)
    capture = threading.Thread(target=lambda: (captures.begun(), begun.set()))
    capture.start()
    assert not begun.wait(0.1)  # held back by the device-wide wait
    finish.set()
    assert begun.wait(10)
    sync.join(10)
    capture.join(10)
    waited = threading.Event()
    sync = threading.Thread(target=captures.device_wide, args=(waited.set,))
    sync.start()
    assert not waited.wait(0.1)  # the capture is still open
    captures.ended()
    assert waited.wait(10)
    sync.join(10)
