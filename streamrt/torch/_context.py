"""How torch tensors map onto one runtime's memory and streams: one :class:`TorchContext` per runtime.

Two pairings exist, chosen by the runtime's capabilities (never by backend name):

* **GPU runtime + CUDA/ROCm torch.** Device tensors are torch CUDA tensors
  (``torch.empty(..., device="cuda")``); torch's work runs on torch's current
  stream, which :meth:`TorchContext.current_stream` wraps. A batch is handed to
  a consumer by making the consumer's stream wait for the batch's event
  (device-side, the host never waits) and recording the consumer's stream on
  the memory (``record_stream``).
* **Simulator + CPU torch** (CI). The simulated device keeps its memory in
  host RAM (``capabilities.is_simulated``), so "device tensors" are CPU
  tensors that *alias* simulator device blocks from ``rt.device_allocator``:
  the simulator's copies move the bytes, CPU torch computes on them in
  place, as a GPU's kernels would. torch runs on the host, in program order,
  so the host itself is torch's "stream": :meth:`current_stream` is a
  per-runtime stream that stands for it, and a hand-off waits for the
  batch's event on the host (CPU torch cannot wait any other way; with
  prefetch depth >= 2 the copy has normally landed long before). A tensor
  that streamrt copies *from* (a fetch) is first copied on the host into a
  temporary simulated device block (:meth:`device_source`): the device-side
  state at that point of torch's program order, which torch's later in-place
  writes on the host cannot overtake (on a GPU the stream orders them).

The same classes (``fetch``, ``Prefetcher``, ``MetricsLogger``) run on both,
through the same stream operations, events, host functions and allocators.

Thread rules: a context may be used from any thread.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from .._buffer import PAGEABLE, Buffer
from .._completion import Completion
from ._interop import as_torch_stream, record_stream, tensor_buffer
from ._lazy import torch_module

if TYPE_CHECKING:
    from .._event import Event
    from .._runtime import Runtime
    from .._stream import Stream

__all__ = ["TorchContext", "context"]

_contexts_lock = threading.Lock()


def context(rt: Runtime) -> TorchContext:
    """The runtime's :class:`TorchContext`, made on first use.

    It is kept as an attribute of the runtime (``_torch_context``), so it lives
    exactly as long as the runtime (a mapping keyed by the runtime would keep
    it alive through the context's streams).
    """
    ctx: TorchContext | None = getattr(rt, "_torch_context", None)
    if ctx is None:
        rt._check_open()
        with _contexts_lock:
            ctx = getattr(rt, "_torch_context", None)
            if ctx is None:
                ctx = TorchContext(rt)
                rt._torch_context = ctx  # type: ignore[attr-defined]
    return ctx


class TorchContext:
    """Per-runtime state of ``streamrt.torch``; see the module docstring."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        #: torch computes on the host (simulator + CPU torch): hand-offs wait on the host.
        self.host_computes = bool(rt.capabilities.is_simulated)
        self._lock = threading.Lock()
        self._wrapped: dict[int, Stream] = {}  # torch stream handle -> wrapped Stream (GPU)
        self._host_stream: Stream | None = None  # the host stand-in (simulator)
        self._join_event: Event | None = None
        self.join_lock = threading.Lock()

    # -- streams --------------------------------------------------------------------------------
    def current_stream(self) -> Stream:
        """torch's current stream as a streamrt Stream (see :func:`streamrt.torch.current_stream`)."""
        if self.host_computes:
            stream = self._host_stream
            if stream is None or stream.is_closed:
                with self._lock:
                    stream = self._host_stream
                    if stream is None or stream.is_closed:
                        stream = self._host_stream = self.rt.create_stream(name="torch-host")
            return stream
        torch = torch_module()
        ts = torch.cuda.current_stream(self.rt.device)
        handle = int(ts.cuda_stream)
        stream = self._wrapped.get(handle)
        if stream is None or stream.is_closed:
            with self._lock:
                stream = self._wrapped.get(handle)
                if stream is None or stream.is_closed:
                    stream = self._wrapped[handle] = self.rt.wrap_stream(ts, name=f"torch-0x{handle:x}" if handle else "torch-default")
        return stream

    def join(self, waiter: Stream, producer: Stream) -> None:
        """Make later work on ``waiter`` wait for the work enqueued so far on ``producer`` (one reused event)."""
        if waiter is producer:
            return
        with self.join_lock:
            ev = self._join_event
            if ev is None:
                ev = self._join_event = self.rt.create_event()
            producer.record(ev)  # a wait binds to the record it saw when enqueued: re-recording is safe
            waiter.wait(ev)

    # -- memory ---------------------------------------------------------------------------------
    def empty(self, nbytes: int, stream: Stream | None) -> tuple[Any, Buffer | None]:
        """A new uint8 device tensor of ``nbytes`` bytes that ``stream`` may write at once.

        Returns ``(tensor, block)``. GPU: ``torch.empty`` on the CUDA device, allocated while
        ``stream`` is torch's current stream (so torch orders its reuse after ``stream``'s
        work); ``block`` is ``None``. Simulator: a device block of ``rt.device_allocator``
        (its Buffer is ``block``) aliased by a CPU tensor; the block is released when the
        tensor's memory is freed (the last view gone), and its reuse then waits for every
        stream noted on it.
        """
        torch = torch_module()
        if not self.host_computes:
            device = torch.device("cuda", self.rt.device)
            if stream is None:
                return torch.empty(nbytes, dtype=torch.uint8, device=device), None
            with torch.cuda.stream(as_torch_stream(stream)):
                return torch.empty(nbytes, dtype=torch.uint8, device=device), None
        block = self.rt.device_allocator.allocate(max(nbytes, 1), stream=stream)
        return alias_block(self.rt, block, nbytes), block

    def device_source(self, tensor: Any) -> tuple[Buffer | None, Buffer | None]:
        """The memory to copy ``tensor`` from, at this point of torch's program order: ``(buffer, temporary)``.

        GPU runtime: the tensor's own memory (torch's later kernels are ordered after the
        copy by the stream), or ``None`` for a tensor in pageable host memory (already on
        the host: read it directly). When torch computes on the host, its later writes are
        not stream-ordered, so the tensor (aliased device memory or plain CPU memory) is
        first copied, on the host, into a ``temporary`` device block: the state the device
        would hold at this point. The caller releases it after enqueueing its copy.
        """
        buf = tensor_buffer(self.rt, tensor)
        if not self.host_computes:
            return (None, None) if buf.kind == PAGEABLE else (buf, None)
        temp = self.rt.device_allocator.allocate(max(buf.nbytes, 1))
        if buf.nbytes:
            ctypes.memmove(temp.ptr, buf.ptr, buf.nbytes)  # simulator device memory is host RAM
        return temp.view(0, buf.nbytes), temp

    def hand_off(self, event: Event, stream: Stream, tensor: Any, block: Buffer | None) -> None:
        """Give a tensor written by work before ``event`` to the consumer on ``stream``.

        ``stream`` waits for ``event`` (device-side); the tensor's memory is marked as used
        by ``stream`` (``record_stream`` / ``note_stream``). When torch computes on the host,
        the host also waits for ``event`` (blocking only if the copy has not landed yet).
        """
        stream.wait(event)
        if block is not None:
            block.note_stream(stream)
        else:
            record_stream(tensor, stream)
        if self.host_computes and not event.is_done:
            event.synchronize()

    def order_host_after(self, work: Completion | Event) -> None:
        """Before torch touches memory that ``work`` (a Completion such as a Run, or an
        Event) still uses: wait for it on the host when torch computes on the host; on a
        GPU runtime nothing (order torch's stream with ``run.join(stream)`` / ``stream.wait``)."""
        if not self.host_computes or work.is_done:
            return
        if isinstance(work, Completion):
            work.wait()
        else:
            work.synchronize()


def alias_block(rt: Runtime, block: Buffer, nbytes: int) -> Any:
    """A uint8 CPU tensor over the first ``nbytes`` bytes of a simulator device ``block``.

    The tensor (and every view of it) keeps the block; when torch frees the
    memory the block is released, on the runtime's releaser thread.
    """
    torch = torch_module()
    raw = (ctypes.c_char * max(nbytes, 1)).from_address(block.ptr)
    arr = np.frombuffer(raw, dtype=np.uint8, count=nbytes)  # type: ignore[call-overload]
    finalizer = weakref.finalize(arr, _release_block, rt, block)
    finalizer.atexit = False  # no backend calls at interpreter exit: the runtime's own exit hook drains
    return torch.from_numpy(arr)


def _release_block(rt: Runtime, block: Buffer) -> None:
    """The aliasing tensor's memory was freed: give the block back (reuse waits for its streams)."""
    if not block.is_released:
        rt.releaser.submit(_release_once, block)


def _release_once(block: Buffer) -> None:
    if not block.is_released:
        block.release()
