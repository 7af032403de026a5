"""The asyncio stream scheduler on the sim backend: placement, priorities, backpressure, fairness."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import pytest

import streamrt as srt
from streamrt._errors import ClosedError
from streamrt._scheduler import Scheduler, SchedulerStatistics


def _hold(events: list[threading.Event]) -> Any:
    """Work that holds its stream (a Python host function) until its event is set."""

    def work(s: srt.Stream) -> Any:
        ev = threading.Event()
        events.append(ev)
        return s.launch_host_func(ev.wait, 10)

    return work


@pytest.fixture
def sched(sim_rt: srt.Runtime) -> Any:
    sc = Scheduler(sim_rt, streams=4, max_in_flight=8)
    yield sc
    sc.close()


@pytest.mark.asyncio
async def test_submit_spreads_work_over_the_least_loaded_streams(sched: Scheduler) -> None:
    held: list[threading.Event] = []
    runs = [await sched.submit(_hold(held)) for _ in range(4)]
    st = sched.statistics()
    assert st.streams == 4
    assert [load for _, load in st.per_stream_in_flight] == [1, 1, 1, 1]
    more = await sched.submit(lambda s: None)  # all busy: the least loaded, least recently used
    assert sorted(load for _, load in sched.statistics().per_stream_in_flight) == [1, 1, 1, 2]
    for ev in held:
        ev.set()
    await asyncio.gather(*runs)
    await more
    st = sched.statistics()
    assert st.in_flight == 0 and st.completed == 5 and st.failed == 0 and st.peak_in_flight == 5


@pytest.mark.asyncio
async def test_what_submit_returns(sim_rt: srt.Runtime, sched: Scheduler) -> None:
    h = sim_rt.host_allocator.allocate(16)

    def fill(s: srt.Stream) -> None:
        s.memset(h, 4)

    tail = await sched.submit(fill)  # None: the stream passing the work
    assert isinstance(tail, srt.Completion)
    await tail
    assert (h.numpy() == 4).all()
    assert await (await sched.submit(lambda s: "value")) == "value"
    assert await (await sched.submit(lambda s: s.launch_host_func(lambda: 9))) == 9

    class Launchable:
        def launch(self, s: srt.Stream) -> srt.Completion:
            return s.wait_idle()

    assert await (await sched.submit(Launchable())) is None

    async def coro() -> str:
        return "awaited"

    fut = await sched.submit(lambda s: coro())
    assert await fut == "awaited"
    with pytest.raises(TypeError, match="launch"):
        await sched.submit(42)
    await asyncio.sleep(0)
    assert sched.statistics().in_flight == 0


@pytest.mark.asyncio
async def test_a_failing_enqueue_gives_the_room_back(sched: Scheduler) -> None:
    def broken(s: srt.Stream) -> None:
        raise RuntimeError("enqueue failed")

    with pytest.raises(RuntimeError, match="enqueue failed"):
        await sched.submit(broken)
    for _ in range(100):
        if sched.statistics().in_flight == 0:
            break
        await asyncio.sleep(0.001)
    assert sched.statistics().in_flight == 0


@pytest.mark.asyncio
async def test_backpressure_by_count_makes_callers_wait(sim_rt: srt.Runtime) -> None:
    sc = Scheduler(sim_rt, streams=2, max_in_flight=2)
    held: list[threading.Event] = []
    first = [await sc.submit(_hold(held)) for _ in range(2)]
    third = asyncio.ensure_future(sc.submit(lambda s: None))
    await asyncio.sleep(0.05)
    assert not third.done()
    assert sc.statistics().waiting == 1
    held[0].set()
    await first[0]
    tail = await asyncio.wait_for(third, 5)
    held[1].set()
    await tail
    await first[1]
    sc.close()


@pytest.mark.asyncio
async def test_backpressure_by_pinned_bytes(sim_rt: srt.Runtime) -> None:
    sc = Scheduler(sim_rt, streams=4, max_in_flight=None, max_pinned_bytes=100)
    held: list[threading.Event] = []
    a = await sc.submit(_hold(held), pinned_bytes=60)
    small = await sc.submit(lambda s: None, pinned_bytes=40)  # fits: 100 in total
    big = asyncio.ensure_future(sc.submit(lambda s: None, pinned_bytes=60))
    await asyncio.sleep(0.05)
    assert not big.done()
    await small
    await asyncio.sleep(0.02)
    assert not big.done()  # 60 + 60 > 100 still
    held[0].set()
    await a
    await (await asyncio.wait_for(big, 5))
    with pytest.raises(ValueError, match="can never fit"):
        await sc.submit(lambda s: None, pinned_bytes=101)
    sc.close()


@pytest.mark.asyncio
async def test_admission_is_fair_between_tasks(sim_rt: srt.Runtime) -> None:
    sc = Scheduler(sim_rt, streams=2, max_in_flight=1)
    order: list[str] = []

    def tagged(tag: str) -> Any:
        def work(s: srt.Stream) -> None:
            order.append(tag)
            s.launch_host_func(lambda: None)

        return work

    async def producer(tag: str, n: int, delay: float) -> None:
        await asyncio.sleep(delay)
        for _ in range(n):
            await sc.submit(tagged(tag))

    await asyncio.gather(producer("A", 20, 0), producer("B", 5, 0.001))
    assert len(order) == 25
    # B never waits behind A's whole backlog: its 5 requests interleave with A's.
    assert max(i for i, t in enumerate(order) if t == "B") < 14
    sc.close()


@pytest.mark.asyncio
async def test_a_fanned_out_group_gets_one_turn_per_round(sim_rt: srt.Runtime) -> None:
    sc = Scheduler(sim_rt, streams=2, max_in_flight=1)
    held: list[threading.Event] = []
    blocker = await sc.submit(_hold(held))
    order: list[str] = []

    def tagged(tag: str) -> Any:
        return lambda s: order.append(tag)

    # 30 concurrent submits (30 tasks) of one producer, then 5 of another.
    flood = [asyncio.ensure_future(sc.submit(tagged("A"), group="A")) for _ in range(30)]
    await asyncio.sleep(0.01)
    late = [asyncio.ensure_future(sc.submit(tagged("B"), group="B")) for _ in range(5)]
    await asyncio.sleep(0.01)
    assert sc.statistics().waiting == 35
    held[0].set()
    await blocker
    await asyncio.gather(*flood, *late)
    assert order[:10] == ["A", "B"] * 5  # round-robin between the groups, not 30 A's first
    sc.close()


@pytest.mark.asyncio
async def test_priorities_map_to_stream_priorities_and_admission_order(sim_rt: srt.Runtime) -> None:
    sc = Scheduler(sim_rt, streams=1, max_in_flight=1)
    least, greatest = sim_rt.capabilities.priority_range
    held: list[threading.Event] = []
    blocker = await sc.submit(_hold(held), priority=least)
    order: list[int] = []

    async def want(p: int) -> None:
        await sc.submit(lambda s: order.append(s.priority), priority=p)

    low = asyncio.ensure_future(want(least))
    await asyncio.sleep(0.01)
    high = asyncio.ensure_future(want(greatest - 10))  # clamped to the greatest priority
    await asyncio.sleep(0.01)
    held[0].set()
    await blocker
    await asyncio.gather(low, high)
    assert order == [greatest, least]  # the later, higher-priority caller went first
    assert sorted(p for p, _ in sc.statistics().per_stream_in_flight) == sorted({least, greatest})
    sc.close()


@pytest.mark.asyncio
async def test_a_leased_stream_is_exclusive_until_the_block_ends(sim_rt: srt.Runtime) -> None:
    sc = Scheduler(sim_rt, streams=1, max_in_flight=4)
    async with sc.stream() as s:
        assert isinstance(s, srt.Stream)
        other = asyncio.ensure_future(sc.submit(lambda st: st))
        await asyncio.sleep(0.02)
        assert not other.done()  # the only stream is leased
        assert sc.statistics().leased == 1
        s.launch_host_func(lambda: None)
    got = await asyncio.wait_for(other, 5)
    assert await got is s  # the same stream once free
    await asyncio.sleep(0.01)
    sc.close()


@pytest.mark.asyncio
async def test_cancelling_a_waiting_caller_withdraws_its_request(sim_rt: srt.Runtime) -> None:
    sc = Scheduler(sim_rt, streams=1, max_in_flight=1)
    held: list[threading.Event] = []
    blocker = await sc.submit(_hold(held))
    cancelled = asyncio.ensure_future(sc.submit(lambda s: pytest.fail("a cancelled request ran")))
    later = asyncio.ensure_future(sc.submit(lambda s: "later"))
    await asyncio.sleep(0.01)
    cancelled.cancel()
    await asyncio.sleep(0.01)
    assert sc.statistics().waiting == 1
    held[0].set()
    await blocker
    assert await (await asyncio.wait_for(later, 5)) == "later"
    sc.close()


@pytest.mark.asyncio
async def test_close_fails_waiting_callers_and_refuses_new_work(sim_rt: srt.Runtime) -> None:
    sc = Scheduler(sim_rt, streams=1, max_in_flight=1)
    held: list[threading.Event] = []
    blocker = await sc.submit(_hold(held))
    waiting = asyncio.ensure_future(sc.submit(lambda s: None))
    await asyncio.sleep(0.01)
    sc.close()
    with pytest.raises(ClosedError):
        await waiting
    with pytest.raises(ClosedError):
        await sc.submit(lambda s: None)
    held[0].set()
    await blocker  # work already enqueued still completes
    st = sc.statistics()
    assert isinstance(st, SchedulerStatistics) and st.closed
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.in_flight = 3  # type: ignore[misc]


def test_bad_arguments(sim_rt: srt.Runtime) -> None:
    with pytest.raises(ValueError):
        Scheduler(sim_rt, streams=0)
    with pytest.raises(ValueError):
        Scheduler(sim_rt, max_in_flight=0)
    with pytest.raises(ValueError):
        Scheduler(sim_rt, max_pinned_bytes=-1)
    sc = Scheduler(sim_rt)
    with pytest.raises(TypeError):
        sc.stream(priority="high")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sc.stream(pinned_bytes=-5)
    sc.close()
