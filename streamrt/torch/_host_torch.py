"""The simulator variant of :class:`~._context.TorchContext`: CPU torch computing on the host.

The simulated device keeps its memory in host RAM, so device tensors are CPU tensors
aliasing simulator device blocks (:func:`alias_block`), torch's "stream" is a stand-in
stream for the host, hand-offs wait on the host, and a fetched tensor is first copied on
the host into a temporary device block (see :mod:`streamrt.torch._context`).

Thread rules: any thread.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from .._backends.protocol import MemcpyKind
from ._context import TorchContext
from ._lazy import torch_module

if TYPE_CHECKING:
    from .._buffer import Buffer
    from .._event import Event
    from .._runtime import Runtime
    from .._stream import Stream

__all__ = ["HostTorch", "alias_block"]

D2H = MemcpyKind.DEVICE_TO_HOST

_memmove = ctypes.memmove


class HostTorch(TorchContext):
    """CPU torch next to the simulator; see the module docstring."""

    host_computes = True

    def __init__(self, rt: Runtime) -> None:
        super().__init__(rt)
        self._host_stream: Stream | None = None  # the host stand-in
        self._pointer_kind = rt._base_backend.pointer_kind

    def current_stream(self) -> Stream:
        stream = self._host_stream
        if stream is None or stream._closed:
            with self._lock:
                stream = self._host_stream
                if stream is None or stream._closed:
                    stream = self._host_stream = self.rt.create_stream(name="torch-host")
        return stream

    def empty(self, nbytes: int, stream: Stream | None) -> tuple[Any, Buffer | None]:
        block = self.rt._device_allocator.allocate(max(nbytes, 1), stream=stream)
        return alias_block(self.rt, block, nbytes), block

    def device_block(self, nbytes: int, stream: Stream) -> tuple[Any, int, Buffer | None]:
        block = self.rt._device_allocator.allocate(max(nbytes, 1), stream=stream)
        return alias_block(self.rt, block, nbytes), block._ptr, block

    def passes_through(self, leaf: Any) -> bool:  # type: ignore[override]
        """A CUDA tensor, or a CPU tensor whose memory is simulator device memory (aliased)."""
        if leaf.is_cuda:
            return True
        ptr = leaf.data_ptr()
        return bool(ptr) and self._pointer_kind(ptr).value == "device"

    def fetch_source(self, tensor: Any) -> tuple[int, MemcpyKind, Buffer | None] | None:
        if tensor.is_cuda:
            raise ValueError("a CUDA tensor cannot be used by a simulator runtime; use CPU tensors with the simulator")
        if not tensor.is_cpu:
            raise TypeError(f"tensors on {tensor.device.type!r} cannot be used as streamrt Buffers")
        nbytes = tensor.nbytes
        temp = self.rt._device_allocator.allocate(max(nbytes, 1))
        if nbytes:
            _memmove(temp._ptr, tensor.data_ptr(), nbytes)  # simulator device memory is host RAM
        return temp._ptr, D2H, temp

    def release_source(self, temporary: Buffer, stream: Stream) -> None:
        temporary.note_stream(stream)
        temporary.release()

    def hand_off(self, event: Event, stream: Stream, block: Buffer | None) -> bool:
        stream._wait_raw(event)
        if block is not None:
            block.note_stream(stream)
        if event.is_done:
            return False
        event.synchronize()
        return True

    def let_go(self, tensor: Any, stream: Stream | None) -> None:
        """Nothing to do: the hand-off noted ``stream`` on the aliased block, which is released (its
        reuse ordered after the streams noted on it) once the tensor's last view is gone."""


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
