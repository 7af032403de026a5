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

How it watches the copies: each is a D2H into pinned staging followed by an
event (see :func:`~streamrt.torch.fetch`), and ``log`` itself asks whether the
oldest due step's event has completed (one event query) and copies its bytes
out. No runtime thread is woken for a logged value, so none takes the GIL
from the training loop; ``flush`` blocks on the events (GIL released) and
``aflush`` awaits them. Call ``log`` and ``poll`` outside a graph capture:
their event queries are not allowed during a global-mode capture.

With ``group=k``, the tensors of ``k`` log calls travel in one copy: ``log``
keeps a (detached) reference to each value, and every ``k``-th call joins
them on the device (one ``torch.stack`` or ``torch.cat`` per dtype) and
copies that out. The other calls enqueue nothing. A step is then due ``lag``
log calls after its group was sent; ``flush`` sends a partial group, ``poll``
does not. The values are read when the group is sent: log a tensor that is
not modified in place afterwards (a step's loss is a new tensor each step).

The sink is called on the thread that calls ``log``/``flush`` (never on a
runtime thread) with ``(step, value)``: a Python scalar for one-element
tensors, a numpy array otherwise, a dict of those for a dict of tensors.
``sink=print`` (the default) prints ``step 12: loss 2.4512``.

Thread rules: use a logger from one thread (the training loop's).
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._completion import Completion
from ._context import context
from ._fetch import HostCopy, copy_source, enqueue_copy
from ._lazy import host_dtype, is_tensor, torch_module
from ._metric_entries import GroupCopy, Grouped, Landing, Pending, Sent, drop_all

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
        group: copy the tensors of this many ``log`` calls out together, in one copy
            (1: each call copies its own; see the module docstring).
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
        group: int = 1,
    ) -> None:
        if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0:
            raise ValueError(f"lag must be a non-negative int, got {lag!r}")
        if isinstance(group, bool) or not isinstance(group, int) or group < 1:
            raise ValueError(f"group must be a positive int, got {group!r}")
        if sink is not None and not callable(sink):
            raise TypeError(f"sink must be callable (or None), got {type(sink).__name__}")
        self._rt = rt
        self._ctx = context(rt)
        self._lag = lag
        self._sink = sink
        self._name = name
        self._stream = stream
        self._keep = keep
        self._group = group
        # With group=: the steps not sent yet, in log order. Lone tensors of one kind (log's fast path) are
        # ``_loose`` steps and tensors, sent as one Sent; any other value first turns them into Pending
        # steps of ``_held`` Grouped values (as every value was before).
        self._loose: list[int] = []
        self._loose_tensors: list[Any] = []
        self._loose_kind: Any = None  # (dtype, device) of the last tensor logged alone, checked
        self._held: list[Grouped] = []
        self._held_steps: list[Pending] = []  # the steps they belong to
        self._checked: set[Any] = set()  # (dtype, device) of tensors known to be fit to copy out
        self._tensor_type: Any = None  # the type of the last tensor logged alone (log's fast path)
        self._since_send = 0  # log calls since the last group was sent
        self._pending: collections.deque[Pending | Sent] = collections.deque()  # sent or not grouped, in step order
        self._steps = 0  # steps logged and not emitted: ``_pending``'s and ``_loose``'s
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
    def group(self) -> int:
        return self._group

    @property
    def records(self) -> list[tuple[int, Any]]:
        """Every emitted ``(step, value)``, in step order (empty with ``keep=False``)."""
        return self._records

    @property
    def pending(self) -> int:
        """Steps logged and not yet emitted."""
        return self._steps

    # -- logging ----------------------------------------------------------------------------
    def log(self, step: int, value: Any) -> None:
        """Start copying ``value`` (a tensor, a dict of tensors, or plain numbers) and emit what is due.

        Never blocks: it enqueues the copies (per tensor a D2H and an event on its
        stream; with ``group=k``, those of the last ``k`` calls on every ``k``-th call)
        and checks whether the oldest due steps have landed (an event query each).
        Raises ``TypeError``/``ValueError`` for a value it cannot copy out, with nothing
        logged. Exceptions of the sink propagate to the caller.
        """
        if self._closed:
            raise ValueError("this MetricsLogger is closed")
        if self._group > 1:
            # a loss again (a lone tensor of the kind checked last): held as a pair until its group is sent
            if type(value) is self._tensor_type and (value.dtype, value.device) == self._loose_kind and not self._rt._closed:
                self._loose.append(int(step))
                self._loose_tensors.append(value.detach())
                self._seq += 1
                self._steps += 1
                if self._steps > self._max_pending:
                    self._max_pending = self._steps
                pending = self._pending
                if pending and not pending[0].held and self._seq - pending[0].seq >= self._lag:
                    self._emit()
                self._since_send += 1
                if self._since_send >= self._group:
                    self._send()
                return
            self._log_held(step, value)
            return
        if isinstance(value, Mapping):
            keys: tuple[str, ...] | None = tuple(map(str, value))
            parts = self._start_all(list(value.values()))
        else:
            keys, parts = None, [self._start(value)]
        self._append(Pending(int(step), keys, parts))

    def poll(self) -> int:
        """Emit what is due and has landed, without logging; returns the number of steps emitted."""
        return self._emit()

    def flush(self, timeout: float | None = None) -> None:
        """Send a partial group, wait for every pending copy and emit everything, in step order
        (blocks; the GIL is released).

        Raises ``TimeoutError`` if a copy has not landed after ``timeout`` seconds
        (what landed before it is emitted; the rest stays pending). Flush before the
        runtime closes: values not yet copied out then raise ``ClosedError``.
        """
        if self._held or self._loose:
            self._send()
        while self._pending:
            for part in self._pending[0].in_flight():
                self._blocking_waits += 1
                if timeout is None:
                    part.event.synchronize()
                else:
                    part.event.completion().wait(timeout)
                part.done = True
            self._emit_head(delay=None)

    async def aflush(self) -> None:
        """:meth:`flush` for asyncio: awaits the copies without blocking the event loop."""
        if self._held or self._loose:
            self._send()
        while self._pending:
            for part in self._pending[0].in_flight():
                await part.event
                part.done = True
            self._emit_head(delay=None)

    def close(self) -> None:
        """Stop logging. Steps still pending are dropped (call :meth:`flush` first to keep them). Idempotent."""
        self._closed = True
        self._drop_pending()

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        """Flush on a normal exit; on an exception, close without waiting."""
        try:
            if exc_type is None:
                self.flush()
        finally:
            self.close()

    def __del__(self) -> None:
        pending = getattr(self, "_pending", None)
        if pending and not self._rt._closed:  # dropped unclosed with copies in flight: their staging goes back
            self._rt.releaser.submit(drop_all, self._ctx, list(pending))
            pending.clear()

    def statistics(self) -> MetricsStatistics:
        return MetricsStatistics(
            logged=self._seq,
            emitted=self._emitted,
            pending=self._steps,
            max_pending=self._max_pending,
            late=self._late,
            max_delay=self._max_delay,
            blocking_waits=self._blocking_waits,
        )

    # -- internals ---------------------------------------------------------------------------------
    def _append(self, entry: Pending) -> None:
        """Queue a step and emit what is due; with ``group=``, send the held values every ``group``-th call."""
        self._seq += 1
        entry.seq = self._seq
        pending = self._pending
        pending.append(entry)
        self._steps += 1
        if self._steps > self._max_pending:
            self._max_pending = self._steps
        head = pending[0]
        if not head.held and self._seq - head.seq >= self._lag:  # (else nothing is due: no _emit call)
            self._emit()
        if self._group > 1:
            self._since_send += 1
            if self._since_send >= self._group:
                self._send()

    def _log_held(self, step: int, value: Any) -> None:
        """``log`` with ``group=``: hold the tensors; every ``group``-th call sends the held ones."""
        ctx = self._ctx
        if self._rt._closed:
            self._rt._check_open()
        if self._loose:
            self._unloose()
        keys: tuple[str, ...] | None = None
        values = [value]
        if isinstance(value, Mapping):
            keys, values = tuple(map(str, value)), list(value.values())
        parts: list[Any] = []
        held: list[Grouped] = []
        for v in values:  # checked first: a value that cannot be copied out logs nothing
            if is_tensor(v):
                kind = (v.dtype, v.device)
                if kind not in self._checked:
                    host_dtype(v.dtype)
                    ctx.check_tensor(v)
                    self._checked.add(kind)
                part = Grouped(v.detach())
                held.append(part)
                parts.append(part)
            elif isinstance(v, Completion):
                raise TypeError("log a tensor (or a number), not a future")
            else:
                parts.append(np.asarray(v))
        entry = Pending(int(step), keys, parts, held=bool(held))
        if held:
            self._held += held
            self._held_steps.append(entry)
        if keys is None and held:
            self._tensor_type = type(value)
            self._loose_kind = (value.dtype, value.device)
        self._append(entry)

    def _unloose(self) -> None:
        """The loose pairs as held steps, before a value that is not one of them (step order kept)."""
        for step, tensor in zip(self._loose, self._loose_tensors):
            part = Grouped(tensor)
            self._held.append(part)
            entry = Pending(step, None, [part], held=True)
            self._held_steps.append(entry)
            self._pending.append(entry)
        self._loose, self._loose_tensors = [], []

    def _send(self) -> None:
        """Copy the held values out: per (dtype, device), one tensor joined on the device and one copy."""
        self._since_send = 0
        if self._loose:
            tensors = self._loose_tensors
            try:
                joined = None if self._held else torch_module().stack(tensors)
            except RuntimeError:  # shapes that differ: sent as held values
                joined = None
            if joined is not None:  # one Sent: one copy
                copy = self._start(joined)  # (raised: they stay loose)
                self._pending.append(Sent(self._loose, tuple(tensors[0].shape), copy, self._seq))
                self._loose, self._loose_tensors = [], []
                return
            self._unloose()
        held = self._held
        by_kind: dict[Any, list[Grouped]] = {}
        for part in held:
            t = part.tensor
            by_kind.setdefault((t.dtype, t.device), []).append(part)
        torch = torch_module()
        try:
            for parts in by_kind.values():
                tensors = [p.tensor for p in parts]
                shape = parts[0].shape
                if all([p.shape == shape for p in parts]):
                    joined = torch.stack(tensors)
                else:
                    joined = torch.cat([t.reshape(-1) for t in tensors])
                copy = GroupCopy(self._start(joined), len(parts))
                offset = 0
                for p in parts:
                    p.copy, p.offset, p.tensor = copy, offset, None
                    offset += math.prod(p.shape)
        finally:  # what was not sent stays held (raised: the runtime closed, a capture in progress)
            self._held = [p for p in held if p.copy is None]
        for entry in self._held_steps:  # due `lag` log calls from now
            entry.held, entry.seq = False, self._seq
        self._held_steps = []

    def _start_all(self, values: list[Any]) -> list[Any]:
        parts: list[Any] = []
        try:
            for v in values:
                parts.append(self._start(v))
        except BaseException:
            drop_all(self._ctx, [Pending(0, None, parts)])
            raise
        return parts

    def _start(self, value: Any) -> Any:
        if is_tensor(value):
            ctx = self._ctx
            source = copy_source(self._rt, ctx, value, self._stream, None)
            if isinstance(source, np.ndarray):
                return source  # already on the host
            got = HostCopy(self._rt, source)
            event = ctx.take_event()
            try:
                enqueue_copy(self._rt, got, source, event)  # the copy, then the event
            except BaseException:
                got.release(False)
                ctx.give_event(event)
                raise
            finally:
                if source[7] is not None:
                    ctx.release_source(source[7], source[6])
            return Landing(got, event)
        if isinstance(value, Completion):
            raise TypeError("log a tensor (or a number), not a future")
        return np.asarray(value)

    def _emit(self) -> int:
        emitted = 0
        pending = self._pending
        while pending:
            head = pending[0]
            if head.held:
                break
            age = self._seq - head.seq
            if age < self._lag:
                break
            if not head.landed():
                if not head.late:
                    head.late = True
                    self._late += head.count
                break
            emitted += self._emit_head(delay=age)
        return emitted

    def _emit_head(self, *, delay: int | None) -> int:
        """Emit the oldest entry (landed) to the sink, step by step; the steps emitted. A sink that raises
        has its step emitted; the entry's later steps stay pending."""
        pending = self._pending
        head = pending[0]
        pairs = head.take(self._ctx)
        if delay is not None and delay > self._max_delay:
            self._max_delay = delay
        sink: Any = self._sink
        n = 0
        try:
            for step, value in pairs:
                n += 1
                self._steps -= 1
                self._emitted += 1
                if self._keep:
                    self._records.append((step, value))
                if sink is print:
                    print(f"step {step}: {_format(self._name, value)}")
                elif sink is not None:
                    sink(step, value)
        finally:
            if n == len(pairs):
                pending.popleft()
            else:
                del pairs[:n]  # (a Sent's own list)
        return n

    def _drop_pending(self) -> None:
        self._held, self._held_steps, self._loose, self._loose_tensors, self._steps = [], [], [], [], 0
        pending, self._pending = list(self._pending), collections.deque()
        if pending and not self._rt._closed:
            drop_all(self._ctx, pending)


def _format(name: str, value: Any) -> str:
    if isinstance(value, dict):
        return "  ".join(_format(k, v) for k, v in value.items())
    if isinstance(value, float):
        return f"{name} {value:.6g}"
    return f"{name} {value}"
