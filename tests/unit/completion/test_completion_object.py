"""The Completion object on its own: resolution, blocking waits, callbacks, awaiting, loops.

These tests resolve Completions by hand from other threads, the way the
engine's lane and worker threads do, so they need no backend.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
import warnings

import pytest

from streamrt import Completion
from streamrt._completion._future import _LoopNotifier


def _resolve_later(c: Completion, delay: float, value: object = None, exc: BaseException | None = None) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        if exc is None:
            c._set_result(value)
        else:
            c._set_exception(exc)

    t = threading.Thread(target=run, name="resolver", daemon=True)
    t.start()
    return t


def test_first_resolution_wins() -> None:
    c = Completion()
    assert not c.is_done
    assert c._set_result(1) is True
    assert c._set_exception(ValueError()) is False
    assert c._set_result(2) is False
    assert c.is_done
    assert c.result() == 1
    assert c.exception() is None


def test_result_raises_the_work_exception_wait_does_not() -> None:
    c = Completion()
    err = ValueError("from the work")
    c._set_exception(err)
    c.wait()  # does not raise
    assert c.exception() is err
    with pytest.raises(ValueError, match="from the work"):
        c.result()


def test_wait_blocks_until_resolved_from_another_thread() -> None:
    c = Completion()
    t = _resolve_later(c, 0.05, value="v")
    t0 = time.monotonic()
    c.wait(5)
    assert time.monotonic() - t0 >= 0.04
    assert c.result() == "v"
    t.join()


def test_wait_timeout_raises_timeouterror_and_leaves_it_pending() -> None:
    c = Completion()
    with pytest.raises(TimeoutError):
        c.wait(0.02)
    with pytest.raises(TimeoutError):
        c.result(0.0)
    assert not c.is_done


def test_done_callback_runs_on_resolving_thread_or_immediately() -> None:
    c = Completion()
    seen: list[tuple[str, Completion]] = []
    c.add_done_callback(lambda x: seen.append((threading.current_thread().name, x)))
    _resolve_later(c, 0.0, value=1).join()
    assert seen == [("resolver", c)]
    c.add_done_callback(lambda x: seen.append((threading.current_thread().name, x)))
    assert seen[-1] == (threading.current_thread().name, c)


def test_failing_callback_is_logged_and_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    c = Completion()
    ran: list[int] = []

    def bad(_: Completion) -> None:
        raise RuntimeError("callback bug")

    c.add_done_callback(bad)
    c.add_done_callback(lambda _: ran.append(1))
    with caplog.at_level(logging.ERROR, logger="streamrt"):
        c._set_result(None)
    assert ran == [1]
    assert "callback bug" in caplog.text


def test_unretrieved_host_call_exception_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    c = Completion()
    c._log_unretrieved = True
    c._set_exception(KeyError("lost"))
    with caplog.at_level(logging.ERROR, logger="streamrt"):
        del c
        gc.collect()
    assert "never retrieved" in caplog.text
    d = Completion()
    d._log_unretrieved = True
    d._set_exception(KeyError("seen"))
    assert isinstance(d.exception(), KeyError)
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="streamrt"):
        del d
        gc.collect()
    assert "never retrieved" not in caplog.text


@pytest.mark.asyncio
async def test_await_resolved_from_another_thread_returns_result() -> None:
    c = Completion()
    _resolve_later(c, 0.02, value=7)
    assert await c == 7


@pytest.mark.asyncio
async def test_await_raises_the_work_exception() -> None:
    c = Completion()
    _resolve_later(c, 0.01, exc=OSError("device said no"))
    with pytest.raises(OSError, match="device said no"):
        await c


@pytest.mark.asyncio
async def test_await_of_done_completion_returns_at_once() -> None:
    c = Completion()
    c._set_result("ready")
    assert await c == "ready"


@pytest.mark.asyncio
async def test_await_does_not_block_the_loop() -> None:
    c = Completion()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while not c.is_done:
            ticks += 1
            await asyncio.sleep(0.001)

    tick_task = asyncio.create_task(ticker())
    _resolve_later(c, 0.1)
    await c
    await tick_task
    assert ticks >= 10


@pytest.mark.asyncio
async def test_cancelling_the_awaiting_task_cancels_only_the_wait() -> None:
    c = Completion()
    task = asyncio.create_task(_await(c))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not c.is_done  # the work is not cancelled
    c._set_result(3)  # the resolution skips the cancelled waiter without error
    await asyncio.sleep(0.01)
    assert await c == 3


async def _await(c: Completion) -> object:
    return await c


@pytest.mark.asyncio
async def test_many_tasks_one_completion_wake_together() -> None:
    c = Completion()
    tasks = [asyncio.create_task(_await(c)) for _ in range(100)]
    await asyncio.sleep(0)
    _resolve_later(c, 0.0, value="all")
    assert await asyncio.gather(*tasks) == ["all"] * 100


def test_awaiters_on_two_loops_in_two_threads() -> None:
    c = Completion()
    results: list[object] = []

    def run_loop() -> None:
        results.append(asyncio.run(_await(c)))

    threads = [threading.Thread(target=run_loop) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    c._set_result("both")
    for t in threads:
        t.join(5)
    assert results == ["both", "both"]


def test_await_under_uvloop() -> None:
    uvloop = pytest.importorskip("uvloop")
    c = Completion()
    loop = uvloop.new_event_loop()
    try:
        _resolve_later(c, 0.02, value="uv")
        assert loop.run_until_complete(_await(c)) == "uv"
    finally:
        loop.close()


def test_loop_closed_before_resolution_warns_once_and_does_not_crash() -> None:
    notifier = _LoopNotifier()
    loop = asyncio.new_event_loop()
    completions = [Completion() for _ in range(3)]
    for c in completions:
        c._notifier = notifier
    tasks = [loop.create_task(_await(c)) for c in completions]
    loop.run_until_complete(asyncio.sleep(0.01))  # tasks are now awaiting
    loop.close()  # closed with the tasks still pending
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for c in completions:
            t = threading.Thread(target=c._set_result, args=(None,))
            t.start()
            t.join()
    relevant = [w for w in caught if issubclass(w.category, RuntimeWarning) and "event loop was closed" in str(w.message)]
    assert len(relevant) == 1
    assert notifier.warned
    assert all(c.is_done for c in completions)
    for task in tasks:  # silence "Task was destroyed but it is pending"
        task._log_destroy_pending = False  # type: ignore[attr-defined]


class _CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts its ``call_soon_threadsafe`` calls (each is one self-pipe wake-up)."""

    threadsafe_calls = 0

    def call_soon_threadsafe(self, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        self.threadsafe_calls += 1
        return super().call_soon_threadsafe(*args, **kwargs)


def test_posts_to_a_loop_coalesce_until_the_loop_runs_them() -> None:
    notifier = _LoopNotifier()
    loop = _CountingLoop()
    try:
        futures = [loop.create_future() for _ in range(6)]
        order: list[int] = []
        for i, fut in enumerate(futures):
            fut.add_done_callback(lambda _f, i=i: order.append(i))
        for batch in (futures[0:2], futures[2:3], futures[3:6]):  # three lane batches, before the loop runs
            t = threading.Thread(target=notifier.post, args=(loop, list(batch)))
            t.start()
            t.join()
        assert loop.threadsafe_calls == 1  # one wake-up carries all three batches
        loop.run_until_complete(asyncio.gather(*futures))
        assert order == list(range(6))
        # Once run, the next post wakes the loop again.
        late = loop.create_future()
        t = threading.Thread(target=notifier.post, args=(loop, [late]))
        t.start()
        t.join()
        loop.run_until_complete(late)
        assert loop.threadsafe_calls == 2
        assert not notifier._queued
    finally:
        loop.close()


def test_a_post_pending_on_a_loop_that_closes_is_dropped_with_the_warning() -> None:
    notifier = _LoopNotifier()
    loop = asyncio.new_event_loop()
    first, second, third = (loop.create_future() for _ in range(3))
    notifier.post(loop, [first])  # scheduled, never run: the loop closes first
    loop.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        notifier.post(loop, [second])  # not appended to the dead post: it warns
        notifier.post(loop, [third])
    relevant = [w for w in caught if "event loop was closed" in str(w.message)]
    assert len(relevant) == 1
    assert not notifier._queued  # nothing keeps the closed loop alive


def test_loops_closed_before_their_wake_up_ran_are_not_kept() -> None:
    notifier = _LoopNotifier()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(20):  # each closes with a wake-up posted and not run
            loop = asyncio.new_event_loop()
            notifier.post(loop, [loop.create_future()])
            loop.close()
    assert len(notifier._queued) <= 5  # a few at most, not one per closed loop
    assert len([w for w in caught if "event loop was closed" in str(w.message)]) == 1
    live = asyncio.new_event_loop()
    try:
        fut = live.create_future()
        notifier.post(live, [fut])
        live.run_until_complete(fut)
        assert live not in notifier._queued
    finally:
        live.close()
