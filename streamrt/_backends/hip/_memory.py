"""Memory calls of the hip backend: allocation, pointer kinds, memsets and copies, peers."""

from __future__ import annotations

from ..protocol import MemcpyKind, PointerKind
from ._codes import _INVALID_VALUE, _check
from ._core import HipCore

__all__ = ["MemoryCalls"]

_PEER_ACCESS_ALREADY_ENABLED = 704  # hipErrorPeerAccessAlreadyEnabled: enable_peer_access treats it as success
_HOST_MALLOC_PORTABLE = 0x1  # hipHostMallocPortable

# hipMemoryType -> PointerKind (Unregistered 0, Host 1, Device 2, Managed 3, Array 10, Unified 11).
_MEMORY_TYPES = {
    0: PointerKind.PAGEABLE,
    1: PointerKind.HOST,
    2: PointerKind.DEVICE,
    3: PointerKind.MANAGED,
    10: PointerKind.DEVICE,
    11: PointerKind.MANAGED,
}


class MemoryCalls(HipCore):
    """malloc / free / host_malloc / host_free / malloc_async / free_async / pointer_kind / memset_async /
    memcpy_async; can_access_peer / enable_peer_access / memcpy_peer_async."""

    # -- memory ------------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> int:
        """Device memory; 0 for ``nbytes == 0``. ``OutOfMemoryError`` when HIP has none left."""
        if nbytes == 0:
            return 0
        err, ptr = self._hipMalloc(nbytes)
        _check(err, "hipMalloc", requested=nbytes)
        return self._keep(self._pointers, ptr)

    def free(self, ptr: int) -> None:
        if ptr == 0:
            return
        _check(self._hipFree(self._pointer(ptr))[0], "hipFree")
        self._pointers.pop(ptr, None)

    def host_malloc(self, nbytes: int) -> int:
        """Page-locked, portable host memory (``hipHostMalloc(n, hipHostMallocPortable)``)."""
        if nbytes == 0:
            return 0
        err, ptr = self._hipHostMalloc(nbytes, _HOST_MALLOC_PORTABLE)
        _check(err, "hipHostMalloc", requested=nbytes)
        return self._keep(self._pointers, ptr)

    def host_free(self, ptr: int) -> None:
        if ptr == 0:
            return
        _check(self._hipHostFree(self._pointer(ptr))[0], "hipHostFree")
        self._pointers.pop(ptr, None)

    def malloc_async(self, nbytes: int, stream: int) -> int:
        """Stream-ordered device memory (``hipMallocAsync``)."""
        if nbytes == 0:
            return 0
        err, ptr = self._hipMallocAsync(nbytes, self._stream(stream))
        _check(err, "hipMallocAsync", requested=nbytes)
        return self._keep(self._pointers, ptr)

    def free_async(self, ptr: int, stream: int) -> None:
        if ptr == 0:
            return
        _check(self._hipFreeAsync(self._pointer(ptr), self._stream(stream))[0], "hipFreeAsync")
        self._pointers.pop(ptr, None)

    def pointer_kind(self, ptr: int) -> PointerKind:
        """What ``ptr`` points to. Memory HIP does not know is ``PAGEABLE``.

        Older HIP releases answer ``hipErrorInvalidValue`` for such memory and
        leave it as the thread's last error; that error is cleared here.
        """
        err, attributes = self._hipPointerGetAttributes(self._pointer(ptr))
        if err == _INVALID_VALUE:
            self._hipGetLastError()
            return PointerKind.PAGEABLE
        _check(err, "hipPointerGetAttributes")
        if attributes.isManaged:
            return PointerKind.MANAGED
        return _MEMORY_TYPES.get(int(attributes.type), PointerKind.PAGEABLE)

    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        p = self._pointers.get(ptr)
        if p is None:
            p = self._remember(self._pointers, self._new_pointer, ptr)
        s = self._streams.get(stream)
        if s is None:
            s = self._remember(self._streams, self._new_stream, stream)
        err = self._hipMemsetAsync(p, value, nbytes, s)[0]
        if err:
            _check(err, "hipMemsetAsync")

    def memcpy_async(self, dst: int, src: int, nbytes: int, kind: MemcpyKind, stream: int) -> None:
        pointers = self._pointers
        d = pointers.get(dst)
        if d is None:
            d = self._remember(pointers, self._new_pointer, dst)
        s = pointers.get(src)
        if s is None:
            s = self._remember(pointers, self._new_pointer, src)
        st = self._streams.get(stream)
        if st is None:
            st = self._remember(self._streams, self._new_stream, stream)
        err = self._hipMemcpyAsync(d, s, nbytes, self._memcpy_kinds[kind], st)[0]
        if err:
            _check(err, "hipMemcpyAsync")

    # -- several devices ---------------------------------------------------------------------
    def can_access_peer(self, device: int, peer: int) -> bool:
        """``hipDeviceCanAccessPeer(device, peer)``; ``False`` for ``device == peer``."""
        err, can = self._hipDeviceCanAccessPeer(device, peer)
        _check(err, "hipDeviceCanAccessPeer")
        return bool(can)

    def enable_peer_access(self, peer: int) -> None:
        """``hipDeviceEnablePeerAccess(peer, 0)`` from the current device; already enabled is success."""
        err = self._hipDeviceEnablePeerAccess(peer, 0)[0]
        if err:
            if err == _PEER_ACCESS_ALREADY_ENABLED:
                self._hipGetLastError()  # do not leave it as the thread's last error
                return
            _check(err, "hipDeviceEnablePeerAccess")

    def memcpy_peer_async(self, dst: int, dst_device: int, src: int, src_device: int, nbytes: int, stream: int) -> None:
        """``hipMemcpyPeerAsync``: stream-ordered; staged through the host when peer access is off."""
        st = self._streams.get(stream)
        if st is None:
            st = self._remember(self._streams, self._new_stream, stream)
        err = self._hipMemcpyPeerAsync(self._pointer(dst), dst_device, self._pointer(src), src_device, nbytes, st)[0]
        if err:
            _check(err, "hipMemcpyPeerAsync")
