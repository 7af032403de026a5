"""Launching pipelines: policies give the same results, Runs report host errors, keepalives last to the tail."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import numpy as np
import pytest
from pipeline_helpers import Gate, eventually, pinned
from support.transfer import download, upload

import streamrt as srt


def _round_trip(rt: srt.Runtime, s: srt.Stream, n: int = 4096) -> tuple[srt.Pipeline, srt.Buffer, srt.Buffer, srt.Buffer]:
    """memset(out_zero) ∥ [D2H src -> host (+1) -> H2D out]: the seed's shape on plain bytes."""
    src = upload(rt, s, np.arange(n, dtype=np.uint8))
    out = rt.device_allocator.allocate(n, stream=s)
    zero = rt.device_allocator.allocate(n, stream=s)
    s.memset(zero, 0xFF)
    s.memset(out, 0)
    stage_in, stage_out = pinned(rt, n), pinned(rt, n)

    def plus_one(a: srt.Buffer, b: srt.Buffer) -> int:
        np.add(a.numpy(), 1, out=b.numpy())
        return int(b.numpy()[0])

    p = srt.Pipeline("round-trip")
    p.memset(zero, 0, name="zero")
    p.copy(dst=stage_in, src=src, name="d2h")
    p.host(plus_one, stage_in, stage_out, reads=[stage_in], writes=[stage_out], name="pack")
    p.copy(dst=out, src=stage_out, name="h2d")
    return p, src, out, zero


@pytest.mark.parametrize("policy", ["stream", "fork", "graph"])
def test_every_policy_gives_the_same_result(rt: srt.Runtime, policy: str) -> None:
    s = rt.create_stream()
    p, _src, out, zero = _round_trip(rt, s)
    if policy == "graph":
        g = p.capture(s)
        run = g.launch(s)
    else:
        run = p.launch(s, policy=policy)
    assert isinstance(run, srt.Run) and isinstance(run, srt.Completion)
    assert run.result(10) is None and run.is_done and run.exception() is None
    assert run.host_result("pack") == 1
    assert np.array_equal(download(rt, s, out), (np.arange(4096) + 1).astype(np.uint8))
    assert (download(rt, s, zero) == 0).all()
    if policy == "graph":
        g.close()


def test_a_run_names_itself_and_refuses_bad_questions(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    p, *_ = _round_trip(rt, s)
    gate = Gate()
    s.launch_host_func(gate)
    try:
        run = p.launch(s)
        assert repr(run) == "<Run 'round-trip' stream running>" and run.name == "round-trip"
    finally:
        gate.open()
    run.wait(10)
    assert repr(run) == "<Run 'round-trip' stream done>"
    with pytest.raises(KeyError, match="not a Python host node"):
        run.host_result("nope")
    with pytest.raises(TypeError, match="join takes a Stream"):
        run.join("stream")  # type: ignore[arg-type]
    other = rt.create_stream()
    run.join(other)  # done: nothing to wait for
    other.close()
    with pytest.raises(srt.ClosedError):
        run.join(other)  # a closed stream is refused, done or not


def test_fork_runs_the_round_trip_on_a_side_stream(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    p, *_ = _round_trip(rt, s)
    run = p.launch(s, policy="fork")
    assert run.policy == "fork" and run.streams[0] is s and len(run.streams) == 2
    run.wait(10)
    single = p.launch(s)
    assert single.streams == (s,)
    single.wait(10)


@pytest.mark.parametrize("join", [True, False])
def test_an_await_of_a_fork_run_polls_the_lane_of_each_of_its_tails(rt: srt.Runtime, join: bool) -> None:
    s = rt.create_stream()
    p, *_ = _round_trip(rt, s)
    run = p.launch(s, policy="fork", join=join)
    tails = [s] if join else list(run.streams)  # joined: one tail, on the caller's stream
    lanes = {rt._engine._lane(x.handle) for x in tails}
    assert len(run.streams) == 2 and set(run._lanes) == lanes  # the Run resolves where its tails retire
    assert asyncio.run(asyncio.wait_for(_await(run), 30)) is None
    if not join:
        run.join(s)
    assert not any(lane.pollers for lane in lanes)


async def _await(obj: object) -> object:
    return await obj  # type: ignore[misc]


def test_fork_without_join_is_joined_later(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    n = 256
    src = upload(rt, s, np.arange(n, dtype=np.uint8))
    out = rt.device_allocator.allocate(n, stream=s)
    other = rt.device_allocator.allocate(n, stream=s)
    stage = pinned(rt, n)
    gate = Gate()
    p = srt.Pipeline("late-join")
    p.memset(other, 1)  # the caller's stream
    d2h = p.copy(dst=stage, src=src)  # a side stream from here on
    held = p.host(gate, after=[d2h])
    p.copy(dst=out, src=stage, after=[held])
    try:
        run = p.launch(s, policy="fork", join=False)
        assert len(run.streams) == 2
        s.synchronize()  # the caller's stream is free: nothing joined it to the side stream
        assert not run.is_done
        consumer = rt.device_allocator.allocate(n, stream=s)
        run.join(s)
        s.copy(consumer, out)
        assert not s.is_idle
    finally:
        gate.open()
    run.result(10)
    assert np.array_equal(download(rt, s, consumer), np.arange(n, dtype=np.uint8))
    run.join(s)  # a no-op once done


def test_a_relaunch_waits_for_the_previous_run_only(rt: srt.Runtime) -> None:
    # Side branches with wait_for=None run ahead of the caller's stream. A relaunch waits for the
    # previous run's tail, not for whatever the caller's stream queued after that run.
    s = rt.create_stream()
    h = pinned(rt, 8, fill=0)
    ran: list[int] = []
    slow, busy = Gate(), Gate()

    def side() -> None:
        if not ran:
            slow()  # the first run's side branch is still working when the second is launched
        ran.append(1)

    p = srt.Pipeline("run-ahead")
    p.memset(rt.device_allocator.allocate(64, stream=s), 0)
    p.host(side, writes=[h])
    try:
        first = p.launch(s, policy="fork", wait_for=None)
        s.launch_host_func(busy)  # the caller's stream is then busy with other work
        second = p.launch(s, policy="fork", wait_for=None)
        slow.open()
        first.result(10)
        eventually(lambda: len(ran) == 2)  # the second side branch did not wait for `busy`
        assert not second.is_done  # its join on the caller's stream does
    finally:
        slow.open()
        busy.open()
    second.result(10)


def test_fork_wait_for_an_event_or_nothing(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    p, *_ = _round_trip(rt, s)
    ready = s.record()
    p.launch(s, policy="fork", wait_for=ready).result(10)
    p.launch(s, policy="fork", wait_for=None).result(10)


def test_host_node_exceptions_surface_on_the_run_and_the_stream_goes_on(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    d = rt.device_allocator.allocate(64, stream=s)
    after: list[int] = []

    def boom() -> None:
        raise KeyError("pack failed")

    p = srt.Pipeline("errors")
    bad = p.host(boom, name="bad")
    p.host(after.append, 1, after=[bad], name="later")
    p.memset(d, 5, after=[bad])
    for launch in (lambda: p.launch(s), lambda: p.launch(s, policy="fork"), lambda: p.capture(s).launch(s)):
        run = launch()
        exc = run.exception(10)
        assert isinstance(exc, KeyError) and "pack failed" in str(exc)
        assert set(run.node_errors) == {"bad"}
        with pytest.raises(KeyError):
            run.result()
        with pytest.raises(KeyError, match="raised"):
            run.host_result("bad")
        assert run.host_result("later") is None
    assert after == [1, 1, 1]
    assert (download(rt, s, d) == 5).all()


async def _await(run: srt.Run) -> None:
    await run


def test_a_run_is_awaitable(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    p, _src, out, _ = _round_trip(rt, s)

    async def main() -> None:
        await p.launch(s)
        await asyncio.gather(*(_await(p.launch(s, policy="fork")) for _ in range(3)))

    asyncio.run(main())
    assert download(rt, s, out)[0] == 1


def test_relaunch_while_in_flight_is_serialized(rt: srt.Runtime) -> None:
    s1, s2 = rt.create_stream(), rt.create_stream()
    h = pinned(rt, 8, fill=0)
    log: list[int] = []
    gate = Gate()
    p = srt.Pipeline("relaunch")
    p.host(lambda: log.append(int(h.numpy()[0])), reads=[h], name="read")
    p.host(lambda: h.numpy().__iadd__(1), writes=[h], name="bump")
    try:
        s1.launch_host_func(gate)
        first = p.launch(s1)
        second = p.launch(s2)  # another stream: must wait for the first run
        third = p.launch(s1, policy="fork")
        assert not second.is_done
    finally:
        gate.open()
    for run in (first, second, third):
        run.result(10)
    assert log == [0, 1, 2]


def test_keepalives_are_held_until_the_tail_then_dropped(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    gate = Gate()

    class Payload:
        pass

    payload = Payload()
    ref = weakref.ref(payload)
    stage = pinned(rt, 1 << 16)
    d = rt.device_allocator.allocate(1 << 16, stream=s)
    p = srt.Pipeline("keepalive")
    p.copy(dst=stage, src=d)
    p.host(lambda obj: None, payload, reads=[stage])
    try:
        s.launch_host_func(gate)
        run = p.launch(s)
        before = rt.host_allocator.statistics()
        stage.release()  # the user is done with it; the run is not
        del p, payload
        gc.collect()
        assert ref() is not None  # the Run's tail keeps the host node's arguments
        during = rt.host_allocator.statistics()
        assert during.in_flight_bytes >= before.in_flight_bytes + (1 << 16)
        assert not run.is_done
    finally:
        gate.open()
    run.result(10)
    gc.collect()
    assert ref() is None
    eventually(lambda: rt.host_allocator.statistics().in_flight_bytes < (1 << 16))


def test_event_nodes_order_two_pipelines(rt: srt.Runtime) -> None:
    s1, s2 = rt.create_stream(), rt.create_stream()
    h = pinned(rt, 8, fill=0)
    ev = rt.create_event()
    gate = Gate()
    seen: list[int] = []
    producer = srt.Pipeline("producer")
    w = producer.host(gate)
    producer.host(lambda: h.numpy().fill(7), writes=[h], after=[w])
    producer.record(ev)
    consumer = srt.Pipeline("consumer")
    wait = consumer.wait(ev)
    consumer.host(lambda: seen.append(int(h.numpy()[0])), reads=[h], after=[wait])
    try:
        a = producer.launch(s1)
        b = consumer.launch(s2, policy="fork")
    finally:
        gate.open()
    a.result(10)
    b.result(10)
    assert seen == [7]


def test_enqueue_nodes_get_the_stream_they_run_on(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    d = rt.device_allocator.allocate(64, stream=s)
    got: list[srt.Stream] = []

    def fill(stream: srt.Stream, buf: srt.Buffer, value: int) -> None:
        got.append(stream)
        stream.memset(buf, value)

    p = srt.Pipeline("enqueue")
    p.enqueue(fill, d.view(0, 32), 1, writes=[d.view(0, 32)])
    p.enqueue(fill, d.view(32, 32), 2, writes=[d.view(32, 32)])
    run = p.launch(s, policy="fork")
    run.result(10)
    assert got[0] is s and got[1] is run.streams[1]
    out = download(rt, s, d)
    assert (out[:32] == 1).all() and (out[32:] == 2).all()


def test_a_node_failing_midway_raises_and_what_was_enqueued_completes(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    d = rt.device_allocator.allocate(64, stream=s)

    def bad_launch(stream: srt.Stream) -> None:
        raise RuntimeError("bad launch")

    p = srt.Pipeline("midway")
    p.memset(d, 1)
    p.enqueue(bad_launch, name="launcher")
    p.memset(d, 2)
    with pytest.raises(RuntimeError, match="bad launch") as info:
        p.launch(s)
    notes = getattr(info.value, "__notes__", None)
    assert notes is None or any("'launcher'" in n for n in notes)
    assert (download(rt, s, d) == 1).all()  # the node before it ran; the one after was never enqueued


def test_kernel_nodes_take_part_in_dependency_inference(rt: srt.Runtime) -> None:
    d = rt.device_allocator.allocate(64)
    p = srt.Pipeline("kernel")
    first = p.memset(d, 0)
    k = p.kernel(rt.kernels.get("fill_u32"), 1, 16, [d, 16, 1, 0])
    assert k.kind == "kernel" and p.predecessors(k) == {first: frozenset({"WAW"})}


def test_native_host_functions_run_on_every_launch_and_replay(rt: srt.Runtime) -> None:
    import ctypes

    from streamrt._native import SEM_POST_ADDRESS, Semaphore

    s = rt.create_stream()
    sem = Semaphore(0)
    post = ctypes.cast(SEM_POST_ADDRESS, ctypes.CFUNCTYPE(None, ctypes.c_void_p))
    p = srt.Pipeline("native")
    p.host(post, sem.address)
    p.launch(s).result(10)
    p.launch(s, policy="fork").result(10)
    g = p.capture(s)
    g.launch(s).result(10)
    g.launch(s).result(10)
    g.close()
    assert sem.value == 4
    sem.destroy()


def test_a_launch_is_one_future_its_tail_resolves(rt: srt.Runtime) -> None:
    """The Run is the only item a launch watches: no Completion or guard event per host node."""
    s = rt.create_stream()
    stage = pinned(rt, 64)
    p = srt.Pipeline("one-future")
    p.host(time.sleep, 0.2, writes=[stage], name="a")
    p.host(lambda: "b", reads=[stage], name="b")
    before = rt._engine.statistics()
    run = p.launch(s)
    during = rt._engine.statistics()
    assert during.pending - before.pending == 1  # the Run itself, on its stream's lane
    assert during.host_calls_pending - before.host_calls_pending == 2
    assert run.result(10) is None and run.host_result("b") == "b"
    assert rt._engine.statistics().pending == 0
