"""Awaiting engine completions on the sim backend: correctness at scale, uvloop, cancellation, closed loops."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import random
import threading
import warnings
import weakref
from typing import Any

import pytest
from _completion_helpers import Harness, wait_until

from streamrt._backends.protocol import MemcpyKind
from streamrt._completion import Completion, CompletionEngine


class Token:
    """A keepalive whose release is observable."""


async def _await(c: Completion) -> Any:
    return await c


async def _checked_awaits(
    backend: Any, engine: CompletionEngine, streams: list[int], tasks: int, per_task: int, seed: int
) -> int:
    """``tasks`` tasks each do ``per_task`` rounds of: memset a device slot to a fresh value,
    copy it to a pinned host slot, await the stream, check the host slot holds the value."""
    dev = backend.malloc(tasks)
    host = backend.host_malloc(tasks)
    view = (ctypes.c_uint8 * tasks).from_address(host)
    checked = 0
    rng = random.Random(seed)
    starts = [rng.randrange(len(streams)) for _ in range(tasks)]

    async def worker(t: int) -> None:
        nonlocal checked
        for i in range(per_task):
            s = streams[(starts[t] + i) % len(streams)]
            value = (t * 7 + i) % 255 + 1
            backend.memset_async(dev + t, value, 1, s)
            backend.memcpy_async(host + t, dev + t, 1, MemcpyKind.DEVICE_TO_HOST, s)
            await engine.completion_for_stream(s)
            assert view[t] == value, f"task {t} round {i}: the await resolved before the copy landed"
            checked += 1
            view[t] = 0

    try:
        await asyncio.gather(*(worker(t) for t in range(tasks)))
    finally:
        for s in streams:
            backend.stream_synchronize(s)
        backend.free(dev)
        backend.host_free(host)
    return checked


@pytest.mark.asyncio
async def test_10000_awaits_across_8_streams_from_1000_tasks(harness: Harness, engine: CompletionEngine) -> None:
    streams = [harness.stream() for _ in range(8)]
    assert await _checked_awaits(harness.backend, engine, streams, tasks=1000, per_task=10, seed=3) == 10_000
    engine.drain()
    stats = engine.statistics()
    assert stats.pending == 0 and stats.host_calls_pending == 0 and stats.failed == 0
    assert stats.retired == 10_000
    assert stats.lanes == 8


def test_awaits_under_uvloop(harness: Harness, engine: CompletionEngine) -> None:
    uvloop = pytest.importorskip("uvloop")
    streams = [harness.stream() for _ in range(4)]
    loop = uvloop.new_event_loop()
    try:
        n = loop.run_until_complete(_checked_awaits(harness.backend, engine, streams, tasks=100, per_task=10, seed=5))
    finally:
        loop.close()
    assert n == 1000
    engine.drain()
    assert engine.statistics().pending == 0


def test_host_call_awaited_under_uvloop(harness: Harness, engine: CompletionEngine) -> None:
    uvloop = pytest.importorskip("uvloop")
    s = harness.stream()

    async def main() -> Any:
        ok = await engine.host_call(s, lambda: "uv")
        with pytest.raises(KeyError):
            await engine.host_call(s, {}.__getitem__, ("missing",))
        return ok

    loop = uvloop.new_event_loop()
    try:
        assert loop.run_until_complete(main()) == "uv"
    finally:
        loop.close()


@pytest.mark.asyncio
async def test_awaited_host_call_returns_value_and_raises_its_exception(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    assert await engine.host_call(s, sum, ([1, 2, 3],)) == 6

    def bad() -> None:
        raise LookupError("host fn failed")

    with pytest.raises(LookupError, match="host fn failed"):
        await engine.host_call(s, bad)
    await engine.completion_for_stream(s)  # the stream went on


@pytest.mark.asyncio
async def test_awaiting_gated_work_never_blocks_the_loop(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    gate = harness.gate(s)
    c = engine.completion_for_stream(s)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while not c.is_done:
            ticks += 1
            await asyncio.sleep(0.001)

    t = asyncio.create_task(ticker())
    gate.open_later(0.1)
    await c
    await t
    assert ticks >= 10


@pytest.mark.asyncio
async def test_cancel_cancels_the_wait_not_the_work_and_keeps_the_keepalive(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    gate = harness.gate(s)
    token = Token()
    ref = weakref.ref(token)
    c = engine.completion_for_stream(s, keepalive=token)
    ran = []
    h = engine.host_call(s, ran.append, (1,))
    del token
    waiting = asyncio.create_task(_await(c))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    gc.collect()
    assert ref() is not None  # not released early
    assert not c.is_done and not h.is_done
    gate.open()
    await c  # the work still completes
    assert await h is None and ran == [1]
    assert wait_until(lambda: ref() is None)  # and only then is the keepalive released


def test_loop_closed_before_completion_warns_once_per_engine(harness: Harness, engine: CompletionEngine) -> None:
    s = harness.stream()
    for round_ in range(2):
        gate = harness.gate(s)
        loop = asyncio.new_event_loop()
        completions = [engine.completion_for_stream(s) for _ in range(3)]
        tasks = [loop.create_task(_await(c)) for c in completions]
        loop.run_until_complete(asyncio.sleep(0.01))
        loop.close()  # the tasks are still waiting
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gate.open()
            engine.drain()
        relevant = [w for w in caught if "event loop was closed" in str(w.message)]
        assert len(relevant) == (1 if round_ == 0 else 0)
        assert all(c.is_done for c in completions)
        for task in tasks:
            task._log_destroy_pending = False  # type: ignore[attr-defined]
    assert engine.statistics().loop_closed_warned


def test_cancelled_await_is_unregistered_and_a_closed_loop_then_gives_no_warning(
    harness: Harness, engine: CompletionEngine
) -> None:
    s = harness.stream()
    gate = harness.gate(s)
    c = engine.completion_for_stream(s)
    loop = asyncio.new_event_loop()
    try:
        cancelled = loop.create_task(_await(c))
        kept = loop.create_task(_await(c))
        loop.run_until_complete(asyncio.sleep(0.01))
        assert c._waiters is not None and len(c._waiters) == 2
        cancelled.cancel()
        loop.run_until_complete(asyncio.wait([cancelled]))
        assert cancelled.cancelled()
        assert c._waiters is not None and len(c._waiters) == 1  # only the cancelled wait left
        gate.open()
        assert loop.run_until_complete(asyncio.wait_for(kept, 5)) is None  # the other awaiter is unaffected
    finally:
        loop.close()
    assert c._waiters is None


def test_wait_for_timeout_then_loop_closed_before_the_work_completes_gives_no_warning(
    harness: Harness, engine: CompletionEngine
) -> None:
    s = harness.stream()
    gate = harness.gate(s)
    completions = [engine.completion_for_stream(s) for _ in range(3)]

    async def give_up() -> None:
        for c in completions:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(_await(c), 0.01)

    asyncio.run(give_up())  # the loop is closed afterwards; the work is still pending
    assert not any(c.is_done for c in completions)
    assert all(c._waiters is None for c in completions)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gate.open()
        for c in completions:
            c.wait(5)
        engine.drain()
    assert not [w for w in caught if "event loop was closed" in str(w.message)]
    assert not engine.statistics().loop_closed_warned


class _NoReentryLock:
    """Stands in for the Completion state lock; records (instead of deadlocking on) re-entry by one thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self.reentered = False

    def __enter__(self) -> None:
        if self._owner == threading.get_ident():
            self.reentered = True
            raise RuntimeError("the Completion state lock was re-entered")
        self._lock.acquire()
        self._owner = threading.get_ident()

    def __exit__(self, *exc: object) -> None:
        self._owner = None
        self._lock.release()


def test_an_abandoned_await_closed_by_the_garbage_collector_does_not_take_the_state_lock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The GC may close a pending await's generator at any allocation, even inside a locked section.

    Only a cancellation (delivered by the loop) unregisters the wait; a GeneratorExit must not
    touch the lock, or a GC pass inside ``add_done_callback`` would deadlock its own thread.
    """
    import streamrt._completion._future as completion_module

    guard = _NoReentryLock()
    monkeypatch.setattr(completion_module, "_state_lock", guard)
    c = Completion()
    loop = asyncio.new_event_loop()
    task = loop.create_task(_await(c))
    loop.run_until_complete(asyncio.sleep(0.01))
    loop.close()  # the task is still pending: never cancelled
    task._log_destroy_pending = False  # type: ignore[attr-defined]
    with guard:  # as if a GC pass ran inside a locked section on this thread
        task.get_coro().close()
    assert not guard.reentered


# -- work pushed on a loop's thread: the lane thread's wake-up waits for the loop's next iteration ----------
def _push_and_stop(engine: CompletionEngine, stream: int) -> Completion:
    """Watch ``stream`` on a loop's thread, and stop and close the loop before its next iteration."""
    loop = asyncio.new_event_loop()
    box: list[Completion] = []

    def step() -> None:
        box.append(engine.completion_for_stream(stream))
        loop.stop()  # the deferred wake-up was scheduled for the next iteration, which never runs

    loop.call_soon(step)
    loop.run_forever()
    loop.close()
    return box[0]


def test_work_pushed_on_a_loop_and_not_awaited_retires_on_the_loops_next_iteration(harness: Harness) -> None:
    engine = harness.engine(watchdog_interval=None)
    s = harness.stream()
    retired = threading.Event()
    threads: list[int] = []

    async def main() -> bool:
        c = engine.completion_for_stream(s)
        c.add_done_callback(lambda _c: (threads.append(threading.get_ident()), retired.set()))
        await asyncio.sleep(0)  # the loop's next iteration wakes the lane thread: nobody polls the lane
        return await asyncio.get_running_loop().run_in_executor(None, retired.wait, 10)

    assert asyncio.run(main())
    assert threads[0] != threading.get_ident()  # the lane thread retired it


def test_a_thread_waiting_wakes_a_lane_left_asleep_by_a_stopped_loop(harness: Harness) -> None:
    engine = harness.engine(watchdog_interval=None)
    c = _push_and_stop(engine, harness.stream())
    c.wait(10)  # Completion.wait wakes the lane
    assert c.is_done


def test_the_watchdog_wakes_a_lane_left_asleep_by_a_stopped_loop(harness: Harness) -> None:
    engine = harness.engine(watchdog_interval=0.05)
    c = _push_and_stop(engine, harness.stream())
    retired = threading.Event()
    c.add_done_callback(lambda _c: retired.set())
    assert retired.wait(10)  # nobody waits: the watchdog's check woke the lane


def test_drain_wakes_a_lane_left_asleep_by_a_stopped_loop(harness: Harness) -> None:
    engine = harness.engine(watchdog_interval=None)
    c = _push_and_stop(engine, harness.stream())
    engine.drain(timeout=10)
    assert c.is_done
