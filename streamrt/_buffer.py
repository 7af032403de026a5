"""Buffers: typed views of device, pinned-host and pageable-host memory.

A :class:`Buffer` is what every stream operation takes. It is either handed out
by an allocator (and then returned to it by :meth:`Buffer.release`) or wraps
foreign memory (numpy arrays and other buffer-protocol objects, torch and cupy
tensors through ``__cuda_array_interface__`` or DLPack); a wrapped buffer keeps
the foreign object alive as long as it lives.

Thread rules: a Buffer may be used from any thread; ``release`` must be called
once, by its owner.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, AbstractSet, Any, Callable, Final, TypeVar

import numpy as np

from ._backends.protocol import PointerKind
from ._errors import ClosedError
from ._extensions import hook

if TYPE_CHECKING:
    from ._runtime import Runtime
    from ._stream import Stream

__all__ = ["Buffer", "BufferKind", "DEVICE", "Deallocate", "HOST", "PAGEABLE"]

BufferKind = str
#: An allocator's stream-ordered release: ``deallocate(ptr, nbytes, streams)`` (see :class:`Buffer`).
Deallocate = Callable[[int, int, AbstractSet["Stream"]], None]
_B = TypeVar("_B", bound="Buffer")
DEVICE: Final = "device"
HOST: Final = "host"  # page-locked (pinned) host memory
PAGEABLE: Final = "pageable"  # ordinary host memory; not allowed in async copies

_KIND_OF_POINTER = {
    PointerKind.DEVICE: DEVICE,
    PointerKind.MANAGED: DEVICE,
    PointerKind.HOST: HOST,
    PointerKind.PAGEABLE: PAGEABLE,
}

# DLPack device types (dlpack.h).
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_ROCM, _DL_ROCM_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 10, 11, 13
_NO_STREAMS: frozenset[Any] = frozenset()
_DL_DEVICE_KINDS = {_DL_CUDA: DEVICE, _DL_ROCM: DEVICE, _DL_CUDA_MANAGED: DEVICE, _DL_CUDA_HOST: HOST, _DL_ROCM_HOST: HOST}


class Buffer:
    """A contiguous range of memory: ``ptr``, ``nbytes``, ``kind``.

    ``kind`` is ``"device"``, ``"host"`` (pinned) or ``"pageable"``.
    A Buffer made by an allocator is returned with :meth:`release`; reuse of
    its memory waits until all work that used it on any stream has completed.
    Using a buffer after ``release`` raises ``ValueError``.

    Allocators construct Buffers directly (the allocator seam, ``docs/allocators.md``)::

        Buffer(ptr, nbytes, kind, runtime, deallocate=fn, stream=s)

    ``deallocate(ptr, nbytes, streams)`` is the stream-ordered release: called
    once, by :meth:`release`, with the streams that used the buffer (empty if
    none). The memory may be handed out again for work on any stream once
    every stream in ``streams`` has passed that point, or at once for work
    on the one stream in ``streams``, which runs after it in stream order.
    ``stream``: the stream the buffer is allocated for, noted at once (see
    :meth:`note_stream`). An allocator whose hot path builds buffers without
    ``__init__`` uses :meth:`allocation_type` and :attr:`ALLOCATION_FIELDS`.
    """

    #: The allocator seam's fast construction: the per-buffer fields an allocator's hot path sets
    #: on a new instance of an :meth:`allocation_type` class made without ``__init__`` (with
    #: ``object.__new__``, or ``tp_alloc`` in C, where they are the type's ``__slots__`` member
    #: descriptors), and reads back at release: ``_ptr`` (int), ``_nbytes`` (int), ``_released``
    #: (bool: ``False`` until released), ``_streams`` (``None``, or a set of the Streams that used
    #: the buffer, one set per buffer: streamrt adds to it). Stable names and meanings.
    ALLOCATION_FIELDS: Final = ("_ptr", "_nbytes", "_released", "_streams")

    __slots__ = (
        "_ptr",
        "_nbytes",
        "_kind",
        "_runtime",
        "_base",
        "_offset",
        "_owner",
        "_deallocate",
        "_released",
        "_streams",
        "_readonly",
        "__weakref__",
    )

    def __init__(
        self,
        ptr: int,
        nbytes: int,
        kind: BufferKind,
        runtime: Runtime | None,
        owner: Any = None,
        *,
        deallocate: Deallocate | None = None,
        stream: Stream | None = None,
        readonly: bool = False,
    ) -> None:
        self._ptr = ptr
        self._nbytes = nbytes
        self._kind = kind
        self._runtime = runtime
        self._base: Buffer | None = None
        self._offset = 0
        self._owner = owner
        self._deallocate = deallocate
        self._released = False
        self._streams: set[Stream] | None = None if stream is None else {stream}
        self._readonly = readonly

    @classmethod
    def allocation_type(cls: type[_B], kind: BufferKind, runtime: Runtime, **attributes: Any) -> type[_B]:
        """A subclass of ``cls`` whose buffers share ``kind`` and ``runtime``, for an allocator's hot path.

        Its buffers are never views, own nothing, are writable and have no
        ``deallocate`` hook: those fields are class attributes, so an instance
        made without ``__init__`` is a whole Buffer once its
        :attr:`ALLOCATION_FIELDS` are set. Its :meth:`release` only marks the
        buffer released, so such a class overrides it to hand the block back
        itself, keeping its contract (a second release raises ``ValueError``;
        ``_released`` is set first). ``attributes`` become class attributes
        too; ``cls`` may add slots of its own.
        """
        shared: dict[str, Any] = {
            "__slots__": (),
            "__module__": cls.__module__,
            "_kind": kind,
            "_runtime": runtime,
            "_base": None,
            "_offset": 0,
            "_owner": None,
            "_deallocate": None,
            "_readonly": False,
        }
        shared.update(attributes)
        return type(cls.__name__, (cls,), shared)

    # -- properties ---------------------------------------------------------------
    @property
    def ptr(self) -> int:
        """The address of the first byte (a device address for device buffers)."""
        return self._ptr

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def kind(self) -> BufferKind:
        """``"device"``, ``"host"`` (pinned) or ``"pageable"``."""
        return self._kind

    @property
    def runtime(self) -> Runtime | None:
        return self._runtime

    @property
    def device(self) -> int | None:
        """The device of the buffer's runtime (``None`` without one).

        Device memory lives there; pinned host memory is reachable from every
        device but belongs, like all buffers, to its runtime.
        """
        rt = self._runtime
        return None if rt is None else rt._device

    @property
    def base(self) -> Buffer:
        """The buffer this one is a view of (itself when it is not a view)."""
        return self._base if self._base is not None else self

    @property
    def offset(self) -> int:
        """Byte offset of this view inside :attr:`base`."""
        return self._offset

    @property
    def is_released(self) -> bool:
        root = self._base if self._base is not None else self
        return root._released

    @property
    def readonly(self) -> bool:
        return self._readonly

    @property
    def streams(self) -> AbstractSet[Stream]:
        """Streams that have had work enqueued with this buffer (or its views) since allocation.

        A live read-only view of the set (not a copy): do not mutate it.
        """
        root = self._base if self._base is not None else self
        return root._streams or _NO_STREAMS

    # -- views and host access -------------------------------------------------------
    def view(self, offset: int, nbytes: int | None = None) -> Buffer:
        """A Buffer for ``nbytes`` bytes starting at ``offset``, sharing this buffer's memory and lifetime.

        Views are tracked by their own byte range in pipelines. Releasing goes through the base buffer.
        """
        offset = _check_size(offset, "offset")
        if nbytes is None:
            nbytes = self._nbytes - offset
        nbytes = _check_size(nbytes, "nbytes")
        if offset + nbytes > self._nbytes:
            raise ValueError(f"view [{offset}, {offset + nbytes}) exceeds the buffer's {self._nbytes} bytes")
        root = self._base if self._base is not None else self
        v = Buffer(self._ptr + offset, nbytes, self._kind, self._runtime, owner=root, readonly=self._readonly)
        v._base = root
        v._offset = self._offset + offset
        return v

    def numpy(self, dtype: Any = np.uint8) -> np.ndarray:
        """A numpy array over the buffer's bytes (host and pageable buffers only).

        The array aliases the memory and keeps the Buffer alive: it stays valid
        until the buffer is released (also past ``rt.close()``), and host writes
        race with in-flight stream work that reads the buffer.
        """
        self.check_usable()
        if self._kind == DEVICE:
            raise TypeError("a device buffer has no host view; copy it into a host buffer first (stream.copy(dst=host, src=device))")
        dt = np.dtype(dtype)
        if self._nbytes % dt.itemsize:
            raise ValueError(f"{self._nbytes} bytes is not a whole number of {dt} elements")
        count = self._nbytes // dt.itemsize
        if count == 0:
            return np.empty(0, dtype=dt)
        raw: Any = (ctypes.c_char * self._nbytes).from_address(self._ptr)  # a buffer-protocol object
        raw._buffer = self  # the array (whose base is raw) keeps the buffer, and so its memory, alive
        arr = np.frombuffer(raw, dtype=dt, count=count)
        if self._readonly:
            arr.flags.writeable = False
        return arr

    # -- lifetime ------------------------------------------------------------------------
    def release(self) -> None:
        """Give the memory back to its allocator (foreign buffers: drop the reference).

        Non-blocking. Hands ``(ptr, nbytes, streams)`` to the allocator's
        ``deallocate`` once (the stream-ordered release, see :class:`Buffer`):
        the memory is not reused before every stream that used the buffer
        has passed this point, except by later work on the one stream that
        used it. Releasing twice, or releasing a view, raises ``ValueError``.
        """
        if self._base is not None:
            raise ValueError("release the base buffer, not a view of it (buffer.base.release())")
        if self._released:
            raise ValueError("buffer released twice")
        self._released = True
        deallocate = self._deallocate
        if deallocate is not None:
            self._deallocate = None
            deallocate(self._ptr, self._nbytes, self._streams or _NO_STREAMS)
        if self._owner is not None:
            self._owner = None

    def check_usable(self) -> None:
        """Raise ``ValueError`` if the buffer (or the buffer it views) was released."""
        root = self._base if self._base is not None else self
        if root._released:
            raise ValueError("buffer used after release()")

    def note_stream(self, stream: Stream) -> None:
        """Record that work using this buffer was enqueued on ``stream`` (like torch's ``record_stream``).

        Stream operations do this themselves; call it for work streamrt does
        not see (a torch kernel on a wrapped stream, say) so release waits for it.
        """
        root = self._base if self._base is not None else self
        s = root._streams
        if s is None:
            root._streams = {stream}
        else:
            s.add(stream)

    # -- interop: DLPack and the CUDA array interface (streamrt._interop._memory) -----------------
    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: Any = None) -> Any:
        """A DLPack capsule over the buffer's bytes; the consumer's ``stream`` waits for streamrt's
        work on the buffer, on the device (docs/interop.md). Raises ``BufferError`` where it cannot."""
        export = hook("export_dlpack")
        return export(self, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        """``(device_type, device_id)``: kDLCUDA/kDLROCM device memory, kDLCUDAHost/kDLROCMHost pinned,
        kDLCPU pageable, and kDLCPU for everything on the simulator."""
        return hook("dlpack_device")(self)  # type: ignore[no-any-return]

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3 of the CUDA array interface, for device buffers of GPU runtimes (absent elsewhere)."""
        return hook("cuda_array_interface")(self)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        state = " released" if self.is_released else ""
        return f"<Buffer {self._kind} ptr=0x{self._ptr:x} nbytes={self._nbytes}{state}>"


# -- foreign memory ---------------------------------------------------------------------


def _check_size(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    value = int(value)
    if value < 0:
        raise ValueError(f"{what} must be >= 0, got {value}")
    return value


def check_size(value: Any, what: str) -> int:
    """Validate a byte count or offset: a non-negative int (not bool)."""
    return _check_size(value, what)


def wrap_foreign(obj: Any, runtime: Runtime, nbytes: int | None = None, *, stream: Stream | None = None) -> Buffer:
    """Wrap ``obj`` as a Buffer of ``runtime``; see the module docstring for what is accepted.

    ``nbytes`` limits the buffer to its first ``nbytes`` bytes. ``stream``: the
    consuming stream, ordered after the producer's stream that foreign device
    memory names (``streamrt._interop._memory``); ``None``: nothing is ordered.
    """
    if obj is None:
        raise TypeError("expected a Buffer or an object exposing memory, got None")
    if isinstance(obj, Buffer):
        buf = obj
    elif runtime._closed:
        raise ClosedError(f"{runtime!r} is closed: it cannot take in foreign memory")
    elif hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):  # first: torch orders itself only here
        buf = _from_dlpack(obj, runtime, stream)
    elif hasattr(obj, "__cuda_array_interface__"):
        buf = _from_cuda_array_interface(obj, runtime, stream)
    else:
        buf = _from_buffer_protocol(obj, runtime)
    if nbytes is not None:
        nbytes = _check_size(nbytes, "nbytes")
        if nbytes > buf.nbytes:
            raise ValueError(f"nbytes={nbytes} exceeds the object's {buf.nbytes} bytes")
        if nbytes != buf.nbytes:
            buf = buf.view(0, nbytes)
    return buf


def _contiguous_nbytes(shape: tuple[int, ...], strides: tuple[int, ...] | None, itemsize: int) -> int:
    n = itemsize
    for d in shape:
        n *= d
    if strides is not None and n:
        expected = itemsize
        for d, s in zip(reversed(shape), reversed(strides)):
            if d != 1 and s != expected:
                raise ValueError("only C-contiguous memory can be wrapped as a Buffer; call .contiguous() / np.ascontiguousarray first")
            expected *= d
    return n


def _check_dlpack_device(obj: Any, runtime: Runtime) -> None:
    """Refuse device memory of another device, when ``obj`` says where it lives (``__dlpack_device__``)."""
    device_of = getattr(obj, "__dlpack_device__", None)
    if device_of is None:
        return
    try:
        dev_type, dev_id = device_of()
    except Exception:  # noqa: BLE001 - an object that cannot say: nothing to check
        return
    if dev_type in (_DL_CUDA, _DL_ROCM) and dev_id != runtime.device:
        raise ValueError(
            f"memory on device {dev_id} cannot be used by a runtime on device {runtime.device}: wrap it with the "
            f"runtime of device {dev_id} (rt.as_buffer); stream.copy between the two is a peer copy"
        )


def _from_cuda_array_interface(obj: Any, runtime: Runtime, stream: Stream | None = None) -> Buffer:
    import_cuda_array_interface = hook("import_cuda_array_interface")

    _check_dlpack_device(obj, runtime)
    cai = obj.__cuda_array_interface__
    ptr, readonly = cai["data"]
    itemsize = np.dtype(cai["typestr"]).itemsize
    nbytes = _contiguous_nbytes(tuple(cai["shape"]), cai.get("strides"), itemsize)
    kind = _KIND_OF_POINTER[runtime.backend.pointer_kind(ptr)] if ptr else DEVICE
    import_cuda_array_interface(cai, stream)  # the producer's stream (version 3) before `stream`
    return Buffer(ptr, nbytes, kind, runtime, owner=obj, readonly=bool(readonly))


def _from_dlpack(obj: Any, runtime: Runtime, stream: Stream | None = None) -> Buffer:
    dev_type, dev_id = obj.__dlpack_device__()
    if dev_type == _DL_CPU:
        return _from_buffer_protocol(obj, runtime)
    if dev_type not in _DL_DEVICE_KINDS:
        raise TypeError(f"unsupported DLPack device type {dev_type}")
    if dev_type in (_DL_CUDA, _DL_ROCM) and dev_id != runtime.device:
        raise ValueError(
            f"memory on device {dev_id} cannot be used by a runtime on device {runtime.device}: wrap it with the "
            f"runtime of device {dev_id} (rt.as_buffer); stream.copy between the two is a peer copy"
        )
    import_dlpack = hook("import_dlpack")

    # The producer orders itself before `stream`. The capsule is peeked at, not consumed:
    # its destructor frees the tensor when our reference goes.
    capsule, tensor, readonly = import_dlpack(obj, dev_type, stream)
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    strides = tuple(tensor.strides[i] for i in range(tensor.ndim)) if tensor.strides else None
    itemsize = (tensor.dtype.bits * tensor.dtype.lanes + 7) // 8
    nbytes = _contiguous_nbytes(shape, tuple(s * itemsize for s in strides) if strides else None, itemsize)
    ptr = (tensor.data or 0) + tensor.byte_offset
    return Buffer(ptr, nbytes, _DL_DEVICE_KINDS[dev_type], runtime, owner=(obj, capsule), readonly=readonly)


def _from_buffer_protocol(obj: Any, runtime: Runtime) -> Buffer:
    try:
        view = memoryview(obj)
    except TypeError:
        numpy_method = getattr(obj, "numpy", None)  # e.g. CPU torch tensors
        if numpy_method is None:
            raise TypeError(
                f"{type(obj).__name__} is not a Buffer and exposes no memory "
                "(buffer protocol, __cuda_array_interface__ or DLPack)"
            ) from None
        return _from_buffer_protocol(numpy_method(), runtime)
    if not view.c_contiguous:
        raise ValueError("only C-contiguous memory can be wrapped as a Buffer; use np.ascontiguousarray first")
    nbytes = view.nbytes
    if nbytes == 0:
        ptr = 0
    else:
        arr = np.frombuffer(view, dtype=np.uint8)
        ptr = arr.ctypes.data
    kind = _KIND_OF_POINTER[runtime.backend.pointer_kind(ptr)] if ptr else PAGEABLE
    return Buffer(ptr, nbytes, kind, runtime, owner=(obj, view), readonly=view.readonly)
