"""The completion watchdog: waiters of a failed context are resolved even when the driver's wait hangs.

The fault is injected with ``FaultyBackend(hang_waits=True)``: after
``fail()``, ``event_synchronize`` blocks (as a driver that hangs on a failed
context would) while ``event_query`` raises the sticky error. Every wait for
a result has a timeout, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest
from _completion_helpers import FaultyBackend, Harness, wait_until

from streamrt._completion import Completion, CompletionEngine
from streamrt._errors import BackendError

FAST = {"watchdog_interval": 0.02, "watchdog_threshold": 0.05}


def _close_within(engine: CompletionEngine, seconds: float, **kwargs: Any) -> float:
    """Close ``engine`` on another thread; fail (instead of hanging) if it takes longer than ``seconds``."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            engine.close(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t0 = time.monotonic()
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"engine.close() still blocked after {seconds} s"
    assert errors == []
    return time.monotonic() - t0


def test_hung_waits_resolve_every_waiter_with_the_error_within_seconds(harness: Harness) -> None:
    """Default watchdog settings: a hung wait on a failed context resolves every waiter, host calls included."""
    faulty = FaultyBackend(harness.backend, hang_waits=True)
    engine = harness.engine(faulty)  # interval 0.5 s, threshold 1 s
    before = sys.getswitchinterval()
    b = harness.backend
    s1, s2 = harness.stream(), harness.stream()
    gate1, gate2 = harness.gate(s1), harness.gate(s2)
    ran: list[int] = []
    calls: list[BaseException | None] = []
    ev = b.event_create(timing=False, blocking_sync=True)
    c1 = engine.completion_for_stream(s1, keepalive=bytearray(8))
    h = engine.host_call(s1, ran.append, (1,))  # behind the gate: the failed stream never reaches it
    engine.record_and_watch(ev, s1, calls.append)
    c2 = engine.completion_for_stream(s1)
    c3 = engine.completion_for_stream(s2)
    for c in (c1, c3):  # a wait wakes each lane (lanes wake lazily), which then blocks in the driver
        with pytest.raises(TimeoutError):
            c.wait(timeout=0.02)
    time.sleep(0.05)
    faulty.fail()
    t0 = time.monotonic()
    for c in (c1, h, c2, c3):
        assert isinstance(c.exception(timeout=5), BackendError)
    assert time.monotonic() - t0 < 4
    assert wait_until(lambda: faulty.hung == 2)  # both lane threads are still blocked in the driver
    assert len(calls) == 1 and isinstance(calls[0], BackendError)
    stats = engine.statistics()
    assert stats.watchdog_failed_lanes == 2
    assert stats.pending == 0 and stats.host_calls_pending == 0
    assert sys.getswitchinterval() == before  # no Python host call is in flight any more
    engine.drain(timeout=5)

    # Work watched on a failed lane later fails at once, with the same error.
    late = engine.completion_for_stream(s1)
    assert late.is_done and late.exception() is c1.exception()
    late_call = engine.host_call(s1, ran.append, (2,))
    assert isinstance(late_call.exception(0), BackendError)

    assert _close_within(engine, 10) < 5
    assert ran == []
    # The driver's waits finally return: nothing is resolved a second time.
    faulty.release_waits()
    assert wait_until(lambda: faulty.hung == 0)
    assert wait_until(lambda: not any(t.is_alive() for t in threading.enumerate() if engine.owns_thread(t)))
    assert len(calls) == 1
    gate1.open()  # the device "recovers": the abandoned host functions are skipped, not run
    gate2.open()
    b.stream_synchronize(s1)
    assert ran == []
    b.event_destroy(ev)


def test_close_waits_for_the_watchdog_instead_of_hanging(harness: Harness) -> None:
    """close() without a timeout drains: the watchdog resolves the hung lane, so close returns."""
    faulty = FaultyBackend(harness.backend, hang_waits=True)
    engine = harness.engine(faulty, **FAST)
    s = harness.stream()
    harness.gate(s)
    cs = [engine.completion_for_stream(s), engine.host_call(s, print, ("never",)), engine.completion_for_stream(s)]
    faulty.fail()
    assert _close_within(engine, 10) < 5
    assert all(isinstance(c.exception(0), BackendError) for c in cs)
    stats = engine.statistics()
    assert stats.closed and stats.lanes == 0 and stats.workers == 0
    faulty.release_waits()


def test_forgotten_stream_with_a_hung_lane_does_not_block_close(harness: Harness) -> None:
    faulty = FaultyBackend(harness.backend, hang_waits=True)
    engine = harness.engine(faulty, **FAST)
    s = harness.stream()
    harness.gate(s)
    c = engine.completion_for_stream(s)
    h = engine.host_call(s, print, ("never",))
    engine.forget_stream(s)  # the lane keeps retiring (and now hangs) on its own
    faulty.fail()
    assert isinstance(c.exception(5), BackendError) and isinstance(h.exception(5), BackendError)
    _close_within(engine, 10)
    assert engine.statistics().lanes == 0
    faulty.release_waits()


def test_a_slow_but_healthy_lane_is_never_failed(harness: Harness) -> None:
    """Queries that return (not ready) leave the lane alone, however long the work takes."""
    faulty = FaultyBackend(harness.backend, hang_waits=True)  # fail() is never called
    engine = harness.engine(faulty, **FAST)
    s = harness.stream()
    gate = harness.gate(s)
    release = threading.Event()
    cs = [engine.completion_for_stream(s), engine.host_call(s, release.wait, (5,)), engine.completion_for_stream(s)]
    time.sleep(0.3)  # the head is waited for ~15 watchdog rounds past the threshold
    gate.open()
    time.sleep(0.3)  # now a long host function holds the stream
    release.set()
    for c in cs:
        assert c.exception(5) is None
    stats = engine.statistics()
    assert stats.watchdog_wakeups >= 5 and stats.watchdog_failed_lanes == 0 and stats.failed == 0


def test_watchdog_sleeps_without_wakeups_while_nothing_is_pending(harness: Harness) -> None:
    engine = harness.engine(**FAST)
    s = harness.stream()
    engine.completion_for_stream(s).wait(5)
    engine.drain()
    watchdog = engine._watchdog
    assert watchdog is not None and watchdog.thread.is_alive()
    assert wait_until(lambda: watchdog.idle)
    before = engine.statistics().watchdog_wakeups
    time.sleep(0.3)  # 15 intervals
    assert engine.statistics().watchdog_wakeups == before
    # Queued work wakes it: timed checks resume while something is pending, and stop after.
    gate = harness.gate(s)
    c = engine.completion_for_stream(s)
    assert wait_until(lambda: engine.statistics().watchdog_wakeups >= before + 3)
    gate.open()
    c.wait(5)
    assert wait_until(lambda: watchdog.idle)
    idle_count = engine.statistics().watchdog_wakeups
    time.sleep(0.2)
    assert engine.statistics().watchdog_wakeups == idle_count


def test_no_watchdog_when_disabled(harness: Harness) -> None:
    engine = harness.engine(watchdog_interval=None)
    s = harness.stream()
    engine.completion_for_stream(s).wait(5)
    assert engine._watchdog is None
    assert not any(t.name == "streamrt-watchdog" and engine.owns_thread(t) for t in threading.enumerate())
    with pytest.raises(ValueError):
        CompletionEngine(harness.backend, 0, watchdog_interval=0)


def test_callbacks_of_failed_work_run_on_an_engine_thread_that_cannot_close_it(harness: Harness) -> None:
    faulty = FaultyBackend(harness.backend, hang_waits=True)
    engine = harness.engine(faulty, **FAST)
    s = harness.stream()
    harness.gate(s)
    seen: list[tuple[str, bool, BaseException | None]] = []

    def cb(c: Completion) -> None:
        refused = None
        try:
            engine.close()
        except RuntimeError as exc:
            refused = exc
        seen.append((threading.current_thread().name, engine.owns_thread(), refused))

    c = engine.completion_for_stream(s)
    c.add_done_callback(cb)
    faulty.fail()
    assert isinstance(c.exception(5), BackendError)
    assert wait_until(lambda: bool(seen))
    name, owned, refused = seen[0]
    assert name == "streamrt-watchdog" and owned and isinstance(refused, RuntimeError)
    assert not engine.is_closed
    _close_within(engine, 10)
    faulty.release_waits()
