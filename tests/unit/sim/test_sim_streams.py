"""Streams, events and real execution on the simulator, through the backend protocol."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from _sim_helpers import Gate, PyHostFn, view

from streamrt._backends.protocol import Backend, MemcpyKind
from streamrt._backends.sim import SimBackend
from streamrt._errors import BackendError

H2D, D2H, D2D, H2H = (
    MemcpyKind.HOST_TO_DEVICE,
    MemcpyKind.DEVICE_TO_HOST,
    MemcpyKind.DEVICE_TO_DEVICE,
    MemcpyKind.HOST_TO_HOST,
)


def test_it_implements_the_backend_protocol(sb: SimBackend) -> None:
    assert isinstance(sb, Backend)
    assert sb.name == "sim"
    missing = [m for m in dir(Backend) if not m.startswith("_") and not hasattr(sb, m)]
    assert missing == []


def test_copies_and_memsets_move_real_bytes_in_every_direction(sb: SimBackend) -> None:
    s = sb.stream_create()
    n = 1 << 16
    h_src, h_dst = sb.host_malloc(n), sb.host_malloc(n)
    d1, d2 = sb.malloc(n), sb.malloc(n)
    pattern = (np.arange(n) % 251).astype(np.uint8)
    view(h_src, n)[:] = pattern
    sb.memcpy_async(d1, h_src, n, H2D, s)  # pinned -> device
    sb.memcpy_async(d2, d1, n, D2D, s)  # device -> device
    sb.memset_async(d2, 0xAB, 16, s)  # first 16 bytes overwritten
    sb.memcpy_async(h_dst, d2, n, D2H, s)  # device -> pinned
    sb.stream_synchronize(s)
    out = view(h_dst, n)
    assert np.all(out[:16] == 0xAB)
    assert np.array_equal(out[16:], pattern[16:])
    sb.memcpy_async(h_dst, h_src, n, H2H, s)
    sb.stream_synchronize(s)
    assert np.array_equal(view(h_dst, n), pattern)


def test_memset_uses_the_low_byte_of_value(sb: SimBackend) -> None:
    s = sb.stream_create()
    h = sb.host_malloc(8)
    sb.memset_async(h, 0x1FF, 8, s)
    sb.stream_synchronize(s)
    assert list(view(h, 8)) == [0xFF] * 8


def test_default_kind_infers_the_direction(sb: SimBackend) -> None:
    s = sb.stream_create()
    h, d = sb.host_malloc(64), sb.malloc(64)
    view(h, 64)[:] = 7
    sb.memcpy_async(d, h, 64, MemcpyKind.DEFAULT, s)
    sb.memset_async(h, 0, 64, s)
    sb.memcpy_async(h, d, 64, MemcpyKind.DEFAULT, s)
    sb.stream_synchronize(s)
    assert np.all(view(h, 64) == 7)
    kinds = [r.kind for r in sb.op_log()]
    assert kinds == ["copy_h2d", "memset", "copy_d2h"]


def test_work_runs_asynchronously_and_queries_reflect_real_state(sb: SimBackend, gate: Gate) -> None:
    s = sb.stream_create()
    h = sb.host_malloc(64)
    ev = sb.event_create(timing=False)
    gate.block(sb, s)
    sb.memset_async(h, 5, 64, s)
    sb.event_record(ev, s)
    time.sleep(0.05)
    assert sb.stream_query(s) is False
    assert sb.event_query(ev) is False
    assert np.all(view(h, 64) == 0)  # the memset is queued behind the gate, not executed
    gate.open()
    sb.event_synchronize(ev)
    assert sb.event_query(ev) is True
    assert sb.stream_query(s) is True
    assert np.all(view(h, 64) == 5)


def test_each_stream_is_fifo(sb: SimBackend, gate: Gate) -> None:
    s = sb.stream_create()
    order: list[int] = []
    fn = PyHostFn(lambda ud: order.append(ud))
    gate.block(sb, s)
    h = sb.host_malloc(4)
    for i in range(50):
        sb.launch_host_func(s, fn.ptr, i + 1)
        sb.memset_async(h, i, 4, s)
    gate.open()
    sb.stream_synchronize(s)
    assert order == list(range(1, 51))
    assert np.all(view(h, 4) == 49)  # the last memset ran last
    seqs = [r.seq for r in sb.op_log()]
    assert seqs == sorted(seqs)


def test_stream_wait_event_orders_work_across_streams(sb: SimBackend, gate: Gate) -> None:
    s1, s2 = sb.stream_create(), sb.stream_create()
    h = sb.host_malloc(64)
    d = sb.malloc(64)
    ev = sb.event_create(timing=False)
    gate.block(sb, s1)
    sb.memset_async(d, 9, 64, s1)
    sb.event_record(ev, s1)
    sb.stream_wait_event(s2, ev)
    sb.memcpy_async(h, d, 64, D2H, s2)
    time.sleep(0.05)
    assert sb.stream_query(s2) is False  # held back by s1's gate
    assert np.all(view(h, 64) == 0)
    gate.open()
    sb.stream_synchronize(s2)
    assert np.all(view(h, 64) == 9)


def test_streams_without_events_run_independently(sb: SimBackend, gate: Gate) -> None:
    s1, s2 = sb.stream_create(), sb.stream_create()
    h = sb.host_malloc(8)
    gate.block(sb, s1)
    sb.memset_async(h, 3, 8, s2)
    sb.stream_synchronize(s2)  # returns although s1 is blocked
    assert np.all(view(h, 8) == 3)
    assert sb.stream_query(s1) is False


def test_null_stream_is_an_ordinary_stream_that_does_not_sync_others(sb: SimBackend, gate: Gate) -> None:
    s = sb.stream_create()
    h = sb.host_malloc(8)
    gate.block(sb, s)
    sb.memset_async(h, 4, 8, 0)
    sb.stream_synchronize(0)  # does not wait for s, unlike CUDA's legacy default stream
    assert np.all(view(h, 8) == 4)
    assert sb.stream_query(s) is False
    gate.open()
    sb.device_synchronize()
    assert sb.stream_query(s) is True


def test_synchronize_blocks_until_real_completion(sb: SimBackend, gate: Gate) -> None:
    s = sb.stream_create()
    gate.block(sb, s)
    done = threading.Event()

    def waiter() -> None:
        sb.stream_synchronize(s)
        done.set()

    t = threading.Thread(target=waiter)
    t.start()
    assert not done.wait(0.1)
    gate.open()
    assert done.wait(5)
    t.join()


def test_device_synchronize_waits_for_every_stream_including_destroyed_ones(sb: SimBackend, gate: Gate) -> None:
    s1, s2 = sb.stream_create(), sb.stream_create()
    h = sb.host_malloc(8)
    gate.block(sb, s1)
    sb.memset_async(h, 8, 8, s1)
    sb.stream_destroy(s1)  # pending work still runs
    threading.Timer(0.05, gate.open).start()
    sb.memset_async(h, 1, 4, s2)
    sb.device_synchronize()
    assert list(view(h, 8)) in ([8] * 8, [1] * 4 + [8] * 4)
    with pytest.raises(BackendError) as exc:
        sb.stream_synchronize(s1)
    assert exc.value.code == 400


def test_event_never_recorded_is_complete_and_waiting_on_it_is_a_no_op(sb: SimBackend) -> None:
    s = sb.stream_create()
    ev = sb.event_create(timing=True)
    assert sb.event_query(ev) is True
    sb.event_synchronize(ev)
    sb.stream_wait_event(s, ev)
    sb.stream_synchronize(s)
    assert sb.op_log() == []


def test_rerecording_an_event_moves_it(sb: SimBackend, gate: Gate) -> None:
    s1, s2 = sb.stream_create(), sb.stream_create()
    ev = sb.event_create(timing=False)
    sb.event_record(ev, s2)
    sb.stream_synchronize(s2)
    assert sb.event_query(ev)
    gate.block(sb, s1)
    sb.event_record(ev, s1)
    assert sb.event_query(ev) is False
    gate.open()
    sb.event_synchronize(ev)
    assert sb.event_query(ev) is True


def test_host_function_runs_on_the_callback_thread_and_the_stream_waits_for_it(sb: SimBackend) -> None:
    s = sb.stream_create()
    h = sb.host_malloc(4)
    seen: list[int] = []

    def body(ud: int) -> None:
        time.sleep(0.05)
        seen.append(int(view(h, 4)[0]))

    fn = PyHostFn(body)
    sb.memset_async(h, 1, 4, s)
    sb.launch_host_func(s, fn.ptr, 1234)
    sb.memset_async(h, 2, 4, s)
    sb.stream_synchronize(s)
    assert fn.calls == [(1234, "streamrt-sim-callback-0")]
    assert seen == [1]  # ran after the first memset, and the second waited for it
    assert view(h, 4)[0] == 2
    assert threading.current_thread().name != "streamrt-sim-callback-0"


def test_a_blocking_native_host_function_does_not_stop_other_streams_device_work(sb: SimBackend, gate: Gate) -> None:
    s1, s2 = sb.stream_create(), sb.stream_create()
    d = sb.malloc(1 << 20)
    h = sb.host_malloc(1 << 20)
    gate.block(sb, s1)  # the callback thread sits in sem_wait
    sb.memset_async(d, 6, 1 << 20, s2)
    sb.memcpy_async(h, d, 1 << 20, D2H, s2)
    sb.stream_synchronize(s2)
    assert np.all(view(h, 1 << 20) == 6)


def test_sem_post_host_function_wakes_a_host_thread(sb: SimBackend) -> None:
    import ctypes

    from _sim_helpers import SEM_POST, _libc

    sem = ctypes.create_string_buffer(64)
    _libc.sem_init(ctypes.addressof(sem), 0, 0)
    s = sb.stream_create()
    sb.launch_host_func(s, SEM_POST, ctypes.addressof(sem))
    _libc.sem_wait(ctypes.addressof(sem))  # returns once the callback thread posted
    sb.stream_synchronize(s)


def test_backend_calls_from_a_host_function_are_not_permitted(sb: SimBackend) -> None:
    s = sb.stream_create()
    errors: list[BaseException] = []

    def body(ud: int) -> None:
        try:
            sb.stream_create()
        except BaseException as exc:
            errors.append(exc)

    fn = PyHostFn(body)
    sb.launch_host_func(s, fn.ptr, 0)
    sb.stream_synchronize(s)
    assert len(errors) == 1
    assert isinstance(errors[0], BackendError) and errors[0].code == 800
    assert errors[0].name == "simErrorNotPermitted"


def test_event_elapsed_ms_is_virtual_time(sb: SimBackend) -> None:
    s = sb.stream_create()
    d = sb.malloc(21_000_000)
    t0, t1 = sb.event_create(timing=True), sb.event_create(timing=True)
    sb.event_record(t0, s)
    sb.memset_async(d, 0, 21_000_000, s)  # 1 µs fixed + 21e6 B / 2100 GB/s = 10 µs
    sb.event_record(t1, s)
    sb.event_synchronize(t1)
    rec0, memset, rec1 = sb.op_log()
    assert memset.duration_us == pytest.approx(11.0)
    # t0 is stamped when the stream reaches it; the memset starts one API call (2 µs) later,
    # when the host issued it, and t1 when the memset ends
    assert memset.start_us - rec0.start_us == pytest.approx(2.0)
    assert rec1.start_us == memset.end_us
    assert sb.event_elapsed_ms(t0, t1) == pytest.approx(0.013)
    assert sb.event_elapsed_ms(t1, t0) == pytest.approx(-0.013)


def test_event_elapsed_ms_errors(sb: SimBackend, gate: Gate) -> None:
    s = sb.stream_create()
    plain = sb.event_create(timing=False)
    t0, t1 = sb.event_create(timing=True), sb.event_create(timing=True)
    with pytest.raises(BackendError) as exc:
        sb.event_elapsed_ms(t0, t1)  # never recorded
    assert exc.value.code == 400
    sb.event_record(plain, s)
    sb.event_record(t0, s)
    with pytest.raises(BackendError) as exc:
        sb.event_elapsed_ms(plain, t0)  # no timing
    assert exc.value.code == 400
    gate.block(sb, s)
    sb.event_record(t1, s)
    with pytest.raises(BackendError) as exc:
        sb.event_elapsed_ms(t0, t1)
    assert (exc.value.code, exc.value.name) == (600, "simErrorNotReady")
    gate.open()
    sb.event_synchronize(t1)
    assert sb.event_elapsed_ms(t0, t1) > 0


def test_destroyed_and_unknown_handles_are_invalid(sb: SimBackend) -> None:
    s = sb.stream_create()
    ev = sb.event_create(timing=False)
    sb.stream_destroy(s)
    sb.event_destroy(ev)
    for call in (
        lambda: sb.stream_synchronize(s),
        lambda: sb.stream_query(s),
        lambda: sb.memset_async(sb.malloc(4), 0, 4, s),
        lambda: sb.event_query(ev),
        lambda: sb.event_record(ev, 0),
        lambda: sb.stream_wait_event(0, ev),
        lambda: sb.event_destroy(ev),
        lambda: sb.stream_destroy(s),
        lambda: sb.stream_synchronize(12345),
        lambda: sb.stream_synchronize(ev),  # an event handle is not a stream
        lambda: sb.graph_launch(7, 0),
        lambda: sb.module_unload(7),
    ):
        with pytest.raises(BackendError) as exc:
            call()
        assert exc.value.code == 400
        assert exc.value.name == "simErrorInvalidResourceHandle"
        assert exc.value.backend == "sim"
    with pytest.raises(BackendError) as exc:
        sb.stream_destroy(0)
    assert exc.value.code == 400


def test_priorities_are_clamped_and_streams_still_work(sb: SimBackend) -> None:
    assert sb.capabilities(0).priority_range == (0, -5)
    for prio in (-100, -5, 0, 7):
        s = sb.stream_create(prio)
        sb.memset_async(sb.host_malloc(1), 1, 1, s)
        sb.stream_synchronize(s)
    with pytest.raises(BackendError):
        sb.stream_create("high")  # type: ignore[arg-type]
