"""The completion engine on the sim backend: lanes, keepalives, host calls, faults, shutdown."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from _completion_helpers import FaultyBackend, Harness, InjectedFailure, wait_until

from streamrt._backends.protocol import PointerKind
from streamrt._completion import Completion, CompletionEngine
from streamrt._errors import BackendError, CaptureError, ClosedError
from streamrt._native import HOLD_ADDRESS, SEM_POST_ADDRESS, Semaphore
from streamrt._switch_interval import DEFAULT_SWITCH_INTERVAL


class Token:
    """A keepalive whose release is observable."""


def _engine_threads(engine: CompletionEngine) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if engine.owns_thread(t) and t.is_alive()]


# -- completion_for_stream -------------------------------------------------------------


def test_completion_resolves_only_after_prior_work(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    gate = harness.gate(s)
    c = engine.completion_for_stream(s)
    time.sleep(0.03)
    assert not c.is_done
    gate.open()
    c.wait(5)
    assert c.is_done and c.result() is None


def test_completions_and_host_calls_retire_in_stream_order(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    gate = harness.gate(s)  # everything piles up behind the gate, then retires in batches
    order: list[int] = []
    lock = threading.Lock()

    def note(i: int) -> Any:
        def cb(_: Completion) -> None:
            with lock:
                order.append(i)

        return cb

    completions = []
    for i in range(300):
        if i % 10 == 3:
            c = engine.host_call(s, lambda: None)
        else:
            c = engine.completion_for_stream(s)
        c.add_done_callback(note(i))
        completions.append(c)
    gate.open()
    for c in completions:
        c.wait(10)
    assert order == list(range(300))
    stats = engine.statistics()
    assert stats.max_batch > 1  # one blocking wait retired several completed events


def test_each_stream_has_its_own_lane_and_a_held_stream_does_not_hold_others(harness: Harness, engine: CompletionEngine) -> None:
    held, free = harness.stream(), harness.stream()
    gate = harness.gate(held)
    c_held = engine.completion_for_stream(held)
    c_free = engine.completion_for_stream(free)
    c_free.wait(5)
    assert not c_held.is_done
    assert engine.statistics().lanes == 2
    gate.open()
    c_held.wait(5)


def test_keepalive_dropped_on_the_lane_thread_after_the_event_before_resolution(
    harness: Harness, engine: CompletionEngine
) -> None:
    s = harness.stream()
    gate = harness.gate(s)
    token = Token()
    seen: dict[str, object] = {}
    c = engine.completion_for_stream(s, keepalive=[token, "buffers"])

    def on_drop() -> None:
        seen["thread"] = threading.current_thread().name
        seen["gate_open"] = gate.opened
        seen["completion_done"] = c.is_done

    weakref.finalize(token, on_drop)
    del token
    gc.collect()
    time.sleep(0.02)
    assert seen == {}  # held while the work is pending
    gate.open()
    c.wait(5)
    assert wait_until(lambda: "thread" in seen)
    assert str(seen["thread"]).startswith("streamrt-lane-")
    assert seen["gate_open"] is True
    assert seen["completion_done"] is False  # dropped before waiters are woken


def test_events_come_from_a_pool(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    for _ in range(50):
        engine.completion_for_stream(s).wait(5)
    stats = engine.statistics()
    assert stats.events_created <= 2
    assert stats.retired == 50 and stats.pending == 0 and stats.failed == 0


def test_record_and_watch_callbacks_run_in_watch_order_on_the_lane(harness: Harness, engine: CompletionEngine) -> None:
    b = harness.backend
    s = harness.stream()
    gate = harness.gate(s)
    events = [b.event_create(timing=False, blocking_sync=True) for _ in range(20)]
    calls: list[tuple[int, object, str]] = []
    done = threading.Event()
    for i, ev in enumerate(events):

        def cb(err: BaseException | None, i: int = i) -> None:
            calls.append((i, err, threading.current_thread().name))
            if i == len(events) - 1:
                done.set()

        engine.record_and_watch(ev, s, cb)
    gate.open()
    assert done.wait(5)
    assert [c[0] for c in calls] == list(range(20))
    assert all(c[1] is None and c[2].startswith("streamrt-lane-") for c in calls)
    for ev in events:
        b.event_destroy(ev)


def test_event_completion_of_a_user_event(harness: Harness, engine: CompletionEngine) -> None:
    b = harness.backend
    s = harness.stream()
    gate = harness.gate(s)
    ev = b.event_create(timing=False, blocking_sync=True)
    b.event_record(ev, s)
    c = engine.event_completion(ev, s)
    time.sleep(0.02)
    assert not c.is_done
    gate.open()
    c.wait(5)
    engine.drain()
    b.event_destroy(ev)


class CountingQueries:
    """The sim backend, counting ``event_query`` calls."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.queries = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def event_query(self, event: int) -> bool:
        self.queries += 1
        return bool(self._inner.event_query(event))


def _hold_lane(engine: CompletionEngine, backend: Any, stream: int) -> tuple[threading.Event, int]:
    """Keep ``stream``'s lane busy in a callback until the returned ``release`` is set; also returns its event."""
    held, release = threading.Event(), threading.Event()
    ev = backend.event_create(timing=False, blocking_sync=True)

    def hold(_err: BaseException | None) -> None:
        held.set()
        release.wait(10)

    engine.record_and_watch(ev, stream, hold)
    assert held.wait(5)
    return release, ev


class GatedWaits:
    """The sim backend whose ``event_synchronize`` returns only once :attr:`release` is set (after the real wait)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.release = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def event_synchronize(self, event: int) -> None:
        self._inner.event_synchronize(event)
        self.release.wait(10)


def test_polling_leaves_the_entry_the_lane_thread_waits_on_to_it(harness: Harness) -> None:
    backend = GatedWaits(harness.backend)
    engine = harness.engine(backend)
    s = harness.stream()
    lane = engine._lane(s)
    lane.hold(harness)  # someone waits: the lane thread waits in the driver (a lane nobody waits on sleeps)
    first, second = engine.completion_for_stream(s), engine.completion_for_stream(s)
    assert wait_until(lambda: lane._waiting is not None)  # the lane thread is in the driver wait on `first`
    harness.backend.stream_synchronize(s)  # both events are complete now
    lane.poll()
    assert len(lane._queue) == 2  # the waited-on entry (and so what follows it) stays queued
    assert not first.is_done and not second.is_done
    pool_before = len(engine._pool)
    backend.release.set()
    first.wait(5)
    second.wait(5)
    assert len(engine._pool) == pool_before + 2  # both events pooled once, by the lane thread
    assert not lane._queue


def test_polling_retires_nothing_while_another_thread_retires(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    release, ev = _hold_lane(engine, harness.backend, s)  # the lane thread is inside a retirement
    try:
        c = engine.completion_for_stream(s)
        harness.backend.stream_synchronize(s)
        lane = engine._lane(s)
        lane.poll()
        assert lane._queue and not c.is_done
    finally:
        release.set()
    c.wait(5)
    harness.backend.event_destroy(ev)


@contextlib.contextmanager
def _polled_lane(engine: CompletionEngine, s: int) -> Iterator[Any]:
    """``s``'s lane, its thread started and asleep while a poller with a deadline a minute ahead holds it."""
    engine.completion_for_stream(s).wait(5)
    engine.drain()
    lane = engine._lane(s)
    holder = object()
    lane.pollers[holder] = time.perf_counter_ns() + int(60e9)  # type: ignore[index]
    try:
        yield lane
    finally:
        lane.end_poll(holder)  # type: ignore[arg-type]


def test_a_poll_retires_done_entries_in_order_on_the_calling_thread(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    with _polled_lane(engine, s) as lane:
        gate = harness.gate(s)
        seen: list[tuple[int, int]] = []
        cs = [engine.completion_for_stream(s) for _ in range(4)]
        for i, c in enumerate(cs):
            c.add_done_callback(lambda _c, i=i: seen.append((i, threading.get_ident())))
        lane.poll()
        assert len(lane._queue) == 4 and not seen  # behind the gate: nothing is done
        gate.open()
        harness.backend.stream_synchronize(s)
        lane.poll()
        assert not lane._queue  # all retired
        assert seen == [(i, threading.get_ident()) for i in range(4)]
    assert engine.statistics().pending == 0


def test_a_poll_that_finds_nothing_new_done_makes_one_query(harness: Harness) -> None:
    """A poll queries the oldest entry first: while it is not done (the usual case) that is the only query;
    once everything is done, the oldest and then the newest take the whole queue."""
    counting = CountingQueries(harness.backend)
    engine = harness.engine(counting)
    s = harness.stream()
    with _polled_lane(engine, s) as lane:
        gate = harness.gate(s)
        cs = [engine.completion_for_stream(s) for _ in range(5)]
        for _ in range(3):
            before = counting.queries
            lane._polled_ns = 0  # (no 2 µs gap between these polls)
            lane.poll()
            assert counting.queries - before == 1 and len(lane._queue) == 5
        gate.open()
        harness.backend.stream_synchronize(s)
        before = counting.queries
        lane._polled_ns = 0
        lane.poll()
        assert counting.queries - before == 2 and not lane._queue and all(c.is_done for c in cs)
    engine.drain()


def test_a_lane_retires_everything_behind_a_done_newest_event_after_one_query(harness: Harness) -> None:
    """Events of a lane complete in stream order: when the newest is done, so is the rest."""
    counting = CountingQueries(harness.backend)
    engine = harness.engine(counting)
    s = harness.stream()
    release, ev = _hold_lane(engine, counting, s)
    order: list[int] = []
    cs = [engine.completion_for_stream(s) for _ in range(30)]
    for i, c in enumerate(cs):
        c.add_done_callback(lambda _c, i=i: order.append(i))
    harness.backend.stream_synchronize(s)  # every event complete before the lane looks
    before = counting.queries
    release.set()
    for c in cs:
        c.wait(5)
    assert order == list(range(30))
    assert counting.queries - before == 1  # one blocking wait for the oldest, one query for the rest
    engine.drain()
    counting.event_destroy(ev)


def test_a_lane_batch_stops_at_the_first_event_not_done(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    release, ev = _hold_lane(engine, harness.backend, s)
    done = [engine.completion_for_stream(s) for _ in range(3)]
    gate = harness.gate(s)
    later = engine.completion_for_stream(s)
    release.set()
    for c in done:
        c.wait(5)
    time.sleep(0.02)
    assert not later.is_done  # held by the gate: the batch stopped before it
    gate.open()
    later.wait(5)
    engine.drain()
    harness.backend.event_destroy(ev)


def test_a_user_event_recorded_again_elsewhere_does_not_retire_earlier_work(harness: Harness, engine: CompletionEngine) -> None:
    """The newest-first shortcut must not trust a user's event: it may have been re-recorded on another stream."""
    b = harness.backend
    s, other = harness.stream(), harness.stream()
    release, ev = _hold_lane(engine, b, s)
    first = engine.completion_for_stream(s)
    gate = harness.gate(s)
    held_back = engine.completion_for_stream(s)
    user = b.event_create(timing=False, blocking_sync=True)
    b.event_record(user, s)
    awaited = engine.event_completion(user, s)
    b.event_record(user, other)  # the user records it again, on an idle stream: complete at once
    b.stream_synchronize(other)
    release.set()
    first.wait(5)
    time.sleep(0.05)
    assert not held_back.is_done  # still behind the gate
    gate.open()
    held_back.wait(5)
    awaited.wait(5)
    engine.drain()
    b.event_destroy(user)
    b.event_destroy(ev)


# -- host calls ----------------------------------------------------------------------------


def test_python_host_fn_runs_on_a_worker_not_the_caller_nor_the_driver_thread(harness: Harness, engine: CompletionEngine) -> None:
    b = harness.backend
    s = harness.stream()
    driver: list[int] = []
    # Only this test runs Python on the callback thread, to learn its identity.
    probe = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: driver.append(threading.get_ident()))
    b.launch_host_func(s, ctypes.cast(probe, ctypes.c_void_p).value, 0)
    c = engine.host_call(s, lambda: (threading.get_ident(), threading.current_thread().name))
    ident, name = c.result(5)
    b.stream_synchronize(s)
    assert driver and ident != driver[0]
    assert ident != threading.get_ident()
    assert name.startswith("streamrt-host-")


def test_host_call_passes_args_and_returns_the_value(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    c = engine.host_call(s, lambda a, b: a * b, (6, 7))
    assert c.result(5) == 42


def test_host_call_holds_the_stream_until_fn_returns(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    release = threading.Event()
    engine.host_call(s, release.wait, (5,))
    after = engine.completion_for_stream(s)
    time.sleep(0.05)
    assert not after.is_done  # later work waits for the Python function
    release.set()
    after.wait(5)


def test_a_failed_host_function_enqueue_leaves_nothing_waiting(harness: Harness) -> None:
    engine = harness.engine(InjectedFailure(harness.backend, "launch_host_func", times=None))
    s = harness.stream()
    ran: list[int] = []
    with pytest.raises(BackendError, match="injected"):
        engine.host_call(s, ran.append, (1,))
    assert engine.statistics().host_calls_pending == 0
    engine.drain(timeout=5)  # nothing in flight: returns at once
    harness.backend.stream_synchronize(s)
    assert ran == []


def test_a_call_whose_hold_fails_to_enqueue_never_runs_although_its_worker_was_woken(harness: Harness) -> None:
    """The driver may post ``ready`` before the submit learns that the hold failed: the worker waits for the outcome."""

    # the hold fails after a while, in which the driver runs the call's sem_post(ready): the worker is woken
    failing = InjectedFailure(harness.backend, "launch_host_func", when=lambda _s, fn, _ud: fn == HOLD_ADDRESS, delay=0.05)
    engine = harness.engine(failing, stream_signals=False)
    s = harness.stream()
    ran: list[str] = []
    with pytest.raises(BackendError, match="injected"):
        engine.host_call(s, ran.append, ("failed",))
    assert engine.host_call(s, ran.append, ("next",)).exception(5) is None
    engine.drain(timeout=5)
    harness.backend.stream_synchronize(s)
    assert ran == ["next"]  # the failed call never ran; the next one ran once


def test_host_fn_exception_reaches_the_waiter_and_the_stream_goes_on(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()

    def boom() -> None:
        raise ZeroDivisionError("in a host function")

    bad = engine.host_call(s, boom)
    good = engine.host_call(s, lambda: "still running")
    tail = engine.completion_for_stream(s)
    with pytest.raises(ZeroDivisionError, match="in a host function"):
        bad.result(5)
    assert good.result(5) == "still running"
    tail.wait(5)
    assert tail.exception() is None


def test_host_call_refuses_a_capturing_stream(harness: Harness, engine: CompletionEngine) -> None:
    b = harness.backend
    if not b.capabilities(0).supports_graphs:
        pytest.skip("backend has no graphs")
    s = harness.stream()
    b.stream_begin_capture(s, 0)
    try:
        with pytest.raises(CaptureError, match="host_slot"):
            engine.host_call(s, print)
    finally:
        b.graph_destroy(b.stream_end_capture(s))


def test_switch_interval_lowered_while_a_python_host_call_is_pending(harness: Harness, engine: CompletionEngine) -> None:
    before = sys.getswitchinterval()
    s = harness.stream()
    gate = harness.gate(s)
    c = engine.host_call(s, lambda: sys.getswitchinterval())
    assert sys.getswitchinterval() == pytest.approx(DEFAULT_SWITCH_INTERVAL)
    assert engine.statistics().switch_interval_lowered
    gate.open()
    assert c.result(5) == pytest.approx(DEFAULT_SWITCH_INTERVAL)
    engine.drain()
    assert sys.getswitchinterval() == before
    assert not engine.statistics().switch_interval_lowered


def test_switch_interval_left_alone_when_disabled(harness: Harness) -> None:
    engine = harness.engine(python_host_switch_interval=None)
    before = sys.getswitchinterval()
    s = harness.stream()
    gate = harness.gate(s)
    c = engine.host_call(s, lambda: sys.getswitchinterval())
    assert sys.getswitchinterval() == before
    gate.open()
    assert c.result(5) == before


def test_native_host_call_runs_on_driver_and_keepalive_released_after(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    sem = Semaphore(0)
    token = Token()
    ref = weakref.ref(token)
    engine.host_call_native(s, SEM_POST_ADDRESS, sem.address, keepalive=token)
    del token
    assert sem.wait(5)
    engine.drain()
    assert wait_until(lambda: ref() is None)
    sem.destroy()
    with pytest.raises(ValueError):
        engine.host_call_native(s, 0, 0)


# -- graph host slots ------------------------------------------------------------------------


def test_host_slot_eager_run(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    box = [1]
    slot = engine.host_slot(lambda b: b[0] * 10, (box,))
    req = slot.arm()
    slot.capture(s)  # on a stream that is not capturing, the slot just runs once
    harness.backend.stream_synchronize(s)
    assert slot.settle(req, None) == (10, None)  # what a replay's Run reads at its tail
    slot.close()
    with pytest.raises(ClosedError):
        slot.arm()


def test_host_slot_reruns_fn_on_every_graph_replay_with_current_inputs(harness: Harness, engine: CompletionEngine) -> None:
    b = harness.backend
    if not b.capabilities(0).supports_graphs:
        pytest.skip("backend has no graphs")
    s = harness.stream()
    box = [0]
    ran_on: list[str] = []

    def node(bx: list[int]) -> int:
        ran_on.append(threading.current_thread().name)
        if bx[0] == 2:
            raise ValueError("replay 2 failed")
        return bx[0] * 100

    slot = engine.host_slot(node, (box,))
    b.stream_begin_capture(s, 0)
    slot.capture(s)
    graph = b.stream_end_capture(s)
    exec_ = b.graph_instantiate(graph)
    results = []
    for i in range(4):
        box[0] = i
        req = slot.arm()
        b.graph_launch(exec_, s)
        b.stream_synchronize(s)  # the input changes for the next replay only after this one ran
        results.append(slot.settle(req, None))
    assert [exc is None for _, exc in results] == [True, True, False, True]
    assert [value for value, exc in results if exc is None] == [0, 100, 300]
    assert len(ran_on) == 4 and all(n.startswith("streamrt-slot-") for n in ran_on)
    b.stream_synchronize(s)
    b.graph_exec_destroy(exec_)
    b.graph_destroy(graph)
    slot.close()
    assert engine.statistics().host_slots == 0


def test_host_slot_runs_a_failed_stream_never_reached_are_abandoned(harness: Harness, engine: CompletionEngine) -> None:
    slot = engine.host_slot(lambda: None)
    r1, r2 = slot.arm(), slot.arm()
    err = BackendError("sim", 700, "x", "stream failed", "graph_launch")
    assert slot.settle(r1, err) == (None, err) and slot.settle(r2, err) == (None, err)
    assert slot.in_flight == 0 and r1.abandoned and r2.abandoned
    slot.close()  # the semaphores are leaked, not freed: a failed launch might still name them


def test_host_slot_disarm_keeps_later_replays_matched(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    box = [0]
    slot = engine.host_slot(lambda b: b[0], (box,))
    failed_launch = slot.arm()
    assert slot.disarm(failed_launch) is True
    assert slot.disarm(failed_launch) is False
    box[0] = 5
    req = slot.arm()
    slot.capture(s)
    harness.backend.stream_synchronize(s)
    assert slot.settle(req, None) == (5, None)
    slot.close()


# -- faults -------------------------------------------------------------------------------------


def test_sticky_error_resolves_every_waiter_and_abandons_host_calls(harness: Harness) -> None:
    faulty = FaultyBackend(harness.backend)
    engine = harness.engine(faulty)
    before = sys.getswitchinterval()
    s = harness.stream()
    gate = harness.gate(s)
    ran: list[int] = []
    c1 = engine.completion_for_stream(s)
    h = engine.host_call(s, ran.append, (1,))
    c2 = engine.completion_for_stream(s)
    time.sleep(0.02)
    faulty.fail()
    for c in (c1, h, c2):
        assert isinstance(c.exception(5), BackendError)
    assert sys.getswitchinterval() == before  # no Python host call in flight any more
    engine.drain()
    stats = engine.statistics()
    assert stats.host_calls_pending == 0 and stats.failed >= 3
    gate.open()  # the device "recovers": the abandoned host function is skipped, not run
    harness.backend.stream_synchronize(s)
    engine.close()
    assert ran == []


def test_waits_on_other_lanes_fail_too(harness: Harness) -> None:
    faulty = FaultyBackend(harness.backend)
    engine = harness.engine(faulty)
    streams = [harness.stream() for _ in range(3)]
    gates = [harness.gate(s) for s in streams]
    cs = [engine.completion_for_stream(s) for s in streams]
    faulty.fail()
    assert all(isinstance(c.exception(5), BackendError) for c in cs)
    for g in gates:
        g.open()


# -- drain, close, lifetime -----------------------------------------------------------------------


def test_drain_waits_for_events_and_host_calls(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    gate = harness.gate(s)
    cs = [engine.completion_for_stream(s), engine.host_call(s, time.sleep, (0.01,)), engine.completion_for_stream(s)]
    with pytest.raises(TimeoutError):
        engine.drain(timeout=0.05)
    gate.open_later(0.02)
    engine.drain()
    assert all(c.is_done for c in cs)
    assert engine.statistics().pending == 0


def test_close_drains_joins_threads_and_refuses_later_work(harness: Harness, engine: CompletionEngine) -> None:
    before = sys.getswitchinterval()
    streams = [harness.stream() for _ in range(3)]
    gate = harness.gate(streams[0])
    cs = [engine.completion_for_stream(s) for s in streams]
    cs.append(engine.host_call(streams[0], lambda: "ran"))
    threads = _engine_threads(engine)
    assert len(threads) == 5  # three lanes, one host-call worker and the watchdog
    gate.open_later(0.05)
    engine.close()
    assert all(c.is_done for c in cs) and cs[-1].result() == "ran"
    assert not any(t.is_alive() for t in threads)
    assert sys.getswitchinterval() == before
    stats = engine.statistics()
    assert stats.closed and stats.lanes == 0 and stats.workers == 0 and stats.pooled_events == 0
    engine.close()  # idempotent
    with pytest.raises(ClosedError):
        engine.completion_for_stream(streams[1])
    with pytest.raises(ClosedError):
        engine.host_call(streams[1], print)


def test_close_with_timeout_gives_up_on_stuck_work(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    gate = harness.gate(s)  # never opened before close
    token = Token()
    ref = weakref.ref(token)
    c = engine.completion_for_stream(s, keepalive=token)
    h = engine.host_call(s, print)
    del token
    t0 = time.monotonic()
    engine.close(timeout=0.05)
    assert time.monotonic() - t0 < 5
    assert isinstance(c.exception(), ClosedError) and isinstance(h.exception(), ClosedError)
    gc.collect()
    assert ref() is not None  # the device may still use it: leaked, not released
    # The stream still passes the abandoned call once it runs again (its sem_wait was credited).
    gate.open()
    assert wait_until(lambda: harness.backend.stream_query(s))


def test_drain_from_a_lane_thread_is_refused(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    errors: list[BaseException] = []

    def cb(_: Completion) -> None:
        try:
            engine.drain()
        except RuntimeError as exc:
            errors.append(exc)

    gate = harness.gate(s)  # so that the callback is added before resolution and runs on the lane
    c = engine.completion_for_stream(s)
    c.add_done_callback(cb)
    gate.open()
    c.wait(5)
    assert wait_until(lambda: bool(errors))
    assert "wait for itself" in str(errors[0])


def test_forget_stream_lets_its_threads_finish_the_work_then_exit(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    gate = harness.gate(s)
    c = engine.completion_for_stream(s)
    h = engine.host_call(s, lambda: 5)
    threads = [t for t in _engine_threads(engine) if t.name != "streamrt-watchdog"]  # the engine's, not the stream's
    assert len(threads) == 2
    engine.forget_stream(s)  # does not block
    assert not c.is_done
    gate.open()
    assert h.result(5) == 5
    c.wait(5)
    assert wait_until(lambda: not any(t.is_alive() for t in threads))
    stats = engine.statistics()
    assert stats.lanes == 0 and stats.workers == 0 and stats.retired == 2
    assert engine.completion_for_stream(s).result(5) is None  # a fresh lane for the same handle


def _thread_cpu_ticks(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")
def test_idle_lanes_and_workers_do_not_poll(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    engine.host_call(s, lambda: None).wait(5)
    engine.drain()
    threads = _engine_threads(engine)
    assert len(threads) == 3  # the lane, the host-call worker and the watchdog
    assert wait_until(lambda: engine._watchdog is not None and engine._watchdog.idle)
    ids = [t.native_id for t in threads if t.native_id is not None]
    before = [_thread_cpu_ticks(i) for i in ids]
    time.sleep(0.3)
    after = [_thread_cpu_ticks(i) for i in ids]
    assert [a - b for a, b in zip(after, before)] == [0] * len(ids)


# -- how a Python host call holds its stream -----------------------------------------------------------


def _signal_value(engine: CompletionEngine, stream: int) -> int:
    channel = engine._channels[stream]
    assert channel.signal is not None
    return ctypes.c_uint64.from_address(channel.signal).value


def test_with_signals_each_call_is_one_host_function_and_a_ticket_on_the_stream_signal(harness: Harness) -> None:
    engine = harness.engine(stream_signals=True)
    assert engine.stream_signals
    s = harness.stream()
    log_start = max((r.seq for r in harness.backend.op_log()), default=0)
    results = [engine.host_call(s, lambda i=i: i) for i in range(3)]
    assert [c.result(5) for c in results] == [0, 1, 2]
    kinds = [r.kind for r in harness.backend.op_log() if r.seq > log_start and r.stream == s]
    assert kinds == ["host_func", "wait_signal", "event_record"] * 3
    assert _signal_value(engine, s) == 3  # the worker stored tickets 1, 2, 3


def test_without_signals_each_call_is_two_host_functions(harness: Harness) -> None:
    engine = harness.engine(stream_signals=False)
    assert not engine.stream_signals
    s = harness.stream()
    log_start = max((r.seq for r in harness.backend.op_log()), default=0)
    assert engine.host_call(s, lambda: 7).result(5) == 7
    kinds = [r.kind for r in harness.backend.op_log() if r.seq > log_start and r.stream == s]
    assert kinds == ["host_func", "host_func", "event_record"]


def test_a_failed_signal_wait_enqueue_abandons_the_call_and_spends_its_ticket(harness: Harness) -> None:
    """The worker may store the failed call's ticket; the next call must wait for a higher one."""

    # the wait fails after a while, in which the driver runs the call's sem_post(ready): the worker is woken
    engine = harness.engine(InjectedFailure(harness.backend, "stream_wait_signal", delay=0.05), stream_signals=True)
    s = harness.stream()
    ran: list[str] = []
    with pytest.raises(BackendError, match="injected"):
        engine.host_call(s, ran.append, ("failed",))
    release = threading.Event()
    engine.host_call(s, release.wait, (5,))
    after = engine.completion_for_stream(s)
    time.sleep(0.05)
    assert not after.is_done  # the stream still waits for the second call's own ticket
    release.set()
    after.wait(5)
    engine.drain(timeout=5)
    assert ran == []  # the abandoned call never ran
    assert _signal_value(engine, s) == 2


def test_a_forgotten_streams_signal_is_reused_and_tickets_go_on_from_its_value(harness: Harness) -> None:
    engine = harness.engine(stream_signals=True)
    s1 = harness.stream()
    engine.host_call(s1, lambda: None).wait(5)
    engine.host_call(s1, lambda: None).wait(5)
    signal = engine._channels[s1].signal
    engine.forget_stream(s1)
    assert wait_until(lambda: engine._signals == [signal])  # the lane stopped the channel and returned it
    s2 = harness.stream()
    release = threading.Event()
    engine.host_call(s2, release.wait, (5,))
    assert engine._channels[s2].signal == signal
    after = engine.completion_for_stream(s2)
    time.sleep(0.05)
    assert not after.is_done  # ticket 3, not an old one already stored
    release.set()
    after.wait(5)
    assert _signal_value(engine, s2) == 3


def test_close_frees_the_signals(harness: Harness) -> None:
    engine = harness.engine(stream_signals=True)
    s = harness.stream()
    engine.host_call(s, lambda: None).wait(5)
    signal = engine._channels[s].signal
    assert harness.backend.pointer_kind(signal) is PointerKind.HOST
    engine.close()
    assert harness.backend.pointer_kind(signal) is PointerKind.PAGEABLE  # freed


def test_a_signal_returned_after_close_is_leaked_not_freed_on_the_returning_thread(harness: Harness) -> None:
    """A lane that outlives a forced close returns its channel's signal late: no real free on a lane."""
    engine = harness.engine(stream_signals=True)
    late = harness.backend.signal_alloc()
    engine.close()
    engine._return_signal(late, reusable=True)
    assert harness.backend.pointer_kind(late) is PointerKind.HOST  # still allocated
    harness.backend.signal_free(late)
