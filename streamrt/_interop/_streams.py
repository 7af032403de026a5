"""Streams across libraries: the CUDA stream protocol out, foreign stream objects in.

Out: :func:`stream_protocol` is ``Stream.__cuda_stream__()``, version 0 of the
CUDA stream protocol that cuda.core, numba-cuda and torch (2.10+) speak:
``(0, handle)`` with the raw ``cudaStream_t`` -- on HIP the ``hipStream_t``, as
torch for ROCm does with its own streams. A simulator stream has no driver
handle, so it refuses with ``TypeError``: a library given its number would
pass it to the driver as a stream pointer.

In: :func:`foreign_stream_handle` reads the handle of what ``rt.wrap_stream``
accepts: objects with ``__cuda_stream__`` (cuda.core, torch 2.10+, numba),
torch streams (``.cuda_stream``), CuPy streams (``.ptr``; their
``__cuda_stream__`` is still a proposal) and raw int handles.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._buffer import Buffer

if TYPE_CHECKING:
    from .._runtime import Runtime
    from .._stream import Stream

__all__ = ["foreign_stream_handle", "stream_protocol"]


def stream_protocol(stream: Stream) -> tuple[int, int]:
    """``(0, handle)``: the stream as version 0 of the CUDA stream protocol.

    Raises ``ClosedError`` for a closed stream (its handle may be gone) and
    ``TypeError`` on the simulator, whose streams are not driver streams.
    """
    stream._check_open()
    if stream.runtime.capabilities.is_simulated:
        raise TypeError(
            f"{stream.name} is a simulator stream, not a CUDA or HIP stream: another library would hand its "
            "handle to the driver. Interop with other GPU libraries needs a GPU runtime (open_runtime('cuda'/'hip'))"
        )
    return (0, stream.handle)


def _device_of(obj: Any) -> int | None:
    """The device a foreign stream says it belongs to (CuPy, torch, cuda.core), when it says."""
    for path in (("device_id",), ("device", "index"), ("device", "device_id")):
        value: Any = obj
        try:
            for name in path:
                value = getattr(value, name)
        except Exception:  # noqa: BLE001 - a property that cannot answer here: try the next spelling
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def foreign_stream_handle(obj: Any, runtime: Runtime) -> int:
    """The raw stream handle of ``obj`` (see the module docstring), checked to be a stream of ``runtime``'s device.

    Raises ``TypeError`` for objects that are not streams (a Buffer, an
    unknown protocol version) and ``ValueError`` for a stream of another device.
    """
    if isinstance(obj, Buffer):
        raise TypeError("cannot wrap a Buffer as a stream: it is memory (wrap_stream takes a stream object or handle)")
    handle: Any
    protocol = getattr(obj, "__cuda_stream__", None)
    if protocol is not None:
        got = protocol() if callable(protocol) else protocol
        try:
            version, handle = got
        except (TypeError, ValueError):
            raise TypeError(f"{type(obj).__name__}.__cuda_stream__ gave {got!r}, not a (version, handle) pair") from None
        if version != 0:
            raise TypeError(f"{type(obj).__name__} speaks version {version!r} of the CUDA stream protocol; streamrt knows version 0")
    elif hasattr(obj, "cuda_stream"):  # torch
        handle = obj.cuda_stream
    elif hasattr(obj, "ptr") and callable(getattr(obj, "wait_event", None)):  # CuPy (a MemoryPointer has no wait_event)
        handle = obj.ptr
    else:
        handle = obj
    if isinstance(handle, bool) or not isinstance(handle, int) or handle < 0:
        raise TypeError(
            f"cannot wrap {type(obj).__name__} as a stream: expected __cuda_stream__, .cuda_stream (torch), "
            ".ptr (CuPy) or an int handle"
        )
    device = None if obj is handle else _device_of(obj)
    if device is not None and device != runtime.device:
        raise ValueError(f"the stream is on device {device}, the runtime on device {runtime.device}: wrap it with that device's runtime")
    return handle
