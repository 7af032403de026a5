"""Deferred launches: a fork launch whose backend calls the runtime's submission thread makes.

The contract runs on every backend: the native submitter on the GPU backends, its Python
twin on the simulator. Tests that stall the submission thread put a blocking step in front
of the launch, which only the Python twin can run (skipped on the GPU backends).
"""

from __future__ import annotations

import threading

import pytest
from pipeline_helpers import pinned

import streamrt as srt
from streamrt._errors import BackendError
from streamrt._submitter import PySubmitter

N = 64


def _branches(rt: srt.Runtime, s: srt.Stream) -> tuple[srt.Pipeline, srt.Buffer, srt.Buffer, srt.Buffer]:
    """memset(a) -> D2H(a -> ha) ∥ D2H(src -> hb): two branches, so "fork" compiles a plan."""
    a, src = (rt.device_allocator.allocate(N, stream=s) for _ in range(2))
    ha, hb = pinned(rt, N), pinned(rt, N)
    p = srt.Pipeline("deferred")
    p.copy(dst=ha, src=a, after=[p.memset(a, 1)], name="d2h_a")
    p.copy(dst=hb, src=src, name="d2h_src")
    return p, src, ha, hb


def _stalled(rt: srt.Runtime) -> threading.Event:
    """Hold the submission thread (the Python twin) until the returned event is set."""
    submitter = rt._engine.submitter()
    if not isinstance(submitter, PySubmitter):
        pytest.skip("only the Python twin of the submitter runs a blocking step")
    go = threading.Event()
    submitter.submit([(go.wait, (10,))], 1)
    return go


def test_deferred_launches_compute_what_eager_ones_do_and_leave_the_callers_stream_free(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    p, src, ha, hb = _branches(rt, s)
    staged = pinned(rt, N)
    for i in range(10):  # changing inputs: each launch reads what the caller's stream wrote before it
        staged.numpy()[:] = i
        s.copy(src, staged)
        run = p.launch(s, policy="fork", join=False, deferred=True)
        run.join(s)
        s.synchronize()
        run.result(10)
        assert (ha.numpy() == 1).all() and (hb.numpy() == i).all()
    assert run.streams[0] is s and s not in run.streams[1:] and len(run.streams) == 3
    assert run.policy == "fork"


def test_deferred_needs_the_fork_policy_without_join_and_enqueues_nothing_otherwise(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    p, _, ha, _ = _branches(rt, s)
    ha.numpy()[:] = 7  # pinned memory is not zeroed on a GPU
    for kwargs in ({"policy": "stream"}, {"policy": "fork"}, {"policy": "fork", "join": True}):
        with pytest.raises(ValueError, match="deferred=True needs policy='fork' and join=False"):
            p.launch(s, deferred=True, **kwargs)
    s.synchronize()
    assert rt._engine._submitter is None and not p._plans and (ha.numpy() == 7).all()


def test_a_deferred_run_is_not_done_before_its_calls_are_made(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    p, _, ha, _ = _branches(rt, s)
    p.launch(s, policy="fork", join=False, deferred=True).result(10)  # compiled
    ha.numpy()[:] = 0
    go = _stalled(rt)
    try:
        run = p.launch(s, policy="fork", join=False, deferred=True)
        for side in run.streams[1:]:  # idle: the calls are not made yet, and the pooled tail events read complete
            rt.backend.stream_synchronize(side.handle)
        assert not run.is_done
        with pytest.raises(TimeoutError):
            run.wait(0.05)
        assert (ha.numpy() == 0).all()
    finally:
        go.set()
    run.result(10)
    assert (ha.numpy() == 1).all()


def test_join_and_order_wait_for_the_submission_then_for_the_work(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    p, _, ha, _ = _branches(rt, s)
    p.launch(s, policy="fork", join=False, deferred=True).result(10)
    ha.numpy()[:] = 0
    go = _stalled(rt)
    run = p.launch(s, policy="fork", join=False, deferred=True)
    threading.Timer(0.05, go.set).start()
    run.join(s)  # blocks until the submission thread made the calls, then orders s after them
    seen = pinned(rt, N)
    s.copy(seen, ha)  # (host to host: runs in order on s after the join)
    s.synchronize()
    assert (seen.numpy() == 1).all()
    run.result(10)


def test_a_call_that_fails_on_the_submission_thread_is_the_runs_error(rt: srt.Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    if rt.backend.native_ops is not None:
        pytest.skip("the native submitter's calls are the driver's: the failure is injected into the Python twin's")
    s = rt.create_stream()
    p, _, ha, hb = _branches(rt, s)
    real = rt.backend.memset_async

    def failing(*args: object) -> None:
        raise BackendError("sim", 1, "E1", "injected", "memset_async")

    monkeypatch.setattr(rt.backend, "memset_async", failing)  # bound into the plan when it compiles
    run = p.launch(s, policy="fork", join=False, deferred=True)
    with pytest.raises(BackendError, match="injected") as info:
        run.result(10)
    assert any("node 'memset" in note and "deferred launch" in note for note in info.value.__notes__)
    assert (ha.numpy() == 0).all()  # what the failed call would have fed never ran
    monkeypatch.setattr(rt.backend, "memset_async", real)
    again = p.launch(s, policy="fork", join=False, deferred=True)  # the same plan: its failing call is bound
    with pytest.raises(BackendError):
        again.result(10)
    p.memset(hb, 0, name="new_version")  # a new version compiles again, with the real call
    p.launch(s, policy="fork", join=False, deferred=True).result(10)
    assert (ha.numpy() == 1).all()


def test_a_deferred_launch_onto_a_stream_another_library_captures_is_a_capture_error(rt: srt.Runtime) -> None:
    """A compiled deferred launch is not recorded into that capture (the submission thread checks for it)."""
    s = rt.create_stream()
    p, _, ha, _ = _branches(rt, s)
    p.launch(s, policy="fork", join=False, deferred=True).result(10)  # compiled while not capturing
    ha.numpy()[:] = 0
    rt.backend.stream_begin_capture(s.handle, srt.CaptureMode.THREAD_LOCAL)
    try:
        run = p.launch(s, policy="fork", join=False, deferred=True)
        with pytest.raises(srt.CaptureError, match="capturing when the submission thread"):
            run.result(10)
    finally:
        graph = rt.backend.stream_end_capture(s.handle)
        rt.backend.graph_destroy(graph)
    assert (ha.numpy() == 0).all()


def test_closing_the_runtime_makes_the_pending_calls_and_resolves_every_run() -> None:
    rt = srt.open_runtime("sim")
    s = rt.create_stream()
    p, _, ha, _ = _branches(rt, s)
    go = _stalled(rt)
    runs = [p.launch(s, policy="fork", join=False, deferred=True) for _ in range(5)]
    threading.Timer(0.05, go.set).start()
    rt.close()
    assert all(r.is_done and r.exception() is None for r in runs)
    assert (ha.numpy() == 1).all()
    with pytest.raises(srt.ClosedError):
        p.launch(s, policy="fork", join=False, deferred=True)


def test_a_fence_on_a_side_stream_waits_for_the_pending_submission(rt: srt.Runtime) -> None:
    """Releasing a buffer a deferred launch uses records its fence after the launch's calls (engine.settle)."""
    s = rt.create_stream()
    p, src, _, _ = _branches(rt, s)
    p.launch(s, policy="fork", join=False, deferred=True).result(10)
    go = _stalled(rt)
    run = p.launch(s, policy="fork", join=False, deferred=True)
    released = threading.Thread(target=src.release)
    released.start()
    released.join(0.1)
    blocked = released.is_alive()  # its fence would otherwise precede the calls that read src
    go.set()
    released.join(10)
    assert blocked and not released.is_alive()
    run.result(10)


def test_a_burst_of_deferred_launches_runs_in_order_each_after_the_previous(rt: srt.Runtime) -> None:
    """Relaunches while the previous run is pending: each waits for its tails (in the submitted program)."""
    s = rt.create_stream()
    p, src, ha, hb = _branches(rt, s)
    staged = pinned(rt, N, fill=3)
    s.copy(src, staged)
    runs = [p.launch(s, policy="fork", join=False, deferred=True) for _ in range(20)]
    assert [r.gate for r in runs] == sorted(r.gate for r in runs) and len({r.gate for r in runs}) == 20
    runs[-1].join(s)
    s.synchronize()
    assert all(r.exception(10) is None for r in runs)
    assert (ha.numpy() == 1).all() and (hb.numpy() == 3).all()


def test_a_deferred_plan_reads_the_source_given_for_one_launch_then_its_nodes_own(rt: srt.Runtime) -> None:
    """``ForkLaunchPlan.launch(sources=...)``: a copy step reads another buffer in that launch only (the
    recipe's seqstart given per launch); the launch notes the buffer's use on the side streams."""
    s = rt.create_stream()
    p, src, ha, hb = _branches(rt, s)
    other = rt.device_allocator.allocate(N, stream=s)
    staged = pinned(rt, N)
    for buf, value in ((src, 5), (other, 7)):
        staged.numpy()[:] = value
        s.copy(buf, staged)
        s.synchronize()
    p.launch(s, policy="fork", join=False, deferred=True).result(10)  # compiles the plan
    plan = p._plans[(s, "stream", False, True)]
    step = plan.copy_step("d2h_src")
    assert step is not None and plan.copy_step("d2h_a") is not None and plan.copy_step("nowhere") is None
    for sources, expect in (((), 5), (((step, other),), 7), ((), 5), (((step, other),), 7), (((step, other),), 7), ((), 5)):
        run = plan.launch(sources)
        run.join(s)
        s.synchronize()
        run.result(10)
        assert (hb.numpy() == expect).all() and (ha.numpy() == 1).all()
    assert other._streams is not None and set(plan.sides) <= other._streams
    with pytest.raises(ValueError, match="released"):
        released = rt.device_allocator.allocate(N, stream=s)
        released.release()
        plan.launch(((step, released),))
    other.release()


def test_the_deferred_template_changes_a_copys_source_for_one_launch_only() -> None:
    """The native program of a deferred plan (GPU backends), without a GPU: the copy step's source
    word is the one given for a launch, and the node's own again in the next launch without one; a
    launch that waits for the previous run gets a program of its own and leaves the template alone."""
    from types import SimpleNamespace

    from streamrt._backends import _native_ops
    from streamrt._backends._native_ops import Program
    from streamrt._pipeline._fork_plan import ForkLaunchPlan

    if not _native_ops.available():
        pytest.skip("streamrt._backends._launch_c is not built")
    words = _native_ops._c.WORDS

    def src_of(program: Program, call: int) -> int:
        return int(program.words[call * words + 2])  # op, dst, src, ...

    def memcpy(*args: object) -> None: ...

    def host(*args: object) -> None: ...

    side = 0x50
    steps = ((memcpy, (0xD0, 0xA0, 64, 2, side)), (host, (side, 0xF0, 0)), (memcpy, (0xD1, 0xA1, 64, 2, side)))
    program = Program().check_not_capturing(0x10).copy(0xD0, 0xA0, 64, 2, side).host(side, 0xF0, 0).copy(0xD1, 0xA1, 64, 2, side)
    plan = object.__new__(ForkLaunchPlan)
    plan.steps, plan.program, plan.body, plan.backend = steps, program, program.after(1), SimpleNamespace(memcpy_async=memcpy)
    plan.template, plan.patched = None, []
    plan.stream, plan.sides = SimpleNamespace(_handle=0x10), (SimpleNamespace(_handle=side),)
    plan._make_template()
    given = SimpleNamespace(_ptr=0xB0)
    work = plan._deferred_work([], [0xE1], ((2, given),))
    assert work is plan.template and (src_of(work, 1), src_of(work, 3)) == (0xA0, 0xB0)
    assert work.words[Program.at(4, 0)] == 0xE1  # the tail record's event (check, 3 steps, the record)
    work = plan._deferred_work([], [0xE2])
    assert (src_of(work, 1), src_of(work, 3)) == (0xA0, 0xA1)  # its own again
    plan._deferred_work([], [0xE3], ((0, given),))
    waited = plan._deferred_work([(side, 0xEE)], [0xE4], ((2, given),))  # check, wait, the steps, the record
    assert waited is not plan.template and (src_of(waited, 2), src_of(waited, 4)) == (0xA0, 0xB0)
    assert src_of(plan.template, 1) == 0xB0  # the last template launch's, until the template's next launch
    work = plan._deferred_work([], [0xE5])
    assert (src_of(work, 1), src_of(work, 3)) == (0xA0, 0xA1)
