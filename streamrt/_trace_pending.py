"""What the tracer keeps of each traced op and blocking call while the trace runs.

:class:`_Pending` (an op) and :class:`_PendingBlock` (a blocking call) are
mutable and frozen into records when the trace finishes; :class:`_HostTiming`
is what a traced Python host call's worker runs instead of ``fn(*args)``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

from ._ranges import Ranges
from ._trace_labels import range_name

__all__: list[str] = []


class _Pending:
    """A traced op while the trace runs (mutable; frozen into a TraceRecord at the end)."""

    __slots__ = (
        "seq",
        "kind",
        "stream",
        "handle",
        "nbytes",
        "pipeline",
        "node",
        "thread",
        "ident",
        "v0",
        "v1",
        "w0",
        "w1",
        "ev0",
        "ev1",
        "event",
        "host_thread",
        "wh0",
        "wh1",
        "completion",
        "error",
        "node_names",
        "op_name",
    )

    def __init__(self, seq: int, kind: str, stream: str, handle: int, nbytes: int) -> None:
        self.seq = seq
        self.kind = kind
        self.stream = stream
        self.handle = handle
        self.nbytes = nbytes
        self.pipeline: str | None = None
        self.node: str | None = None
        self.thread = ""
        self.v0 = self.v1 = 0.0
        self.w0 = self.w1 = 0
        self.ev0: int | None = None
        self.ev1: int | None = None
        self.event: int | None = None
        self.host_thread: str | None = None
        self.wh0: int | None = None
        self.wh1: int | None = None
        self.completion: Any = None  # a Python host call's request; its resolution time is read at finish
        self.error: str | None = None
        self.node_names: Sequence[str] | None = None
        self.op_name: str | None = None


class _HostTiming:
    """A traced Python host call's run: the worker calls it instead of ``fn(*args)``."""

    __slots__ = ("_p", "_ranges")

    def __init__(self, p: _Pending, ranges: Ranges | None) -> None:
        self._p = p
        self._ranges = ranges

    def __call__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, BaseException | None]:
        p = self._p
        p.host_thread = threading.current_thread().name
        if self._ranges is not None:
            self._ranges.push(range_name(p.pipeline, f"host {p.node}", "host function"))
        p.wh0 = time.perf_counter_ns()
        try:
            return fn(*args), None
        except BaseException as exc:  # noqa: BLE001 - delivered to the awaiter by the worker
            p.error = f"{type(exc).__name__}: {exc}"[:300]
            return None, exc
        finally:
            p.wh1 = time.perf_counter_ns()
            if self._ranges is not None:
                self._ranges.pop()


class _PendingBlock:
    __slots__ = ("seq", "what", "stream", "handle", "thread", "v0", "v1", "w0", "w1", "last_seq")

    def __init__(self, seq: int, what: str, stream: str | None, handle: int | None, thread: str) -> None:
        self.seq = seq
        self.what = what
        self.stream = stream
        self.handle = handle
        self.thread = thread
        self.v0 = self.v1 = 0.0
        self.w0 = self.w1 = 0
        self.last_seq: int | None = None
