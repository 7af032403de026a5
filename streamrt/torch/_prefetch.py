"""Prefetcher: the next batches staged to the device on a side stream while the current one computes.

::

    batches = Prefetcher(loader, rt, depth=2)       # loader yields CPU tensors / numpy / dicts of them
    for batch in batches:                           # device tensors, ready for the compute stream
        loss = model(batch["tokens"], batch["cu_seqlens"])

For each batch taken from the iterable, on the calling thread:

1. its leaves (CPU tensors and numpy arrays, inside dicts, lists, tuples:
   see :mod:`._tree`) are packed into the pinned staging block of a *slot*
   (each leaf 256-byte aligned);
2. one host-to-device copy into the slot's device memory is enqueued on the
   copy stream, then the slot's event (one native call on cuda and hip);
3. the leaves become the slot's typed views of that memory.

**Slots** (:mod:`._slots`). A slot holds a pinned staging block, a device
block (GPU: ``torch.empty(..., device="cuda")`` while the copy stream is
torch's current stream; simulator: a device block aliased by a CPU tensor, see
:mod:`._context`), the views the batch's leaves became, and the event recorded
after its copy. Once a batch is handed out, its slot is free again: the next
batch reuses the oldest free slot whose copy has landed (one event query) and
whose views and memory nothing outside the Prefetcher refers to any more
(reference counts): a loop that drops each batch by the next step stages with
no allocation and no torch call at all. The copy into a reused device block
first waits, on the device, for the work enqueued on the stream the block was
handed to. A batch the loop still holds keeps its slot; while no free slot is
usable a new one is made, up to ``depth + 2``; past that the oldest slot's
blocks are replaced (its staging goes back to the allocator after its copy,
its device memory stays the held batch's own). ``reuse_memory=False`` gives
every batch new device memory instead. The blocks go back on
:meth:`Prefetcher.close`.

**Plans.** What steps 1 and 3 work out -- each leaf's offset, the block's size,
each view's dtype, shape and strides -- depends only on the batch's structure
and its leaves' dtypes and shapes. It is kept per Prefetcher, keyed by those
(:class:`_Plan`, the last few), and a slot keeps its views for the plan it
last staged, so batches of a repeating structure (a padded token budget) are
staged with one ``memmove`` per leaf, one copy and one event record.

``next()`` hands out the oldest staged batch: the consumer's stream (the
``device_stream``, default torch's current stream at the time of the call)
waits for the batch's event -- on the device; the host does not wait. Then it
tops the queue up again, so the next copies are enqueued before the consumer's
compute. **Work on other streams** that reads a batch must be ordered into the
consumer's stream (``consumer.wait_stream(other)``) before the loop drops the
batch, since its memory is reused after the consumer's work only.

Back-pressure: at most ``depth`` batches are taken from the iterable and not
yet handed out; a slow consumer makes the prefetcher pull slowly, never pile up.

**Groups.** With ``group=k`` the prefetcher takes ``k`` batches at a time and
stages them as one: one slot, one copy, one event, and one hand-off, made when
the first of them is handed out (the others are ready on the consumer's stream
by then). It stages the next group once fewer than ``depth`` batches are left,
so up to ``depth - 1 + k`` are in flight, and the slot is free again once all
``k`` were handed out and dropped. A batch handed to another stream than the
group's earlier ones makes that stream wait for theirs first. A batch that
cannot be staged raises with its whole group.

Varlen batches carry ``cu_seqlens`` (int32, ``batch + 1``) next to the packed
tokens: it is one more leaf, copied with the others and ready on the device
with them (feed it to a varlen kernel, a mask, or the FMHA workspace prepare).

Leaves already in device memory (CUDA tensors, or simulator-aliased tensors)
are passed through unchanged. The iterable runs on the thread calling
``next()``; an exception it raises is re-raised once the batches staged
before it have been handed out.

On the simulator with CPU torch, the hand-off also waits on the host for the
batch's event (torch computes on the host): with ``depth >= 2`` the copy has
normally landed by then (:attr:`PrefetchStatistics.host_waits` counts the times it had not).

Thread rules: consume a Prefetcher from one thread.
"""

from __future__ import annotations

import collections
import ctypes
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._stream import Stream
from .._trace_labels import label
from ._context import context
from ._lazy import numpy_to_torch_dtype, torch_module
from ._slots import Slot, Slots
from ._tree import flatten, unflatten

if TYPE_CHECKING:
    from .._runtime import Runtime

__all__ = ["PrefetchStatistics", "Prefetcher"]

_ALIGN = 256
_SPARE_SLOTS = 2  # slots beyond depth (see "Slots")
_MAX_PLANS = 8  # plans kept per Prefetcher (varlen batches of ever-new shapes make a plan each)
_memmove = ctypes.memmove


@dataclass(frozen=True)
class PrefetchStatistics:
    """A snapshot of a :class:`Prefetcher`.

    Attributes:
        staged: batches taken from the iterable and staged so far.
        delivered: batches handed out by ``next()``.
        in_flight: staged and not yet handed out (at most ``depth``; ``depth - 1 + group`` with ``group=``).
        max_in_flight: the most batches in flight at once.
        staged_bytes: bytes copied to the device so far.
        host_waits: hand-offs where the host waited for a copy (only when torch
            computes on the host: the simulator with CPU torch).
        plans: staging plans made (one per new batch structure, dtypes and shapes; the rest reused one).
        staging_slots: staging slots held (pinned blocks reused once their copies landed; at most ``depth + 2``).
        device_blocks: device blocks allocated so far (a loop that drops its batches reuses at most ``depth + 2``).
    """

    staged: int
    delivered: int
    in_flight: int
    max_in_flight: int
    staged_bytes: int
    host_waits: int
    plans: int = 0
    staging_slots: int = 0
    device_blocks: int = 0


class _Plan:
    """How batches of one structure and leaf signature are staged.

    ``copies``: per staged leaf with bytes, ``(value index, staging offset, nbytes, is numpy)``;
    ``total``: the staging bytes; ``padded``: the device tensor's bytes (a multiple of 256, so every
    dtype views it); ``views``: per staged leaf ``(value index, torch dtype, shape, strides, element
    offset)``; ``dtypes``: the distinct dtypes.
    """

    __slots__ = ("copies", "dtypes", "padded", "total", "views")

    def __init__(self, values: list[Any], tensor_type: Any, passes: list[bool]) -> None:
        copies: list[tuple[int, int, int, bool]] = []
        views: list[tuple[int, Any, tuple[int, ...], tuple[int, ...], int]] = []
        total = 0
        for i, value in enumerate(values):
            if isinstance(value, np.ndarray):
                dtype, itemsize, shape, is_numpy = numpy_to_torch_dtype(value.dtype), value.dtype.itemsize, tuple(value.shape), True
            elif isinstance(value, tensor_type) and not passes[i]:
                dtype, itemsize, shape, is_numpy = value.dtype, value.element_size(), tuple(value.shape), False
            else:
                continue
            nbytes = itemsize * int(np.prod(shape, dtype=np.int64))
            offset = -(-total // _ALIGN) * _ALIGN
            if nbytes:
                copies.append((i, offset, nbytes, is_numpy))
            total = offset + nbytes
            strides, step = [], 1
            for d in reversed(shape):
                strides.append(step)
                step *= max(d, 1)
            views.append((i, dtype, shape, tuple(reversed(strides)), offset // itemsize))
        self.copies = tuple(copies)
        self.views = tuple(views)
        self.dtypes = tuple({v[1]: None for v in views})
        self.total = total
        self.padded = max(-(-total // _ALIGN) * _ALIGN, _ALIGN) if views else 0


class Prefetcher(Iterator[Any]):
    """Stages batches of ``iterable`` to the device ahead of use; see the module docstring.

    Args:
        iterable: yields batches: CPU tensors, numpy arrays, or dicts/lists/tuples of them.
        rt: the runtime.
        depth: batches staged ahead (at least 1).
        stream: the stream the copies run on (default: a new stream, closed with the prefetcher).
        device_stream: the stream that consumes the batches (default: torch's current
            stream when ``next()`` is called; see :func:`~streamrt.torch.current_stream`).
        reuse_memory: reuse a slot's device memory once nothing refers to its batch (default);
            ``False``: new device memory per batch, freed under torch's rules.
        group: batches staged together, in one copy (see "Groups" in the module docstring).
    """

    def __init__(
        self,
        iterable: Iterable[Any],
        rt: Runtime,
        depth: int = 2,
        stream: Stream | None = None,
        device_stream: Stream | None = None,
        reuse_memory: bool = True,
        group: int = 1,
    ) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an int >= 1, got {depth!r}")
        if isinstance(group, bool) or not isinstance(group, int) or group < 1:
            raise ValueError(f"group must be an int >= 1, got {group!r}")
        for what, s in (("stream", stream), ("device_stream", device_stream)):
            if s is not None and (not isinstance(s, Stream) or s.runtime is not rt):
                raise ValueError(f"{what} must be a streamrt Stream of this runtime (wrap torch streams with streamrt.torch.wrap_stream)")
        self._tensor_type: Any = torch_module().Tensor  # (fails early without torch)
        self._rt = rt
        self._ctx = context(rt)
        self._it = iter(iterable)
        self._depth = depth
        self._owns_stream = stream is None
        self._stream = rt.create_stream(name="prefetch") if stream is None else stream
        self._device_stream = device_stream
        # (batch, slot, lead, last) staged and not handed out; the slot's event is recorded after the batch's
        # copy, its views are the batch's leaves; ``lead``/``last``: the first/last batch of its slot's group
        self._queue: collections.deque[tuple[Any, Slot, bool, bool]] = collections.deque()
        self._group = group
        self._slots = Slots(rt, self._ctx, self._stream, depth + _SPARE_SLOTS, reuse_memory)
        self._plans: dict[Any, _Plan] = {}
        self._exhausted = False
        self._error: BaseException | None = None
        self._closed = False
        self._staged = 0
        self._delivered = 0
        self._max_in_flight = 0
        self._staged_bytes = 0
        self._host_waits = 0
        self._plans_made = 0

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def stream(self) -> Stream:
        """The stream the copies run on."""
        return self._stream

    @property
    def in_flight(self) -> int:
        """Batches staged and not yet handed out."""
        return len(self._queue)

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        """The next batch on the device, ready for the consumer's stream. Raises ``StopIteration`` at the end,
        ``ClosedError`` once the runtime is closed."""
        if self._closed:
            raise StopIteration
        if self._rt._closed:
            self._rt._check_open()
        queue = self._queue
        if not queue:
            self._fill()
            if not queue:
                error, self._error = self._error, None
                if error is not None:
                    raise error
                raise StopIteration
        batch, slot, lead, last = queue.popleft()
        self._fill()  # the next copies go in before the consumer enqueues its compute
        consumer = self._device_stream if self._device_stream is not None else self._ctx.current_stream()
        if lead or consumer is not slot.consumer:
            if not lead and slot.consumer is not None:  # a group's earlier batches went to another stream
                self._ctx.join(consumer, slot.consumer)  # reuse after this stream's work is after theirs too
            if self._slots.hand_off(slot, consumer):
                self._host_waits += 1
            if slot.device is not None:
                slot.consumer = consumer  # the block's reuse waits for this stream's work (see _slots)
        if last:
            self._slots.free.append(slot)
        self._delivered += 1
        return batch

    def prefetch(self) -> int:
        """Stage batches now, up to ``depth`` in flight (``next()`` does it too); returns how many are in flight.

        Lets the first copies start before the loop does (during model set-up, say).
        """
        if not self._closed:
            self._fill()
        return len(self._queue)

    def statistics(self) -> PrefetchStatistics:
        return PrefetchStatistics(
            staged=self._staged,
            delivered=self._delivered,
            in_flight=len(self._queue),
            max_in_flight=self._max_in_flight,
            staged_bytes=self._staged_bytes,
            host_waits=self._host_waits,
            plans=self._plans_made,
            staging_slots=self._slots.made,
            device_blocks=self._slots.device_blocks,
        )

    def close(self) -> None:
        """Drop the batches still staged, give the staging blocks back (stream-ordered after their
        copies), free the events, close an owned copy stream. Idempotent.

        An owned copy stream is synchronized first (the copies still in flight are short), so
        no memory torch may hand out again is written after the stream is gone.
        """
        if self._closed:
            return
        self._closed = True
        slots = list({id(entry[1]): entry[1] for entry in self._queue}.values()) + list(self._slots.free)
        self._queue = collections.deque()
        self._slots.free.clear()
        self._plans = {}
        if not self._rt.is_closed:
            self._slots.close(slots)
            if self._owns_stream:
                self._stream.synchronize()
                self._stream.close()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- staging ------------------------------------------------------------------------------------
    def _fill(self) -> None:
        queue, depth, group = self._queue, self._depth, self._group
        while len(queue) < depth and not self._exhausted:
            hosts: list[Any] = []
            while len(hosts) < group:
                try:
                    hosts.append(next(self._it))
                except StopIteration:
                    self._exhausted = True
                    break
                except Exception as exc:  # noqa: BLE001 - re-raised once the batches staged before it are handed out
                    self._exhausted = True
                    self._error = exc
                    break
            if not hosts:
                break
            if group == 1:
                batch, slot = self._stage(hosts[0])
                queue.append((batch, slot, True, True))
            else:  # the group is one batch, a tuple of them, to the plan and the slot
                batches, slot = self._stage(tuple(hosts))
                last = len(batches) - 1
                for i, batch in enumerate(batches):
                    queue.append((batch, slot, i == 0, i == last))
            self._staged += len(hosts)
            if len(queue) > self._max_in_flight:
                self._max_in_flight = len(queue)

    def _stage(self, host: Any) -> tuple[Any, Slot]:
        """Stage one batch: checks first (nothing is allocated for a batch that raises), then the plan's steps."""
        values, structure = flatten(host)
        tensor_type, passes_through = self._tensor_type, self._ctx.passes_through
        signature: list[Any] = []
        passes: list[bool] = []
        for value in values:
            if isinstance(value, tensor_type):
                through = passes_through(value)
                if not through and not value.is_cpu:
                    raise TypeError(f"cannot prefetch a tensor on {value.device}")
                signature.append(True if through else (value.dtype, value.shape))
                passes.append(through)
            else:
                signature.append(("np", value.dtype, value.shape) if isinstance(value, np.ndarray) else None)
                passes.append(False)
        key = (structure, tuple(signature))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._new_plan(key, values, passes)
        if self._rt._tracer is not None:
            with label("prefetch", None):
                slot = self._enqueue(plan, values)
        else:
            slot = self._enqueue(plan, values)
        self._staged_bytes += plan.total
        if not plan.views:
            return host, slot
        for (i, *_), view in zip(plan.views, slot.views if slot.plan is plan else self._slots.views(slot, plan)):
            values[i] = view
        return unflatten(structure, values), slot

    def _new_plan(self, key: Any, values: list[Any], passes: list[bool]) -> _Plan:
        plans = self._plans
        if len(plans) >= _MAX_PLANS:
            del plans[next(iter(plans))]  # the oldest
        plan = plans[key] = _Plan(values, self._tensor_type, passes)
        self._plans_made += 1
        return plan

    def _enqueue(self, plan: _Plan, values: list[Any]) -> Slot:
        """Take a slot, pack the leaves into its staging, enqueue the copy to its device memory and the record."""
        slots = self._slots
        total = plan.total
        slot = slots.take(total, plan.padded)
        try:
            if total:
                base = slot.block._ptr  # type: ignore[union-attr]
                for i, offset, nbytes, is_numpy in plan.copies:
                    value = values[i]
                    if is_numpy:
                        value = np.ascontiguousarray(value)
                        _memmove(base + offset, value.ctypes.data, nbytes)
                    else:
                        if not value.is_contiguous():
                            value = value.detach().contiguous()
                        _memmove(base + offset, value.data_ptr(), nbytes)
                slots.copy(slot, total)
            else:
                self._stream._record_raw(slot.event)
        except BaseException:
            slots.drop_staging(slot)  # a copy may have been enqueued from it
            slots.drop_device(slot)
            slots.free.appendleft(slot)
            raise
        return slot
