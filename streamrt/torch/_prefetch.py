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
3. one host-to-device copy is enqueued on the copy stream, then an event;
4. the staging block is released at once: the allocator reuses it only once
   the copy stream has passed the copy (the stream-tail keepalive).

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
import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .._stream import Stream
from .._trace_labels import label
from ._context import context
from ._interop import tensor_buffer
from ._lazy import is_tensor, numpy_to_torch_dtype, torch_module
from ._tree import map_leaves

if TYPE_CHECKING:
    from .._buffer import Buffer
    from .._event import Event
    from .._runtime import Runtime

__all__ = ["PrefetchStatistics", "Prefetcher"]

_ALIGN = 256


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
    """

    staged: int
    delivered: int
    in_flight: int
    max_in_flight: int
    staged_bytes: int
    host_waits: int


class _Staged:
    __slots__ = ("batch", "block", "event", "nbytes", "tensor")

    def __init__(self, batch: Any, event: Event, tensor: Any, block: Buffer | None, nbytes: int) -> None:
        self.batch = batch
        self.event = event
        self.tensor = tensor  # the uint8 device tensor every staged leaf views (None: nothing staged)
        self.block = block  # simulator: the allocator block behind it
        self.nbytes = nbytes


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
        torch_module()  # fail early without torch
        self._rt = rt
        self._ctx = context(rt)
        self._it = iter(iterable)
        self._depth = depth
        self._owns_stream = stream is None
        self._stream = rt.create_stream(name="prefetch") if stream is None else stream
        self._device_stream = device_stream
        self._queue: collections.deque[_Staged] = collections.deque()
        self._events: list[Event] = []  # idle events for reuse
        self._exhausted = False
        self._error: BaseException | None = None
        self._closed = False
        self._staged = 0
        self._delivered = 0
        self._max_in_flight = 0
        self._staged_bytes = 0
        self._host_waits = 0

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
        self._rt._check_open()
        if not self._queue:
            self._fill()
        if not self._queue:
            error, self._error = self._error, None
            if error is not None:
                raise error
            raise StopIteration
        item = self._queue.popleft()
        self._fill()  # the next copies go in before the consumer enqueues its compute
        consumer = self._device_stream if self._device_stream is not None else self._ctx.current_stream()
        if self._ctx.host_computes and not item.event.is_done:
            self._host_waits += 1
        self._ctx.hand_off(item.event, consumer, item.tensor, item.block)
        self._events.append(item.event)
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
        )

    def close(self) -> None:
        """Drop the batches still staged, free the events, close an owned copy stream. Idempotent.

        An owned copy stream is synchronized first (the copies still in flight are short), so
        no memory torch may hand out again is written after the stream is gone.
        """
        if self._closed:
            return
        self._closed = True
        staged, self._queue = list(self._queue), collections.deque()
        events = [s.event for s in staged] + self._events
        self._events = []
        del staged
        if not self._rt.is_closed:
            for ev in events:
                ev.close()
            if self._owns_stream:
                self._stream.synchronize()
                self._stream.close()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- staging ------------------------------------------------------------------------------------
    def _fill(self) -> None:
        while len(self._queue) < self._depth and not self._exhausted:
            try:
                host = next(self._it)
            except StopIteration:
                self._exhausted = True
                break
            except Exception as exc:  # noqa: BLE001 - re-raised once the batches staged before it are handed out
                self._exhausted = True
                self._error = exc
                break
            self._queue.append(self._stage(host))
            self._staged += 1
            self._max_in_flight = max(self._max_in_flight, len(self._queue))

    def _event(self) -> Event:
        return self._events.pop() if self._events else self._rt.create_event()

    def _stage(self, host: Any) -> _Staged:
        rt, ctx, stream = self._rt, self._ctx, self._stream
        plan: list[tuple[np.ndarray, Any, tuple[int, ...], int]] = []  # (bytes, torch dtype, shape, offset)
        staged_leaves: list[bool] = []  # per leaf, in visiting order: staged (else passed through)
        total = 0

        def collect(leaf: Any) -> Any:
            nonlocal total
            staged = _host_leaf(rt, leaf)
            staged_leaves.append(staged is not None)
            if staged is None:
                return leaf
            raw, dtype, shape = staged
            offset = -(-total // _ALIGN) * _ALIGN
            plan.append((raw, dtype, shape, offset))
            total = offset + raw.nbytes
            return leaf

        map_leaves(host, collect)
        tracing = rt._tracer is not None
        with label("prefetch", None) if tracing else contextlib.nullcontext():
            tensor, block = None, None
            if plan:
                staging = rt.host_allocator.allocate(total)
                try:
                    dst = staging.numpy(np.uint8)
                    for raw, _dtype, _shape, offset in plan:
                        dst[offset : offset + raw.nbytes] = raw
                    tensor, block = ctx.empty(total, stream)
                    device = block.view(0, total) if block is not None else tensor_buffer(rt, tensor)
                    stream.copy(device, staging, total)
                finally:
                    staging.release()  # reused only once `stream` has passed the copy
            event = stream.record(self._event())
        self._staged_bytes += total
        if tensor is None:
            return _Staged(host, event, None, None, 0)
        views = iter([_typed_view(tensor[off : off + raw.nbytes], dtype, shape) for raw, dtype, shape, off in plan])
        staged_flags = iter(staged_leaves)
        batch = map_leaves(host, lambda leaf: next(views) if next(staged_flags) else leaf)
        return _Staged(batch, event, tensor, block, total)


def _typed_view(raw: Any, dtype: Any, shape: tuple[int, ...]) -> Any:
    """The uint8 tensor ``raw`` viewed as ``dtype`` and ``shape`` (one torch call for a 1-D leaf)."""
    typed = raw.view(dtype)
    return typed if len(shape) == 1 else typed.view(shape)


def _passes_through(rt: Runtime, leaf: Any) -> bool:
    """A leaf already in device memory (a CUDA tensor, or a simulator-aliased CPU tensor)."""
    if not is_tensor(leaf):
        return False
    if leaf.is_cuda:
        return True
    ptr = int(leaf.data_ptr())
    return bool(ptr) and rt.capabilities.is_simulated and rt.backend.pointer_kind(ptr).value == "device"


def _host_leaf(rt: Runtime, leaf: Any) -> tuple[np.ndarray, Any, tuple[int, ...]] | None:
    """``(bytes, torch dtype, shape)`` of a host leaf to stage, or ``None`` for a leaf passed through."""
    if isinstance(leaf, np.ndarray):
        arr = np.ascontiguousarray(leaf)
        return arr.reshape(-1).view(np.uint8), numpy_to_torch_dtype(arr.dtype), tuple(arr.shape)
    if _passes_through(rt, leaf):
        return None
    if leaf.device.type != "cpu":
        raise TypeError(f"cannot prefetch a tensor on {leaf.device}")
    torch = torch_module()
    t = leaf.detach() if leaf.requires_grad else leaf
    if not t.is_contiguous():
        t = t.contiguous()
    # numpy does the reshaping (a torch call costs microseconds); it has no bfloat16: read its bits as int16
    arr = t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
    return arr.reshape(-1).view(np.uint8), t.dtype, arr.shape
