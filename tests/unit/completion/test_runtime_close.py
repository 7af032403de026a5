"""``Runtime.close()`` from one of the runtime's own threads raises at once instead of deadlocking.

``close()`` drains: called from a Python host function (its stream waits for
that very function) or from a done callback on a completion lane (the lane
waits for the callback), it would wait for itself forever. It must raise
``RuntimeError`` before doing anything, leaving the runtime usable.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import streamrt as srt
from streamrt._native import SEM_WAIT_ADDRESS, Semaphore

MESSAGE = "cannot close the runtime from its own thread"


def _close_within(rt: srt.Runtime, seconds: float) -> None:
    t = threading.Thread(target=rt.close, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"rt.close() still blocked after {seconds} s"


@pytest.fixture
def rt() -> Iterator[srt.Runtime]:
    runtime = srt.open_runtime("sim")
    try:
        yield runtime
    finally:
        _close_within(runtime, 30)


def _still_usable(rt: srt.Runtime, s: srt.Stream) -> None:
    d = rt.device_allocator.allocate(64, stream=s)
    h = rt.host_allocator.allocate(64)
    s.memset(d, 9)
    s.copy(h, d)
    s.wait_idle().result(10)
    assert (h.numpy() == 9).all()
    c = s.launch_host_func(lambda: 5)
    assert c is not None and c.result(10) == 5


def test_close_from_a_host_function_raises_through_its_completion(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    sched = rt.scheduler(streams=1)
    c = s.launch_host_func(rt.close)
    assert c is not None
    with pytest.raises(RuntimeError, match=MESSAGE):
        c.result(timeout=10)
    assert not rt.is_closed
    assert not sched.statistics().closed  # refused before anything was touched
    _still_usable(rt, s)
    _close_within(rt, 30)
    assert rt.is_closed


def test_close_from_a_done_callback_raises(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    gate = Semaphore(0)
    rt.backend.launch_host_func(s.handle, SEM_WAIT_ADDRESS, gate.address)  # resolve on the lane, not here
    outcome: list[tuple[bool, BaseException | None]] = []

    def cb(_c: srt.Completion) -> None:
        try:
            rt.close()
        except RuntimeError as exc:
            outcome.append((rt._engine.owns_thread(), exc))
        else:
            outcome.append((rt._engine.owns_thread(), None))

    c = s.wait_idle()
    c.add_done_callback(cb)
    gate.post()
    c.wait(10)
    rt._engine.drain(timeout=10)
    assert len(outcome) == 1
    on_runtime_thread, exc = outcome[0]
    assert on_runtime_thread and isinstance(exc, RuntimeError) and MESSAGE in str(exc)
    assert not rt.is_closed
    _still_usable(rt, s)
    rt.synchronize()
    gate.destroy()


def test_a_closed_runtime_forgets_its_releaser_thread() -> None:
    # A later thread may get the exited releaser's ident; close() must not mistake it for its own.
    runtime = srt.open_runtime("sim")
    assert runtime.releaser.thread_ident is not None
    runtime.close()
    assert runtime.releaser.thread_ident is None
    errors: list[BaseException] = []

    def close_again() -> None:
        try:
            runtime.close()
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            errors.append(exc)

    t = threading.Thread(target=close_again)
    t.start()
    t.join(10)
    assert not errors
