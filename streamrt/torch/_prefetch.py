"""Prefetcher: the next batches staged to the device on a side stream while the current one computes.

::

    batches = Prefetcher(loader, rt, depth=2)       # loader yields CPU tensors / numpy / dicts of them
    for batch in batches:                           # device tensors, ready for the compute stream
        loss = model(batch["tokens"], batch["cu_seqlens"])

For each batch taken from the iterable, on the calling thread:

1. its leaves (CPU tensors and numpy arrays, inside dicts, lists, tuples:
   see :mod:`._tree`) are packed into one pinned staging block from
   ``rt.host_allocator`` (each leaf 256-byte aligned);
2. one device block is allocated (GPU: ``torch.empty(..., device="cuda")``
   while the copy stream is torch's current stream, so torch's allocator
   orders the block's reuse after the copy; simulator: a device block
   aliased by a CPU tensor, see :mod:`._context`) and the leaves become typed
   views of it;
3. one host-to-device copy is enqueued on the copy stream, then an event.

**Staging slots.** Each staged batch takes a *slot*: a pinned staging block and
the event recorded after the block's copy. Once the batch is handed out, its
slot goes back to the Prefetcher's free slots; the next batch reuses the oldest
one whose copy has landed (one event query), so a warm Prefetcher stages with
no allocator call and one event record per batch. While every free slot's copy
is still in flight a new slot is made, up to ``depth + 2`` of them; past that,
the oldest slot's block goes back to the allocator, stream-ordered after its
copy, and a new block is taken. The slots' blocks return to ``rt.host_allocator``
on :meth:`Prefetcher.close`.

**Plans.** What steps 1 and 2 work out -- each leaf's offset, the block's size,
each view's dtype, shape and strides -- depends only on the batch's structure
and its leaves' dtypes and shapes. It is kept per Prefetcher, keyed by those
(:class:`_Plan`, the last few), so batches of a repeating structure (a padded
token budget) are staged with one device allocation, one ``memmove`` per leaf,
one copy, one event record and one torch view per leaf.

``next()`` hands out the oldest staged batch: the consumer's stream (the
``device_stream``, default torch's current stream at the time of the call)
waits for the batch's event -- on the device; the host does not wait -- and
the batch's memory is recorded on that stream (``record_stream``), so torch
does not reuse it before the consumer's work has run. Then it tops the queue
up again, so the next copies are enqueued before the consumer's compute.

Back-pressure: at most ``depth`` batches are taken from the iterable and not
yet handed out; a slow consumer makes the prefetcher pull slowly, never pile up.

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

from .._backends._native_ops import Program
from .._backends.protocol import MemcpyKind
from .._stream import Stream
from .._trace_labels import label
from ._context import context
from ._lazy import numpy_to_torch_dtype, torch_module
from ._tree import flatten, unflatten

if TYPE_CHECKING:
    from .._backends._native_ops import NativeOps
    from .._buffer import Buffer
    from .._event import Event
    from .._runtime import Runtime

__all__ = ["PrefetchStatistics", "Prefetcher"]

H2D = MemcpyKind.HOST_TO_DEVICE

_ALIGN = 256
_SPARE_SLOTS = 2  # staging slots beyond depth (see "Staging slots")
_MAX_PLANS = 8  # plans kept per Prefetcher (varlen batches of ever-new shapes make a plan each)
_memmove = ctypes.memmove


@dataclass(frozen=True)
class PrefetchStatistics:
    """A snapshot of a :class:`Prefetcher`.

    Attributes:
        staged: batches taken from the iterable and staged so far.
        delivered: batches handed out by ``next()``.
        in_flight: staged and not yet handed out (at most ``depth``).
        max_in_flight: the most batches in flight at once.
        staged_bytes: bytes copied to the device so far.
        host_waits: hand-offs where the host waited for a copy (only when torch
            computes on the host: the simulator with CPU torch).
        plans: staging plans made (one per new batch structure, dtypes and shapes; the rest reused one).
        staging_slots: staging slots held (pinned blocks reused once their copies landed; at most ``depth + 2``).
    """

    staged: int
    delivered: int
    in_flight: int
    max_in_flight: int
    staged_bytes: int
    host_waits: int
    plans: int = 0
    staging_slots: int = 0


class _Slot:
    """A pinned staging block and the event recorded after its last copy (see "Staging slots").

    ``program``: the copy and the record as one native program (the copy's destination and size
    are set per batch), where the backend has native ops.
    """

    __slots__ = ("block", "capacity", "event", "program")

    def __init__(self, event: Event) -> None:
        self.event = event
        self.block: Buffer | None = None
        self.capacity = 0
        self.program: Program | None = None


class _Staged:
    __slots__ = ("batch", "block", "slot", "tensor")

    def __init__(self, batch: Any, slot: _Slot, tensor: Any, block: Buffer | None) -> None:
        self.batch = batch
        self.slot = slot  # its event is recorded after the batch's copy
        self.tensor = tensor  # the uint8 device tensor every staged leaf views (None: nothing staged)
        self.block = block  # simulator: the allocator block behind it


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
    """

    def __init__(
        self,
        iterable: Iterable[Any],
        rt: Runtime,
        depth: int = 2,
        stream: Stream | None = None,
        device_stream: Stream | None = None,
    ) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an int >= 1, got {depth!r}")
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
        self._queue: collections.deque[_Staged] = collections.deque()
        self._free: collections.deque[_Slot] = collections.deque()  # slots of batches handed out, oldest first
        self._slots = 0  # slots made and not dropped
        self._ops: NativeOps | None = getattr(rt._base_backend, "native_ops", None)
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
        item = queue.popleft()
        self._fill()  # the next copies go in before the consumer enqueues its compute
        ctx = self._ctx
        consumer = self._device_stream if self._device_stream is not None else ctx.current_stream()
        if ctx.hand_off(item.slot.event, consumer, item.tensor, item.block):
            self._host_waits += 1
        self._free.append(item.slot)
        self._delivered += 1
        return item.batch

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
            staging_slots=self._slots,
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
        slots = [s.slot for s in self._queue] + list(self._free)
        self._queue, self._free = collections.deque(), collections.deque()
        self._plans = {}
        if not self._rt.is_closed:
            for slot in slots:
                self._drop_block(slot)
                slot.event.close()
            if self._owns_stream:
                self._stream.synchronize()
                self._stream.close()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- staging ------------------------------------------------------------------------------------
    def _fill(self) -> None:
        queue, depth = self._queue, self._depth
        while len(queue) < depth and not self._exhausted:
            try:
                host = next(self._it)
            except StopIteration:
                self._exhausted = True
                break
            except Exception as exc:  # noqa: BLE001 - re-raised once the batches staged before it are handed out
                self._exhausted = True
                self._error = exc
                break
            queue.append(self._stage(host))
            self._staged += 1
            if len(queue) > self._max_in_flight:
                self._max_in_flight = len(queue)

    def _stage(self, host: Any) -> _Staged:
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
        rt = self._rt
        if rt._tracer is not None:
            with label("prefetch", None):
                tensor, block, slot = self._enqueue(plan, values)
        else:
            tensor, block, slot = self._enqueue(plan, values)
        self._staged_bytes += plan.total
        if tensor is None:
            return _Staged(host, slot, None, None)
        typed = {}
        for dtype in plan.dtypes:
            typed[dtype] = tensor.view(dtype)
        for i, dtype, shape, strides, offset in plan.views:
            values[i] = typed[dtype].as_strided(shape, strides, offset)
        return _Staged(unflatten(structure, values), slot, tensor, block)

    def _new_plan(self, key: Any, values: list[Any], passes: list[bool]) -> _Plan:
        plans = self._plans
        if len(plans) >= _MAX_PLANS:
            del plans[next(iter(plans))]  # the oldest
        plan = plans[key] = _Plan(values, self._tensor_type, passes)
        self._plans_made += 1
        return plan

    def _enqueue(self, plan: _Plan, values: list[Any]) -> tuple[Any, Buffer | None, _Slot]:
        """Pack the leaves into a slot's staging, allocate the device block, enqueue the copy and the record."""
        stream = self._stream
        total = plan.total
        slot = self._slot(total)
        tensor, block = None, None
        try:
            if plan.views:
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
                tensor, address, block = self._ctx.device_block(plan.padded, stream)
                if total:
                    self._copy_and_record(slot, address, total)
                    return tensor, block, slot
            stream._record_raw(slot.event)
        except BaseException:
            self._drop_block(slot)  # a copy may have been enqueued from it
            self._free.appendleft(slot)
            raise
        return tensor, block, slot

    def _slot(self, total: int) -> _Slot:
        """The oldest free slot whose copy has landed, else a new one (up to ``depth + 2``, then the oldest
        with a new block), with at least ``total`` bytes of staging."""
        free = self._free
        if free and self._stream._backend.event_query(free[0].event._handle):
            slot = free.popleft()
        elif self._slots < self._depth + _SPARE_SLOTS or not free:
            slot = _Slot(self._rt.create_event())
            self._slots += 1
        else:
            slot = free.popleft()
            self._drop_block(slot)  # its copy is still in flight: the allocator reuses the block after it
        if slot.capacity < total:
            self._drop_block(slot)
            try:
                block = slot.block = self._rt._host_allocator.allocate(total)
            except BaseException:
                free.appendleft(slot)
                raise
            slot.capacity = total
            ops = self._ops
            if ops is not None:
                handle = self._stream._handle
                slot.program = Program().copy(0, block._ptr, 0, H2D, handle).record(slot.event._handle, handle)
        return slot

    def _drop_block(self, slot: _Slot) -> None:
        """Release a slot's staging block, stream-ordered after the copies enqueued from it."""
        block = slot.block
        if block is not None:
            slot.block, slot.capacity, slot.program = None, 0, None
            block.note_stream(self._stream)
            block.release()

    def _copy_and_record(self, slot: _Slot, address: int, total: int) -> None:
        """The batch's copy from the slot's staging to ``address``, then the slot's event, on the copy stream:
        one native call where the backend has one (and no trace or ``stream.capture()`` is open)."""
        stream = self._stream
        program = slot.program
        with stream._lock:
            if stream._closed:
                stream._check_open()
            if program is not None and stream._capture is None and getattr(stream._backend, "native_ops", None) is not None:
                program.set(0, 0, address)
                program.set(0, 2, total)
                failed = self._ops.run(program)  # type: ignore[union-attr]
                if failed is not None:
                    raise failed[1]  # type: ignore[misc]
                slot.event._recorded_on = stream._handle
                return
        stream._copy_raw(address, slot.block._ptr, total, H2D)  # type: ignore[union-attr]
        stream._record_raw(slot.event)
