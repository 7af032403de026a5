"""A Prefetcher's slots: pinned staging and resident device memory, reused once nothing uses them.

A :class:`Slot` is what one staged batch occupies:

* a pinned **staging block** from ``rt.host_allocator`` and the **event** recorded
  after the batch's copy: reusable once that event has completed (one query);
* a **device block** (a uint8 torch tensor: ``torch.empty`` on a GPU, an aliased
  simulator block on the simulator) and the typed **views** of it that the batch's
  leaves became: reusable once nothing outside the Prefetcher refers to them.

"Nothing refers to them" is read from reference counts, never guessed: no Python
reference to a view the slot handed out (``sys.getrefcount``), no other owner of a
view's tensor (``Tensor._use_count``: autograd's saved tensors, say) and no other
tensor on the block's memory (``torch._C._storage_Use_Count``: views derived from
a leaf). A batch the loop still holds (or that autograd saved for backward) keeps
its slot; the Prefetcher then stages into another one.

Reusing a device block is ordered on the device: the copy that overwrites it first
waits for the work enqueued so far on the stream the block was handed to (one event,
recorded there and waited for by the copy stream, in the same native call as the copy
where the backend has native ops). So the consumer's reads of the old batch run before
the new bytes land, without the host waiting. Work the loop ran on *other* streams must
be ordered into the consumer's stream before the batch's last reference goes.

A block that leaves its slot (a larger batch, a slot whose batch is still held, close)
is given back to torch with the consumer's stream recorded on it (``record_stream``,
see :meth:`~._context.TorchContext.let_go`), as a batch's memory was before slots kept it.

Thread rules: one Prefetcher's thread.
"""

from __future__ import annotations

import collections
import sys
from typing import TYPE_CHECKING, Any

from .._backends._native_ops import Program
from .._backends.protocol import MemcpyKind
from ._lazy import torch_module

if TYPE_CHECKING:
    from .._backends._native_ops import NativeOps
    from .._buffer import Buffer
    from .._event import Event
    from .._runtime import Runtime
    from .._stream import Stream
    from ._context import TorchContext

__all__ = ["Slot", "Slots"]

H2D = MemcpyKind.HOST_TO_DEVICE
_getrefcount = sys.getrefcount


class Slot:
    """One staged batch's staging block, device block, views and events. See the module docstring."""

    __slots__ = (
        "address", "block", "capacity", "cdata", "consumer", "copy_call", "device", "device_block", "device_capacity",
        "event", "key", "owners", "plan", "program", "refs", "uses", "views", "wait", "wait_on",
    )

    def __init__(self, event: Event) -> None:
        self.event = event  # recorded after the slot's last copy
        self.block: Buffer | None = None  # pinned staging
        self.capacity = 0
        self.device: Any = None  # the uint8 device tensor
        self.address = 0
        self.device_block: Buffer | None = None  # simulator: the allocator block behind it
        self.device_capacity = 0
        self.cdata = 0  # the device tensor's storage (torch's StorageImpl), for its use count
        self.plan: Any = None  # the plan ``views`` were made for
        self.views: tuple[Any, ...] = ()
        self.refs: tuple[int, ...] = ()  # the views' Python reference counts while only the slot holds them
        self.owners: tuple[int, ...] = ()  # their tensors' use counts then
        self.uses = 0  # the storage's use count then
        self.consumer: Stream | None = None  # the stream the device block was last handed to
        self.program: Program | None = None  # [the reuse wait,] the copy and the record, as one native call
        self.key: tuple[int, int, int | None] | None = None  # what ``program`` was built for
        self.copy_call = 0  # the copy's index in ``program``
        self.wait: Program | None = None  # ``wait_on``'s wait for ``event`` (the hand-off), as one native call
        self.wait_on: Stream | None = None


class Slots:
    """At most ``limit`` slots of one Prefetcher, the free ones oldest first. See the module docstring.

    ``resident=False``: a device block is never reused (every batch gets new torch memory,
    freed under torch's rules once the batch is dropped).
    """

    def __init__(self, rt: Runtime, ctx: TorchContext, stream: Stream, limit: int, resident: bool) -> None:
        self._rt = rt
        self._ctx = ctx
        self._stream = stream
        self._limit = limit
        self.free: collections.deque[Slot] = collections.deque()  # slots of batches handed out, oldest first
        self.made = 0  # slots made and not dropped
        self.device_blocks = 0  # device blocks allocated
        self._ops: NativeOps | None = getattr(rt._base_backend, "native_ops", None)
        torch = torch_module()
        self._storage_uses = getattr(torch._C, "_storage_Use_Count", None) if resident else None
        self._owners: Any = getattr(torch.Tensor, "_use_count", None)
        if self._owners is None:
            self._storage_uses = None  # no way to tell a held batch: never reuse device memory
        self._progress: Event | None = None  # recorded on a consumer, waited for by the copy stream

    # -- taking a slot ------------------------------------------------------------------------------
    def take(self, total: int, padded: int) -> Slot:
        """A slot with ``total`` bytes of staging and ``padded`` bytes of device memory: the oldest free
        one whose copy has landed and whose device memory nothing uses, else a new one (up to the limit),
        else the oldest, its staging and device memory replaced by new blocks."""
        free = self.free
        query = self._stream._backend.event_query
        slot = None
        for candidate in free:
            if self._unused(candidate) and query(candidate.event._handle):
                slot = candidate
                break
        else:
            if free:
                # A batch may be held only by finished streamrt work that a lazy lane has not retired yet
                # (a Run's keepalive): retire that work here, rather than allocate while it waits.
                self._rt._engine.retire_ready()
                slot = self._reusable(free, query)
        if slot is not None:
            if slot is free[0]:
                free.popleft()
            else:
                free.remove(slot)
        elif self.made < self._limit or not free:
            slot = Slot(self._rt.create_event())
            self.made += 1
        else:
            slot = free.popleft()
            if not query(slot.event._handle):
                self.drop_staging(slot)  # its copy is still in flight: the allocator reuses the block after it
            if not self._unused(slot):
                self.drop_device(slot)  # its batch is still held: that memory becomes the batch's own
        try:
            if slot.consumer is not None and slot.consumer._closed:
                self.drop_device(slot)  # nothing can be ordered after a closed stream's work any more
            if slot.capacity < total:
                self.drop_staging(slot)
                slot.block = self._rt._host_allocator.allocate(total)
                slot.capacity = total
            if padded and slot.device_capacity < padded:
                self.drop_device(slot)
                slot.device, slot.address, slot.device_block = self._ctx.device_block(padded, self._stream)
                slot.device_capacity = padded
                slot.cdata = slot.device.untyped_storage()._cdata
                self.device_blocks += 1
        except BaseException:
            free.appendleft(slot)
            raise
        return slot

    def _reusable(self, free: collections.deque[Slot], query: Any) -> Slot | None:
        """The oldest free slot whose copy has landed and whose device memory nothing uses (``None``: none).

        (:meth:`take`'s first look is this loop inline: one Python call less per batch.)"""
        for candidate in free:
            if self._unused(candidate) and query(candidate.event._handle):
                return candidate
        return None

    def _unused(self, slot: Slot) -> bool:
        """Nothing outside the Prefetcher refers to the slot's device memory (see the module docstring)."""
        if slot.device is None:
            return True
        uses = self._storage_uses
        if uses is None or uses(slot.cdata) != slot.uses or tuple(map(_getrefcount, slot.views)) != slot.refs:
            return False
        return tuple(map(self._owners, slot.views)) == slot.owners

    def views(self, slot: Slot, plan: Any) -> tuple[Any, ...]:
        """The leaves' typed views of the slot's device memory for ``plan`` (made once per slot and plan)."""
        if slot.plan is not plan:
            slot.views = slot.refs = slot.owners = ()
            base = slot.device
            typed = {dtype: base.view(dtype) for dtype in plan.dtypes}
            views = tuple(typed[dtype].as_strided(shape, strides, offset) for _i, dtype, shape, strides, offset in plan.views)
            del typed
            slot.plan, slot.views = plan, views
            slot.refs = tuple(map(_getrefcount, views))  # (the slot's own reference included)
            slot.owners = tuple(map(self._owners, views)) if self._owners is not None else ()
            slot.uses = self._storage_uses(slot.cdata) if self._storage_uses is not None else 0
        return slot.views

    # -- the copy -----------------------------------------------------------------------------------
    def copy(self, slot: Slot, total: int) -> None:
        """Enqueue the batch's copy from the slot's staging into its device memory, after the consumer's
        work on what it held before, then the slot's event; one native call where the backend has native
        ops (and no trace or ``stream.capture()`` is open on the copy stream)."""
        stream = self._stream
        consumer = slot.consumer
        progress = self._progress
        if consumer is not None and progress is None:
            progress = self._progress = self._rt.create_event()
        ops = self._ops
        if ops is not None and stream._capture is None and getattr(stream._backend, "native_ops", None) is not None:
            # the consumer's lock, then the copy stream's (the order every slot copy takes them in; both
            # are reentrant, so without a consumer the copy stream's is simply taken twice)
            with (stream if consumer is None else consumer)._lock, stream._lock:
                if stream._closed:
                    stream._check_open()
                if consumer is not None and consumer._closed:
                    consumer._check_open()
                program = slot.program
                key = (slot.block._ptr, slot.address, None if consumer is None else consumer._handle)  # type: ignore[union-attr]
                if slot.key != key:
                    program = self._program(slot, consumer, key)
                program.set(slot.copy_call, 2, total)  # type: ignore[union-attr]
                failed = ops.run(program)  # type: ignore[arg-type]
                if failed is not None:
                    raise failed[1]  # type: ignore[misc]
                slot.event._recorded_on = stream._handle
        else:
            if consumer is not None:
                consumer._record_raw(progress)  # type: ignore[arg-type]
                stream._wait_raw(progress)  # type: ignore[arg-type]
            stream._copy_raw(slot.address, slot.block._ptr, total, H2D)  # type: ignore[union-attr]
            stream._record_raw(slot.event)
        slot.consumer = None  # ordered: the next reuse waits for whoever consumes this batch

    def _program(self, slot: Slot, consumer: Stream | None, key: tuple[int, int, int | None]) -> Program:
        """The slot's copy program for ``key`` (its staging, its device memory, the consumer's handle)."""
        handle = self._stream._handle
        program = Program()
        if consumer is not None:  # (its handle may be 0: the legacy default stream)
            progress = self._progress._handle  # type: ignore[union-attr]
            program.record(progress, consumer._handle).wait(handle, progress)
        slot.copy_call = len(program)
        slot.program = program.copy(slot.address, slot.block._ptr, 0, H2D, handle).record(slot.event._handle, handle)  # type: ignore[union-attr]
        slot.key = key
        return slot.program

    def hand_off(self, slot: Slot, consumer: Stream) -> bool:
        """``consumer`` waits for the slot's event (see :meth:`~._context.TorchContext.hand_off`): one native
        call where the backend has native ops. Returns whether the host waited."""
        ops = self._ops
        if ops is None or consumer._capture is not None or getattr(consumer._backend, "native_ops", None) is None:
            return self._ctx.hand_off(slot.event, consumer, slot.device_block)
        program = slot.wait
        if program is None or slot.wait_on is not consumer:
            program = slot.wait = Program().wait(consumer._handle, slot.event._handle)
            slot.wait_on = consumer
        with consumer._lock:
            if consumer._closed:
                consumer._check_open()
            failed = ops.run(program)
        if failed is not None:
            raise failed[1]  # type: ignore[misc]
        return False

    # -- giving memory back -------------------------------------------------------------------------
    def drop_staging(self, slot: Slot) -> None:
        """Release a slot's staging block, stream-ordered after the copies enqueued from it."""
        block = slot.block
        if block is not None:
            slot.block, slot.capacity, slot.key = None, 0, None
            block.note_stream(self._stream)
            block.release()

    def drop_device(self, slot: Slot) -> None:
        """Give a slot's device memory back to torch (after its consumer's work, see ``let_go``)."""
        tensor = slot.device
        if tensor is None:
            return
        consumer = slot.consumer
        slot.device, slot.address, slot.device_block, slot.device_capacity, slot.cdata = None, 0, None, 0, 0
        slot.plan, slot.views, slot.refs, slot.owners, slot.key, slot.consumer = None, (), (), (), None, None
        self._ctx.let_go(tensor, consumer)

    def close(self, slots: list[Slot]) -> None:
        """Give every slot's memory back and free the events (the runtime still open)."""
        for slot in slots:
            self.drop_staging(slot)
            self.drop_device(slot)
            slot.event.close()
        if self._progress is not None:
            self._progress.close()
            self._progress = None

