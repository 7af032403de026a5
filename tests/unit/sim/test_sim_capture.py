"""Stream capture and graph replay on the simulator, modelled on CUDA's rules."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from _sim_helpers import PyHostFn, view

from streamrt._backends import sim
from streamrt._backends.protocol import CaptureMode, MemcpyKind
from streamrt._backends.sim import SimBackend, SimProfile
from streamrt._errors import BackendError, CaptureError

H2D, D2H = MemcpyKind.HOST_TO_DEVICE, MemcpyKind.DEVICE_TO_HOST
GLOBAL, THREAD_LOCAL, RELAXED = CaptureMode.GLOBAL, CaptureMode.THREAD_LOCAL, CaptureMode.RELAXED


def _capture_fork_join(b: SimBackend, s1: int, s2: int, d: int, h: int, fn_ptr: int) -> int:
    """memset(d[0:512]) on s1 || memset(d[512:1024]) + host fn on s2, joined, then D2H of d to h."""
    fork, join = b.event_create(timing=False), b.event_create(timing=False)
    b.stream_begin_capture(s1, GLOBAL)
    b.event_record(fork, s1)
    b.stream_wait_event(s2, fork)  # s2 joins the capture
    b.memset_async(d, 1, 512, s1)
    b.memset_async(d + 512, 2, 512, s2)
    b.launch_host_func(s2, fn_ptr, 77)
    b.event_record(join, s2)
    b.stream_wait_event(s1, join)  # joined back
    b.memcpy_async(h, d, 1024, D2H, s1)
    assert b.stream_is_capturing(s1) and b.stream_is_capturing(s2)
    return b.stream_end_capture(s1)


def test_captured_work_does_not_run_until_replayed_and_every_replay_moves_real_bytes(sb: SimBackend) -> None:
    s1, s2 = sb.stream_create(), sb.stream_create()
    d, h = sb.malloc(1024), sb.host_malloc(1024)
    fn = PyHostFn()
    graph = _capture_fork_join(sb, s1, s2, d, h, fn.ptr)
    assert not sb.stream_is_capturing(s1) and not sb.stream_is_capturing(s2)
    sb.device_synchronize()
    assert sb.op_log() == [] and fn.calls == [] and np.all(view(h, 1024) == 0)
    exe = sb.graph_instantiate(graph)
    for _ in range(3):
        view(h, 1024)[:] = 0
        sb.graph_launch(exe, s1)
        sb.stream_synchronize(s1)
        out = view(h, 1024)
        assert np.all(out[:512] == 1) and np.all(out[512:] == 2)
    assert fn.calls == [(77, "streamrt-sim-callback-0")] * 3  # host nodes re-run on every replay


def test_replayed_branches_run_concurrently_in_virtual_time() -> None:
    b = sim.create(profile=SimProfile(graph_node_gap_us=1.0, host_func_us=40.0))
    try:
        s1, s2 = b.stream_create(), b.stream_create()
        d, h = b.malloc(1024), b.host_malloc(1024)
        fn = PyHostFn()
        exe = b.graph_instantiate(_capture_fork_join(b, s1, s2, d, h, fn.ptr))
        b.graph_launch(exe, s1)
        b.stream_synchronize(s1)
        nodes = {r.node: r for r in b.op_log() if r.graph_exec == exe and r.node >= 0}
        m1, m2, host, d2h = nodes[0], nodes[1], nodes[2], nodes[3]
        assert (m1.kind, m2.kind, host.kind, d2h.kind) == ("memset", "memset", "host_func", "copy_d2h")
        assert m1.start_us == m2.start_us  # independent branches overlap
        assert host.start_us == m2.end_us + 1.0  # graph_node_gap_us after a device node
        assert host.end_us == host.start_us + 40.0
        assert d2h.start_us == max(m1.end_us + 1.0, host.end_us)  # waits for both branches
        marker = b.op_log()[-1]
        assert marker.kind == "graph_launch" and marker.start_us == d2h.end_us
        assert {r.stream for r in nodes.values()} == {s1}  # replay runs on the launch stream
    finally:
        b.close()


def test_work_after_a_graph_launch_waits_for_the_whole_graph(sb: SimBackend) -> None:
    s1, s2, s3 = sb.stream_create(), sb.stream_create(), sb.stream_create()
    d, h = sb.malloc(1024), sb.host_malloc(1024)
    fn = PyHostFn()
    exe = sb.graph_instantiate(_capture_fork_join(sb, s1, s2, d, h, fn.ptr))
    sb.graph_launch(exe, s3)
    h2 = sb.host_malloc(1024)
    sb.memcpy_async(h2, d, 1024, D2H, s3)
    sb.stream_synchronize(s3)
    assert np.all(view(h2, 1024)[:512] == 1) and np.all(view(h2, 1024)[512:] == 2)
    log = sb.op_log()
    assert log[-1].start_us >= max(r.end_us for r in log[:-1])


def test_launches_of_one_exec_are_ordered_even_on_different_streams(sb: SimBackend) -> None:
    s, a, c = sb.stream_create(), sb.stream_create(), sb.stream_create()
    d = sb.malloc(64)
    sb.stream_begin_capture(s, GLOBAL)
    sb.memset_async(d, 1, 64, s)
    exe = sb.graph_instantiate(sb.stream_end_capture(s))
    sb.graph_launch(exe, a)
    sb.graph_launch(exe, c)
    sb.device_synchronize()
    first, _, second, _ = sb.op_log()
    assert second.start_us >= first.end_us


def test_event_on_one_stream_waited_by_another_forks_the_capture_and_unjoined_work_fails(sb: SimBackend) -> None:
    s1, s2 = sb.stream_create(), sb.stream_create()
    d = sb.malloc(64)
    ev = sb.event_create(timing=False)
    sb.stream_begin_capture(s1, GLOBAL)
    sb.event_record(ev, s1)
    sb.stream_wait_event(s2, ev)
    sb.memset_async(d, 1, 64, s2)  # never joined back into s1
    with pytest.raises(CaptureError, match="simErrorStreamCaptureUnjoined") as exc:
        sb.stream_end_capture(s1)
    assert isinstance(exc.value.__cause__, BackendError) and exc.value.__cause__.code == 904
    # both streams are out of capture and usable
    assert not sb.stream_is_capturing(s1) and not sb.stream_is_capturing(s2)
    sb.memset_async(d, 5, 64, s2)
    sb.memset_async(d, 6, 64, s1)
    sb.device_synchronize()
    assert [r.kind for r in sb.op_log()] == ["memset", "memset"]


def test_a_forked_stream_without_work_needs_no_join(sb: SimBackend) -> None:
    s1, s2 = sb.stream_create(), sb.stream_create()
    ev = sb.event_create(timing=False)
    sb.stream_begin_capture(s1, GLOBAL)
    sb.event_record(ev, s1)
    sb.stream_wait_event(s2, ev)
    graph = sb.stream_end_capture(s1)
    sb.graph_destroy(graph)


@pytest.mark.parametrize(
    "offence, code",
    [
        ("stream_synchronize", 900),
        ("stream_query", 900),
        ("device_synchronize", 900),
        ("event_query", 907),
        ("event_synchronize", 907),
        ("malloc", 900),
        ("free", 900),
        ("host_malloc", 900),
        ("wait_outside_event", 905),
        ("pageable_copy", 900),
    ],
)
def test_unsupported_calls_invalidate_the_capture_then_the_stream_is_usable(
    sb: SimBackend, offence: str, code: int
) -> None:
    s = sb.stream_create()
    d = sb.malloc(64)
    outside = sb.event_create(timing=False)
    sb.event_record(outside, 0)
    captured = sb.event_create(timing=False)
    sb.stream_begin_capture(s, GLOBAL)
    sb.memset_async(d, 1, 64, s)
    sb.event_record(captured, s)
    offences = {
        "stream_synchronize": lambda: sb.stream_synchronize(s),
        "stream_query": lambda: sb.stream_query(s),
        "device_synchronize": lambda: sb.device_synchronize(),
        "event_query": lambda: sb.event_query(captured),
        "event_synchronize": lambda: sb.event_synchronize(captured),
        "malloc": lambda: sb.malloc(16),
        "free": lambda: sb.free(d),
        "host_malloc": lambda: sb.host_malloc(16),
        "wait_outside_event": lambda: sb.stream_wait_event(s, outside),
        "pageable_copy": lambda: sb.memcpy_async(d, np.zeros(64, np.uint8).ctypes.data, 64, H2D, s),
    }
    with pytest.raises(BackendError) as exc:
        offences[offence]()
    assert exc.value.code == code
    assert exc.value.name.startswith("simError")
    # later captured calls fail with "invalidated"
    with pytest.raises(BackendError) as exc2:
        sb.memset_async(d, 2, 64, s)
    assert (exc2.value.code, exc2.value.name) == (901, "simErrorStreamCaptureInvalidated")
    assert sb.stream_is_capturing(s)
    with pytest.raises(CaptureError, match="invalidated"):
        sb.stream_end_capture(s)
    assert not sb.stream_is_capturing(s)
    # the stream works eagerly again, and nothing captured ever ran
    h = sb.host_malloc(64)
    sb.memset_async(d, 3, 64, s)
    sb.memcpy_async(h, d, 64, D2H, s)
    sb.stream_synchronize(s)
    assert np.all(view(h, 64) == 3)
    assert [r.kind for r in sb.op_log()] == ["event_record", "memset", "copy_d2h"]


def test_relaxed_mode_allows_malloc_and_free_during_capture(sb: SimBackend) -> None:
    s = sb.stream_create()
    sb.stream_begin_capture(s, RELAXED)
    d = sb.malloc(64)
    sb.memset_async(d, 1, 64, s)
    sb.free(sb.malloc(32))
    graph = sb.stream_end_capture(s)
    sb.graph_launch(sb.graph_instantiate(graph), s)
    sb.stream_synchronize(s)


def test_thread_local_capture_only_restricts_its_own_thread(sb: SimBackend) -> None:
    s = sb.stream_create()
    sb.stream_begin_capture(s, THREAD_LOCAL)
    other: list[int] = []
    t = threading.Thread(target=lambda: other.append(sb.malloc(16)))
    t.start()
    t.join()
    assert other and other[0] != 0  # another thread may allocate
    with pytest.raises(BackendError) as exc:
        sb.malloc(16)  # this thread may not
    assert exc.value.code == 900
    with pytest.raises(CaptureError):
        sb.stream_end_capture(s)


def test_global_capture_restricts_other_threads_too(sb: SimBackend) -> None:
    s = sb.stream_create()
    sb.stream_begin_capture(s, GLOBAL)
    errors: list[BaseException] = []

    def other() -> None:
        try:
            sb.malloc(16)
        except BackendError as exc:
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(errors) == 1 and errors[0].code == 900  # type: ignore[attr-defined]
    with pytest.raises(CaptureError):
        sb.stream_end_capture(s)


def test_end_capture_misuse(sb: SimBackend) -> None:
    s1, s2 = sb.stream_create(), sb.stream_create()
    with pytest.raises(BackendError) as exc:
        sb.stream_end_capture(s1)  # not capturing
    assert exc.value.code == 401
    with pytest.raises(BackendError) as exc:
        sb.stream_begin_capture(0, GLOBAL)
    assert exc.value.code == 900
    ev = sb.event_create(timing=False)
    sb.stream_begin_capture(s1, GLOBAL)
    with pytest.raises(BackendError) as exc:
        sb.stream_begin_capture(s1, GLOBAL)
    assert exc.value.code == 401
    sb.event_record(ev, s1)
    sb.stream_wait_event(s2, ev)
    with pytest.raises(BackendError) as exc:
        sb.stream_end_capture(s2)  # not the origin
    assert (exc.value.code, exc.value.name) == (903, "simErrorStreamCaptureUnmatched")
    errors: list[BaseException] = []

    def end_elsewhere() -> None:
        try:
            sb.stream_end_capture(s1)
        except BackendError as e:
            errors.append(e)

    t = threading.Thread(target=end_elsewhere)
    t.start()
    t.join()
    assert errors and errors[0].code == 908  # type: ignore[attr-defined]
    graph = sb.stream_end_capture(s1)  # still fine from the capturing thread
    sb.graph_destroy(graph)
    with pytest.raises(BackendError) as exc:
        sb.stream_wait_event(s2, ev)  # recorded in a capture that has ended
    assert exc.value.code == 907
    with pytest.raises(BackendError):
        sb.stream_begin_capture(s1, 7)  # type: ignore[arg-type]


def test_relaxed_capture_may_be_ended_by_another_thread(sb: SimBackend) -> None:
    s = sb.stream_create()
    sb.stream_begin_capture(s, RELAXED)
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(sb.stream_end_capture(s)))
    t.start()
    t.join()
    assert out and out[0] != 0


def test_two_captures_cannot_merge(sb: SimBackend) -> None:
    s1, s2 = sb.stream_create(), sb.stream_create()
    ev = sb.event_create(timing=False)
    sb.stream_begin_capture(s1, RELAXED)
    sb.stream_begin_capture(s2, RELAXED)
    sb.event_record(ev, s1)
    with pytest.raises(BackendError) as exc:
        sb.stream_wait_event(s2, ev)
    assert exc.value.code == 902
    for s in (s1, s2):
        with pytest.raises(CaptureError):
            sb.stream_end_capture(s)


def test_stream_ordered_allocations_in_a_capture_belong_to_the_graph(sb: SimBackend) -> None:
    s = sb.stream_create()
    h = sb.host_malloc(256)
    free0 = sb.mem_get_info()[0]
    sb.stream_begin_capture(s, GLOBAL)
    scratch = sb.malloc_async(256, s)
    sb.memset_async(scratch, 4, 256, s)
    sb.memcpy_async(h, scratch, 256, D2H, s)
    sb.free_async(scratch, s)
    graph = sb.stream_end_capture(s)
    exe = sb.graph_instantiate(graph)
    for _ in range(2):  # the same address stays valid on every replay
        view(h, 256)[:] = 0
        sb.graph_launch(exe, s)
        sb.stream_synchronize(s)
        assert np.all(view(h, 256) == 4)
    assert sb.mem_get_info()[0] == free0 - 256
    sb.graph_destroy(graph)
    assert sb.mem_get_info()[0] == free0 - 256  # the exec still uses it
    sb.graph_exec_destroy(exe)
    sb.device_synchronize()
    assert sb.mem_get_info()[0] == free0
    with pytest.raises(BackendError) as exc:
        sb.graph_launch(exe, s)
    assert exc.value.code == 400
    with pytest.raises(BackendError) as exc:
        sb.graph_instantiate(graph)
    assert exc.value.code == 400


def test_failed_capture_frees_its_allocations(sb: SimBackend) -> None:
    s = sb.stream_create()
    free0 = sb.mem_get_info()[0]
    sb.stream_begin_capture(s, GLOBAL)
    p = sb.malloc_async(4096, s)
    with pytest.raises(BackendError):
        sb.stream_query(s)
    with pytest.raises(CaptureError):
        sb.stream_end_capture(s)
    assert sb.mem_get_info()[0] == free0
    assert sb.pointer_kind(p).value == "pageable"


def test_graph_launch_refuses_memory_freed_since_capture(sb: SimBackend) -> None:
    s = sb.stream_create()
    d = sb.malloc(64)
    sb.stream_begin_capture(s, GLOBAL)
    sb.memset_async(d, 1, 64, s)
    exe = sb.graph_instantiate(sb.stream_end_capture(s))
    sb.free(d)
    with pytest.raises(BackendError, match="freed since the capture") as exc:
        sb.graph_launch(exe, s)
    assert exc.value.code == 1
    assert sb.op_log() == []


def test_destroying_an_exec_with_a_launch_in_flight_lets_the_launch_finish(sb: SimBackend) -> None:
    from _sim_helpers import Gate

    gate = Gate()
    s = sb.stream_create()
    h = sb.host_malloc(64)
    sb.stream_begin_capture(s, GLOBAL)
    scratch = sb.malloc_async(64, s)
    sb.memset_async(scratch, 9, 64, s)
    sb.memcpy_async(h, scratch, 64, D2H, s)
    graph = sb.stream_end_capture(s)
    exe = sb.graph_instantiate(graph)
    gate.block(sb, s)
    sb.graph_launch(exe, s)
    sb.graph_exec_destroy(exe)
    sb.graph_destroy(graph)
    gate.open()
    sb.device_synchronize()
    assert np.all(view(h, 64) == 9)
    assert sb.op_log()[-1].kind == "graph_free"
