"""Ordering across devices: a stream of one device waits on an event recorded on another."""

from __future__ import annotations

import time

import numpy as np
import pytest
from md_helpers import HostGate, pattern
from support.transfer import download, upload

import streamrt as srt


def test_nothing_on_device_1_runs_before_a_gated_event_of_device_0(pair) -> None:
    """Device 1 waits for an event recorded on device 0 behind a host function that holds device 0's
    stream: while the gate is closed, none of device 1's later work runs, its host buffer stays
    untouched and nothing reports completion; once the gate opens everything runs, in order."""
    rt0, rt1 = pair
    s0, s1 = rt0.create_stream(), rt1.create_stream()
    d1 = rt1.device_allocator.allocate(4096, stream=s1)
    h1 = rt1.host_allocator.allocate(4096)
    h1.numpy()[:] = 7
    gate = HostGate()
    held = s0.launch_host_func(gate)
    ev = s0.record()
    s1.wait(ev)
    s1.memset(d1, 0xAB)
    s1.copy(h1, d1)
    idle1 = s1.wait_idle()
    assert gate.started.wait(5)
    time.sleep(0.1)  # real time for anything that could run early to do so
    assert not ev.is_done and not s1.is_idle and not idle1.is_done
    assert (h1.numpy() == 7).all()
    assert not [r for r in rt1.backend.op_log() if r.device == 1 and r.kind in ("memset", "copy_d2h")]
    gate.open()
    held.result(5)
    idle1.wait(5)
    assert (h1.numpy() == 0xAB).all()
    log = rt1.backend.op_log()
    record = next(r for r in log if r.kind == "event_record" and r.device == 0)
    memset = next(r for r in log if r.kind == "memset" and r.device == 1)
    assert memset.start_us >= record.end_us  # virtual time follows the wait across devices


def test_device_work_before_the_event_is_visible_after_the_wait(pair) -> None:
    """Data written on device 0 before the record is what device 1's peer copy reads after the wait."""
    rt0, rt1 = pair
    s0, s1 = rt0.create_stream(), rt1.create_stream()
    src = upload(rt0, s0, pattern(1 << 16, 1))
    dst = rt1.device_allocator.allocate(1 << 16, stream=s1)
    gate = HostGate()
    s0.launch_host_func(gate)
    s0.memset(src, 0x3C)  # runs only after the gate
    s1.wait(s0.record())
    s1.copy(dst, src)  # a peer copy on device 1's stream
    done = s1.wait_idle()
    assert gate.started.wait(5)
    time.sleep(0.05)
    assert not done.is_done
    gate.open()
    assert (download(rt1, s1, dst) == 0x3C).all()


def test_wait_stream_on_a_stream_of_another_device(pair) -> None:
    rt0, rt1 = pair
    s0, s1 = rt0.create_stream(), rt1.create_stream()
    gate = HostGate()
    s0.launch_host_func(gate)
    s1.wait_stream(s0)
    h1 = rt1.host_allocator.allocate(64)
    h1.numpy()[:] = 0
    d1 = rt1.device_allocator.allocate(64, stream=s1)
    s1.memset(d1, 1)
    s1.copy(h1, d1)
    assert gate.started.wait(5)
    time.sleep(0.05)
    assert (h1.numpy() == 0).all()
    gate.open()
    s1.synchronize()
    assert (h1.numpy() == 1).all()


def test_a_chain_across_all_devices_keeps_its_order(machine) -> None:
    """Device i adds its mark to a buffer that travels 0 -> 1 -> 2 -> 3 by peer copies, each hop waiting on
    the previous device's event: the result has every mark, so no hop ran before its predecessor."""
    rts = machine(4)
    streams = [rt.create_stream() for rt in rts]
    n = 4096
    bufs = [rt.device_allocator.allocate(n, stream=s) for rt, s in zip(rts, streams)]
    stage = [rt.host_allocator.allocate(n) for rt in rts]
    for rt, s, b in zip(rts, streams, bufs):
        s.memset(b, 0)
    gate = HostGate()
    streams[0].launch_host_func(gate)
    for i, (rt, s) in enumerate(zip(rts, streams)):
        if i:
            s.wait(streams[i - 1].record())
            s.copy(bufs[i], bufs[i - 1])
        # mark bytes [i*1024, (i+1)*1024) with i+1
        s.memset(bufs[i].view(i * 1024, 1024), i + 1)
    last = streams[-1]
    last.copy(stage[-1], bufs[-1])
    done = last.wait_idle()
    assert gate.started.wait(5)
    time.sleep(0.05)
    assert not done.is_done
    gate.open()
    done.wait(10)
    expected = np.repeat(np.arange(1, 5, dtype=np.uint8), 1024)
    assert np.array_equal(stage[-1].numpy(), expected)


def test_waiting_on_an_event_never_recorded_is_a_no_op_across_devices(pair) -> None:
    rt0, rt1 = pair
    s1 = rt1.create_stream()
    s1.wait(rt0.create_event())
    s1.synchronize()
    assert s1.is_idle


def test_timing_events_of_two_devices_have_no_common_clock(pair) -> None:
    rt0, rt1 = pair
    s0, s1 = rt0.create_stream(), rt1.create_stream()
    a, b = rt0.create_event(timing=True), rt1.create_event(timing=True)
    c = rt0.create_event(timing=True)
    s0.record(a)
    s1.record(b)
    d0 = rt0.device_allocator.allocate(1 << 20, stream=s0)
    s0.memset(d0, 1)
    s0.record(c)
    s0.synchronize()
    s1.synchronize()
    with pytest.raises(ValueError, match="one device"):
        a.elapsed_ms(b)
    assert a.elapsed_ms(c) > 0


def test_a_race_between_devices_is_a_hazard_and_an_event_removes_it(machine) -> None:
    """With hazard checking on, a peer copy that reads device 0 memory while device 0 still writes it
    (no event between them) is reported; the same copy after a wait on device 0's event is not."""
    rt0, rt1 = machine(2, check_hazards=True)
    backend = rt0.backend
    s0, s1 = rt0.create_stream(), rt1.create_stream()
    src = rt0.device_allocator.allocate(4096, stream=s0)
    dst = rt1.device_allocator.allocate(4096, stream=s1)
    s0.synchronize()
    s1.synchronize()
    backend.clear_hazards()
    s0.memset(src, 1)
    s1.copy(dst, src)  # unordered with the memset
    races = [h for h in backend.hazards() if h.kind == "race"]
    assert races and "copy_peer" in races[0].message
    s0.synchronize()
    s1.synchronize()
    backend.clear_hazards()
    s0.memset(src, 2)
    s1.wait(s0.record())
    s1.copy(dst, src)
    s1.synchronize()
    assert backend.hazards() == ()
    assert (download(rt1, s1, dst) == 2).all()


def test_events_of_another_backend_instance_are_refused(pair) -> None:
    rt0, _ = pair
    s0 = rt0.create_stream()
    with srt.open_runtime("sim", device=1, devices=3) as stranger:
        ev = stranger.create_stream().record()
        with pytest.raises(ValueError, match="different backend instance"):
            s0.wait(ev)
        with pytest.raises(ValueError, match="another runtime"):
            s0.record(ev)
    s0.synchronize()
    assert not [r for r in rt0.backend.op_log() if r.kind == "wait_event"]
