"""A lane retires an entry only once its own event completed, whatever order threads pushed in.

Two threads enqueueing on one stream can record their events in one order and
reach the lane in the other. The lane must not take "the newest entry is done"
to mean "every entry is done" for such a queue: that resolved a Python host
call that had not run yet ("never ran") and dropped keepalives early.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from _completion_helpers import USLEEP_ADDRESS, Harness

from streamrt._completion import CompletionEngine


class PausedRecord:
    """The backend, except that the next ``event_record`` made by ``thread`` pauses after recording."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.thread: threading.Thread | None = None
        self.recorded = threading.Event()
        self.resume = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def event_record(self, event: int, stream: int) -> None:
        self._inner.event_record(event, stream)
        if threading.current_thread() is self.thread:
            self.thread = None
            self.recorded.set()
            assert self.resume.wait(10)


def _interleave(harness: Harness, second: Any) -> tuple[CompletionEngine, Any, Any]:
    """Thread A records an event and pauses before pushing it; ``second(engine, stream)`` runs meanwhile.

    The stream is gated until both are pushed, with the lane waiting on an
    earlier entry, so the lane retires both in one batch after that wait.
    """
    paused = PausedRecord(harness.backend)
    engine = harness.engine(paused, await_poll_us=0)
    s = harness.stream()
    gate = harness.gate(s)
    engine.completion_for_stream(s)  # the lane's thread blocks on this one
    first: dict[str, Any] = {}

    def record_first() -> None:
        paused.thread = threading.current_thread()
        first["completion"] = engine.completion_for_stream(s)

    t = threading.Thread(target=record_first)
    t.start()
    assert paused.recorded.wait(10)
    later: dict[str, Any] = {}
    t2 = threading.Thread(target=lambda: later.setdefault("completion", second(engine, s)))
    t2.start()  # it waits for the first thread's push, or (before the fix) slips in between
    time.sleep(0.1)
    paused.resume.set()
    t.join(10)
    t2.join(10)
    gate.open()
    return engine, first["completion"], later["completion"]


def test_host_call_pushed_before_an_earlier_record_still_runs(harness: Harness) -> None:
    ran = threading.Event()

    def slow() -> str:
        time.sleep(0.3)
        ran.set()
        return "ran"

    _engine, first, call = _interleave(harness, lambda engine, s: engine.host_call(s, slow))
    assert call.result(10) == "ran"
    assert ran.is_set()
    first.result(10)


def test_keepalive_pushed_before_an_earlier_record_is_held_until_its_work_completed(harness: Harness) -> None:
    def later_work(engine: CompletionEngine, s: int) -> Any:
        harness.backend.launch_host_func(s, USLEEP_ADDRESS, 300_000)  # 0.3 s of work before the tail
        return engine.completion_for_stream(s, keepalive=object())

    t0 = time.monotonic()
    _engine, first, tail = _interleave(harness, later_work)
    tail.result(10)
    assert time.monotonic() - t0 >= 0.29, "the tail resolved before the work in front of it completed"
    first.result(10)
