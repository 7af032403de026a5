"""Main-thread dispatch of Python host calls (``python_host_dispatch="main"``) on every backend.

The main thread runs a call when it reaches a bytecode boundary before the
call's worker thread takes the GIL; the worker runs it otherwise. Either way
each call runs once, in stream order, and its outcome reaches its Completion.
To make the main thread's win certain, some tests make the worker late
(``late_worker``): it takes its call 0.1 s after waking, as a worker that
wakes slowly or waits for the GIL would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

import streamrt as srt
from streamrt._host_dispatch import MainDispatch, unavailable_reason
from streamrt._native import leaked_semaphores
from support.gate import Gate


@pytest.fixture
def main_rt(backend: str) -> Iterator[srt.Runtime]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    # The runtime leaves the switch interval alone: tests set it themselves.
    runtime = srt.open_runtime(backend, python_host_dispatch="main", python_host_switch_interval=None)
    try:
        yield runtime
    finally:
        runtime.close()


@pytest.fixture
def late_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers take a call 0.1 s after the driver woke them (the GIL released meanwhile)."""
    take = MainDispatch.take

    def late(self: MainDispatch) -> object:
        time.sleep(0.1)
        return take(self)

    monkeypatch.setattr(MainDispatch, "take", late)


def _spin_until(done: Callable[[], bool], seconds: float = 30.0) -> None:
    """Run Python on this thread (never releasing the GIL on purpose) until ``done()``."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")


def _dispatch(rt: srt.Runtime, s: srt.Stream):  # type: ignore[no-untyped-def]
    return rt._engine._channel(s.handle)._main


def test_a_busy_main_thread_runs_the_call_itself(main_rt: srt.Runtime, late_worker: None) -> None:
    s = main_rt.create_stream()
    ran: list[threading.Thread] = []
    c = s.launch_host_func(lambda: ran.append(threading.current_thread()))
    _spin_until(lambda: bool(ran))
    assert ran == [threading.main_thread()]
    c.wait(30)
    assert c.result() is None
    assert _dispatch(main_rt, s).on_main == 1


def test_the_default_runs_calls_on_the_worker(backend: str) -> None:
    with srt.open_runtime(backend, python_host_switch_interval=None) as rt:
        s = rt.create_stream()
        ran: list[threading.Thread] = []
        s.launch_host_func(lambda: ran.append(threading.current_thread()))
        _spin_until(lambda: bool(ran))
        assert ran and ran[0] is not threading.main_thread()


def test_a_blocked_main_thread_leaves_the_call_to_the_worker(main_rt: srt.Runtime) -> None:
    """The main thread sleeps (no bytecode runs) while the stream reaches the call: the worker runs it."""
    s = main_rt.create_stream()
    gate = Gate(main_rt, s)
    ran: list[threading.Thread] = []
    c = s.launch_host_func(lambda: ran.append(threading.current_thread()))
    opener = threading.Timer(0.05, gate.open)
    opener.start()
    time.sleep(0.5)  # the gate opens, and the call runs, meanwhile
    opener.join()
    c.wait(30)
    assert len(ran) == 1 and ran[0] is not threading.main_thread()
    assert _dispatch(main_rt, s).on_main == 0
    assert not gate.forced


def test_an_exception_of_a_call_run_on_the_main_thread_reaches_its_completion(main_rt: srt.Runtime, late_worker: None) -> None:
    s = main_rt.create_stream()
    seen: list[int] = []

    def fail() -> None:
        seen.append(threading.get_ident())
        raise ValueError("from the host function")

    c = s.launch_host_func(fail)
    after = s.launch_host_func(seen.append, 7)
    _spin_until(lambda: len(seen) == 2)
    assert seen[0] == threading.main_thread().ident
    with pytest.raises(ValueError, match="from the host function"):
        c.result(30)
    assert after.result(30) is None and seen[1] == 7  # the stream went on


def test_every_call_runs_once_in_stream_order_whichever_thread_runs_it(main_rt: srt.Runtime) -> None:
    """Calls while the main thread runs Python, sleeps, or waits for them: each runs once, in order."""
    streams = [main_rt.create_stream() for _ in range(2)]
    out: dict[int, list[int]] = {0: [], 1: []}
    completions = []
    for i in range(300):
        k = i % 2
        completions.append(streams[k].launch_host_func(out[k].append, i))
        if i % 3 == 0:
            t = time.perf_counter() + 200e-6
            while time.perf_counter() < t:
                pass
        elif i % 3 == 1:
            time.sleep(0.0002)
        else:
            completions[-1].wait(30)
    for c in completions:
        assert c.result(30) is None
    assert out[0] == list(range(0, 300, 2))
    assert out[1] == list(range(1, 300, 2))
    main_rt.synchronize()
    for s in streams:
        d = _dispatch(main_rt, s)
        assert d.dispatched == 150
        assert d.refused == 0


def test_a_pipeline_launch_runs_its_python_host_node_on_the_busy_main_thread(main_rt: srt.Runtime, late_worker: None) -> None:
    s = main_rt.create_stream()
    host = main_rt.host_allocator.allocate(64)
    host.numpy()[:] = 0
    ran: list[threading.Thread] = []

    def fill(buf: srt.Buffer) -> None:
        ran.append(threading.current_thread())
        buf.numpy()[:] = 5

    p = srt.Pipeline("dispatch")
    p.host(fill, host, writes=[host])
    run = p.launch(s)
    _spin_until(lambda: bool(ran))
    run.result(30)
    assert ran == [threading.main_thread()]
    assert (host.numpy() == 5).all()
    host.release()


def test_the_runtime_closes_with_calls_served_on_the_main_thread(backend: str, late_worker: None) -> None:
    if unavailable_reason() is not None:
        pytest.skip(unavailable_reason())
    leaked = leaked_semaphores()
    rt = srt.open_runtime(backend, python_host_dispatch="main", python_host_switch_interval=None)
    s = rt.create_stream()
    ran: list[int] = []
    for i in range(3):
        s.launch_host_func(ran.append, i)
    _spin_until(lambda: len(ran) == 3)
    rt.close()  # drains: the worker finishes what the main thread ran
    assert ran == [0, 1, 2]
    assert leaked_semaphores() == leaked  # a clean stop frees the semaphores and the dispatch


def test_a_traced_call_is_left_to_the_worker_and_traced(main_rt: srt.Runtime, late_worker: None) -> None:
    s = main_rt.create_stream()
    ran: list[threading.Thread] = []
    with main_rt.trace() as t:
        s.launch_host_func(lambda: ran.append(threading.current_thread()))
        s.synchronize()
    assert len(ran) == 1 and ran[0] is not threading.main_thread()
    (r,) = [r for r in t.records if r.kind == "host_python"]
    assert r.error is None


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"python_host_dispatch": "thread"}, ValueError, "python_host_dispatch must be one of"),
        ({"python_host_dispatch": "main", "stream_signals": True}, ValueError, "cannot be combined with stream_signals"),
    ],
)
def test_bad_dispatch_options_are_refused(options: dict[str, object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        srt.open_runtime("sim", **options)  # type: ignore[arg-type]
