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
Python: no host function is enqueued, so no stream stalls on the GIL. The
calling thread makes three backend calls (a capture check, the copy, the
record) and takes the staging block on the allocator's fast path: nothing
but the copy uses it, and it is released only once the copy has landed.

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

from typing import TYPE_CHECKING, Any

import numpy as np

from .._backends.protocol import MemcpyKind
from .._buffer import DEVICE, PAGEABLE, Buffer
from .._completion import Completion
from .._errors import CaptureError
from .._extensions import provide
from .._stream import Stream
from .._trace_labels import label
from ._context import TorchContext, context
from ._interop import record_stream
from ._lazy import host_dtype, is_tensor, torch_module

if TYPE_CHECKING:
    from .._event import Event
    from .._runtime import Runtime

__all__ = ["FetchFuture", "HostCopy", "Source", "copy_source", "enqueue_copy", "fetch"]

_FLOAT32 = np.dtype(np.float32)

_H2H = MemcpyKind.HOST_TO_HOST
D2H = MemcpyKind.DEVICE_TO_HOST


class FetchFuture(Completion):
    """The outcome of :func:`fetch`: a :class:`~streamrt.Completion` that resolves with a numpy array.

    * ``fut.result()`` blocks until the copy has landed (GIL released) and returns the array
      (a fresh copy the caller owns; bfloat16 tensors come back as float32, exactly);
    * ``await fut`` never blocks the event loop; ``fut.is_done`` never blocks;
    * ``fut.item()`` is ``fut.result().item()``: a Python scalar for one-element tensors.

    ``shape`` and ``dtype`` describe the array it resolves with.
    """

    __slots__ = ("_copy", "_ctx", "_dtype", "_shape", "_watched")

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        super().__init__()
        self._shape = shape
        self._dtype = dtype
        self._copy: HostCopy | None = None  # the copy in flight, until it landed
        self._ctx: TorchContext | None = None
        self._watched: Event | None = None  # the event recorded after the copy

    @property
    def is_done(self) -> bool:
        """``True`` once the array is ready. Never blocks.

        While the copy has not landed this is one event query of the copy's own event; once it
        has, its lane's complete work is retired on the calling thread (as
        :attr:`Completion.is_done`), this future with it.
        """
        if not self._done:
            event = self._watched  # (None once landed: the lane thread may be resolving it now)
            if event is not None:
                rt = event._runtime
                try:
                    if not rt._closed and not rt._base_backend.event_query(event._handle):
                        return False  # (a spurious False, should the event be reused meanwhile, only delays this)
                except Exception:  # noqa: BLE001 - the lane reports a failed wait; its poll below is safe
                    pass
            for lane in self._lanes:
                lane.poll()
        return self._done

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

    def _landed(self, error: BaseException | None) -> None:
        """On the stream's lane thread, once the copy has landed (or waiting for it failed)."""
        got, ctx, event = self._copy, self._ctx, self._watched
        self._copy = self._ctx = self._watched = None
        assert got is not None and ctx is not None and event is not None
        landed = error is None
        try:
            if landed:
                try:
                    value = got.value()
                except BaseException as err:  # noqa: BLE001 - delivered to whoever awaits the future
                    error = err
            if error is None:
                self._set_result(value)
            else:
                self._log_unretrieved = True
                self._set_exception(error)
        finally:
            got.release(landed)
            if landed:
                ctx.give_event(event)  # (after a failed wait the event is left alone)


class HostCopy:
    """A device-to-host copy of ``source`` (:func:`copy_source`) into a new pinned staging block of
    ``rt.host_allocator``, which only this copy uses; :func:`enqueue_copy` enqueues it.

    Its owner watches for it to land (an event recorded after it), then reads :meth:`value`
    and calls :meth:`release`; or calls ``release(False)`` at once to drop it, whereupon the
    allocator reuses the block only once the stream has passed the copy.
    """

    __slots__ = ("dtype", "nbytes", "result_dtype", "shape", "staging", "stream", "widen")

    def __init__(self, rt: Runtime, source: Source) -> None:
        _, _, nbytes, dtype, self.shape, widen, self.stream, _ = source
        self.dtype = dtype  # of the bytes
        self.widen = widen
        self.result_dtype = _FLOAT32 if widen else dtype  # of the value (bfloat16 bits widen to float32)
        self.nbytes = nbytes
        self.staging = rt._host_allocator.allocate(nbytes or 1)

    def value(self) -> np.ndarray:
        """The landed bytes as a new array the caller owns."""
        raw = self.staging.numpy(np.uint8)[: self.nbytes]
        return _copy_out(raw, self.dtype, self.shape, self.widen)

    def release(self, landed: bool) -> None:
        """Give the staging back: at once when the copy has ``landed``, else once the stream has passed it."""
        if not landed:
            self.staging.note_stream(self.stream)
        self.staging.release()


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
    argument (a tensor of another device, an unsupported dtype, ...), and
    ``CaptureError`` on a stream that is capturing.
    """
    ctx = rt._torch_context  # (context()'s fast path, inline)
    if ctx is None:
        ctx = context(rt)
    source = copy_source(rt, ctx, tensor, stream, dtype)
    if isinstance(source, np.ndarray):
        return _resolved(source, rt)
    stream, temp = source[6], source[7]
    got = HostCopy(rt, source)
    fut = FetchFuture(got.shape, got.result_dtype)
    engine = rt._engine
    fut._notifier = engine._notifier
    fut._lanes = (stream._lane,)  # an await polls the stream's lane
    event = ctx.take_event()
    fut._copy, fut._ctx, fut._watched = got, ctx, event
    try:  # the copy and the watched record (one native call on cuda and hip)
        engine.record_and_watch(event._handle, stream._handle, fut._landed, enqueue_copy, (rt, got, source, event))
    except BaseException:  # nothing watched: the copy may still run
        fut._copy = fut._ctx = fut._watched = None
        got.release(False)
        ctx.give_event(event)
        raise
    finally:
        if temp is not None:
            ctx.release_source(temp, stream)
    return fut


#: What a copy to the host reads, checked (:func:`copy_source`): ``(address, kind, nbytes, dtype of the
#: bytes, shape, whether bfloat16 bits widen to float32, stream, simulator temporary or None)``.
Source = tuple[int, MemcpyKind, int, np.dtype, tuple[int, ...], bool, Stream, Buffer | None]


def enqueue_copy(rt: Runtime, got: HostCopy, source: Source, event: Event) -> None:
    """Enqueue ``source``'s copy into ``got``'s staging, then ``event``'s record (``Stream._copy_record_raw``).

    Raises ``CaptureError`` on a capturing stream (nothing enqueued), else the backend's error; the caller
    then releases ``got`` with ``release(False)``. For :func:`fetch` and ``MetricsLogger``."""
    stream = source[6]
    if rt._tracer is not None:
        with label("torch.fetch", None):
            recorded = stream._copy_record_raw(got.staging._ptr, source[0], source[2], source[1], event)
    else:
        recorded = stream._copy_record_raw(got.staging._ptr, source[0], source[2], source[1], event)
    if not recorded:
        raise CaptureError(f"{stream.name} is capturing: fetch the tensor after the graph is launched, not inside the capture")


def copy_source(rt: Runtime, ctx: TorchContext, value: Any, stream: Stream | None, dtype: Any) -> Source | np.ndarray:
    """Check ``value`` (a tensor, or a Buffer with ``stream``) and say what its copy to the host reads, or
    return the array itself when it is already in pageable host memory. Raises ``TypeError``,
    ``ValueError`` or ``ClosedError`` with nothing enqueued."""
    if rt._closed:
        rt._check_open()
    if stream is not None:
        _check_stream(rt, stream)
    temp: Buffer | None = None
    if is_tensor(value):
        if dtype is not None:
            raise TypeError("dtype= applies to Buffers; a tensor is read with its own dtype")
        np_dtype, widen = host_dtype(value.dtype)
        t = value if value.is_contiguous() else value.detach().contiguous()
        shape = tuple(t.shape)
        source = ctx.fetch_source(t)
        if source is None:  # pageable CPU memory next to a GPU: already on the host
            return _copy_out(_host_bytes(t), np_dtype, shape, widen)
        src, kind, temp = source
        nbytes = t.nbytes
        producer = ctx.current_stream()
        if stream is None:
            stream = producer
        elif stream is not producer:
            ctx.join(stream, producer)
            record_stream(t, stream)
    elif isinstance(value, Buffer):
        if stream is None:
            raise TypeError("fetching a Buffer needs stream=: the stream whose work wrote it")
        np_dtype, widen = np.dtype(np.uint8 if dtype is None else dtype), False
        nbytes = value.nbytes
        if nbytes % np_dtype.itemsize:
            raise ValueError(f"{nbytes} bytes is not a whole number of {np_dtype} elements")
        if value.runtime is not rt:
            raise ValueError("the buffer belongs to another runtime")
        value.check_usable()
        shape = (nbytes // np_dtype.itemsize,)
        if value.kind == PAGEABLE:
            return _copy_out(value.numpy(np.uint8), np_dtype, shape, False)
        src, kind = value.ptr, (D2H if value.kind == DEVICE else _H2H)
        value.note_stream(stream)  # its release waits for the copy
    else:
        raise TypeError(f"fetch takes a torch tensor or a streamrt Buffer, not {type(value).__name__}")
    return src, kind, nbytes, np_dtype, shape, widen, stream, temp


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
