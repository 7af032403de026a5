"""``fetch``: a host copy of a tensor, without synchronizing any stream.

``fut = fetch(rt, loss)`` (``rt.fetch(loss)``) enqueues, in this order:

1. on the tensor's stream (torch's current stream; ``stream=`` to choose):
   a device-to-host copy into a pinned staging block from
   ``rt.host_allocator``. It sits in the stream's order, so a later in-place
   update of the tensor (the next step's ``loss``, a replayed graph's static
   output) cannot overtake it;
2. right after it, on the same stream, an event the completion engine
   watches. When the copy has landed, the stream's lane thread copies the
   staging bytes into a new numpy array, resolves the future with it, and
   only then releases the staging block.

The stream carries one small copy and an event record, and never waits for
Python: no host function is enqueued, so no stream stalls on the GIL, and
the enqueue is two backend calls.

Where the tensor lives:

* CUDA tensor: copied as is; if ``stream=`` names another stream than torch's
  current one, that stream first waits for the current one and the tensor
  is recorded on it (``record_stream``).
* CPU tensor on a GPU runtime: already on the host; the future is resolved
  at once with a copy.
* Simulator (CPU torch): CPU torch writes memory on the host, outside any
  stream's order, so the tensor (in simulated device memory or ordinary CPU
  memory) is first copied on the host into a temporary simulated device
  block -- its value at this point of the program, as a GPU stream would see
  it -- and then takes the same path as on a GPU (see :mod:`streamrt.torch._context`).

A streamrt Buffer can be fetched too (``dtype=`` says how to read its
bytes; ``stream=`` is then required: the stream whose work wrote it).

Thread rules: ``fetch`` may be called from any thread; the future is
resolved on a runtime thread (its callbacks run there).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import numpy as np

from .._buffer import PAGEABLE, Buffer
from .._errors import CaptureError
from .._completion import Completion
from .._extensions import provide
from .._stream import Stream
from .._trace_labels import label
from ._context import TorchContext, context
from ._interop import record_stream
from ._lazy import host_dtype, is_tensor, torch_module

if TYPE_CHECKING:
    from .._runtime import Runtime

__all__ = ["FetchFuture", "fetch"]


class FetchFuture(Completion):
    """The outcome of :func:`fetch`: a :class:`~streamrt.Completion` that resolves with a numpy array.

    * ``fut.result()`` blocks until the copy has landed (GIL released) and returns the array
      (a fresh copy the caller owns; bfloat16 tensors come back as float32, exactly);
    * ``await fut`` never blocks the event loop; ``fut.is_done`` never blocks;
    * ``fut.item()`` is ``fut.result().item()``: a Python scalar for one-element tensors.

    ``shape`` and ``dtype`` describe the array it resolves with.
    """

    __slots__ = ("_dtype", "_shape")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        super().__init__()
        self._shape = shape
        self._dtype = dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype of the resulting array."""
        return self._dtype

    def item(self, timeout: float | None = None) -> Any:
        """Wait like :meth:`result`, then return the array's single element as a Python scalar."""
        return self.result(timeout).item()



def _copy_out(raw: np.ndarray, dtype: np.dtype, shape: tuple[int, ...], widen_bf16: bool) -> np.ndarray:
    """Staging bytes -> a new array the caller owns."""
    values = raw.view(dtype) if raw.size else np.empty(0, dtype=dtype)
    if widen_bf16:
        return (values.astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return values.reshape(shape).copy()


def _host_bytes(tensor: Any) -> np.ndarray:
    """The bytes of a contiguous CPU tensor as a uint8 array (no copy; any dtype)."""
    torch = torch_module()
    return tensor.reshape(-1).view(torch.uint8).numpy()


def fetch(rt: Runtime, tensor: Any, stream: Stream | None = None, *, dtype: Any = None) -> FetchFuture:
    """A host copy (numpy) of ``tensor`` as a :class:`FetchFuture`; nothing blocks. See the module docstring.

    Args:
        rt: the runtime.
        tensor: a torch tensor (not necessarily contiguous: ``.contiguous()`` is
            enqueued first when needed), or a streamrt Buffer.
        stream: the stream the device-to-host copy runs on. Default: torch's
            current stream (:func:`~streamrt.torch.current_stream`), the one
            that produced the tensor. Required for a Buffer.
        dtype: for a Buffer, the numpy dtype to read its bytes as (default uint8).

    Raises ``TypeError``/``ValueError`` before anything is enqueued for a wrong
    argument (a tensor of another device, an unsupported dtype, ...).
    """
    rt._check_open()
    if stream is not None:
        _check_stream(rt, stream)
    ctx = context(rt)
    if is_tensor(tensor):
        if dtype is not None:
            raise TypeError("dtype= applies to Buffers; a tensor is read with its own dtype")
        t = tensor.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        np_dtype, widen = host_dtype(t.dtype)
        shape = tuple(int(d) for d in t.shape)
        producer = ctx.current_stream()
        src, temp = ctx.device_source(t)
        if src is None:  # pageable CPU memory next to a GPU: already on the host
            return _resolved(_copy_out(_host_bytes(t), np_dtype, shape, widen), rt)
        try:
            if stream is None:
                stream = producer
            elif stream is not producer:
                ctx.join(stream, producer)
                record_stream(t, stream)
            return _enqueue(rt, ctx, stream, src, np_dtype, shape, widen)
        finally:
            if temp is not None:
                temp.release()  # reuse waits for the copy that reads it
    if isinstance(tensor, Buffer):
        if stream is None:
            raise TypeError("fetching a Buffer needs stream=: the stream whose work wrote it")
        np_dtype = np.dtype(np.uint8 if dtype is None else dtype)
        if tensor.nbytes % np_dtype.itemsize:
            raise ValueError(f"{tensor.nbytes} bytes is not a whole number of {np_dtype} elements")
        shape = (tensor.nbytes // np_dtype.itemsize,)
        if tensor.kind == PAGEABLE:
            return _resolved(_copy_out(tensor.numpy(np.uint8), np_dtype, shape, False), rt)
        return _enqueue(rt, ctx, stream, tensor, np_dtype, shape, False)
    raise TypeError(f"fetch takes a torch tensor or a streamrt Buffer, not {type(tensor).__name__}")


def _enqueue(rt: Runtime, ctx: TorchContext, stream: Stream, src: Buffer, np_dtype: np.dtype, shape: tuple[int, ...], widen: bool) -> FetchFuture:
    """The D2H into staging and the watched event on ``stream``; the future, resolved on the lane."""
    if stream._backend.stream_is_capturing(stream._handle):
        raise CaptureError(f"{stream.name} is capturing: fetch the tensor after the graph is launched, not inside the capture")
    nbytes = src.nbytes
    with label("torch.fetch", None) if rt._tracer is not None else contextlib.nullcontext():
        staging = rt.host_allocator.allocate(max(nbytes, 1))
        try:
            raw = staging.numpy(np.uint8)[:nbytes]
            if nbytes:
                stream.copy(staging, src, nbytes)
            landed = rt._engine.completion_for_stream(stream._handle)
        except BaseException:
            staging.release()  # reused only once the stream has passed what was enqueued
            raise
    fut = FetchFuture(shape, np.dtype(np.float32) if widen else np_dtype)
    fut._notifier = landed._notifier

    def settle(done: Completion) -> None:  # on the stream's lane thread, once the copy has landed
        try:
            exc = done.exception(0)
            if exc is None:
                try:
                    value = _copy_out(raw, np_dtype, shape, widen)
                except BaseException as err:  # noqa: BLE001 - delivered to whoever awaits the future
                    exc = err
            if exc is None:
                fut._set_result(value)
            else:
                fut._log_unretrieved = True
                fut._set_exception(exc)
        finally:
            staging.release()

    landed.add_done_callback(settle)
    return fut


def _resolved(value: np.ndarray, rt: Runtime) -> FetchFuture:
    fut = FetchFuture(tuple(value.shape), value.dtype)
    fut._notifier = rt._engine._notifier
    fut._set_result(value)
    return fut


def _check_stream(rt: Runtime, stream: Any) -> None:
    if not isinstance(stream, Stream):
        raise TypeError(f"stream must be a streamrt Stream (wrap torch streams with streamrt.torch.wrap_stream), not {type(stream).__name__}")
    if stream.runtime is not rt:
        raise ValueError("the stream belongs to another runtime")
    stream._check_open()


provide("fetch", fetch)  # Runtime.fetch
