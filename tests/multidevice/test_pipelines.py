"""Pipelines spanning devices: nodes run on their devices' streams, cross-device edges become events."""

from __future__ import annotations

import time

import numpy as np
import pytest
from md_helpers import HostGate, pattern
from support.transfer import download, upload

import streamrt as srt


def _ops(rt: srt.Runtime, since: int = 0) -> list:
    return [r for r in rt.backend.op_log() if r.seq > since]


def _seq(rt: srt.Runtime) -> int:
    log = rt.backend.op_log()
    return log[-1].seq if log else 0


def test_a_pipeline_runs_each_node_on_its_device_and_orders_devices_with_events(pair) -> None:
    """device 0: memset -> peer copy to device 1 -> device 1: memset of a part -> D2H into device 1's
    pinned buffer -> host node reading it. Launched on device 0's stream, eagerly."""
    rt0, rt1 = pair
    s0 = rt0.create_stream()
    n = 1 << 14
    a0 = rt0.device_allocator.allocate(n, stream=s0)
    b1 = rt1.device_allocator.allocate(n)
    h1 = rt1.host_allocator.allocate(n)
    seen: list[np.ndarray] = []
    p = srt.Pipeline("two-devices")
    p.memset(a0, 0x11, name="fill")
    p.copy(dst=b1, src=a0, name="to1")
    p.memset(b1.view(0, 256), 0x22, name="mark")
    p.copy(dst=h1, src=b1, name="down")
    p.host(lambda: seen.append(h1.numpy().copy()), reads=[h1], name="look")
    assert p.runtimes == (rt0, rt1)
    start = _seq(rt0)
    run = p.launch(s0)
    run.result(10)
    expected = np.full(n, 0x11, np.uint8)
    expected[:256] = 0x22
    assert np.array_equal(seen[0], expected)
    assert len(run.streams) == 2 and run.streams[1].device == 1
    ops = _ops(rt0, start)
    dev = {(r.kind, r.nbytes): r.device for r in ops if r.kind in ("memset", "copy_peer", "copy_d2h")}
    assert dev[("memset", n)] == 0 and dev[("copy_peer", n)] == 0  # the peer copy runs on the launch device
    assert dev[("memset", 256)] == 1 and dev[("copy_d2h", n)] == 1
    assert any(r.kind == "wait_event" and r.device == 1 for r in ops)  # the edge 0 -> 1 is an event
    assert any(r.kind == "wait_event" and r.device == 0 for r in ops)  # and the join 1 -> 0


def test_device_1_nodes_wait_for_a_gated_device_0_node(pair) -> None:
    rt0, rt1 = pair
    s0 = rt0.create_stream()
    h0 = rt0.host_allocator.allocate(64)
    d0 = rt0.device_allocator.allocate(64, stream=s0)
    d1 = rt1.device_allocator.allocate(64)
    h1 = rt1.host_allocator.allocate(64)
    h1.numpy()[:] = 0
    gate = HostGate()
    p = srt.Pipeline("gated")
    g = p.host(gate, writes=[h0], name="gate")
    z = p.memset(d0, 9, after=[g], name="z")
    c = p.copy(dst=d1, src=d0, name="peer")
    p.copy(dst=h1, src=d1, name="down")
    assert p.predecessors(c) == {z: frozenset({"RAW"})}
    run = p.launch(s0)
    try:
        assert gate.started.wait(5)
        time.sleep(0.1)
        assert not run.is_done
        assert (h1.numpy() == 0).all()
    finally:
        gate.open()
    run.result(10)
    assert (h1.numpy() == 9).all()


def test_fork_branches_on_two_devices_are_joined_into_the_launch_stream(pair) -> None:
    rt0, rt1 = pair
    s0 = rt0.create_stream()
    n = 4096
    a0 = rt0.device_allocator.allocate(n, stream=s0)
    b0 = rt0.device_allocator.allocate(n, stream=s0)
    a1 = rt1.device_allocator.allocate(n)
    h0, h1 = rt0.host_allocator.allocate(n), rt1.host_allocator.allocate(n)
    gate = HostGate()
    p = srt.Pipeline("forked")
    p.memset(a0, 1)
    p.copy(dst=h0, src=a0)
    g = p.host(gate, reads=[h1], name="hold1")  # device 1's branch is held by a host node on device 1
    p.memset(a1, 2, after=[g])
    p.copy(dst=h1, src=a1)
    p.memset(b0, 3)
    run = p.launch(s0, policy="fork")
    try:
        assert gate.started.wait(5)
        assert {s.device for s in run.streams} == {0, 1}
        after = s0.wait_idle()  # the launch stream joined every branch, device 1's included
        time.sleep(0.05)
        assert not after.is_done
    finally:
        gate.open()
    after.wait(10)
    run.result(10)
    assert (h0.numpy() == 1).all() and (h1.numpy() == 2).all()
    assert (download(rt0, s0, b0) == 3).all()
    with pytest.raises(ValueError, match="join=True"):
        p.launch(s0, policy="fork", join=False)


def test_a_pipeline_launches_from_either_device_and_relaunches(pair) -> None:
    rt0, rt1 = pair
    s0, s1 = rt0.create_stream(), rt1.create_stream()
    data = pattern(8192, 2)
    a0 = upload(rt0, s0, data)
    b1 = rt1.device_allocator.allocate(8192, stream=s1)
    c0 = rt0.device_allocator.allocate(8192, stream=s0)
    p = srt.Pipeline("there-and-back")
    p.copy(dst=b1, src=a0, name="out")
    p.memset(b1.view(100, 10), 0xEE, name="touch")
    p.copy(dst=c0, src=b1, name="back")
    expected = data.copy()
    expected[100:110] = 0xEE
    for launch_on in (s0, s1, s0, s1):
        run = p.launch(launch_on)
        run.result(10)
        assert np.array_equal(download(rt0, s0, c0), expected)
    runs = [p.launch(s0) for _ in range(5)]  # back to back: each waits for the previous one
    runs[-1].result(10)
    assert np.array_equal(download(rt0, s0, c0), expected)


def test_a_record_node_records_on_its_event_device(pair) -> None:
    rt0, rt1 = pair
    s0, s1 = rt0.create_stream(), rt1.create_stream()
    d1 = rt1.device_allocator.allocate(64, stream=s1)
    h1 = rt1.host_allocator.allocate(64)
    ev1 = rt1.create_event()
    d0 = rt0.device_allocator.allocate(64, stream=s0)
    p = srt.Pipeline("signal")
    m = p.memset(d0, 4)
    p.record(ev1, after=[m])  # an event of device 1: recorded on a device-1 stream
    run = p.launch(s0)
    s1.wait(ev1)
    s1.memset(d1, 5)
    s1.copy(h1, d1)
    s1.synchronize()
    run.result(10)
    assert (h1.numpy() == 5).all()


def test_what_a_pipeline_across_devices_refuses(pair) -> None:
    rt0, rt1 = pair
    s0 = rt0.create_stream()
    d0 = rt0.device_allocator.allocate(64, stream=s0)
    d1 = rt1.device_allocator.allocate(64)
    h0, h1 = rt0.host_allocator.allocate(64), rt1.host_allocator.allocate(64)
    p = srt.Pipeline("refusals")
    p.memset(d0, 0)
    with pytest.raises(ValueError, match="several devices"):
        p.host(print, reads=[h0], writes=[h1])
    with pytest.raises(ValueError, match="peer copy"):
        p.copy(dst=d0, src=h1)
    with pytest.raises(ValueError, match="several devices"):
        p.enqueue(lambda s: None, reads=[d0, d1])
    twin = srt.open_runtime("sim", device=0, devices=2)
    stranger = srt.open_runtime("sim")
    try:
        with pytest.raises(ValueError, match="another runtime"):
            p.memset(twin.device_allocator.allocate(64), 0)  # same device, another runtime
        with pytest.raises(ValueError, match="another runtime"):
            p.memset(stranger.device_allocator.allocate(64), 0)  # another backend instance
        with pytest.raises(ValueError, match="another runtime"):
            p.wait(stranger.create_event())
        p.copy(dst=d1, src=d0)  # a peer copy: now the pipeline spans devices
        with pytest.raises(ValueError, match="another runtime"):
            p.launch(twin.create_stream())
        with pytest.raises(srt.CaptureError, match="spanning devices"):
            p.capture(s0)
    finally:
        stranger.close()
        twin.close()
    p.launch(s0).result(10)  # still launchable after the refusals


def test_a_single_device_pipeline_is_untouched(pair) -> None:
    """No other device in the pipeline: one stream, no extra events, captures work."""
    rt0, _ = pair
    s0 = rt0.create_stream()
    d0 = rt0.device_allocator.allocate(64, stream=s0)
    h0 = rt0.host_allocator.allocate(64)
    p = srt.Pipeline("local")
    p.memset(d0, 6)
    p.copy(dst=h0, src=d0)
    run = p.launch(s0)
    run.result(10)
    assert run.streams == (s0,)
    g = p.capture(s0)
    g.launch(s0).result(10)
    g.close()
    assert (h0.numpy() == 6).all()


def test_a_traced_launch_labels_the_nodes_of_every_device(pair) -> None:
    """With both runtimes traced, each traces the nodes that ran on its streams, named after the pipeline."""
    rt0, rt1 = pair
    s0 = rt0.create_stream()
    a0 = rt0.device_allocator.allocate(4096, stream=s0)
    b1 = rt1.device_allocator.allocate(4096)
    p = srt.Pipeline("traced")
    p.memset(a0, 1, name="fill0")
    p.copy(dst=b1, src=a0, name="peer")
    p.memset(b1.view(0, 64), 2, name="fill1")
    with rt0.trace() as t0, rt1.trace() as t1:
        p.launch(s0).result(10)
        rt1.synchronize()
        rt0.synchronize()
    mine0 = {(r.node, r.kind): r for r in t0.records if r.traced and r.pipeline == "traced" and r.node}
    mine1 = {(r.node, r.kind): r for r in t1.records if r.traced and r.pipeline == "traced" and r.node}
    assert ("fill0", "memset") in mine0 and ("fill1", "memset") in mine1
    peer = mine0[("peer", "device_to_device")]
    assert peer.category == "copy" and peer.nbytes == 4096
    assert ("peer", "record") in mine0 and ("fill1", "wait_event") in mine1  # the cross-device edge
    assert mine1[("fill1", "memset")].device_start_us >= peer.device_end_us
