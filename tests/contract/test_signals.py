"""Stream signals on every backend: a stream waits, on the device, for a 64-bit word the host stores.

With ``stream_signals=True`` this is what holds a stream while a Python host
function runs on a runtime worker (``streamrt._hostcall``); here the backend
primitive itself is checked, and a host call under either hold.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Iterator

import pytest

import streamrt as srt


@pytest.fixture
def signal(rt: srt.Runtime) -> Iterator[int]:
    if not rt.capabilities.supports_stream_signals:
        pytest.skip(f"{rt.capabilities.backend} on {rt.capabilities.device_name} reports no stream signals")
    sig = rt.backend.signal_alloc()
    word = ctypes.c_uint64.from_address(sig)
    try:
        yield sig
    finally:
        word.value = (1 << 64) - 1  # lets any wait a failed test left behind go
        rt.synchronize()
        rt.backend.signal_free(sig)


def _store(signal: int, value: int) -> None:
    ctypes.c_uint64.from_address(signal).value = value


def _done_within(query: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if query():
            return True
        time.sleep(0.001)
    return False


def test_a_signal_is_eight_aligned_zeroed_bytes(rt: srt.Runtime, signal: int) -> None:
    assert signal % 8 == 0
    assert ctypes.c_uint64.from_address(signal).value == 0


def test_only_a_signal_is_freed_or_waited_on_as_one(rt: srt.Runtime, signal: int) -> None:
    """Other memory (pinned host memory here, or a freed signal) is refused, and nothing is freed."""
    b = rt.backend
    s = rt.create_stream()
    other = b.host_malloc(8)
    try:
        with pytest.raises(srt.BackendError, match="not a signal"):
            b.signal_free(other)
        with pytest.raises(srt.BackendError, match="not a signal"):
            b.stream_wait_signal(s.handle, other, 1)
        _store(other, 7)  # still allocated
        assert ctypes.c_uint64.from_address(other).value == 7
    finally:
        b.host_free(other)
    spare = b.signal_alloc()
    b.signal_free(spare)
    with pytest.raises(srt.BackendError, match="not a signal"):
        b.signal_free(spare)
    s.synchronize()  # the stream was never held


def test_a_stream_waits_until_the_host_stores_a_large_enough_value(rt: srt.Runtime, signal: int) -> None:
    b = rt.backend
    s = rt.create_stream()
    b.stream_wait_signal(s.handle, signal, 2)
    after = rt.create_event()
    s.record(after)
    time.sleep(0.05)
    assert not after.is_done
    _store(signal, 1)
    time.sleep(0.05)
    assert not after.is_done  # 1 < 2
    _store(signal, 2)
    assert _done_within(lambda: after.is_done, 5.0)


def test_a_value_already_reached_lets_every_smaller_wait_pass(rt: srt.Runtime, signal: int) -> None:
    b = rt.backend
    s = rt.create_stream()
    _store(signal, 10)
    for value in (1, 3, 10):
        b.stream_wait_signal(s.handle, signal, value)
    s.synchronize()  # returns: nothing to wait for


def test_a_waiting_stream_holds_back_only_itself(rt: srt.Runtime, signal: int) -> None:
    b = rt.backend
    held, free = rt.create_stream(), rt.create_stream()
    buf = rt.device_allocator.allocate(4096, stream=free)
    b.stream_wait_signal(held.handle, signal, 1)
    held_done = rt.create_event()
    held.record(held_done)
    free.memset(buf, 3)
    free.synchronize()  # the other stream runs while `held` waits
    assert not held_done.is_done
    _store(signal, 1)
    assert _done_within(lambda: held_done.is_done, 5.0)
    buf.release()


@pytest.mark.parametrize("stream_signals", [True, False], ids=["signal-hold", "sem_wait-hold"])
def test_a_python_host_function_holds_its_stream_either_way(backend: str, stream_signals: bool) -> None:
    import threading

    with srt.open_runtime(backend, stream_signals=stream_signals) as rt:
        assert rt._engine.stream_signals == (stream_signals and rt.capabilities.supports_stream_signals)
        s = rt.create_stream()
        release = threading.Event()
        order: list[str] = []
        first = s.launch_host_func(lambda: (release.wait(5), order.append("first")))
        second = s.launch_host_func(order.append, "second")
        after = rt.create_event()
        s.record(after)
        time.sleep(0.05)
        assert not after.is_done and order == []
        release.set()
        second.result(5)
        first.result(5)
        assert _done_within(lambda: after.is_done, 5.0)
        assert order == ["first", "second"]
