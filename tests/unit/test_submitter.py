"""The submission thread's contract, on both implementations: the C one over fake entry points, the Python twin.

Programs run in submission order on the submitter's thread; a failed call skips the rest
of its program but its ``always`` suffix; ``failure`` reports it once; ``close`` makes
the calls submitted so far first. Nothing here needs a GPU (the C entry points are
ctypes callbacks, see test_native_ops.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_native_ops import FakeDriver, ops_over

from streamrt._backends import _native_ops
from streamrt._backends._native_ops import Program
from streamrt._errors import BackendError
from streamrt._submitter import NativeSubmitter, PySubmitter


class Harness:
    """A submitter, a way to build a program of memsets (``value`` per call) and the log of calls made."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.fail: dict[int, Exception] = {}  # Python twin: value -> what its call raises
        if kind == "native":
            self.driver = FakeDriver(hip=False)
            self.submitter: Any = NativeSubmitter(ops_over(self.driver), "test-submit")
        else:
            self.calls: list[int] = []
            self.submitter = PySubmitter("test-submit")

    def program(self, values: list[int], capture_check: bool = False) -> Any:
        if self.kind == "native":
            program = Program()
            if capture_check:
                program.check_not_capturing(99)
            for v in values:
                program.memset(0x1000, v, 8, 5)
            return program

        def memset(v: int) -> None:
            if v in self.fail:
                raise self.fail[v]
            self.calls.append(v)

        return [(memset, (v,)) for v in values]

    def made(self) -> list[int]:
        if self.kind == "native":
            return [entry[2] for entry in self.driver.log if entry[0] == "memset"]
        return list(self.calls)

    def fail_call(self, position: int, value: int) -> None:
        """The memset at ``position`` of the next program (writing ``value``) fails."""
        if self.kind == "native":
            self.driver.codes["memset"] = [0] * position + [700]
        else:
            self.fail[value] = BackendError("sim", 700, "E700", "injected", "memset_async")


@pytest.fixture(params=["native", "python"])
def h(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "native" and not _native_ops.available():
        pytest.skip("streamrt._backends._launch_c is not built")
    harness = Harness(request.param)
    yield harness
    harness.submitter.close()


def test_programs_run_in_submission_order_and_tickets_count_up(h: Harness) -> None:
    tickets = [h.submitter.submit(h.program([i, i + 100]), 2) for i in range(5)]
    assert tickets == [1, 2, 3, 4, 5]
    h.submitter.wait(5)
    assert h.submitter.done() == 5
    assert h.made() == [v for i in range(5) for v in (i, i + 100)]
    assert all(h.submitter.failure(t, None) is None for t in tickets)


def test_a_failed_call_skips_the_rest_but_the_always_suffix_and_is_reported_once(h: Harness) -> None:
    h.fail_call(1, 2)
    work = h.program([1, 2, 3, 4, 5])
    ticket = h.submitter.submit(work, 3)  # calls 3 and 4 (values 4, 5) are the suffix
    later = h.submitter.submit(h.program([6]), 1)
    h.submitter.wait(later)
    assert h.made()[-3:] == [4, 5, 6] and 3 not in h.made()  # 2 failed, 3 skipped; the next program ran
    index, error = h.submitter.failure(ticket, work)
    assert index == 1 and isinstance(error, BackendError) and error.code == 700
    assert h.submitter.failure(ticket, work) is None  # once


def test_a_capture_check_that_finds_its_stream_capturing_is_a_failure_without_an_error() -> None:
    if not _native_ops.available():
        pytest.skip("streamrt._backends._launch_c is not built")
    h = Harness("native")
    try:
        h.driver.capturing = 1
        work = h.program([1, 2], capture_check=True)
        ticket = h.submitter.submit(work, 3)  # no suffix
        h.submitter.wait(ticket)
        assert h.submitter.failure(ticket, work) == (0, None) and h.made() == []
    finally:
        h.submitter.close()


def test_close_makes_the_calls_submitted_first_then_refuses_more(h: Harness) -> None:
    gate = threading.Event()
    if h.kind == "python":
        h.submitter.submit([(gate.wait, (10,))], 1)
    for i in range(3):
        h.submitter.submit(h.program([i]), 1)
    threading.Timer(0.02, gate.set).start()
    h.submitter.close()
    assert h.made() == [0, 1, 2]
    with pytest.raises(RuntimeError, match="stopped"):
        h.submitter.submit(h.program([9]), 1)
    with pytest.raises(RuntimeError, match="stopped before that program ran"):
        h.submitter.wait(99)


def test_waiting_blocks_until_the_ticket_ran(h: Harness) -> None:
    if h.kind == "native":
        pytest.skip("the native submitter's calls cannot be held from here")
    gate = threading.Event()
    first = h.submitter.submit([(gate.wait, (10,))], 1)
    waited: list[int] = []
    waiter = threading.Thread(target=lambda: (h.submitter.wait(first), waited.append(h.submitter.done())))
    waiter.start()
    waiter.join(0.05)
    assert waiter.is_alive() and h.submitter.done() == 0
    gate.set()
    waiter.join(10)
    assert waited == [1]


def test_bad_programs_are_refused_before_anything_is_queued() -> None:
    if not _native_ops.available():
        pytest.skip("streamrt._backends._launch_c is not built")
    h = Harness("native")
    try:
        c: Callable[..., Any] = h.submitter._c.submit
        with pytest.raises(ValueError, match="whole number"):
            c(b"\0" * 7, 0)
        with pytest.raises(ValueError, match="unknown op"):
            c(bytes([99]) + bytes(47), 1)
        with pytest.raises(ValueError, match="always"):
            c(h.program([1]).words, 2)
        assert h.submitter.submit(h.program([1]), 1) == 1  # nothing was queued before
        with pytest.raises(RuntimeError, match="served by one thread"):
            h.submitter._c.serve()  # its thread serves it already
    finally:
        h.submitter.close()
