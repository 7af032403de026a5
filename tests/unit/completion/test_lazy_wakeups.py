"""Lazy lane wake-ups: work nobody waits for wakes no runtime thread; every kind of waiter still gets it."""

from __future__ import annotations

import asyncio
import threading
import time

from _completion_helpers import Harness, wait_until

from streamrt._completion._lane import _BACKLOG_HIGH, _BACKLOG_LOW


def _sleeping_lane(harness: Harness, engine, s: int):  # type: ignore[no-untyped-def]
    """The lane of ``s``, its thread started and asleep with nothing queued."""
    engine.completion_for_stream(s).wait(5)
    lane = engine._lane(s)
    assert wait_until(lambda: lane._sleeping and not lane._queue)
    return lane


def test_work_nobody_waits_for_wakes_no_lane_and_is_done_retires_it_on_the_caller(harness: Harness) -> None:
    engine = harness.engine(watchdog_interval=30.0)
    s = harness.stream()
    lane = _sleeping_lane(harness, engine, s)
    gate = harness.gate(s)  # a lane thread still on its way to sleep finds nothing complete
    batches = lane.batches
    completions = [engine.completion_for_stream(s) for _ in range(10)]
    time.sleep(0.02)
    gate.open()
    harness.backend.stream_synchronize(s)  # all of it complete on the device
    time.sleep(0.05)
    assert lane.batches == batches and len(lane._queue) == 10  # the lane thread never woke
    assert all(not c._done for c in completions)
    assert completions[-1].is_done  # polls: one query retires the whole complete queue here
    assert all(c._done for c in completions) and not lane._queue
    assert lane.batches == batches + 1


def test_a_thread_that_waits_gets_the_work_promptly(harness: Harness) -> None:
    engine = harness.engine()
    s = harness.stream()
    _sleeping_lane(harness, engine, s)
    gate = harness.gate(s)
    c = engine.completion_for_stream(s)
    gate.open_later(0.05)
    t0 = time.monotonic()
    c.wait(5)  # holds the lane: its thread waits in the driver until the work is done
    assert time.monotonic() - t0 < 2.0  # well before the watchdog's check would have retired it
    assert not engine._lane(s).holders  # the hold ends with the wait


def test_a_done_callback_runs_without_a_waiter(harness: Harness) -> None:
    engine = harness.engine(watchdog_interval=30.0)  # the watchdog's check cannot be what retires it
    s = harness.stream()
    lane = _sleeping_lane(harness, engine, s)
    ran = threading.Event()
    c = engine.completion_for_stream(s)
    c.add_done_callback(lambda _c: ran.set())
    assert ran.wait(5)
    assert wait_until(lambda: not lane.holders)  # released when it resolved


def test_an_await_past_its_polling_holds_the_lane(harness: Harness) -> None:
    engine = harness.engine(watchdog_interval=30.0, await_poll_us=0)  # no polling: the lane thread must do it
    s = harness.stream()
    _sleeping_lane(harness, engine, s)
    gate = harness.gate(s)
    c = engine.completion_for_stream(s)

    async def main() -> None:
        gate.open_later(0.05)
        await asyncio.wait_for(c, 5)

    asyncio.run(main())
    assert not engine._lane(s).holders


def test_a_backlog_wakes_the_lane_and_it_waits_until_the_backlog_is_short(harness: Harness) -> None:
    engine = harness.engine(watchdog_interval=30.0)
    s = harness.stream()
    lane = _sleeping_lane(harness, engine, s)
    completions = [engine.completion_for_stream(s) for _ in range(_BACKLOG_HIGH)]
    assert wait_until(lambda: len(lane._queue) < _BACKLOG_LOW)  # retired with nobody waiting
    assert sum(c._done for c in completions) > _BACKLOG_HIGH - _BACKLOG_LOW


def test_the_watchdog_retires_work_nobody_waits_for(harness: Harness) -> None:
    engine = harness.engine(watchdog_interval=0.05)
    s = harness.stream()
    _sleeping_lane(harness, engine, s)
    c = engine.completion_for_stream(s)
    assert wait_until(lambda: c._done, timeout=5)  # nobody polled, waited or asked for a callback


def test_without_a_watchdog_lanes_wake_on_every_push(harness: Harness) -> None:
    engine = harness.engine(watchdog_interval=None)  # no backstop: nothing may wait for a waiter
    s = harness.stream()
    lane = _sleeping_lane(harness, engine, s)
    assert not lane.lazy
    c = engine.completion_for_stream(s)
    assert wait_until(lambda: c._done)


def test_drain_waits_for_lazy_work(harness: Harness) -> None:
    engine = harness.engine(watchdog_interval=30.0)
    s = harness.stream()
    _sleeping_lane(harness, engine, s)
    gate = harness.gate(s)
    completions = [engine.completion_for_stream(s) for _ in range(5)]
    gate.open_later(0.05)
    engine.drain(5)
    assert all(c._done for c in completions)
