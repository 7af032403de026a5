"""How torch tensors map onto one runtime's memory and streams: one :class:`TorchContext` per runtime.

Two pairings exist, chosen once per runtime by its capabilities (never by backend name),
each a variant of :class:`TorchContext` behind the same methods:

* **GPU runtime + CUDA/ROCm torch** (:class:`~._device_torch.DeviceTorch`). Device tensors
  are torch CUDA tensors (``torch.empty(..., device="cuda")``); torch's work runs on torch's
  current stream, which :meth:`TorchContext.current_stream` wraps. A batch is handed to a
  consumer by making the consumer's stream wait for the batch's event (device-side, the
  host never waits) and recording the consumer's stream on the memory (``record_stream``).
* **Simulator + CPU torch** (CI; :class:`~._host_torch.HostTorch`). The simulated device
  keeps its memory in host RAM (``capabilities.is_simulated``), so "device tensors" are CPU
  tensors that *alias* simulator device blocks from ``rt.device_allocator``: the
  simulator's copies move the bytes, CPU torch computes on them in place, as a GPU's
  kernels would. torch runs on the host, in program order, so the host itself is torch's
  "stream": :meth:`current_stream` is a per-runtime stream that stands for it, and a
  hand-off waits for the batch's event on the host (CPU torch cannot wait any other way;
  with prefetch depth >= 2 the copy has normally landed long before). A tensor that
  streamrt copies *from* (a fetch) is first copied on the host into a temporary simulated
  device block (:meth:`fetch_source`): the device-side state at that point of torch's
  program order, which torch's later in-place writes on the host cannot overtake (on a
  GPU the stream orders them).

The same classes (``fetch``, ``Prefetcher``, ``MetricsLogger``) run on both, through the
same stream operations, events and allocators.

Thread rules: a context may be used from any thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._backends.protocol import MemcpyKind
from .._completion import Completion

if TYPE_CHECKING:
    from .._buffer import Buffer
    from .._event import Event
    from .._runtime import Runtime
    from .._stream import Stream

__all__ = ["TorchContext", "context"]

_contexts_lock = threading.Lock()


def context(rt: Runtime) -> TorchContext:
    """The runtime's :class:`TorchContext`, made on first use (the variant its capabilities call for).

    It is kept as an attribute of the runtime (``_torch_context``), so it lives
    exactly as long as the runtime (a mapping keyed by the runtime would keep
    it alive through the context's streams).
    """
    ctx: TorchContext | None = rt._torch_context
    if ctx is None:
        rt._check_open()
        with _contexts_lock:
            ctx = rt._torch_context
            if ctx is None:
                if rt.capabilities.is_simulated:
                    from ._host_torch import HostTorch as variant
                else:
                    from ._device_torch import DeviceTorch as variant  # type: ignore[assignment]
                ctx = rt._torch_context = variant(rt)
    return ctx


class TorchContext:
    """Per-runtime state of ``streamrt.torch``; see the module docstring for the two variants."""

    #: torch computes on the host (simulator + CPU torch): hand-offs wait on the host.
    host_computes = False
    #: ``passes_through(leaf)``: a tensor leaf already in the runtime's device memory (a Prefetcher
    #: hands it on as it is).
    passes_through: Callable[[Any], bool]

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._lock = threading.Lock()
        self._join_event: Event | None = None
        self.join_lock = threading.Lock()
        self._idle_events: list[Event] = []  # events the helpers record and give back (take_event)

    # -- the variant's part ---------------------------------------------------------------------
    def current_stream(self) -> Stream:
        """torch's current stream as a streamrt Stream (see :func:`streamrt.torch.current_stream`)."""
        raise NotImplementedError

    def empty(self, nbytes: int, stream: Stream | None) -> tuple[Any, Buffer | None]:
        """A new uint8 device tensor of ``nbytes`` bytes that ``stream`` may write at once: ``(tensor, block)``.

        GPU: ``torch.empty`` on the CUDA device, allocated while ``stream`` is torch's current
        stream (so torch orders its reuse after ``stream``'s work); ``block`` is ``None``.
        Simulator: a device block of ``rt.device_allocator`` (its Buffer is ``block``) aliased
        by a CPU tensor; the block is released when the tensor's memory is freed (the last
        view gone), and its reuse then waits for every stream noted on it.
        """
        raise NotImplementedError

    def device_block(self, nbytes: int, stream: Stream) -> tuple[Any, int, Buffer | None]:
        """:meth:`empty` for a copy on ``stream`` to write: ``(tensor, its address, block)``."""
        raise NotImplementedError

    def fetch_source(self, tensor: Any) -> tuple[int, MemcpyKind, Buffer | None] | None:
        """Where to copy a contiguous ``tensor`` from, at this point of torch's program order:
        ``(address, copy kind, temporary)``, or ``None`` for pageable host memory (read it directly).

        GPU runtime: the tensor's own memory (torch's later kernels are ordered after the copy by
        the stream). When torch computes on the host, its later writes are not stream-ordered, so
        the tensor is first copied, on the host, into a ``temporary`` device block: the state the
        device would hold at this point; the caller releases it after enqueueing its copy (noting
        the copy's stream on it). Raises ``ValueError``/``TypeError`` for a tensor of another device.
        """
        raise NotImplementedError

    def check_tensor(self, tensor: Any) -> None:
        """Raise as :meth:`fetch_source` would for a tensor this runtime cannot copy out, doing nothing else."""
        if not tensor.is_cpu:  # both variants refuse these before any side effect; CPU tensors all pass
            self.fetch_source(tensor)

    def release_source(self, temporary: Buffer, stream: Stream) -> None:
        """Release a :meth:`fetch_source` temporary once a copy from it is enqueued on ``stream``
        (or failed to be): it is reused once ``stream`` has passed the copy."""
        raise NotImplementedError  # only a variant that makes temporaries has them

    def hand_off(self, event: Event, stream: Stream, block: Buffer | None) -> bool:
        """Give memory written by work before ``event`` (a :meth:`device_block`) to the consumer on ``stream``.

        ``stream`` waits for ``event`` (device-side). When torch computes on the host, the host
        also waits for ``event`` (blocking only if the copy has not landed yet) and ``block`` is
        marked as used by ``stream``. Returns whether the host waited.
        """
        raise NotImplementedError

    def let_go(self, tensor: Any, stream: Stream | None) -> None:
        """The caller drops its reference to a :meth:`device_block` tensor that was handed to ``stream``
        (``None``: to nobody): torch reuses the memory only after the work enqueued on ``stream``
        so far (GPU: ``record_stream``; after a closed stream, once the device is idle)."""
        raise NotImplementedError

    def order_host_after(self, work: Completion | Event) -> None:
        """Before torch touches memory that ``work`` (a Completion such as a Run, or an Event)
        still uses: wait for it on the host when torch computes on the host; on a GPU runtime
        nothing (order torch's stream with ``run.join(stream)`` / ``stream.wait``)."""
        if not self.host_computes or work.is_done:
            return
        if isinstance(work, Completion):
            work.wait()
        else:
            work.synchronize()

    # -- shared ---------------------------------------------------------------------------------
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

    def take_event(self) -> Event:
        """An idle event of the runtime to record (give it back with :meth:`give_event`)."""
        try:
            return self._idle_events.pop()
        except IndexError:
            return self.rt.create_event()

    def give_event(self, event: Event) -> None:
        """Give back an event of :meth:`take_event` once nothing waits on or queries its last record.
        Any thread (a list append); the idle events are as many as were ever in use at once."""
        self._idle_events.append(event)
