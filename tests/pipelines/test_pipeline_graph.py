"""Captured pipelines: replays re-run host nodes on current inputs, graphs own their callables, errors leave nothing behind."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest
from pipeline_helpers import Gate, pinned
from support.transfer import download, upload

import streamrt as srt


def _scale_pipeline(rt: srt.Runtime, s: srt.Stream, n: int = 256) -> tuple[srt.Pipeline, srt.Buffer, srt.Buffer]:
    """D2H inp -> host (x3) -> H2D out, with its staging owned only by the pipeline."""
    inp = rt.device_allocator.allocate(n * 4, stream=s)
    out = rt.device_allocator.allocate(n * 4, stream=s)
    stage_in, stage_out = pinned(rt, n * 4), pinned(rt, n * 4)
    p = srt.Pipeline("scale")
    p.copy(dst=stage_in, src=inp)
    p.host(lambda a, b: np.multiply(a.numpy(np.int32), 3, out=b.numpy(np.int32)), stage_in, stage_out, reads=[stage_in], writes=[stage_out], name="x3")
    p.copy(dst=out, src=stage_out)
    return p, inp, out


@pytest.mark.parametrize("policy", ["stream", "fork"])
def test_100_replays_follow_changing_device_inputs(rt: srt.Runtime, policy: str) -> None:
    s = rt.create_stream()
    p, inp, out = _scale_pipeline(rt, s)
    p.memset(rt.device_allocator.allocate(1024, stream=s), 0)  # an independent branch for "fork"
    g = p.capture(s, policy=policy)
    rng = np.random.default_rng(7)
    stage = pinned(rt, inp.nbytes)
    result = pinned(rt, out.nbytes)
    for i in range(100):
        values = rng.integers(-1000, 1000, 256, dtype=np.int32)
        s.synchronize()  # the previous replay has read `stage` through inp
        stage.numpy(np.int32)[:] = values
        s.copy(inp, stage)
        run = g.launch(s)
        s.copy(result, out)
        run.result(10)
        s.synchronize()
        assert np.array_equal(result.numpy(np.int32), values * 3), f"replay {i}"
    assert g.replays == 100
    g.close()


def test_the_graph_keeps_host_callables_and_arguments_alive(rt: srt.Runtime) -> None:
    # CuPy issue 9274 / the CK replay bug: a captured host callback freed after its first run.
    s = rt.create_stream()
    p, inp, out = _scale_pipeline(rt, s)
    upload(rt, s, np.arange(256, dtype=np.int32), dst=inp)
    g = p.capture(s)
    fn_ref = weakref.ref(p.nodes[1].fn)  # type: ignore[attr-defined]
    del p
    gc.collect()
    for _ in range(3):
        g.launch(s).result(10)
        gc.collect()
    assert fn_ref() is not None
    assert np.array_equal(download(rt, s, out, np.int32), np.arange(256) * 3)
    g.close()
    gc.collect()
    assert fn_ref() is None


def test_close_releases_the_host_slots_after_the_last_replay(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    p, *_ = _scale_pipeline(rt, s)
    engine = rt._engine
    slots_before = engine.statistics().host_slots
    g = p.capture(s)
    assert g.host_slots == 1 and engine.statistics().host_slots == slots_before + 1
    gate = Gate()
    try:
        s.launch_host_func(gate)
        run = g.launch(s)
        g.close()  # the replay is still queued: nothing may be freed yet
        assert g.is_closed and not run.is_done
    finally:
        gate.open()
    run.result(10)
    rt.releaser.drain()
    assert engine.statistics().host_slots == slots_before
    with pytest.raises(srt.ClosedError):
        g.launch(s)
    g.close()  # idempotent


def test_update_rebinds_buffers_of_the_same_size(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    p, inp, out = _scale_pipeline(rt, s)
    g = p.capture(s)
    inp2 = upload(rt, s, np.full(256, 5, np.int32))
    out2 = rt.device_allocator.allocate(out.nbytes, stream=s)
    upload(rt, s, np.full(256, 1, np.int32), dst=inp)
    g.launch(s).result(10)
    g.update({inp: inp2, out: out2})
    assert g.updates == 1
    g.launch(s).result(10)
    assert (download(rt, s, out, np.int32) == 3).all()  # untouched by the rebound replay
    assert (download(rt, s, out2, np.int32) == 15).all()
    with pytest.raises(ValueError, match="size and kind"):
        g.update({inp2: rt.device_allocator.allocate(16)})
    with pytest.raises(ValueError, match="not used"):
        g.update({inp: out2})
    g.close()
    with pytest.raises(srt.ClosedError):
        g.update({inp2: inp})


def test_update_rejects_bad_rebindings_and_keeps_the_graph_as_it_was(rt: srt.Runtime, backend: str) -> None:
    s = rt.create_stream()
    p, inp, out = _scale_pipeline(rt, s)
    g = p.capture(s)
    spare = rt.device_allocator.allocate(inp.nbytes, stream=s)
    released = rt.device_allocator.allocate(inp.nbytes)
    released.release()
    readonly = srt.Buffer(spare.ptr, spare.nbytes, "device", rt, owner=spare, readonly=True)
    with pytest.raises(TypeError, match="mapping"):
        g.update([(inp, spare)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Buffers"):
        g.update({inp: np.zeros(256, np.int32)})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="was released"):
        g.update({inp: released})
    with pytest.raises(ValueError, match="read-only"):
        g.update({out: readonly})  # the graph writes `out`
    with srt.open_runtime(backend) as other:
        with pytest.raises(ValueError, match="another runtime"):
            g.update({inp: other.device_allocator.allocate(inp.nbytes)})
    g.update({})  # nothing to rebind: nothing re-captured
    assert g.updates == 0
    upload(rt, s, np.arange(256, dtype=np.int32), dst=inp)
    g.launch(s).result(10)
    assert np.array_equal(download(rt, s, out, np.int32), np.arange(256) * 3)
    g.close()


def test_update_refuses_a_rebinding_that_makes_a_copy_overlap(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    a = rt.device_allocator.allocate(64, stream=s)
    b = rt.device_allocator.allocate(64, stream=s)
    p = srt.Pipeline("d2d")
    p.copy(dst=b, src=a)
    g = p.capture(s)
    with pytest.raises(ValueError, match="overlap"):
        g.update({b: a})
    assert g.updates == 0
    g.close()


def test_graph_launch_takes_a_stream_of_its_own_runtime(rt: srt.Runtime, backend: str) -> None:
    s = rt.create_stream()
    p, _inp, _out = _scale_pipeline(rt, s)
    with p.capture(s) as g:
        with pytest.raises(TypeError, match="Stream"):
            g.launch(object())  # type: ignore[arg-type]
        with srt.open_runtime(backend) as other:
            with pytest.raises(ValueError, match="another runtime"):
                g.launch(other.create_stream())
        assert g.replays == 0
    assert g.is_closed


def test_a_released_buffer_stops_replays_until_rebound(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    p, _inp, out = _scale_pipeline(rt, s)
    g = p.capture(s)
    out.release()
    with pytest.raises(ValueError, match="released"):
        g.launch(s)
    g.close()


def test_a_synchronizing_call_during_capture_is_a_capture_error(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    d = rt.device_allocator.allocate(64, stream=s)
    slots_before = rt._engine.statistics().host_slots
    p = srt.Pipeline("sync-in-capture")
    p.memset(d, 1)
    p.host(lambda: None)  # a host slot is made before the capture starts
    p.enqueue(lambda stream: stream.synchronize(), name="drain")  # illegal while capturing
    p.memset(d, 2)
    with pytest.raises(srt.CaptureError, match="at node 'drain'"):
        p.capture(s)
    assert not rt.backend.stream_is_capturing(s.handle)
    assert rt._engine.statistics().host_slots == slots_before
    s.memset(d, 9)  # the stream is usable afterwards
    assert (download(rt, s, d) == 9).all()
    p2 = srt.Pipeline("fine")
    p2.memset(d, 3)
    p2.capture(s).launch(s).result(10)
    assert (download(rt, s, d) == 3).all()


def test_a_failing_fork_capture_leaves_side_streams_usable(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    a = rt.device_allocator.allocate(64, stream=s)
    b = rt.device_allocator.allocate(64, stream=s)
    p = srt.Pipeline("fork-fail")
    p.memset(a, 1)
    p.enqueue(lambda stream: stream.synchronize(), writes=[b], name="drain")
    with pytest.raises(srt.CaptureError):
        p.capture(s, policy="fork")
    q = srt.Pipeline("after")
    q.memset(a, 4)
    q.memset(b, 5)
    q.launch(s, policy="fork").result(10)
    assert (download(rt, s, a) == 4).all() and (download(rt, s, b) == 5).all()


def test_a_host_call_made_by_an_enqueue_node_is_recorded_into_the_capture(rt: srt.Runtime) -> None:
    """The pipeline's capture is, for the enqueue node's host call, a capture someone else began."""
    s = rt.create_stream()
    ran: list[int] = []
    recorded: list[srt.Completion] = []
    p = srt.Pipeline("host-in-enqueue")
    p.enqueue(lambda stream: recorded.append(stream.launch_host_func(ran.append, 1)), name="inner")
    g = p.capture(s)
    assert ran == [] and len(recorded) == 1
    assert recorded[0].is_done
    with pytest.raises(srt.CaptureError, match="recorded into a graph"):
        recorded[0].result()
    for _ in range(3):
        g.launch(s).result(10)
    assert ran == [1, 1, 1]
    g.close()


def test_a_launch_made_by_an_enqueue_node_is_recorded_into_the_capture(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    d = rt.device_allocator.allocate(64, stream=s)
    inner = srt.Pipeline("inner")
    inner.memset(d, 1)
    runs: list[srt.Run] = []
    outer = srt.Pipeline("outer")
    outer.enqueue(lambda stream: runs.append(inner.launch(stream)))
    outer.memset(d, 2, nbytes=32)
    g = outer.capture(s)
    assert len(runs) == 1 and runs[0].policy == "captured" and isinstance(runs[0].exception(), srt.CaptureError)
    s.memset(d, 0)
    g.launch(s).result(10)
    values = download(rt, s, d)
    assert (values[:32] == 2).all() and (values[32:] == 1).all()
    g.close()
    inner.launch(s).result(10)  # eager again once the capture is over
    assert (download(rt, s, d) == 1).all()


def test_capturing_a_capturing_stream_is_an_error(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    d = rt.device_allocator.allocate(64, stream=s)
    inner = srt.Pipeline("inner")
    inner.memset(d, 1)
    outer = srt.Pipeline("outer")
    errors: list[BaseException] = []

    def nested(stream: srt.Stream) -> None:
        try:
            inner.capture(stream)
        except srt.CaptureError as exc:
            errors.append(exc)

    outer.enqueue(nested)
    outer.memset(d, 2)
    g = outer.capture(s)
    assert len(errors) == 1 and "already capturing" in str(errors[0])
    g.launch(s).result(10)
    assert (download(rt, s, d) == 2).all()
    g.close()


class _ReplayOps:
    """A stand-in for the native executor's ``replay`` on the simulator: the same calls through the
    backend, with a failure injected at call ``fail_at`` (0 the capture check, 1 the launch, 2 the record)."""

    def __init__(self, backend: object) -> None:
        self.backend: Any = backend
        self.fail_at: int | None = None

    def replay(self, graph_exec: int, stream: int, event: int = 0) -> tuple[int, BaseException | None] | None:
        b = self.backend
        if self.fail_at == 0 or b.stream_is_capturing(stream):
            return 0, None
        if self.fail_at == 1:
            return 1, srt.BackendError("sim", 1, "E1", "launch failed", "graph_launch")
        b.graph_launch(graph_exec, stream)
        if self.fail_at == 2:
            return 2, srt.BackendError("sim", 2, "E2", "record failed", "event_record")
        if event:
            b.event_record(event, stream)
        return None


def test_a_native_replay_and_its_failures_keep_replays_matched_and_the_graph_accounted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the backend has native ops, a replay is one call (check, launch, tail record). A replay that
    enqueued nothing raises and leaves its host node unarmed; one whose tail failed raises, still runs,
    and counts as in flight until the device is idle, so a close destroys the graph only after it."""
    with srt.open_runtime("sim") as rt:
        s = rt.create_stream()
        p, inp, out = _scale_pipeline(rt, s)
        g = p.capture(s)
        ops = _ReplayOps(rt.backend)
        monkeypatch.setattr(rt.backend, "native_ops", ops)
        state = g._state
        assert state is not None
        slot = state.slots[0][1]

        def replay(values: np.ndarray) -> srt.Run:
            upload(rt, s, values, dst=inp)
            return g.launch(s)

        run = replay(np.arange(256, dtype=np.int32))
        assert run.result(10) is None and (download(rt, s, out, np.int32) == np.arange(256) * 3).all()
        for fail_at, error in ((0, srt.CaptureError), (1, srt.BackendError)):
            ops.fail_at = fail_at
            with pytest.raises(error):
                replay(np.full(256, 5, np.int32))
            s.synchronize()
            assert state.pending == 0 and not slot._queue  # nothing in flight, nothing armed
        ops.fail_at = 2
        upload(rt, s, np.full(256, 7, np.int32), dst=inp)
        gate = Gate()
        s.launch_host_func(gate)  # the replay waits behind it
        try:
            with pytest.raises(srt.BackendError, match="record failed"):
                g.launch(s)
            assert state.pending == 1
            g.close()
            assert not state.destroyed  # the replay that nothing watches has not run yet
        finally:
            gate.open()
        s.synchronize()
        rt.releaser.drain()
        assert state.destroyed and state.pending == 0
        assert (download(rt, s, out, np.int32) == 21).all()  # it ran, its host node included
        assert g.replays == 1
