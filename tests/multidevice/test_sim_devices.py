"""The simulator's devices at the backend protocol: peer copies, peer access, per-device clocks, event rules."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from streamrt._backends import sim
from streamrt._backends.protocol import CaptureMode
from streamrt._backends.sim import SimBackend, SimProfile
from streamrt._errors import BackendError

MiB = 1 << 20
# Round numbers make the expected times exact.
PROFILE = SimProfile(
    api_call_us=1.0,
    launch_latency_us=2.0,
    op_gap_us=0.0,
    op_fixed_us=1.0,
    memset_gbps=1000.0,
    d2d_gbps=1000.0,
    h2d_gbps=50.0,
    d2h_gbps=40.0,
    peer_bandwidth_gbps=200.0,
    peer_latency_us=3.0,
)


@pytest.fixture
def b2() -> Iterator[SimBackend]:
    backend = sim.create(devices=2, profile=PROFILE)
    try:
        yield backend
    finally:
        backend.close()


def _on(b: SimBackend, device: int) -> tuple[int, int]:
    """A stream and a 4 MiB device allocation on ``device`` (made current)."""
    b.set_device(device)
    return b.stream_create(), b.malloc(4 * MiB)


def _view(ptr: int, n: int) -> np.ndarray:
    import ctypes

    return np.frombuffer((ctypes.c_uint8 * n).from_address(ptr), dtype=np.uint8)


def _last(b: SimBackend, kind: str) -> sim.OpRecord:
    return [r for r in b.op_log() if r.kind == kind][-1]


def test_peer_copies_move_bytes_and_take_the_peer_bandwidth_once_access_is_enabled(b2: SimBackend) -> None:
    _, d1 = _on(b2, 1)
    s0, d0 = _on(b2, 0)
    _view(d0, 4 * MiB)[:] = np.arange(4 * MiB, dtype=np.uint32).astype(np.uint8)
    b2.memcpy_peer_async(d1, 1, d0, 0, 4 * MiB, s0)
    b2.stream_synchronize(s0)
    staged = _last(b2, "copy_peer")
    assert staged.duration_us == pytest.approx(PROFILE.peer_copy_us(4 * MiB, peer_access=False))
    assert staged.duration_us == pytest.approx(1.0 + 3.0 + 4 * MiB / 40e3)  # min(h2d, d2h) = 40 GB/s
    assert np.array_equal(_view(d1, 4 * MiB), _view(d0, 4 * MiB))
    assert b2.can_access_peer(0, 1) and b2.can_access_peer(1, 0) and not b2.can_access_peer(0, 0)
    b2.enable_peer_access(1)  # from device 0
    b2.enable_peer_access(1)  # idempotent
    assert b2.peer_access_enabled(0, 1) and not b2.peer_access_enabled(1, 0)
    b2.memcpy_peer_async(d1, 1, d0, 0, 4 * MiB, s0)
    b2.stream_synchronize(s0)
    direct = _last(b2, "copy_peer")
    assert direct.duration_us == pytest.approx(1.0 + 3.0 + 4 * MiB / 200e3)
    assert direct.duration_us == pytest.approx(PROFILE.peer_copy_us(4 * MiB))
    assert direct.device == 0 and direct.nbytes == 4 * MiB


def test_a_peer_copy_within_one_device_costs_a_d2d_copy(b2: SimBackend) -> None:
    s0, d0 = _on(b2, 0)
    other = b2.malloc(MiB)
    b2.memcpy_peer_async(other, 0, d0, 0, MiB, s0)
    b2.stream_synchronize(s0)
    assert _last(b2, "copy_peer").duration_us == pytest.approx(PROFILE.copy_us("d2d", MiB))


def test_copies_of_one_link_direction_queue_and_opposite_directions_overlap(b2: SimBackend) -> None:
    s1, d1 = _on(b2, 1)
    s0, d0 = _on(b2, 0)
    s0b = b2.stream_create()
    b2.enable_peer_access(1)
    b2.memcpy_peer_async(d1, 1, d0, 0, 2 * MiB, s0)
    b2.memcpy_peer_async(d1 + 2 * MiB, 1, d0 + 2 * MiB, 0, 2 * MiB, s0b)  # same link 0 -> 1, another stream
    b2.memcpy_peer_async(d0, 0, d1, 1, 2 * MiB, s1)  # the other direction
    b2.device_synchronize()
    b2.set_device(1)
    b2.device_synchronize()
    first, second, back = [r for r in b2.op_log() if r.kind == "copy_peer"]
    assert second.start_us == pytest.approx(first.end_us)  # queued behind the first on link 0 -> 1
    assert back.start_us < first.end_us  # 1 -> 0 ran meanwhile


def test_each_device_has_its_own_timeline_and_waits_carry_time_across(b2: SimBackend) -> None:
    s1, d1 = _on(b2, 1)
    s0, d0 = _on(b2, 0)
    for _ in range(4):
        b2.memset_async(d0, 1, 4 * MiB, s0)  # ~4.2 us each on device 0
    assert b2.device_time_us(0) > 16.0
    assert b2.device_time_us(1) == 0.0  # device 1 has run nothing
    ev = b2.event_create(timing=False)
    b2.event_record(ev, s0)
    t0 = b2.device_time_us(0)
    b2.set_device(1)
    b2.stream_wait_event(s1, ev)
    b2.memset_async(d1, 2, 64, s1)
    b2.stream_synchronize(s1)
    memset1 = _last(b2, "memset")
    assert memset1.device == 1
    assert memset1.start_us >= t0  # not before the event it waited for
    assert b2.device_time_us(1) == pytest.approx(memset1.end_us)
    assert b2.device_time_us(0) == pytest.approx(t0)  # device 1's work did not move device 0


def test_the_same_program_gives_the_same_times_on_every_run() -> None:
    def program() -> list[tuple[object, ...]]:
        b = sim.create(devices=3, profile=PROFILE)
        try:
            streams, bufs = zip(*(_on(b, d) for d in range(3)))
            b.set_device(0)
            b.enable_peer_access(1)
            for i in range(3):
                b.set_device(i)
                ev = b.event_create(timing=False)
                b.memset_async(bufs[i], i, MiB, streams[i])
                b.event_record(ev, streams[i])
                nxt = (i + 1) % 3
                b.set_device(nxt)
                b.stream_wait_event(streams[nxt], ev)
                b.memcpy_peer_async(bufs[nxt], nxt, bufs[i], i, MiB, streams[nxt])
            for d in range(3):
                b.set_device(d)
                b.device_synchronize()
            return [(r.kind, r.device, r.start_us, r.end_us) for r in b.op_log()]
        finally:
            b.close()

    first = program()
    assert first == program()
    assert any(k == "copy_peer" for k, *_ in first)


def test_an_event_is_recorded_only_on_streams_of_its_device(b2: SimBackend) -> None:
    s1, _ = _on(b2, 1)
    s0, _ = _on(b2, 0)
    ev0 = b2.event_create(timing=True)  # device 0 current
    with pytest.raises(BackendError) as info:
        b2.event_record(ev0, s1)
    assert info.value.name == "simErrorInvalidResourceHandle" and "device 0" in str(info.value)
    b2.event_record(ev0, s0)
    b2.set_device(1)
    ev1 = b2.event_create(timing=True)
    b2.event_record(ev1, s1)
    b2.device_synchronize()
    b2.set_device(0)
    b2.device_synchronize()
    with pytest.raises(BackendError, match="no common clock"):
        b2.event_elapsed_ms(ev0, ev1)


def test_peer_access_and_peer_copy_arguments_are_checked(b2: SimBackend) -> None:
    s0, d0 = _on(b2, 0)
    h = b2.host_malloc(64)
    with pytest.raises(BackendError, match="own peer") as info:
        b2.enable_peer_access(0)
    assert info.value.name == "simErrorInvalidDevice"
    with pytest.raises(BackendError, match="simErrorInvalidDevice|does not exist"):
        b2.enable_peer_access(2)
    with pytest.raises(BackendError):
        b2.can_access_peer(0, 5)
    b2.set_device(1)
    d1 = b2.malloc(64)
    b2.set_device(0)
    with pytest.raises(BackendError, match="pinned host memory"):
        b2.memcpy_peer_async(d1, 1, h, 0, 64, s0)
    with pytest.raises(BackendError, match="destination .* is memory of device 0, not of device 1"):
        b2.memcpy_peer_async(d0, 1, d1, 1, 64, s0)
    with pytest.raises(BackendError, match="overrun"):
        b2.memcpy_peer_async(d1, 1, d0, 0, 65, s0)
    with pytest.raises(BackendError, match="memcpy_peer_async"):
        b2.memcpy_async(d1, d0, 64, 3, s0)  # a plain copy does not cross devices
    b2.stream_synchronize(s0)
    assert not [r for r in b2.op_log() if r.kind == "copy_peer"]


def test_a_captured_peer_copy_replays_with_real_bytes(b2: SimBackend) -> None:
    _, d1 = _on(b2, 1)
    s0, d0 = _on(b2, 0)
    b2.enable_peer_access(1)
    b2.stream_begin_capture(s0, CaptureMode.THREAD_LOCAL)
    b2.memcpy_peer_async(d1, 1, d0, 0, 4096, s0)
    graph = b2.stream_end_capture(s0)
    exec_ = b2.graph_instantiate(graph)
    for value in (3, 4):
        _view(d0, 4096)[:] = value
        b2.graph_launch(exec_, s0)
        b2.stream_synchronize(s0)
        assert (_view(d1, 4096) == value).all()
    nodes = [r for r in b2.op_log() if r.graph_exec]
    assert {r.kind for r in nodes} >= {"copy_peer"}
    b2.graph_exec_destroy(exec_)
    b2.graph_destroy(graph)
