"""Simulated device memory and pinned host memory, kept in host RAM.

Every allocation is its own anonymous private ``mmap``: the address is real and
page aligned (so 256-byte aligned), the runtime may ``memmove`` through it, and
the pages are only committed when touched. Fresh memory reads as zeros (do not
rely on it: real devices return garbage).

:class:`MemoryMap` classifies any address by interval lookup (a sorted list of
bases, ``bisect``): inside a live allocation's mapping it is that allocation's
kind, otherwise it is ordinary pageable memory. Freed allocations are kept as
*tombstones* (their pages returned with ``MADV_DONTNEED``, their address range
still reserved) for the last ``tombstone_limit`` frees, so a use of a freed
pointer is reported as such instead of silently touching whatever the host
allocator put there next. Ops hold a reference to the allocations they touch,
so a mapping is never unmapped while queued work may still use it.

Not thread-safe: the backend calls it under its lock.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
from collections import deque
from typing import Any

from ..._errors import OutOfMemoryError
from ..protocol import PointerKind

__all__ = ["Allocation", "MemoryMap", "ALIGNMENT"]

ALIGNMENT = 256
_PAGE = mmap.PAGESIZE
_DEVICE_GRANULE = 256  # device allocations are accounted in multiples of this


class Allocation:
    """One simulated allocation.

    Attributes:
        base: the address (page aligned).
        size: bytes asked for; accesses beyond ``base + size`` are out of range.
        span: bytes mapped (``size`` rounded up to a page, at least one page).
        kind: ``PointerKind.DEVICE`` or ``PointerKind.HOST``.
        device: the device whose memory it is (the current device at allocation).
        mm: the mapping; keeps the memory alive.
        stream_ordered: made by ``malloc_async``.
        owner: the graph memory record owning it (allocated during capture), or ``None``.
        accounted: bytes counted against the device's memory (0 for host memory).
        freed: it has been freed (it is a tombstone or fully released).
        history: recent accesses, kept by the hazard checker (``None`` until used).
    """

    __slots__ = (
        "base",
        "size",
        "span",
        "kind",
        "device",
        "mm",
        "stream_ordered",
        "owner",
        "accounted",
        "freed",
        "history",
    )

    def __init__(self, base: int, size: int, span: int, kind: PointerKind, device: int, mm: mmap.mmap) -> None:
        self.base = base
        self.size = size
        self.span = span
        self.kind = kind
        self.device = device
        self.mm = mm
        self.stream_ordered = False
        self.owner: Any = None
        self.accounted = 0
        self.freed = False
        self.history: Any = None

    @property
    def end(self) -> int:
        return self.base + self.size

    def describe(self) -> str:
        what = "device" if self.kind is PointerKind.DEVICE else "pinned host"
        return f"{self.size}-byte {what} allocation at {self.base:#x}"


def _map(span: int) -> mmap.mmap:
    if hasattr(mmap, "MAP_ANONYMOUS"):
        return mmap.mmap(-1, span, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return mmap.mmap(-1, span)  # pragma: no cover - platforms without MAP_ANONYMOUS


def _address(mm: mmap.mmap) -> int:
    view = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(view)
    finally:
        del view  # release the buffer export; the address stays valid while mm lives


class _IntervalSet:
    """Allocations sorted by base, non-overlapping; lookup by any interior address."""

    __slots__ = ("_bases", "_allocs")

    def __init__(self) -> None:
        self._bases: list[int] = []
        self._allocs: list[Allocation] = []

    def add(self, alloc: Allocation) -> None:
        i = bisect.bisect_left(self._bases, alloc.base)
        self._bases.insert(i, alloc.base)
        self._allocs.insert(i, alloc)

    def remove(self, alloc: Allocation) -> bool:
        i = bisect.bisect_left(self._bases, alloc.base)
        if i < len(self._bases) and self._allocs[i] is alloc:
            del self._bases[i]
            del self._allocs[i]
            return True
        return False

    def find(self, ptr: int) -> Allocation | None:
        i = bisect.bisect_right(self._bases, ptr) - 1
        if i >= 0:
            alloc = self._allocs[i]
            if ptr < alloc.base + alloc.span:
                return alloc
        return None

    def __len__(self) -> int:
        return len(self._allocs)

    def values(self) -> list[Allocation]:
        return list(self._allocs)

    def clear(self) -> None:
        self._bases.clear()
        self._allocs.clear()


class MemoryMap:
    """Live allocations, tombstones of recent frees, and per-device accounting.

    Args:
        devices: number of simulated devices.
        total_memory: device memory per device, bytes.
        tombstone_limit: how many freed allocations keep their address reserved.
    """

    def __init__(self, devices: int, total_memory: int, tombstone_limit: int = 4096) -> None:
        self.total_memory = total_memory
        self.used = [0] * devices
        self._live = _IntervalSet()
        self._tombs = _IntervalSet()
        self._tomb_order: deque[Allocation] = deque()
        self._tombstone_limit = tombstone_limit

    # -- allocation -----------------------------------------------------------------------
    def allocate(self, nbytes: int, kind: PointerKind, device: int) -> Allocation:
        """Map ``nbytes`` (> 0) of ``kind`` memory; raises :class:`OutOfMemoryError`.

        Device memory fails when the device's accounted bytes would exceed
        ``total_memory``; any allocation fails when the host cannot map it.
        """
        accounted = 0
        if kind is PointerKind.DEVICE:
            accounted = -(-nbytes // _DEVICE_GRANULE) * _DEVICE_GRANULE
            in_use = self.used[device]
            if in_use + accounted > self.total_memory:
                raise OutOfMemoryError(
                    f"sim device {device} out of memory: {nbytes} bytes requested, {in_use} of "
                    f"{self.total_memory} bytes in use",
                    requested=nbytes,
                    limit=self.total_memory,
                    in_use=in_use,
                    backend="sim",
                    code=2,
                )
        span = max(_PAGE, -(-nbytes // _PAGE) * _PAGE)
        try:
            mm = _map(span)
        except (OSError, OverflowError, ValueError, MemoryError) as exc:
            what = "device" if kind is PointerKind.DEVICE else "pinned host"
            raise OutOfMemoryError(
                f"sim could not map {nbytes} bytes of {what} memory in host RAM: {exc}",
                requested=nbytes,
                limit=self.total_memory if kind is PointerKind.DEVICE else None,
                in_use=self.used[device] if kind is PointerKind.DEVICE else None,
                backend="sim",
                code=2,
            ) from exc
        alloc = Allocation(_address(mm), nbytes, span, kind, device, mm)
        alloc.accounted = accounted
        self.used[device] += accounted
        self._live.add(alloc)
        return alloc

    def retire(self, alloc: Allocation) -> None:
        """Remove ``alloc`` from the live set and keep it as a tombstone (accounting unchanged)."""
        if self._live.remove(alloc):
            alloc.freed = True
            self._tombs.add(alloc)
            self._tomb_order.append(alloc)
            while len(self._tomb_order) > self._tombstone_limit:
                self._tombs.remove(self._tomb_order.popleft())

    def release(self, alloc: Allocation) -> None:
        """Return a retired allocation's bytes to its device and its pages to the OS."""
        self.used[alloc.device] -= alloc.accounted
        alloc.accounted = 0
        if hasattr(alloc.mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            try:
                alloc.mm.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):  # pragma: no cover - best effort
                pass

    def free_now(self, alloc: Allocation) -> None:
        """:meth:`retire` then :meth:`release`."""
        self.retire(alloc)
        self.release(alloc)

    # -- lookup -----------------------------------------------------------------------------
    def find(self, ptr: int) -> Allocation | None:
        """The live allocation whose mapping contains ``ptr``, or ``None``."""
        return self._live.find(ptr)

    def find_freed(self, ptr: int) -> Allocation | None:
        """The tombstone whose mapping contains ``ptr``, or ``None``."""
        return self._tombs.find(ptr)

    def kind_of(self, ptr: int) -> PointerKind:
        alloc = self._live.find(ptr)
        return alloc.kind if alloc is not None else PointerKind.PAGEABLE

    def live(self) -> list[Allocation]:
        return self._live.values()

    def close(self) -> None:
        """The backend closed: forget the tombstones, keep live allocations mapped.

        As on a GPU, where closing a context-sharing runtime frees no memory,
        memory never freed stays valid: a Buffer (or a numpy array over one)
        kept past ``rt.close()`` still reads and writes it. The mappings go
        with this map, once nothing references the backend object.
        """
        self._tombs.clear()
        self._tomb_order.clear()
