"""Creating and closing the simulator, its threads, and its error table."""

from __future__ import annotations

import gc
import threading
import time

import pytest
from _sim_helpers import Gate

from streamrt._backends import load_backend, probe_backend, sim
from streamrt._backends.sim import ERRORS, SimBackend
from streamrt._errors import BackendError


def _sim_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("streamrt-sim-")]


def test_the_registry_loads_the_simulator_and_it_is_always_available() -> None:
    assert sim.probe() is None
    assert probe_backend("sim") is None
    b = load_backend("sim", devices=2)
    try:
        assert isinstance(b, SimBackend) and b.device_count() == 2
    finally:
        b.close()


def test_close_drains_queued_work_then_joins_its_threads() -> None:
    before = set(_sim_threads())
    b = sim.create(devices=2)
    mine = [t for t in _sim_threads() if t not in before]
    assert sorted(t.name for t in mine) == [
        "streamrt-sim-callback-0",
        "streamrt-sim-callback-1",
        "streamrt-sim-exec-0",
        "streamrt-sim-exec-1",
    ]
    s = b.stream_create()
    h = b.host_malloc(1 << 20)
    gate = Gate()
    gate.block(b, s)
    b.memset_async(h, 1, 1 << 20, s)
    threading.Timer(0.05, gate.open).start()
    log_before_close = len(b.op_log())
    b.close()
    assert log_before_close <= 1
    assert [r.kind for r in b.op_log()] == ["host_func", "memset"]  # queued work completed first
    for t in mine:
        assert not t.is_alive()
    b.close()  # idempotent
    assert b.closed


def test_calls_after_close_fail_with_deinitialized(sb: SimBackend) -> None:
    s = sb.stream_create()
    sb.close()
    for call in (sb.stream_create, lambda: sb.malloc(8), lambda: sb.stream_synchronize(s), sb.device_synchronize):
        with pytest.raises(BackendError) as exc:
            call()
        assert (exc.value.code, exc.value.name) == (4, "simErrorDeinitialized")
    assert sb.error_name(2) == "simErrorMemoryAllocation"  # error look-ups still work


def test_close_abandons_work_stuck_behind_a_host_function_that_never_returns() -> None:
    b = sim.create(close_timeout=0.2)
    gate = Gate()
    s = b.stream_create()
    h = b.host_malloc(64)
    gate.block(b, s)
    b.memset_async(h, 1, 64, s)
    waiter_error: list[BaseException] = []

    def waiter() -> None:
        try:
            b.stream_synchronize(s)
        except BackendError as exc:
            waiter_error.append(exc)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    with pytest.warns(RuntimeWarning, match="abandoned"):
        b.close()
    t.join(5)
    assert not t.is_alive()
    assert waiter_error and waiter_error[0].code == 4  # type: ignore[attr-defined]
    gate.open()  # the callback thread returns from sem_wait and exits; the memset never runs
    for th in _sim_threads():
        th.join(5)
    assert "memset" not in [r.kind for r in b.op_log()]


def test_an_unclosed_backend_is_collected_and_its_threads_stop() -> None:
    before = set(_sim_threads())
    b = sim.create()
    b.memset_async(b.host_malloc(8), 1, 8, 0)
    b.device_synchronize()
    mine = [t for t in _sim_threads() if t not in before]
    del b
    gc.collect()
    for t in mine:
        t.join(5)
        assert not t.is_alive()


def test_close_is_refused_from_the_simulators_own_threads(sb: SimBackend) -> None:
    from _sim_helpers import PyHostFn

    errors: list[BaseException] = []

    def body(ud: int) -> None:
        try:
            sb.close()
        except BackendError as exc:
            errors.append(exc)

    fn = PyHostFn(body)
    s = sb.stream_create()
    sb.launch_host_func(s, fn.ptr, 0)
    sb.stream_synchronize(s)
    assert errors and errors[0].code == 800  # type: ignore[attr-defined]
    assert not sb.closed


def test_error_names_and_strings_mirror_cuda_codes(sb: SimBackend) -> None:
    expected = {
        0: "simSuccess",
        1: "simErrorInvalidValue",
        2: "simErrorMemoryAllocation",
        400: "simErrorInvalidResourceHandle",
        600: "simErrorNotReady",
        900: "simErrorStreamCaptureUnsupported",
        901: "simErrorStreamCaptureInvalidated",
        904: "simErrorStreamCaptureUnjoined",
        907: "simErrorCapturedEvent",
    }
    for code, name in expected.items():
        assert sb.error_name(code) == name
        assert ERRORS[code][0] == name
        assert sb.error_string(code) and sb.error_string(code) != "unrecognized error code"
    assert sb.error_name(123456) == "unrecognized error code"
    assert sb.error_string(123456) == "unrecognized error code"
    err = pytest.raises(BackendError, sb.stream_synchronize, 999).value
    assert err.backend == "sim" and err.call == "stream_synchronize"
    assert "sim error 400 (simErrorInvalidResourceHandle) in stream_synchronize" in str(err)


def test_op_log_is_bounded_and_clearable() -> None:
    b = sim.create(op_log_limit=10)
    try:
        h = b.host_malloc(8)
        for _ in range(25):
            b.memset_async(h, 1, 8, 0)
        b.device_synchronize()
        log = b.op_log()
        assert len(log) == 10 and log[-1].seq == 25
        b.clear_op_log()
        assert b.op_log() == []
    finally:
        b.close()
    b = sim.create(op_log_limit=0)
    try:
        b.memset_async(b.host_malloc(8), 1, 8, 0)
        b.device_synchronize()
        assert b.op_log() == []
    finally:
        b.close()


def test_the_executor_sleeps_when_idle(sb: SimBackend) -> None:
    sb.memset_async(sb.host_malloc(8), 1, 8, sb.stream_create())
    sb.device_synchronize()
    assert any(t.name == "streamrt-sim-exec-0" and t.is_alive() for t in _sim_threads())
    cpu0 = time.process_time()
    time.sleep(0.3)
    # the process (its executor and callback threads included) used almost no CPU: no busy polling
    assert time.process_time() - cpu0 < 0.05
