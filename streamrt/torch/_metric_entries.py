"""A MetricsLogger's entries: the logged steps whose values are on their way to the host.

* :class:`Landing`: one value's D2H copy into pinned staging and the event after it,
  polled by the logging thread (one event query, never a wait);
* :class:`GroupCopy`: one copy out of the values of several ``log`` calls (``group=``),
  read by each of them;
* :class:`Grouped`: a value held for its group, then its place in the group's copy;
* :class:`Pending`: one logged step (its parts: arrays, landings, grouped values);
* :class:`Sent`: a group of lone tensors of one kind and shape, one entry for all its steps.

``Pending`` and ``Sent`` are read alike: ``held``, ``seq``, ``late``, ``count``,
``landed()``, ``in_flight()``, ``take(ctx)`` (the ``(step, value)`` pairs) and ``drop(ctx)``.

Thread rules: the logging thread's.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .._errors import ClosedError

if TYPE_CHECKING:
    from .._event import Event
    from ._context import TorchContext
    from ._fetch import HostCopy

__all__ = ["GroupCopy", "Grouped", "Landing", "Pending", "Sent", "drop_all"]


class Landing:
    """One value's copy in flight and the event recorded after it; the logging thread polls it."""

    __slots__ = ("copy", "done", "event")

    def __init__(self, copy: HostCopy, event: Event) -> None:
        self.copy = copy
        self.event = event
        self.done = False

    def landed(self) -> bool:
        """Never blocks: one event query until it reports the copy landed."""
        if not self.done:
            rt = self.event._runtime
            if rt._closed:
                raise ClosedError("the runtime was closed before this value was copied out: it is lost")
            self.done = rt._base_backend.event_query(self.event._handle)
        return self.done

    def take(self, ctx: TorchContext) -> np.ndarray:
        """The landed value; the staging and the event are given back."""
        if ctx.rt._closed:  # its staging went with the runtime's allocator
            raise ClosedError("the runtime was closed before this value was copied out: it is lost")
        try:
            return self.copy.value()
        finally:
            self.copy.release(True)
            ctx.give_event(self.event)

    def drop(self, ctx: TorchContext) -> None:
        """Give up on the value: the staging is reused once the stream has passed the copy."""
        self.copy.release(self.done)
        ctx.give_event(self.event)


class GroupCopy:
    """One copy out of the values of several log calls (``group=``): their :class:`Landing`, then the
    landed array they are read from. The staging goes back with the first read, or once every value
    was dropped."""

    __slots__ = ("array", "landing", "users")

    def __init__(self, copy: Landing | np.ndarray, users: int) -> None:
        self.landing: Landing | None = None
        self.array: np.ndarray | None = None
        if isinstance(copy, np.ndarray):  # the values were in pageable host memory
            self.array = copy.reshape(-1)
        else:
            self.landing = copy
        self.users = users

    def value(self, ctx: TorchContext, offset: int, shape: tuple[int, ...]) -> np.ndarray:
        if self.array is None:
            assert self.landing is not None
            self.array = self.landing.take(ctx).reshape(-1)
            self.landing = None
        self.users -= 1
        return self.array[offset : offset + math.prod(shape)].reshape(shape)

    def drop(self, ctx: TorchContext) -> None:
        self.users -= 1
        if not self.users and self.landing is not None:
            self.landing.drop(ctx)
            self.landing = None


class Grouped:
    """A value logged with ``group=``: the tensor until its group is sent, then its place in the group's copy."""

    __slots__ = ("copy", "offset", "shape", "tensor")

    def __init__(self, tensor: Any) -> None:
        self.tensor: Any = tensor
        self.shape: tuple[int, ...] = tuple(tensor.shape)
        self.copy: GroupCopy | None = None
        self.offset = 0

    def drop(self, ctx: TorchContext) -> None:
        self.tensor = None
        if self.copy is not None:
            self.copy.drop(ctx)


class Pending:
    """One logged step: its parts, until it is emitted."""

    __slots__ = ("held", "keys", "late", "parts", "seq", "step")

    count = 1  # steps

    def __init__(self, step: int, keys: tuple[str, ...] | None, parts: list[Any], held: bool = False) -> None:
        self.step = step
        self.keys = keys  # a dict's keys, in order (None: one value)
        self.parts = parts  # per value: an array (already on the host), a Landing or a Grouped
        self.seq = 0  # the log call that made it due (its own, or the one that sent its group)
        self.held = held  # a part waits for its group to be sent
        self.late = False

    def landed(self) -> bool:
        for part in self.parts:
            kind = type(part)
            if kind is Grouped:  # (inline: a group's later steps find its copy taken already)
                copy = part.copy
                if copy is None or copy.landing is not None and not copy.landing.landed():
                    return False
            elif kind is not np.ndarray and not part.landed():
                return False
        return True

    def in_flight(self) -> list[Landing]:
        """The copies this step still waits for (called once its group was sent)."""
        out = []
        for part in self.parts:
            kind = type(part)
            landing = part if kind is Landing else part.copy.landing if kind is Grouped else None
            if landing is not None and not landing.landed():
                out.append(landing)
        return out

    def take(self, ctx: TorchContext) -> list[tuple[int, Any]]:
        """``[(step, value)]``, once landed; the staging goes back."""
        values = []
        for part in self.parts:
            kind = type(part)
            arr = part if kind is np.ndarray else part.copy.value(ctx, part.offset, part.shape) if kind is Grouped else part.take(ctx)
            values.append(arr.item() if arr.size == 1 else arr)
        return [(self.step, values[0] if self.keys is None else dict(zip(self.keys, values)))]

    def drop(self, ctx: TorchContext) -> None:
        for part in self.parts:
            if type(part) is not np.ndarray:
                part.drop(ctx)


class Sent:
    """A group of lone tensors of one kind and shape (``group=``'s usual case: a loss per step), sent in
    one copy: one entry for all its steps, due and emitted together. Read as :class:`Pending`."""

    __slots__ = ("copy", "late", "seq", "shape", "steps")

    held = False  # (sent)

    def __init__(self, steps: list[int], shape: tuple[int, ...], copy: Landing | np.ndarray, seq: int) -> None:
        self.steps = steps
        self.shape = shape  # each step's value
        # the landing of the stacked values, or the array already on the host; once taken, the
        # (step, value) pairs not emitted yet
        self.copy: Landing | np.ndarray | list[tuple[int, Any]] = copy
        self.seq = seq
        self.late = False

    @property
    def count(self) -> int:
        return len(self.steps)

    def landed(self) -> bool:
        copy = self.copy
        return not isinstance(copy, Landing) or copy.landed()

    def in_flight(self) -> list[Landing]:
        copy = self.copy
        return [copy] if isinstance(copy, Landing) and not copy.landed() else []

    def take(self, ctx: TorchContext) -> list[tuple[int, Any]]:
        """The pairs not emitted yet (kept here: the emitter removes those it emitted)."""
        copy = self.copy
        if isinstance(copy, list):
            return copy
        arr = copy.take(ctx) if isinstance(copy, Landing) else copy
        if math.prod(self.shape) == 1:  # a scalar per step: Python numbers, as .item() gives them
            pairs = list(zip(self.steps, arr.reshape(-1).tolist()))
        else:
            pairs = list(zip(self.steps, arr.reshape(len(self.steps), *self.shape)))
        self.copy = pairs
        return pairs

    def drop(self, ctx: TorchContext) -> None:
        if isinstance(self.copy, Landing):
            self.copy.drop(ctx)


def drop_all(ctx: TorchContext, pending: list[Pending | Sent]) -> None:
    """Give back the staging and events of steps that will not be emitted."""
    for head in pending:
        head.drop(ctx)
