"""The simulator's virtual clock: deterministic times from the cost model."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from _sim_helpers import PyHostFn, view

from streamrt._backends import sim
from streamrt._backends.protocol import CaptureMode, MemcpyKind
from streamrt._backends.sim import OpRecord, SimBackend, SimProfile

H2D, D2H = MemcpyKind.HOST_TO_DEVICE, MemcpyKind.DEVICE_TO_HOST

# round numbers so expected times can be written down exactly
ROUND = SimProfile(
    api_call_us=1.0,
    launch_latency_us=10.0,
    op_gap_us=2.0,
    op_fixed_us=0.5,
    memset_gbps=1000.0,  # 1e6 bytes -> 1 µs
    h2d_gbps=100.0,  # 1e6 bytes -> 10 µs
    d2h_gbps=50.0,  # 1e6 bytes -> 20 µs
    d2d_gbps=1000.0,
    host_func_us=40.0,
    host_func_start_us=15.0,
    kernel_default_us=1.0,
    sync_wake_us=3.0,
    graph_node_gap_us=0.25,
)
MB = 1_000_000


def _program(b: SimBackend) -> tuple[list[OpRecord], float, float]:
    """A fixed mixed workload; returns the op log, an elapsed time and the final host clock."""
    s1, s2 = b.stream_create(), b.stream_create()
    d = b.malloc(4 * MB)
    h = b.host_malloc(4 * MB)
    t0, t1 = b.event_create(timing=True), b.event_create(timing=True)
    ev = b.event_create(timing=False)
    fn = PyHostFn()
    b.event_record(t0, s1)
    b.memset_async(d, 1, 2 * MB, s1)
    b.memcpy_async(h, d, MB, D2H, s1)
    b.launch_host_func(s1, fn.ptr, 1)
    b.event_record(ev, s1)
    b.stream_wait_event(s2, ev)
    b.memcpy_async(d + 2 * MB, h, MB, H2D, s2)
    b.memcpy_async(d + 3 * MB, h, MB, H2D, s1)  # queues on the H2D copy engine behind s2's
    b.event_record(t1, s2)
    b.stream_begin_capture(s1, CaptureMode.GLOBAL)
    b.memset_async(d, 2, MB, s1)
    b.memcpy_async(h, d, MB, D2H, s1)
    g = b.stream_end_capture(s1)
    ge = b.graph_instantiate(g)
    for _ in range(3):
        b.graph_launch(ge, s1)
    b.stream_synchronize(s2)
    b.device_synchronize()
    b.memset_async(d, 0, 64, s2)
    b.stream_synchronize(s2)
    elapsed = b.event_elapsed_ms(t0, t1)
    return b.op_log(), elapsed, b.host_now_us()


@pytest.mark.parametrize("profile", [None, ROUND], ids=["h200", "round"])
def test_the_same_program_gives_identical_times_on_every_run(profile: SimProfile | None) -> None:
    runs = []
    for _ in range(2):
        b = sim.create(profile=profile)
        try:
            runs.append(_program(b))
        finally:
            b.close()
    (log_a, ms_a, host_a), (log_b, ms_b, host_b) = runs
    assert len(log_a) == 19  # 9 eager ops, 3 replays of 2 nodes + their end markers, 1 memset
    assert log_a == log_b  # every field: kinds, streams, bytes, enqueue/start/end times, threads
    assert ms_a == ms_b
    assert host_a == host_b


def test_op_times_follow_the_cost_model() -> None:
    b = sim.create(profile=ROUND)
    try:
        s = b.stream_create()  # host clock 1
        d = b.malloc(MB)  # 2
        h = b.host_malloc(MB)  # 3
        fn = PyHostFn()
        b.memset_async(d, 0, MB, s)  # issued at 4
        b.memcpy_async(d, h, MB, H2D, s)  # 5
        b.launch_host_func(s, fn.ptr, 0)  # 6
        b.memcpy_async(h, d, MB, D2H, s)  # 7
        assert b.host_now_us() == 7.0
        b.stream_synchronize(s)
        memset, h2d, host, d2h = b.op_log()
        # idle stream: issue + launch latency; duration fixed 0.5 + 1e6 B / 1000 GB/s
        assert (memset.enqueue_us, memset.start_us, memset.end_us) == (4.0, 14.0, 15.5)
        # after a device op, the 2 µs gap; 0.5 + 1e6 B / 100 GB/s
        assert (h2d.enqueue_us, h2d.start_us, h2d.end_us) == (5.0, 17.5, 28.0)
        # a host function occupies the stream for host_func_us
        assert (host.start_us, host.end_us) == (30.0, 70.0)
        # no gap after a host function; 0.5 + 1e6 B / 50 GB/s
        assert (d2h.start_us, d2h.end_us) == (70.0, 90.5)
        # the synchronize returned sync_wake_us after the completion it waited for
        assert b.host_now_us() == 93.5
        b.memset_async(d, 0, MB, s)
        b.stream_synchronize(s)
        assert b.op_log()[-1].start_us == 94.5 + 10.0
    finally:
        b.close()


def test_empty_kernel_gap_and_host_function_gap_match_the_h200_figures() -> None:
    p = SimProfile()
    assert p.kernel_default_us + p.op_gap_us == pytest.approx(3.0)  # empty kernel gap ~3 µs
    assert p.host_func_us == pytest.approx(48.0)  # host function gap 48 µs
    assert p.launch_latency_us + p.host_func_start_us == pytest.approx(20.0)  # launch -> host fn start
    assert p.h2d_gbps == p.d2h_gbps == 55.0
    assert p.d2d_gbps == pytest.approx(2100.0)
    assert p.api_call_us == pytest.approx(2.0)
    assert p.event_record_us == 0.0
    # pinned H2D of 55 MB takes 1 ms (+ the fixed part)
    assert p.copy_us("h2d", 55_000_000) == pytest.approx(1000.0 + p.op_fixed_us)


def test_copy_engines_serialize_copies_of_one_direction_across_streams() -> None:
    for serialize in (True, False):
        b = sim.create(profile=ROUND.replace(serialize_copy_engines=serialize))
        try:
            s1, s2, s3 = b.stream_create(), b.stream_create(), b.stream_create()  # host 3
            d, h = b.malloc(3 * MB), b.host_malloc(3 * MB)  # host 5
            b.memcpy_async(d, h, MB, H2D, s1)  # issued 6: [16, 26.5]
            b.memcpy_async(d + MB, h + MB, MB, H2D, s2)  # issued 7: waits for the engine?
            b.memcpy_async(h + 2 * MB, d + 2 * MB, MB, D2H, s3)  # other direction: never waits
            b.device_synchronize()
            first, second, other = b.op_log()
            assert first.start_us == 16.0 and first.end_us == 26.5
            assert second.start_us == (26.5 if serialize else 17.0)
            assert other.start_us == 18.0
        finally:
            b.close()


def test_queries_cost_no_virtual_time_and_calls_cost_api_time(sb: SimBackend) -> None:
    s = sb.stream_create()
    t = sb.host_now_us()
    for _ in range(10):
        sb.stream_query(s)
        sb.pointer_kind(0)
        sb.capabilities(0)
    assert sb.host_now_us() == t
    ev = sb.event_create(timing=False)
    assert sb.host_now_us() == t + sb.profile.api_call_us
    assert sb.advance_host_clock(100.0) == t + sb.profile.api_call_us + 100.0
    del ev


def test_each_host_thread_has_its_own_clock_and_name_in_the_log(sb: SimBackend) -> None:
    s1, s2 = sb.stream_create(), sb.stream_create()
    h = sb.host_malloc(8)
    main_clock = sb.host_now_us()
    other: dict[str, float] = {}

    def worker() -> None:
        sb.memset_async(h, 1, 4, s2)
        sb.stream_synchronize(s2)
        other["clock"] = sb.host_now_us()

    t = threading.Thread(target=worker, name="sim-test-worker")
    t.start()
    t.join()
    assert sb.host_now_us() == main_clock  # the worker's calls did not move this thread's clock
    rec = sb.op_log()[-1]
    assert rec.thread == "sim-test-worker"
    assert rec.enqueue_us == sb.profile.api_call_us  # the worker's clock started at 0
    assert other["clock"] > rec.end_us
    sb.memset_async(h + 4, 2, 4, s1)
    sb.stream_synchronize(s1)
    assert sb.op_log()[-1].thread == threading.current_thread().name
    assert list(view(h, 8)) == [1] * 4 + [2] * 4


def test_profile_json_round_trip_and_create_from_a_path(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    text = ROUND.to_json(path)
    assert json.loads(path.read_text()) == json.loads(text)
    assert SimProfile.from_json(path) == ROUND
    assert SimProfile.from_json(text) == ROUND
    b = sim.create(profile=str(path))
    try:
        assert b.profile == ROUND
    finally:
        b.close()
    path.write_text(json.dumps({"name": "small", "total_memory": 1e9}))
    small = SimProfile.from_json(path)
    assert small.total_memory == 1_000_000_000 and small.api_call_us == SimProfile().api_call_us


def test_profile_validation() -> None:
    with pytest.raises(ValueError, match="unknown SimProfile field"):
        SimProfile.from_dict({"api_call_us": 1.0, "warp_speed": 9})
    with pytest.raises(ValueError):
        SimProfile(h2d_gbps=0)
    with pytest.raises(ValueError):
        SimProfile(api_call_us=-1)
    with pytest.raises(ValueError):
        SimProfile(total_memory=0)
    with pytest.raises(TypeError):
        sim.create(profile=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sim.create(devices=0)
    with pytest.raises(ValueError):
        sim.create(check_hazards="loud")


def test_capabilities_come_from_the_profile() -> None:
    b = sim.create(profile=SimProfile(name="H100", total_memory=80 * 10**9, multiprocessor_count=114))
    try:
        caps = b.capabilities(0)
        assert caps.backend == "sim" and caps.is_simulated and caps.virtual_clock
        assert caps.device_name == "streamrt simulated H100"
        assert caps.architecture == "sim"
        assert caps.total_memory == 80 * 10**9 and caps.multiprocessor_count == 114
        assert caps.supports_graphs and caps.supports_stream_ordered_alloc
        assert b.mem_get_info() == (80 * 10**9, 80 * 10**9)
    finally:
        b.close()
    b = sim.create()
    try:
        caps = b.capabilities(0)
        assert caps.device_name == "streamrt simulated H200"
        assert caps.multiprocessor_count == 132 and caps.total_memory == 141 * 10**9
        assert caps.priority_range == (0, -5)
    finally:
        b.close()
