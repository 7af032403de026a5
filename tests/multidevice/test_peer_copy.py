"""Peer copies: stream.copy between device buffers of two devices moves the bytes, and only those."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from md_helpers import HostGate, pattern
from support.transfer import download, upload

import streamrt as srt


def test_every_pair_of_four_devices_copies_real_bytes_on_either_side_stream(machine) -> None:
    rts = machine(4)
    streams = [rt.create_stream() for rt in rts]
    n = 3 * 4096 + 17
    for i, j in itertools.permutations(range(4), 2):
        data = pattern(n, 10 * i + j)
        src = upload(rts[i], streams[i], data)
        dst = rts[j].device_allocator.allocate(n, stream=streams[j])
        on = i if (i + j) % 2 else j  # alternately the source's and the destination's stream
        s = streams[on]
        s.copy(dst, src)
        s.synchronize()
        assert np.array_equal(download(rts[j], streams[j], dst), data), (i, j, on)
        src.release()
        dst.release()
    kinds = {r.kind for r in rts[0].backend.op_log()}
    assert "copy_peer" in kinds


def test_views_and_partial_sizes_copy_exactly_their_bytes(pair) -> None:
    rt0, rt1 = pair
    s0, s1 = rt0.create_stream(), rt1.create_stream()
    data = pattern(8192, 3)
    src = upload(rt0, s0, data)
    dst = upload(rt1, s1, np.zeros(8192, np.uint8))
    s1.copy(dst.view(1000, 3000), src.view(4000), nbytes=2500)
    expected = np.zeros(8192, np.uint8)
    expected[1000:3500] = data[4000:6500]
    assert np.array_equal(download(rt1, s1, dst), expected)


def test_a_stream_of_a_third_device_copies_between_two_others(machine) -> None:
    rt0, rt1, rt2 = machine(3)
    s0, s1, s2 = rt0.create_stream(), rt1.create_stream(), rt2.create_stream()
    data = pattern(5000, 7)
    src = upload(rt0, s0, data)
    dst = rt1.device_allocator.allocate(5000, stream=s1)
    s1.synchronize()
    s2.copy(dst, src)
    s2.synchronize()
    assert np.array_equal(download(rt1, s1, dst), data)
    peer = [r for r in rt0.backend.op_log() if r.kind == "copy_peer"]
    assert peer[-1].device == 2


def test_peer_access_is_enabled_once_per_pair_in_both_directions(machine) -> None:
    rts = machine(3)
    backend = rts[0].backend
    assert not backend.peer_access_enabled(0, 1)
    s0, s1 = rts[0].create_stream(), rts[1].create_stream()
    a = rts[0].device_allocator.allocate(64, stream=s0)
    b = rts[1].device_allocator.allocate(64, stream=s1)
    s0.synchronize()
    s1.synchronize()
    calls: list[int] = []
    enable = backend.enable_peer_access
    backend.enable_peer_access = lambda peer: (calls.append(peer), enable(peer))[1]  # type: ignore[method-assign]
    try:
        for _ in range(3):
            s0.copy(b, a)
            s1.copy(a, b)
    finally:
        del backend.enable_peer_access
    s0.synchronize()
    s1.synchronize()
    assert sorted(calls) == [0, 1]  # 0 -> 1 from device 0, 1 -> 0 from device 1, once each
    assert backend.peer_access_enabled(0, 1) and backend.peer_access_enabled(1, 0)
    assert not backend.peer_access_enabled(0, 2)


def test_a_released_peer_buffer_is_not_reused_before_the_copy_ran(pair) -> None:
    """The source (device 0) is released right after a peer copy queued behind a closed gate on device
    1. Its memory must not come back to device 0's allocator until the copy ran: a new allocation of
    the same size is another block (or waits), and overwriting it does not change what is copied."""
    rt0, rt1 = pair
    s0, s1 = rt0.create_stream(), rt1.create_stream()
    n = 1 << 16
    data = pattern(n, 5)
    src = upload(rt0, s0, data)
    dst = rt1.device_allocator.allocate(n, stream=s1)
    gate = HostGate()
    s1.launch_host_func(gate)
    s1.copy(dst, src)
    old = src.ptr
    src.release()
    rt0.releaser.drain()  # whatever the release handed to the releaser thread has run
    fresh = rt0.device_allocator.allocate(n, stream=s0)
    s0.memset(fresh, 0xFF)
    s0.synchronize()
    gate.open()
    assert fresh.ptr != old
    assert np.array_equal(download(rt1, s1, dst), data)
    fresh.release()
    reused = rt0.device_allocator.allocate(n, stream=s0)  # the copy has run: the old block may come back
    reused.release()


def test_the_peer_stream_stands_for_the_copy_in_the_other_runtime(pair) -> None:
    rt0, rt1 = pair
    s0, s1 = rt0.create_stream(), rt1.create_stream()
    src = upload(rt0, s0, pattern(4096, 1))
    dst = rt1.device_allocator.allocate(4096, stream=s1)
    gate = HostGate()
    s1.launch_host_func(gate)
    s1.copy(dst, src)
    peer = rt0._peer_stream()
    assert peer.device == 0
    assert set(src.streams) == {s0, peer}  # never device 1's stream: its fences live on device 0
    assert s1 in dst.streams
    try:
        assert gate.started.wait(5)
        time.sleep(0.05)
        assert not peer.is_idle  # it waits for the gated copy
    finally:
        gate.open()
    s1.synchronize()
    peer.synchronize()
    assert peer.is_idle


# -- what is refused, before anything is enqueued -----------------------------------------------------


def _log_len(rt: srt.Runtime) -> int:
    rt.backend.device_synchronize()
    return len(rt.backend.op_log())


def test_a_peer_copy_takes_device_buffers_only(pair) -> None:
    rt0, rt1 = pair
    s0, s1 = rt0.create_stream(), rt1.create_stream()
    d0 = rt0.device_allocator.allocate(64, stream=s0)
    h1 = rt1.host_allocator.allocate(64)
    h0 = rt0.host_allocator.allocate(64)
    d1 = rt1.device_allocator.allocate(64, stream=s1)
    s0.synchronize()
    s1.synchronize()
    before = _log_len(rt0)
    with pytest.raises(ValueError, match="device buffers only"):
        s0.copy(d0, h1)
    with pytest.raises(ValueError, match="both sides must be device buffers"):
        s0.copy(h0, d1)
    assert _log_len(rt0) == before


def test_a_copy_between_two_buffers_of_another_device_is_refused(machine) -> None:
    rt0, rt1 = machine(2)
    s0, s1 = rt0.create_stream(), rt1.create_stream()
    a = rt1.device_allocator.allocate(64, stream=s1)
    b = rt1.device_allocator.allocate(64, stream=s1)
    s1.synchronize()
    with pytest.raises(ValueError, match="both buffers are on device 1"):
        s0.copy(a, b)


def test_other_runtimes_on_the_same_device_are_not_peers(pair) -> None:
    """Two runtimes on device 0 of one machine share the backend, but a buffer still belongs to one runtime."""
    rt0, _ = pair
    twin = srt.open_runtime("sim", device=0, devices=2)
    try:
        assert twin.backend is rt0.backend
        s0 = rt0.create_stream()
        d0 = rt0.device_allocator.allocate(64, stream=s0)
        theirs = twin.device_allocator.allocate(64)
        with pytest.raises(ValueError, match="another runtime on the same device"):
            s0.copy(d0, theirs)
        with pytest.raises(ValueError, match="another runtime or device"):
            s0.memset(theirs, 0)
        s0.wait(twin.create_stream().record())  # events may cross runtimes of one backend
        s0.synchronize()
        theirs.release()
    finally:
        twin.close()


def test_buffers_of_another_backend_instance_are_refused(pair) -> None:
    rt0, _ = pair
    s0 = rt0.create_stream()
    d0 = rt0.device_allocator.allocate(64, stream=s0)
    with srt.open_runtime("sim", device=1, devices=2, check_hazards=True) as stranger:
        assert stranger.backend is not rt0.backend
        theirs = stranger.device_allocator.allocate(64)
        before = _log_len(rt0)
        with pytest.raises(ValueError, match="different backend instance"):
            s0.copy(d0, theirs)
        with pytest.raises(ValueError, match="different backend instance"):
            s0.copy(theirs, d0)
        with pytest.raises(ValueError, match="another runtime"):
            s0.memset(theirs, 0)
        assert _log_len(rt0) == before
        theirs.release()


def test_a_buffer_of_a_closed_runtime_is_refused(machine) -> None:
    rt0, _, rt2 = machine(3)
    s0 = rt0.create_stream()
    d0 = rt0.device_allocator.allocate(64, stream=s0)
    d2 = rt2.device_allocator.allocate(64)
    rt2.close()
    with pytest.raises(srt.ClosedError, match="closed"):
        s0.copy(d0, d2)


def test_sizes_and_read_only_destinations_are_checked_for_peer_copies(pair) -> None:
    rt0, rt1 = pair
    s0, s1 = rt0.create_stream(), rt1.create_stream()
    small = rt0.device_allocator.allocate(32, stream=s0)
    big = rt1.device_allocator.allocate(64, stream=s1)
    s0.synchronize()
    s1.synchronize()
    before = _log_len(rt0)
    with pytest.raises(ValueError, match="exceeds"):
        s0.copy(small, big)  # 64 bytes into 32
    with pytest.raises(ValueError, match="exceeds"):
        s0.copy(big, small, nbytes=33)
    assert _log_len(rt0) == before
    s0.copy(small, big, nbytes=32)
    s0.synchronize()
