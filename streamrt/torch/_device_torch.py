"""The GPU variant of :class:`~._context.TorchContext`: CUDA/ROCm torch on the runtime's device.

Device tensors are torch CUDA tensors; torch's work runs on torch's current stream, wrapped
once per torch stream. The per-step paths ask torch as little as they can:

* :meth:`DeviceTorch.current_stream` keys its cache by ``torch._C._cuda_getCurrentStream``
  (one C call returning ``(stream id, device, type)``) instead of building a
  ``torch.cuda.Stream`` each time;
* :meth:`DeviceTorch.device_block` allocates with the copy stream as torch's current stream by
  setting it and setting the previous one back (``torch._C._cuda_setStream``), which is what
  ``with torch.cuda.stream(...)`` does, without its Python.

Where this torch build lacks those functions (checked once), the public ``torch.cuda``
calls do the same work.

Thread rules: any thread (torch's current stream is per thread).
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

from .._allocator import release_after_device
from .._backends.protocol import MemcpyKind
from ._context import TorchContext
from ._interop import as_torch_stream
from ._lazy import torch_module

if TYPE_CHECKING:
    from .._buffer import Buffer
    from .._event import Event
    from .._runtime import Runtime
    from .._stream import Stream

__all__ = ["DeviceTorch"]

_H2H = MemcpyKind.HOST_TO_HOST
D2H = MemcpyKind.DEVICE_TO_HOST


class DeviceTorch(TorchContext):
    """CUDA/ROCm torch on a GPU runtime; see the module docstring."""

    host_computes = False
    passes_through = operator.attrgetter("is_cuda")

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt)
        self._index = rt.device
        self._pointer_kind = rt._base_backend.pointer_kind
        self._torch: Any = None  # torch's part, set up by the first call that needs torch (_setup)
        self._wrapped: dict[Any, Stream] = {}  # torch's stream key -> wrapped Stream
        self._ids: dict[int, tuple[int, int, int]] = {}  # streamrt stream handle -> torch stream ids
        self._last: tuple[Stream | None, Any] = (None, None)  # (Stream, its torch stream): record_stream's

    def _setup(self) -> Any:
        """Import torch (a Buffer fetch never needs it) and look up the calls the hot paths use."""
        torch = torch_module()
        c = torch._C
        self._device = torch.device("cuda", self._index)
        self._uint8 = torch.uint8
        self._get_stream = getattr(c, "_cuda_getCurrentStream", None)  # (stream id, device index, device type)
        self._set_stream = getattr(c, "_cuda_setStream", None)
        self._get_device = getattr(c, "_cuda_getDevice", None)
        self._torch = torch
        return torch

    # -- streams --------------------------------------------------------------------------------
    def current_stream(self) -> Stream:
        if self._torch is None:
            self._setup()
        get = self._get_stream
        if get is not None:
            key: Any = get(self._index)
        else:
            key = self._torch.cuda.current_stream(self._index).cuda_stream
        stream = self._wrapped.get(key)
        if stream is None or stream._closed:
            stream = self._wrap_current(key)
        return stream

    def _wrap_current(self, key: Any) -> Stream:
        ts = self._torch.cuda.current_stream(self._index)
        handle = int(ts.cuda_stream)
        with self._lock:
            stream = self._wrapped.get(key)
            if stream is None or stream._closed:
                stream = self._wrapped[key] = self.rt.wrap_stream(ts, name=f"torch-0x{handle:x}" if handle else "torch-default")
        return stream

    def _torch_stream(self, stream: Stream) -> Any:
        last, ts = self._last
        if last is not stream:
            ts = as_torch_stream(stream)
            self._last = (stream, ts)
        return ts

    # -- memory ---------------------------------------------------------------------------------
    def empty(self, nbytes: int, stream: Stream | None) -> tuple[Any, Buffer | None]:
        torch = self._torch if self._torch is not None else self._setup()
        if stream is None:
            return torch.empty(nbytes, dtype=self._uint8, device=self._device), None
        set_stream, get_device = self._set_stream, self._get_device
        if set_stream is None or get_device is None or self._get_stream is None or get_device() != self._index:
            with torch.cuda.stream(as_torch_stream(stream)):  # (it also restores another current device)
                return torch.empty(nbytes, dtype=self._uint8, device=self._device), None
        ids = self._ids.get(stream._handle)
        if ids is None:
            ts = as_torch_stream(stream)
            ids = self._ids[stream._handle] = (ts.stream_id, ts.device_index, ts.device_type)
        previous = self._get_stream(self._index)
        set_stream(*ids)
        try:
            return torch.empty(nbytes, dtype=self._uint8, device=self._device), None
        finally:
            set_stream(*previous)

    def device_block(self, nbytes: int, stream: Stream) -> tuple[Any, int, Buffer | None]:
        tensor = self.empty(nbytes, stream)[0]
        return tensor, tensor.data_ptr(), None

    def fetch_source(self, tensor: Any) -> tuple[int, MemcpyKind, Buffer | None] | None:
        if tensor.is_cuda:
            if tensor.get_device() != self._index:
                raise ValueError(f"the tensor is on cuda:{tensor.get_device()}, the runtime on device {self._index}")
            return tensor.data_ptr(), D2H, None
        if not tensor.is_cpu:
            raise TypeError(f"tensors on {tensor.device.type!r} cannot be used as streamrt Buffers")
        ptr = tensor.data_ptr()
        if not ptr:
            return None
        kind = self._pointer_kind(ptr).value
        if kind == "pageable":
            return None
        return ptr, (_H2H if kind == "host" else D2H), None  # pinned host memory, or managed memory

    def hand_off(self, event: Event, stream: Stream, block: Buffer | None) -> bool:
        stream._wait_raw(event)
        return False

    def let_go(self, tensor: Any, stream: Stream | None) -> None:
        if stream is None:
            return  # allocated on the copy stream, which torch orders its reuse after
        if not stream._closed:
            tensor.record_stream(self._torch_stream(stream))
        else:  # its handle may be gone: keep the memory until the device has passed everything
            release_after_device(self.rt, lambda: tensor)
