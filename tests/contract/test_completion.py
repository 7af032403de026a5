"""Completion, asyncio awaits and Python host functions on every backend (issue 3).

Each test states one behaviour of the public API (``Stream.wait_idle``,
``await event``, ``Stream.launch_host_func``) that must hold on sim, cuda and
hip alike; the engine-level details are covered in tests/unit/completion.
"""

from __future__ import annotations

import asyncio
import ctypes
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterator

import pytest

import streamrt as srt
from streamrt._native import HOLD_ADDRESS, SEM_WAIT_ADDRESS, Semaphore


class _Gate:
    """Holds a stream (libc ``sem_wait`` as a native host function) until opened.

    A watchdog opens it after ``timeout`` seconds and marks it ``forced``: on a GPU
    the queue behind a blocked host function is bounded, so a test that enqueues
    too much behind a gate would otherwise hang instead of failing.
    """

    def __init__(self, rt: srt.Runtime, s: srt.Stream, timeout: float = 30.0) -> None:
        self.sem = Semaphore(0)
        self.forced = False
        self._opened = threading.Event()
        rt.backend.launch_host_func(s.handle, SEM_WAIT_ADDRESS, self.sem.address)
        self._watchdog = threading.Thread(target=self._force_after, args=(timeout,), daemon=True)
        self._watchdog.start()

    def _force_after(self, timeout: float) -> None:
        if not self._opened.wait(timeout):
            self.forced = True
            self.open()

    def open(self) -> None:
        if not self._opened.is_set():
            self._opened.set()
            self.sem.post()


@pytest.fixture
def gates(rt: srt.Runtime) -> object:
    made: list[_Gate] = []

    def make(s: srt.Stream) -> _Gate:
        g = _Gate(rt, s)
        made.append(g)
        return g

    yield make
    for g in made:
        g.open()
    rt.synchronize()
    for g in made:
        g._watchdog.join()
        g.sem.destroy()
    assert not any(g.forced for g in made), "a gate had to be forced open: the test enqueued too much behind it"


@pytest.mark.asyncio
async def test_await_wait_idle_sees_the_copy(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    n = 1 << 16
    d = rt.device_allocator.allocate(n, stream=s)
    h = rt.host_allocator.allocate(n)
    for value in (3, 7, 11):
        s.memset(d, value)
        s.copy(h, d)
        await s.wait_idle()
        assert (h.numpy() == value).all()


@pytest.mark.asyncio
async def test_await_event_resolves_after_recorded_work(rt: srt.Runtime, gates: object) -> None:
    s = rt.create_stream()
    gate = gates(s)  # type: ignore[operator]
    ev = s.record()
    waiter = asyncio.ensure_future(_await(ev))
    await asyncio.sleep(0.02)
    assert not waiter.done()
    gate.open()
    await asyncio.wait_for(waiter, 10)
    assert ev.is_done


async def _await(obj: object) -> object:
    return await obj  # type: ignore[misc]


@pytest.mark.asyncio
async def test_python_host_func_runs_on_a_runtime_worker_in_stream_order(rt: srt.Runtime) -> None:
    """D2H copy -> Python host fn edits the pinned buffer -> H2D copy: the seed workload's shape."""
    s = rt.create_stream()
    n = 4096
    d = rt.device_allocator.allocate(n, stream=s)
    h = rt.host_allocator.allocate(n)
    out = rt.host_allocator.allocate(n)
    s.memset(d, 5)
    s.copy(h, d)
    seen: dict[str, object] = {}

    def pack(buf: srt.Buffer) -> int:
        seen["thread"] = threading.current_thread().name
        arr = buf.numpy()
        seen["before"] = int(arr[0])
        arr[:] = arr + 1
        return int(arr.sum())

    c = s.launch_host_func(pack, h)
    assert isinstance(c, srt.Completion)
    s.copy(d, h)
    s.copy(out, d)
    assert await c == 6 * n
    await s.wait_idle()
    assert seen["before"] == 5
    assert str(seen["thread"]).startswith("streamrt-host-")
    assert (out.numpy() == 6).all()


@pytest.mark.asyncio
async def test_host_func_exception_reaches_the_awaiter_and_the_stream_goes_on(rt: srt.Runtime) -> None:
    s = rt.create_stream()

    def fail() -> None:
        raise ArithmeticError("raised in a host function")

    bad = s.launch_host_func(fail)
    good = s.launch_host_func(lambda: "after")
    with pytest.raises(ArithmeticError, match="raised in a host function"):
        await bad  # type: ignore[misc]
    assert await good == "after"  # type: ignore[misc]
    await s.wait_idle()


@pytest.mark.skipif(HOLD_ADDRESS == SEM_WAIT_ADDRESS, reason="the signal-proof hold is in the C extension streamrt._graph_release_c (not built)")
def test_a_signal_on_the_driver_thread_does_not_end_a_python_host_funcs_hold(rt: srt.Runtime) -> None:
    """libc ``sem_wait`` returns on a signal (EINTR): as the hold it would let the stream go on early."""
    s = rt.create_stream()
    driver_thread: list[tuple[int, int]] = []  # (its pthread id, its blocked-signal mask)

    def where(_data: object) -> None:  # Python on the driver's thread: fine in a test, never in streamrt
        with open("/proc/thread-self/status") as status:
            blocked = next(int(line.split()[1], 16) for line in status if line.startswith("SigBlk:"))
        driver_thread.append((threading.get_ident(), blocked))

    native_where = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(where)
    s.launch_host_func(native_where)
    s.synchronize()
    thread, blocked = driver_thread[0]
    if blocked >> (signal.SIGUSR1 - 1) & 1:
        pytest.skip("the driver's host-function thread blocks SIGUSR1: no signal can interrupt its hold")
    caught: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, _frame: caught.append(signum))
    release = threading.Event()
    try:
        done = s.launch_host_func(release.wait, 30.0)
        after = s.record()
        time.sleep(0.05)  # the driver's thread is in the hold by now
        signal.pthread_kill(thread, signal.SIGUSR1)
        time.sleep(0.05)
        assert caught == [signal.SIGUSR1]  # the handler ran: the signal was delivered
        assert not after.is_done and not done.is_done  # and the stream is still held
    finally:
        release.set()
        s.synchronize()
        signal.signal(signal.SIGUSR1, previous)
    assert done.result() is True and after.is_done


def test_completions_retire_in_stream_order(rt: srt.Runtime, gates: object) -> None:
    s = rt.create_stream()
    gate = gates(s)  # type: ignore[operator]
    order: list[int] = []
    lock = threading.Lock()
    completions = []
    for i in range(100):
        if i == 16:
            gate.open()  # GPUs bound the queue behind a blocked host function: hold only the first few
        c = s.launch_host_func(lambda: None) if i % 7 == 0 else s.wait_idle()
        assert c is not None
        c.add_done_callback(lambda _c, i=i: (lock.acquire(), order.append(i), lock.release()))
        completions.append(c)
    for c in completions:
        c.wait(10)
    assert order == list(range(100))


@pytest.mark.asyncio
async def test_cancelling_an_await_keeps_the_work_and_its_keepalive(rt: srt.Runtime, gates: object) -> None:
    s = rt.create_stream()
    gate = gates(s)  # type: ignore[operator]

    class Token:
        pass

    token = Token()
    ref = weakref.ref(token)
    c = rt._engine.completion_for_stream(s.handle, keepalive=token)
    del token
    t = asyncio.ensure_future(_await(c))
    await asyncio.sleep(0.01)
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert ref() is not None and not c.is_done
    gate.open()
    await c
    await s.wait_idle()
    for _ in range(1000):
        if ref() is None:
            break
        await asyncio.sleep(0.001)
    assert ref() is None


@pytest.mark.asyncio
async def test_10000_awaits_across_8_streams_from_1000_tasks(rt: srt.Runtime) -> None:
    streams = [rt.create_stream() for _ in range(8)]
    d = rt.device_allocator.allocate(1000)
    h = rt.host_allocator.allocate(1000)
    hv = h.numpy()
    checked = 0

    async def task(t: int) -> None:
        nonlocal checked
        for i in range(10):
            s = streams[(t + i) % 8]
            value = (t * 3 + i) % 255 + 1
            s.memset(d.view(t, 1), value)
            s.copy(h.view(t, 1), d.view(t, 1))
            await s.wait_idle()
            assert hv[t] == value
            hv[t] = 0
            checked += 1

    await asyncio.gather(*(task(t) for t in range(1000)))
    assert checked == 10_000
    rt._engine.drain()
    stats = rt._engine.statistics()
    assert stats.pending == 0 and stats.host_calls_pending == 0 and stats.failed == 0


def test_awaits_under_uvloop(rt: srt.Runtime) -> None:
    uvloop = pytest.importorskip("uvloop")
    s = rt.create_stream()
    d = rt.device_allocator.allocate(64, stream=s)
    h = rt.host_allocator.allocate(64)

    async def main() -> int:
        total = 0
        for i in range(50):
            s.memset(d, i)
            s.copy(h, d)
            await s.wait_idle()
            total += int(h.numpy()[0])
            total += await s.launch_host_func(lambda: 1)  # type: ignore[misc]
        return total

    loop = uvloop.new_event_loop()
    try:
        assert loop.run_until_complete(main()) == sum(range(50)) + 50
    finally:
        loop.close()


def test_switch_interval_lowered_only_while_a_python_host_func_is_pending(rt: srt.Runtime, gates: object) -> None:
    before = sys.getswitchinterval()
    s = rt.create_stream()
    gate = gates(s)  # type: ignore[operator]
    c = s.launch_host_func(sys.getswitchinterval)
    assert sys.getswitchinterval() < before
    gate.open()
    assert c is not None and c.result(10) < before
    rt._engine.drain()
    assert sys.getswitchinterval() == before


def test_runtime_close_drains_pending_completions(backend: str) -> None:
    runtime = srt.open_runtime(backend)
    s = runtime.create_stream()
    d = runtime.device_allocator.allocate(1 << 20, stream=s)
    s.memset(d, 1)
    cs = [s.wait_idle(), s.launch_host_func(lambda: "done")]
    runtime.close()
    assert all(c is not None and c.is_done for c in cs)
    assert cs[1].result() == "done"  # type: ignore[union-attr]


# -- awaits polled from the event loop (open_runtime(await_poll_us=...)) ------------------------------------
@pytest.fixture
def polling_rt(backend: str) -> Iterator[srt.Runtime]:
    """A runtime whose awaits poll for up to 1 s: long enough for any backend to finish tiny work."""
    runtime = srt.open_runtime(backend, await_poll_us=1e6)
    try:
        yield runtime
    finally:
        runtime.close()


def _hold_lane_thread(rt: srt.Runtime, s: srt.Stream, seconds: float) -> tuple[object, object]:
    """Register a stand-in polling await on ``s``'s lane: its thread starts no driver wait for ``seconds``."""
    s.wait_idle().wait(10)  # the lane exists and is idle
    rt._engine.drain()
    lane = rt._engine._lane(s.handle)
    holder = object()
    lane.pollers[holder] = time.perf_counter_ns() + int(seconds * 1e9)  # type: ignore[index]
    return lane, holder


def test_an_awaiting_loop_retires_the_work_itself_in_stream_order(polling_rt: srt.Runtime) -> None:
    rt = polling_rt
    s = rt.create_stream()
    d = rt.device_allocator.allocate(1 << 16, stream=s)
    lane, holder = _hold_lane_thread(rt, s, 60.0)  # so only the awaiting loop can retire anything
    try:
        order: list[int] = []
        threads: set[int] = set()
        cs = []
        for i in range(5):
            s.memset(d, i)
            c = s.wait_idle()
            c.add_done_callback(lambda _c, i=i: (order.append(i), threads.add(threading.get_ident())))
            cs.append(c)
        host = s.launch_host_func(lambda: "ran")
        tail = s.wait_idle()

        async def main() -> int:
            assert await host == "ran"  # type: ignore[misc]
            await tail
            return threading.get_ident()

        loop_thread = asyncio.run(asyncio.wait_for(main(), 30))
        assert order == list(range(5))
        assert threads == {loop_thread}  # not a lane thread: the loop polled them
        assert all(c.is_done for c in cs)
    finally:
        lane.end_poll(holder)  # type: ignore[attr-defined]
    assert not lane.pollers  # type: ignore[attr-defined]  # nothing left registered
    rt._engine.drain()
    assert rt._engine.statistics().pending == 0


def test_the_lane_thread_takes_over_when_polling_ends(polling_rt: srt.Runtime) -> None:
    rt = polling_rt
    s = rt.create_stream()
    lane, holder = _hold_lane_thread(rt, s, 60.0)
    c = s.wait_idle()
    thread: list[int] = []
    c.add_done_callback(lambda _c: thread.append(threading.get_ident()))
    lane.end_poll(holder)  # type: ignore[attr-defined]
    c.wait(10)
    assert thread and thread[0] != threading.get_ident()


def test_an_await_left_behind_by_a_stopped_loop_holds_the_lane_no_longer_than_its_deadline(polling_rt: srt.Runtime) -> None:
    rt = polling_rt
    s = rt.create_stream()
    _hold_lane_thread(rt, s, 0.2)  # never ended, as when a loop stops while a task polls
    c = s.wait_idle()
    c.wait(10)  # the lane thread resumed at the deadline
    assert c.is_done


def test_await_poll_us_zero_leaves_awaits_to_the_lane_threads(backend: str) -> None:
    with srt.open_runtime(backend, await_poll_us=0) as rt:
        s = rt.create_stream()
        d = rt.device_allocator.allocate(1 << 16, stream=s)
        lane = rt._engine._lane(s.handle)

        async def main() -> None:
            for i in range(20):
                s.memset(d, i)
                task = asyncio.ensure_future(_await(s.wait_idle()))
                await asyncio.sleep(0)
                assert not lane.pollers  # nothing registered: the lane thread waits
                await task

        asyncio.run(main())


@pytest.mark.parametrize("value", [-1, 1e7, True, "50"])
def test_await_poll_us_is_checked(value: object) -> None:
    before = set(threading.enumerate())
    with pytest.raises(ValueError, match="await_poll_us"):
        srt.open_runtime("sim", await_poll_us=value)  # type: ignore[arg-type]
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert not left, f"a refused runtime left threads running: {left}"


def test_close_from_a_done_callback_run_by_a_polling_await_is_refused(polling_rt: srt.Runtime) -> None:
    rt = polling_rt
    s = rt.create_stream()
    lane, holder = _hold_lane_thread(rt, s, 60.0)  # so the awaiting loop retires the work
    try:
        refused: list[BaseException] = []

        def close_now(_c: object) -> None:
            try:
                rt.close()
            except RuntimeError as exc:
                refused.append(exc)

        c = s.wait_idle()
        c.add_done_callback(close_now)
        asyncio.run(asyncio.wait_for(_await(c), 30))
        assert refused and "wait for itself" in str(refused[0])
        assert not rt.is_closed
    finally:
        lane.end_poll(holder)  # type: ignore[attr-defined]
