"""Awaiting engine completions on the sim backend: correctness at scale, uvloop, cancellation, closed loops."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import random
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
