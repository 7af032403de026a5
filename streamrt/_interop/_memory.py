"""Memory across libraries: Buffers exported as DLPack and the CUDA array interface, foreign memory taken in.

Export (``Buffer.__dlpack__``, ``__dlpack_device__``, ``__cuda_array_interface__``):

* Device buffers are ``kDLCUDA`` / ``kDLROCM`` memory of the runtime's device,
  host buffers (pinned or pageable) ``kDLCPU``, as torch and numpy accept
  (``torch.from_dlpack`` refuses ``kDLCUDAHost``). On the simulator, whose device memory is host RAM, every buffer
  is ``kDLCPU``: ``np.from_dlpack(buf)`` and ``torch.from_dlpack(buf)`` run in CI.
* ``__dlpack__(stream=s)``: the consumer's stream ``s`` waits, on the device,
  for the work streamrt has enqueued so far with the buffer: an event is
  recorded on each open stream in ``buffer.streams`` and ``s`` waits on it.
  ``stream=None`` means the legacy default stream for device memory (as the
  DLPack standard says) and no ordering for host-visible memory, whose
  consumer is the host: like ``Buffer.numpy()``, order the host after the
  work first (await it, synchronize, or read it in a host function).
  ``stream=-1``: no ordering. Never a host synchronization.
* ``max_version >= (1, 0)`` gives a versioned capsule (``DLManagedTensorVersioned``,
  read-only buffers flagged), anything else the legacy one (a read-only
  buffer then raises ``BufferError``: legacy DLPack cannot say read-only).
  The capsule is made by numpy over the buffer's bytes (a ``uint8`` vector),
  so its destructor and deleter are numpy's native ones; the device field is
  then set to the buffer's device. It keeps the Buffer object alive until the
  consumer's deleter runs. An allocator's Buffer must not be released while
  a consumer still uses its memory.
* ``__cuda_array_interface__`` (version 3; device buffers of GPU runtimes
  only: on the simulator and for host buffers the attribute does not exist):
  ``stream`` is the one stream with streamrt work on the buffer, or, when
  there are several, the runtime's ``interop`` stream made to wait for all of
  them; ``None`` when no streamrt work used it.

Import (``wrap_foreign`` with the consuming stream, i.e. a stream operation
given the object, or ``rt.as_buffer(obj, stream=s)``): the CUDA array
interface's ``stream`` (version 3) is honoured by making the consuming
stream wait for an event recorded on the producer's stream; DLPack producers
are called with ``__dlpack__(stream=<consuming stream>)`` so they order
themselves. Both happen when the object is wrapped, on the device, without
blocking the host. Without a consuming stream (``rt.as_buffer(obj)``,
pipeline nodes, kernel arguments) nothing is ordered.
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from .._buffer import DEVICE, Buffer
from .._errors import ClosedError
from ._events import order_after_foreign_stream

if TYPE_CHECKING:
    from .._runtime import Runtime
    from .._stream import Stream

__all__ = [
    "DLManagedTensorVersioned",
    "DLTensor",
    "cuda_array_interface",
    "dlpack_device",
    "export_dlpack",
    "import_cuda_array_interface",
    "import_dlpack",
]

# DLPack device types (dlpack.h).
DL_CPU, DL_CUDA, DL_ROCM = 1, 2, 10
_GPU_TYPES = (DL_CUDA, DL_ROCM)
_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
_VERSIONED = b"dltensor_versioned"
_LEGACY = b"dltensor"


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


# Private function objects (their argtypes are ours, not shared with ctypes.pythonapi's users).
_api = ctypes.PyDLL(ctypes.pythonapi._name, handle=ctypes.pythonapi._handle)
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _tensor_of(capsule: Any) -> tuple[DLTensor, bool]:
    """The DLTensor inside an unconsumed DLPack capsule (a view into it) and its read-only flag."""
    if _api.PyCapsule_IsValid(capsule, _VERSIONED):
        managed = DLManagedTensorVersioned.from_address(_api.PyCapsule_GetPointer(capsule, _VERSIONED))
        return managed.dl_tensor, bool(managed.flags & _READ_ONLY)
    return DLTensor.from_address(_api.PyCapsule_GetPointer(capsule, _LEGACY)), False


# -- export -------------------------------------------------------------------------------------


def dlpack_device(buf: Buffer) -> tuple[int, int]:
    """``(device_type, device_id)`` of ``buf`` in DLPack's terms (see the module docstring)."""
    buf.check_usable()
    if buf.kind == DEVICE:
        rt = buf.runtime
        if rt is None:
            raise BufferError("a device Buffer without a runtime cannot say where it lives")
        gpu = rt.capabilities.dlpack_device_type
        return (gpu, rt.device) if gpu in _GPU_TYPES else (DL_CPU, 0)
    return (DL_CPU, 0)  # host memory, pinned or not


def _consumer_handle(device_type: int, stream: Any) -> int | None:
    """The raw handle of the consumer's stream given to ``__dlpack__`` (``None``: nothing to order)."""
    if stream is None:
        return 0 if device_type in _GPU_TYPES else None  # the legacy default stream; a host consumer
    if isinstance(stream, bool) or not isinstance(stream, int) or stream < -1:
        raise TypeError(f"__dlpack__ stream must be None or an int >= -1 (a stream handle), not {stream!r}")
    if stream == -1:
        return None
    if device_type == DL_CUDA:
        if stream == 0:
            raise BufferError("stream=0 is ambiguous on CUDA (DLPack): pass 1 for the legacy default stream, 2 for the per-thread one")
        return 0 if stream == 1 else stream
    return stream


def _order_consumer(buf: Buffer, consumer: int) -> None:
    """The stream ``consumer`` waits for the streamrt work enqueued so far with ``buf``. Non-blocking."""
    for s in list(buf.streams):
        if s.is_closed or s.handle == consumer:
            continue
        try:
            event = s.record()
        except ClosedError:  # closed meanwhile by another thread
            continue
        try:
            s.runtime.backend.stream_wait_event(consumer, event.handle)
        finally:
            event.close()


def _numpy_view(buf: Buffer) -> np.ndarray:
    """A uint8 array over ``buf``'s bytes that keeps ``buf`` alive; never read here (device memory too)."""
    raw: Any = (ctypes.c_char * buf.nbytes).from_address(buf.ptr)
    raw._buffer = buf
    arr = np.frombuffer(raw, dtype=np.uint8)
    if buf.readonly:
        arr.flags.writeable = False
    return arr


def export_dlpack(buf: Buffer, *, stream: Any = None, max_version: Any = None, dl_device: Any = None, copy: Any = None) -> Any:
    """``Buffer.__dlpack__``: a DLPack capsule over ``buf`` (see the module docstring).

    Raises ``BufferError`` for ``copy=True`` (streamrt exports without
    copying), a ``dl_device`` other than the buffer's, ``stream=0`` on CUDA,
    and a read-only buffer asked for the legacy capsule.
    """
    device = dlpack_device(buf)
    if dl_device is not None and tuple(dl_device) != device:
        raise BufferError(f"the buffer lives on DLPack device {device}, not {tuple(dl_device)}; streamrt exports without copying")
    if copy:
        raise BufferError("streamrt exports its memory without copying (copy=True is not supported)")
    consumer = _consumer_handle(device[0], stream)
    arr = _numpy_view(buf)
    if max_version is None or tuple(max_version) < (1, 0):
        capsule = arr.__dlpack__()
    else:
        try:
            capsule = arr.__dlpack__(max_version=tuple(max_version))
        except TypeError:  # numpy < 2.1 makes only the legacy capsule, which the standard allows here
            capsule = arr.__dlpack__()
    if device[0] != DL_CPU:
        tensor, _ = _tensor_of(capsule)
        tensor.device.device_type, tensor.device.device_id = device
    if consumer is not None:
        _order_consumer(buf, consumer)
    return capsule


_join_lock = threading.Lock()
_JOIN_ATTR = "_interop_join_stream"  # kept on the runtime: a registry here would keep closed runtimes alive


def _join_stream(rt: Runtime) -> Stream:
    """The runtime's ``interop`` stream (made on first use): it joins several streams into one to name.
    Closed with the runtime, like its other streams."""
    with _join_lock:
        stream: Stream | None = getattr(rt, _JOIN_ATTR, None)
        if stream is None or stream.is_closed:
            stream = rt.create_stream(name="interop")
            setattr(rt, _JOIN_ATTR, stream)
        return stream


def cuda_array_interface(buf: Buffer) -> dict[str, Any]:
    """``Buffer.__cuda_array_interface__`` (version 3, bytes); ``AttributeError`` where it does not apply."""
    rt = buf.runtime
    if buf.kind != DEVICE or rt is None or rt.capabilities.dlpack_device_type not in _GPU_TYPES:
        where = "on the simulator (its device memory is host RAM; use DLPack)" if buf.kind == DEVICE else f"for {buf.kind} memory"
        raise AttributeError(f"__cuda_array_interface__ describes GPU device memory: none {where}")
    buf.check_usable()
    streams = [s for s in list(buf.streams) if not s.is_closed]
    producer: int | None = None
    if len(streams) == 1:
        producer = streams[0].handle
    elif streams:
        join = _join_stream(rt)
        for s in streams:
            join.wait_stream(s)
        producer = join.handle
    return {
        "shape": (buf.nbytes,),
        "typestr": "|u1",
        "data": (buf.ptr, buf.readonly),
        "strides": None,
        "version": 3,
        "stream": 1 if producer == 0 else producer,  # 0 is not allowed: 1 is the legacy default stream
    }


# -- import -------------------------------------------------------------------------------------


def import_cuda_array_interface(cai: dict[str, Any], stream: Stream | None) -> None:
    """Order ``stream`` after the producer's stream named by a version-3 CUDA array interface. Non-blocking.

    Nothing without a consuming ``stream`` or without a ``stream`` field. Raises
    ``ValueError`` for ``stream`` 0, which the interface forbids.
    """
    producer = cai.get("stream") if int(cai.get("version", 0)) >= 3 else None
    if producer is None or stream is None:
        return
    if isinstance(producer, bool) or not isinstance(producer, int) or producer < 0:
        raise TypeError(f"__cuda_array_interface__ stream must be None or a stream handle, not {producer!r}")
    if producer == 0:
        raise ValueError("__cuda_array_interface__ stream 0 is not allowed (ambiguous); 1 is the legacy default stream")
    order_after_foreign_stream(stream, 0 if producer == 1 else producer)


def import_dlpack(obj: Any, device_type: int, stream: Stream | None) -> tuple[Any, DLTensor, bool]:
    """Call ``obj.__dlpack__`` (versioned when the producer can, with ``stream=`` the consuming stream's
    handle for GPU memory) and return ``(capsule, tensor, readonly)``; the capsule stays unconsumed and
    owns the tensor's memory."""
    kwargs: dict[str, Any] = {}
    if stream is not None and device_type in _GPU_TYPES:
        handle = stream.handle
        kwargs["stream"] = 1 if handle == 0 and device_type == DL_CUDA else handle
    try:
        capsule = obj.__dlpack__(max_version=(1, 0), **kwargs)
    except TypeError:  # a producer older than DLPack 1.0
        capsule = obj.__dlpack__(**kwargs)
    tensor, readonly = _tensor_of(capsule)
    return capsule, tensor, readonly
