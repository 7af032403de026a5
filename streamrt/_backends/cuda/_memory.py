"""Memory calls of the CUDA backend: allocation, pointer kinds, memsets and copies, peers."""

from __future__ import annotations

from ..protocol import MemcpyKind, PointerKind
from ._codes import _check
from ._core import CudaCore

__all__ = ["MemoryCalls"]

# cudaErrorPeerAccessAlreadyEnabled (driver_types.h): enable_peer_access treats it as success.
_PEER_ACCESS_ALREADY_ENABLED = 704

# cudaMemoryType values (fixed by driver_types.h) -> PointerKind.
_POINTER_KINDS = {
    0: PointerKind.PAGEABLE,  # cudaMemoryTypeUnregistered
    1: PointerKind.HOST,  # cudaMemoryTypeHost
    2: PointerKind.DEVICE,  # cudaMemoryTypeDevice
    3: PointerKind.MANAGED,  # cudaMemoryTypeManaged
}


class MemoryCalls(CudaCore):
    """malloc / free / host_malloc / host_free / malloc_async / free_async / pointer_kind / memset_async /
    memcpy_async; can_access_peer / enable_peer_access / memcpy_peer_async."""

    # -- memory -----------------------------------------------------------------------------------

    def _device_memory_note(self) -> str:
        try:
            err, free, total = self._rt.cudaMemGetInfo()
        except Exception:
            return ""
        return f" ({int(free)} of {int(total)} bytes free on the device)" if int(err) == 0 else ""

    def malloc(self, nbytes: int) -> int:
        err, ptr = self._rt.cudaMalloc(nbytes)
        if err:
            _check(err, "cudaMalloc", requested=nbytes, extra=self._device_memory_note())
        return int(ptr)

    def free(self, ptr: int) -> None:
        (err,) = self._rt.cudaFree(ptr)
        _check(err, "cudaFree")

    def host_malloc(self, nbytes: int) -> int:
        rt = self._rt
        err, ptr = rt.cudaHostAlloc(nbytes, rt.cudaHostAllocPortable)
        _check(err, "cudaHostAlloc", requested=nbytes)
        return int(ptr)

    def host_free(self, ptr: int) -> None:
        (err,) = self._rt.cudaFreeHost(ptr)
        _check(err, "cudaFreeHost")

    def malloc_async(self, nbytes: int, stream: int) -> int:
        err, ptr = self._rt.cudaMallocAsync(nbytes, self._stream(stream))
        if err:
            _check(err, "cudaMallocAsync", requested=nbytes, extra=self._device_memory_note())
        return int(ptr)

    def free_async(self, ptr: int, stream: int) -> None:
        (err,) = self._rt.cudaFreeAsync(ptr, self._stream(stream))
        _check(err, "cudaFreeAsync")

    def pointer_kind(self, ptr: int) -> PointerKind:
        """What ``ptr`` points to. Memory CUDA does not know (a failed query included) is pageable."""
        rt = self._rt
        err, attrs = rt.cudaPointerGetAttributes(ptr)
        if err:
            if int(err) == int(rt.cudaError_t.cudaErrorInvalidValue):
                rt.cudaGetLastError()  # the failed query must not surface in a later call
                return PointerKind.PAGEABLE
            _check(err, "cudaPointerGetAttributes")
        return _POINTER_KINDS.get(int(attrs.type), PointerKind.PAGEABLE)

    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        s = self._stream_get(stream)
        err = self._cudaMemsetAsync(ptr, value, nbytes, self._stream(stream) if s is None else s)[0]
        if err:
            _check(err, "cudaMemsetAsync")

    def memcpy_async(self, dst: int, src: int, nbytes: int, kind: MemcpyKind, stream: int) -> None:
        s = self._stream_get(stream)
        err = self._cudaMemcpyAsync(dst, src, nbytes, kind, self._stream(stream) if s is None else s)[0]
        if err:
            _check(err, "cudaMemcpyAsync")

    # -- several devices -------------------------------------------------------------------------

    def can_access_peer(self, device: int, peer: int) -> bool:
        """``cudaDeviceCanAccessPeer(device, peer)``; ``False`` for ``device == peer``."""
        err, can = self._rt.cudaDeviceCanAccessPeer(device, peer)
        _check(err, "cudaDeviceCanAccessPeer")
        return bool(can)

    def enable_peer_access(self, peer: int) -> None:
        """``cudaDeviceEnablePeerAccess(peer, 0)`` from the current device; already enabled is success."""
        (err,) = self._rt.cudaDeviceEnablePeerAccess(peer, 0)
        if err:
            if int(err) == _PEER_ACCESS_ALREADY_ENABLED:
                self._rt.cudaGetLastError()  # do not leave it as the thread's last error
                return
            _check(err, "cudaDeviceEnablePeerAccess")

    def memcpy_peer_async(self, dst: int, dst_device: int, src: int, src_device: int, nbytes: int, stream: int) -> None:
        """``cudaMemcpyPeerAsync``: stream-ordered; staged by the driver when peer access is off."""
        s = self._stream_get(stream)
        err = self._cudaMemcpyPeerAsync(
            dst, dst_device, src, src_device, nbytes, self._stream(stream) if s is None else s
        )[0]
        if err:
            _check(err, "cudaMemcpyPeerAsync")
