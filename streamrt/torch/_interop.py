"""torch interop: streams both ways, tensors as Buffers, ``record_stream``, torch-backed allocators.

Streams. :func:`wrap_stream` turns a torch stream into a streamrt
:class:`~streamrt.Stream` (``rt.wrap_stream`` does the work: torch streams
carry ``.cuda_stream``); :func:`as_torch_stream` gives torch a
``torch.cuda.ExternalStream`` over a streamrt stream (or the torch stream it
wraps). :func:`current_stream` is the streamrt Stream on which torch's work is
ordered: torch's current stream on GPU runtimes; on the simulator, where torch
runs on the CPU, a per-runtime stream that stands for the host (see
:mod:`streamrt.torch._context`).

Tensors. :func:`tensor_buffer` wraps a contiguous tensor's memory as a
Buffer of the runtime without a copy (any dtype, bfloat16 included): CUDA
tensors are device memory; CPU tensors are pinned, pageable, or -- on the
simulator -- device memory, as the backend reports for their address.

Caching allocator. torch's allocator reuses a freed block on the stream it
was allocated on without waiting for other streams. When streamrt enqueues
work on a torch CUDA tensor on another stream, :func:`record_stream` tells
torch (``tensor.record_stream``), so the memory is not reused before that
work has run; :func:`fetch <streamrt.torch.fetch>` and the
:class:`~streamrt.torch.Prefetcher` do it themselves.

Thread rules: everything here may be called from any thread.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._buffer import DEVICE, PAGEABLE, Buffer
from .._event import Event
from .._extensions import provide
from .._stream import Stream
from ._context import context
from ._lazy import is_tensor, torch_module

if TYPE_CHECKING:
    from .._allocator import Allocator
    from .._runtime import Runtime

__all__ = [
    "as_torch_stream",
    "current_stream",
    "device_empty",
    "order_after",
    "record_stream",
    "tensor_buffer",
    "torch_allocators",
    "wrap_stream",
]

_KIND_OF_POINTER = {"device": DEVICE, "managed": DEVICE, "host": "host", "pageable": PAGEABLE}

# Stream -> the torch.cuda.ExternalStream made for it (one per streamrt stream).
_external: weakref.WeakKeyDictionary[Stream, Any] = weakref.WeakKeyDictionary()


def wrap_stream(rt: Runtime, torch_stream: Any, *, name: str | None = None) -> Stream:
    """A streamrt Stream over ``torch_stream`` (a ``torch.cuda.Stream``/``ExternalStream``).

    streamrt never destroys it; the Stream keeps the torch object alive.
    ``as_torch_stream`` of the result returns ``torch_stream`` itself.
    """
    if not hasattr(torch_stream, "cuda_stream"):
        raise TypeError(f"expected a torch CUDA stream, got {type(torch_stream).__name__}")
    device = getattr(torch_stream, "device", None)
    index = getattr(device, "index", None)
    if index is not None and index != rt.device:
        raise ValueError(f"the torch stream is on device {index}, the runtime on device {rt.device}")
    return rt.wrap_stream(torch_stream, name=name)


def as_torch_stream(stream: Stream) -> Any:
    """The torch stream for a streamrt ``stream``: the torch stream it wraps, else a
    ``torch.cuda.ExternalStream`` over its handle (made once per stream).

    Use it with ``torch.cuda.stream(...)`` to put torch work on a streamrt stream,
    or with ``tensor.record_stream``. Raises ``TypeError`` on the simulator (its
    streams are not CUDA streams) and ``RuntimeError`` when torch has no GPU.
    The streamrt stream must outlive the torch object's use.
    """
    if not isinstance(stream, Stream):
        raise TypeError(f"as_torch_stream takes a streamrt Stream, not {type(stream).__name__}")
    stream._check_open()
    got = _external.get(stream)
    if got is not None:
        return got
    rt = stream.runtime
    if rt.capabilities.is_simulated:
        raise TypeError("a simulator stream has no torch counterpart: torch runs on the CPU next to the simulator")
    torch = torch_module()
    if not torch.cuda.is_available():
        raise RuntimeError("torch has no CUDA/ROCm device: install a GPU build of torch to share streams with it")
    foreign = stream._foreign
    if foreign is not None and isinstance(foreign, torch.cuda.Stream):
        ts = foreign
    else:
        ts = torch.cuda.ExternalStream(stream.handle, device=torch.device("cuda", rt.device))
    _external[stream] = ts
    return ts


def current_stream(rt: Runtime) -> Stream:
    """The streamrt Stream on which torch's work is ordered now.

    GPU runtimes: torch's current stream on the runtime's device, wrapped (one
    Stream per torch stream, cached). Simulator: the runtime's host stand-in
    stream (torch runs on the CPU, in program order).
    """
    return (rt._torch_context or context(rt)).current_stream()


def tensor_buffer(rt: Runtime, tensor: Any) -> Buffer:
    """The memory of a contiguous torch ``tensor`` as a Buffer of ``rt`` (no copy; keeps the tensor alive).

    Any dtype works (bfloat16 too: the Buffer is bytes). Raises ``ValueError``
    for a non-contiguous tensor, a CUDA tensor on another device or on a
    simulator runtime, and ``TypeError`` for other tensor devices (meta, mps, ...).
    """
    if not is_tensor(tensor):
        raise TypeError(f"expected a torch tensor, got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError("only contiguous tensors can be used as Buffers; call .contiguous() first")
    ptr = tensor.data_ptr()
    if tensor.is_cuda:  # (is_cuda and get_device: a tenth of what tensor.device.type costs)
        if rt._capabilities.is_simulated:
            raise ValueError("a CUDA tensor cannot be used by a simulator runtime; use CPU tensors with the simulator")
        if tensor.get_device() != rt._device:
            raise ValueError(f"the tensor is on cuda:{tensor.get_device()}, the runtime on device {rt._device}")
        kind = DEVICE
    elif tensor.is_cpu:
        kind = _KIND_OF_POINTER[rt._base_backend.pointer_kind(ptr).value] if ptr else PAGEABLE
    else:
        raise TypeError(f"tensors on {tensor.device.type!r} cannot be used as streamrt Buffers")
    return Buffer(ptr, tensor.nbytes, kind, rt, owner=tensor)


def record_stream(tensor: Any, stream: Stream) -> None:
    """Tell torch's caching allocator that work on ``stream`` uses ``tensor`` (``tensor.record_stream``).

    torch then does not reuse the tensor's memory, once freed, before the work
    enqueued on ``stream`` so far has completed. A no-op for CPU tensors and for
    memory torch's allocator does not own; cheap when ``stream`` is the tensor's
    allocation stream. Call it for every stream other than the allocation
    stream that streamrt work touching the tensor runs on.
    """
    if is_tensor(tensor) and tensor.is_cuda:
        tensor.record_stream(as_torch_stream(stream))


def torch_allocators(**options: Any) -> Callable[[Runtime, str], Allocator]:
    """A ``(runtime, kind) -> Allocator`` factory whose blocks come from torch's allocators.

    For ``open_runtime(host_allocator=..., device_allocator=...)``: the
    caching allocators of the ``allocators`` package over
    :class:`allocators.TorchSource` (pinned host blocks from torch's pinned
    allocator; device blocks from torch's CUDA caching allocator, so streamrt
    and torch share one memory budget). On the simulator device memory stays
    the simulator's (torch cannot allocate it). ``options`` go to the
    allocators (``max_cached_bytes``, ``max_total_bytes``, ``debug``, ...).
    """

    def make(runtime: Runtime, kind: str) -> Allocator:
        import allocators

        source = None
        if kind == "host" or not runtime.capabilities.is_simulated:
            source = allocators.TorchSource(runtime, kind)
        cls = allocators.CachingPinnedAllocator if kind == "host" else allocators.CachingDeviceAllocator
        return cls(runtime, source, **options)

    return make


def device_empty(rt: Runtime, shape: Any, dtype: Any = None, *, stream: Stream | None = None) -> Any:
    """An uninitialized tensor in ``rt``'s device memory, usable by torch and by streamrt.

    GPU runtimes: ``torch.empty(shape, dtype=dtype, device="cuda:<rt.device>")``
    (allocated with ``stream`` as torch's current stream when given, so
    streamrt work on ``stream`` may use it at once). Simulator: a CPU tensor
    aliasing a simulator device block (see :mod:`streamrt.torch._context`);
    the block returns to ``rt.device_allocator`` when the tensor's memory is
    freed, and the tensor must not be used after the runtime is closed.
    ``dtype`` defaults to ``torch.float32``.
    """
    torch = torch_module()
    dtype = torch.float32 if dtype is None else dtype
    shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
    numel = 1
    for d in shape:
        numel *= d
    raw, _block = context(rt).empty(numel * dtype.itemsize, stream)
    return raw.view(dtype).view(shape)


def order_after(rt: Runtime, work: Any, stream: Stream | None = None) -> None:
    """Make torch's later work on ``stream`` (default: torch's current stream) wait for ``work``.

    ``work`` is a pipeline :class:`~streamrt.Run` (or anything with ``join(stream)``)
    or an :class:`~streamrt.Event`. On a GPU runtime the wait is on the device
    (the host never blocks). When torch computes on the host (the simulator
    with CPU torch), the host waits for ``work`` (a no-op if it is done).
    """
    ctx = rt._torch_context or context(rt)
    s = ctx.current_stream() if stream is None else stream
    if isinstance(work, Event):
        s.wait(work)
    else:
        join = getattr(work, "join", None)
        if not callable(join):
            raise TypeError(f"order_after takes a Run (anything with join(stream)) or an Event, not {type(work).__name__}")
        join(s)
    if ctx.host_computes:  # (on a GPU runtime the wait above is all: no call)
        ctx.order_host_after(work)


provide("as_torch_stream", as_torch_stream)  # a foreign wait on a torch.distributed Work (streamrt._interop)
