"""MetricsLogger: each step's loss logged a few steps late, without ever blocking the loop.

::

    logger = MetricsLogger(rt, lag=2)            # sink=print by default
    for step, batch in enumerate(prefetcher):
        loss = train_step(batch)
        logger.log(step, loss)                   # enqueues a fetch; emits older steps that landed
    logger.flush()                               # the end of the loop: waits for the rest

``log`` starts a :func:`~streamrt.torch.fetch` of the value (a tensor, or a
dict of tensors) and then emits, oldest first, every logged step that is at
least ``lag`` log calls old and whose copy has landed. A step whose copy has
not landed when it is due is *late*: it stays queued (``log`` never waits)
and is emitted, still in step order, by a later ``log`` or by ``flush``. So
with a GPU that keeps up, step ``n`` is emitted during ``log(n + lag)``.

The sink is called on the thread that calls ``log``/``flush`` (never on a
runtime thread) with ``(step, value)``: a Python scalar for one-element
tensors, a numpy array otherwise, a dict of those for a dict of tensors.
``sink=print`` (the default) prints ``step 12: loss 2.4512``.

Thread rules: use a logger from one thread (the training loop's).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._completion import Completion
from ._fetch import FetchFuture, _resolved, fetch
from ._lazy import is_tensor

if TYPE_CHECKING:
    from .._runtime import Runtime
    from .._stream import Stream

__all__ = ["MetricsLogger", "MetricsStatistics"]

Sink = Callable[[int, Any], Any]


@dataclass(frozen=True)
class MetricsStatistics:
    """A snapshot of a :class:`MetricsLogger`.

    Attributes:
        logged: ``log`` calls so far.
        emitted: steps handed to the sink.
        pending: steps logged and not yet emitted.
        max_pending: the most steps pending at once.
        late: steps whose copy had not landed when they were due (``lag`` logs old);
            they were emitted later, never waited for.
        max_delay: the most ``log`` calls between a step's ``log`` and its emission
            (``lag`` when the GPU keeps up; steps emitted by ``flush`` not counted).
        blocking_waits: waits ``flush`` made for copies still in flight (``log`` never waits).
    """

    logged: int
    emitted: int
    pending: int
    max_pending: int
    late: int
    max_delay: int
    blocking_waits: int


class _Pending:
    __slots__ = ("futures", "late", "seq", "step")

    def __init__(self, step: int, futures: FetchFuture | dict[str, FetchFuture], seq: int) -> None:
        self.step = step
        self.futures = futures
        self.seq = seq
        self.late = False

    def each(self) -> list[FetchFuture]:
        return list(self.futures.values()) if isinstance(self.futures, dict) else [self.futures]

    def is_done(self) -> bool:
        return all(f.is_done for f in self.each())


class MetricsLogger:
    """Logs values (usually the loss) a few steps late, never blocking; see the module docstring.

    Args:
        rt: the runtime.
        lag: how many ``log`` calls a step waits before it is looked at (0: as soon
            as its copy has landed). Not a bound: a step not landed when due waits longer.
        sink: ``sink(step, value)``, called on the logging thread; ``print`` (default)
            prints a formatted line.
        name: the metric's name in printed lines.
        stream: the stream the copies are made on (default: torch's current stream,
            the one that computed the values; see :func:`~streamrt.torch.fetch`).
        keep: keep every emitted ``(step, value)`` in :attr:`records`.
    """

    def __init__(
        self,
        rt: Runtime,
        lag: int = 2,
        sink: Sink | None = print,
        *,
        name: str = "loss",
        stream: Stream | None = None,
        keep: bool = True,
    ) -> None:
        if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0:
            raise ValueError(f"lag must be a non-negative int, got {lag!r}")
        if sink is not None and not callable(sink):
            raise TypeError(f"sink must be callable (or None), got {type(sink).__name__}")
        self._rt = rt
        self._lag = lag
        self._sink = sink
        self._name = name
        self._stream = stream
        self._keep = keep
        self._pending: collections.deque[_Pending] = collections.deque()
        self._records: list[tuple[int, Any]] = []
        self._seq = 0
        self._emitted = 0
        self._max_pending = 0
        self._late = 0
        self._max_delay = 0
        self._blocking_waits = 0
        self._closed = False

    @property
    def lag(self) -> int:
        return self._lag

    @property
    def records(self) -> list[tuple[int, Any]]:
        """Every emitted ``(step, value)``, in step order (empty with ``keep=False``)."""
        return self._records

    @property
    def pending(self) -> int:
        """Steps logged and not yet emitted."""
        return len(self._pending)

    # -- logging ----------------------------------------------------------------------------
    def log(self, step: int, value: Any) -> None:
        """Start copying ``value`` (a tensor, a dict of tensors, or plain numbers) and emit what is due.

        Never blocks: it enqueues the copies (a D2H and an event on the value's
        stream, a host function on the fetch stream) and checks which earlier
        steps have landed. Exceptions of the sink propagate to the caller.
        """
        if self._closed:
            raise ValueError("this MetricsLogger is closed")
        if isinstance(value, Mapping):
            futures: FetchFuture | dict[str, FetchFuture] = {str(k): self._start(v) for k, v in value.items()}
        else:
            futures = self._start(value)
        self._seq += 1
        self._pending.append(_Pending(int(step), futures, self._seq))
        self._max_pending = max(self._max_pending, len(self._pending))
        self._emit()

    def poll(self) -> int:
        """Emit what is due and has landed, without logging; returns the number of steps emitted."""
        return self._emit()

    def flush(self, timeout: float | None = None) -> None:
        """Wait for every pending copy and emit everything, in step order (blocks; the GIL is released).

        Raises ``TimeoutError`` if a copy has not landed after ``timeout`` seconds
        (what landed before it is emitted; the rest stays pending).
        """
        while self._pending:
            for fut in self._pending[0].each():
                if not fut.is_done:
                    self._blocking_waits += 1
                    fut.wait(timeout)
            self._emit_head(delay=None)

    async def aflush(self) -> None:
        """:meth:`flush` for asyncio: awaits the copies without blocking the event loop."""
        while self._pending:
            for fut in self._pending[0].each():
                if not fut.is_done:
                    await fut
            self._emit_head(delay=None)

    def close(self) -> None:
        """Stop logging. Steps still pending are dropped (call :meth:`flush` first to keep them). Idempotent."""
        self._closed = True
        self._pending.clear()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        """Flush on a normal exit; on an exception, close without waiting."""
        try:
            if exc_type is None:
                self.flush()
        finally:
            self.close()

    def statistics(self) -> MetricsStatistics:
        return MetricsStatistics(
            logged=self._seq,
            emitted=self._emitted,
            pending=len(self._pending),
            max_pending=self._max_pending,
            late=self._late,
            max_delay=self._max_delay,
            blocking_waits=self._blocking_waits,
        )

    # -- internals ---------------------------------------------------------------------------------
    def _start(self, value: Any) -> FetchFuture:
        if is_tensor(value):
            return fetch(self._rt, value, self._stream)
        if isinstance(value, Completion):
            raise TypeError("log a tensor (or a number), not a future")
        return _resolved(np.asarray(value), self._rt)

    def _emit(self) -> int:
        emitted = 0
        pending = self._pending
        while pending:
            head = pending[0]
            age = self._seq - head.seq
            if age < self._lag:
                break
            if not head.is_done():
                if not head.late:
                    head.late = True
                    self._late += 1
                break
            self._emit_head(delay=age)
            emitted += 1
        return emitted

    def _emit_head(self, *, delay: int | None) -> None:
        head = self._pending.popleft()
        if isinstance(head.futures, dict):
            value: Any = {k: _plain(f.result()) for k, f in head.futures.items()}
        else:
            value = _plain(head.futures.result())
        self._emitted += 1
        if delay is not None and delay > self._max_delay:
            self._max_delay = delay
        if self._keep:
            self._records.append((head.step, value))
        sink: Any = self._sink
        if sink is print:
            print(f"step {head.step}: {_format(self._name, value)}")
        elif sink is not None:
            sink(head.step, value)


def _plain(arr: np.ndarray) -> Any:
    return arr.item() if arr.size == 1 else arr


def _format(name: str, value: Any) -> str:
    if isinstance(value, dict):
        return "  ".join(_format(k, v) for k, v in value.items())
    if isinstance(value, float):
        return f"{name} {value:.6g}"
    return f"{name} {value}"
