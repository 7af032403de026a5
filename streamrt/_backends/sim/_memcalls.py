"""Memory calls of the sim backend: allocation, frees, pointer kinds, memsets and copies.

See ``_backend`` for the behaviour and ``_memory`` for how memory is kept.
"""

from __future__ import annotations

import ctypes
from typing import Any

from ..protocol import MemcpyKind, PointerKind
from . import _codes as C
from ._codes import fail
from ._core import DEVICE, HOST, PAGEABLE, SimCore, check_count
from ._hazards import FREE, READ, WRITE
from ._memory import Allocation

__all__ = ["MemoryCalls"]

# MemcpyKind value -> the direction it names ("" for DEFAULT: inferred)
_COPY_KINDS = {0: "h2h", 1: "h2d", 2: "d2h", 3: "d2d", 4: ""}
# (source is device, destination is device) -> direction
_DIRECTIONS = {(False, False): "h2h", (False, True): "h2d", (True, False): "d2h", (True, True): "d2d"}
_COPY_OPS = {"h2h": "copy_h2h", "h2d": "copy_h2d", "d2h": "copy_d2h", "d2d": "copy_d2d"}


class MemoryCalls(SimCore):
    """malloc / free / host_malloc / host_free / malloc_async / free_async / pointer_kind / memset_async /
    memcpy_async / memcpy_peer_async."""

    # == memory =====================================================================================
    def malloc(self, nbytes: int) -> int:
        """Device memory on the current device; ``0`` for 0 bytes. OOM raises :class:`~streamrt.OutOfMemoryError`."""
        return self._malloc_sync(nbytes, DEVICE, "malloc")

    def host_malloc(self, nbytes: int) -> int:
        """Pinned host memory; ``0`` for 0 bytes."""
        return self._malloc_sync(nbytes, HOST, "host_malloc")

    def _malloc_sync(self, nbytes: Any, kind: PointerKind, call: str) -> int:
        tls = self._enter(call)
        n = check_count(nbytes, "nbytes", call)
        with self._lock:
            self._unsafe_during_capture(call)
            if n == 0:
                return 0
            alloc = self._mem.allocate(n, kind, tls.device)
            self._charge(tls)
            return alloc.base

    def _free_target(self, ptr: int, kind: PointerKind, call: str) -> Allocation:
        """The allocation ``ptr`` starts, checked for freeing. Lock held."""
        alloc = self._mem.find(ptr)
        if alloc is None:
            tomb = self._mem.find_freed(ptr)
            if tomb is not None:
                if self._hz is not None:
                    self._hz.report([self._hz.freed_access(tomb, ptr, ptr + 1, call)], call)
                fail(C.INVALID_VALUE, f"{ptr:#x} was already freed (the {tomb.describe()})", call)
            fail(C.INVALID_VALUE, f"{ptr:#x} is not a sim allocation", call)
        if alloc.base != ptr:
            fail(C.INVALID_VALUE, f"{ptr:#x} is inside the {alloc.describe()}, not its start", call)
        if alloc.kind is not kind:
            other = "host_free" if alloc.kind is HOST else "free or free_async"
            fail(C.INVALID_VALUE, f"{ptr:#x} is the {alloc.describe()}; release it with {other}", call)
        if alloc.owner is not None:
            fail(C.INVALID_VALUE, f"{ptr:#x} was allocated during a capture and is owned by its graph", call)
        return alloc

    def _free_sync(self, ptr: Any, kind: PointerKind, call: str) -> None:
        tls = self._enter(call)
        p = check_count(ptr, "ptr", call)
        if p == 0:
            self._charge(tls)
            return
        with self._lock:
            self._unsafe_during_capture(call)
            alloc = self._free_target(p, kind, call)
        # like cudaFree / cudaFreeHost: wait for the device first
        self._sync_device(tls, alloc.device, call)
        with self._lock:
            if self._mem.find(p) is not alloc:
                fail(C.INVALID_VALUE, f"{p:#x} was freed by another thread meanwhile", call)
            self._mem.free_now(alloc)

    def free(self, ptr: int) -> None:
        """Free device memory after waiting for all work on its device; ``free(0)`` does nothing."""
        self._free_sync(ptr, DEVICE, "free")

    def host_free(self, ptr: int) -> None:
        """Free pinned memory after waiting for all work on its device; ``host_free(0)`` does nothing."""
        self._free_sync(ptr, HOST, "host_free")

    def malloc_async(self, nbytes: int, stream: int) -> int:
        """Stream-ordered device allocation (graph-owned when ``stream`` captures)."""
        call = "malloc_async"
        tls = self._enter(call)
        n = check_count(nbytes, "nbytes", call)
        with self._lock:
            s = self._stream(stream, tls, call)
            if n == 0:
                self._charge(tls)
                return 0
            if s.capture is not None:
                cap = s.capture
                self._check_capture_valid(cap, call)
                alloc = self._mem.allocate(n, DEVICE, s.device)
                alloc.stream_ordered = True
                alloc.owner = cap.memory
                cap.memory.allocations.append(alloc)
                self._capture_node(tls, s, "malloc_async", call, nbytes=n, work=False, refs=(alloc,))
                return alloc.base
            alloc = self._mem.allocate(n, DEVICE, s.device)
            alloc.stream_ordered = True
            seq = self._next_seq()
            self._hazard_check(s, "malloc_async", seq, [(alloc, alloc.base, alloc.end, WRITE)], call)
            self._enqueue(tls, s, "malloc_async", seq, duration=0.0, work=False, refs=(alloc,), nbytes=n)
            return alloc.base

    def free_async(self, ptr: int, stream: int) -> None:
        """Stream-ordered free: the pointer is invalid for new work at once; the bytes return when it runs."""
        call = "free_async"
        tls = self._enter(call)
        p = check_count(ptr, "ptr", call)
        with self._lock:
            s = self._stream(stream, tls, call)
            if p == 0:
                self._charge(tls)
                return
            alloc = self._mem.find(p)
            if s.capture is not None and alloc is not None and alloc.base == p and alloc.owner is s.capture.memory:
                self._capture_node(tls, s, "free_async", call, nbytes=alloc.size, work=False, refs=(alloc,))
                return
            alloc = self._free_target(p, DEVICE, call)
            if s.capture is not None:
                self._violation(
                    [s.capture],
                    C.CAPTURE_UNSUPPORTED,
                    "freeing memory allocated outside the capture is not supported by the simulator",
                    call,
                )
            seq = self._next_seq()
            self._hazard_check(s, "free_async", seq, [(alloc, alloc.base, alloc.end, FREE)], call)
            self._mem.retire(alloc)
            self._enqueue(
                tls,
                s,
                "free_async",
                seq,
                duration=0.0,
                work=False,
                fn=self._release_async,
                args=(alloc,),
                refs=(alloc,),
                nbytes=alloc.size,
            )

    def pointer_kind(self, ptr: int) -> PointerKind:
        """DEVICE or HOST inside a live sim allocation, PAGEABLE for any other address."""
        call = "pointer_kind"
        self._enter(call)
        p = check_count(ptr, "ptr", call)
        with self._lock:
            return self._mem.kind_of(p)

    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        """Set ``nbytes`` bytes to ``value & 0xFF`` (device or pinned memory), stream-ordered."""
        call = "memset_async"
        tls = self._tls
        if tls.role is not None or self._closed:
            self._enter(call)
        if self._charge_host_time:
            self._charge_real(tls)
        n = nbytes if type(nbytes) is int and nbytes >= 0 else check_count(nbytes, "nbytes", call)
        dst = ptr if type(ptr) is int and ptr >= 0 else check_count(ptr, "ptr", call)
        if type(value) is not int:
            if isinstance(value, bool) or not isinstance(value, int):
                fail(C.INVALID_VALUE, f"value must be an int, got {value!r}", call)
            value = int(value)
        byte = value & 0xFF
        with self._lock:
            s = self._stream_fast(stream, tls, call)
            if n == 0:
                self._charge(tls)
                return
            alloc = self._mem.find(dst)
            if alloc is None or dst + n > alloc.end:
                alloc = self._region(dst, n, "destination", call, "memset", s)
                if alloc is None:
                    fail(
                        C.INVALID_VALUE, f"memset needs device or pinned memory; {dst:#x} is pageable host memory", call
                    )
            if alloc.device != s.device and alloc.kind is DEVICE:
                fail(
                    C.INVALID_VALUE,
                    f"{dst:#x} is memory of device {alloc.device}, the stream is on device {s.device}",
                    call,
                )
            duration = self._memset_fixed_us + n * self._memset_rate
            if s.capture is not None:
                self._capture_node(
                    tls,
                    s,
                    "memset",
                    call,
                    nbytes=n,
                    duration_us=duration,
                    gap_after_us=self._profile.graph_node_gap_us,
                    fn=ctypes.memset,
                    args=(dst, byte, n),
                    refs=(alloc,),
                    accesses=((alloc, dst, dst + n, WRITE),),
                )
                return
            self._seq = seq = self._seq + 1
            if self._hz is not None:
                self._hazard_check(s, "memset", seq, [(alloc, dst, dst + n, WRITE)], call)
            self._enqueue(
                tls,
                s,
                "memset",
                seq,
                duration=duration,
                work=True,
                gap_after=self._gap_us,
                fn=ctypes.memset,
                args=(dst, byte, n),
                refs=alloc,
                nbytes=n,
            )

    def memcpy_async(self, dst: int, src: int, nbytes: int, kind: MemcpyKind, stream: int) -> None:
        """Copy ``nbytes``; ``kind`` must match the pointers (DEFAULT infers). Pageable sides run synchronously."""
        call = "memcpy_async"
        tls = self._tls
        if tls.role is not None or self._closed:
            self._enter(call)
        if self._charge_host_time:
            self._charge_real(tls)
        n = nbytes if type(nbytes) is int and nbytes >= 0 else check_count(nbytes, "nbytes", call)
        d = dst if type(dst) is int and dst >= 0 else check_count(dst, "dst", call)
        sp = src if type(src) is int and src >= 0 else check_count(src, "src", call)
        try:
            expected = _COPY_KINDS.get(kind) if not isinstance(kind, bool) else None
        except TypeError:
            expected = None
        if expected is None:
            fail(C.INVALID_VALUE, f"kind must be a MemcpyKind (0..4), got {kind!r}", call)
        with self._lock:
            s = self._stream_fast(stream, tls, call)
            if n == 0:
                self._charge(tls)
                return
            mem = self._mem
            da = mem.find(d)
            if da is None or d + n > da.end:
                da = self._region(d, n, "destination", call, "copy", s)
            sa = mem.find(sp)
            if sa is None or sp + n > sa.end:
                sa = self._region(sp, n, "source", call, "copy", s)
            src_dev = sa is not None and sa.kind is DEVICE
            dst_dev = da is not None and da.kind is DEVICE
            actual = _DIRECTIONS[(src_dev, dst_dev)]
            if expected and expected != actual:
                sk = sa.kind if sa is not None else PAGEABLE
                dk = da.kind if da is not None else PAGEABLE
                fail(
                    C.INVALID_VALUE,
                    f"{MemcpyKind(kind).name} copy, but the source is {sk.value} memory and the destination is "
                    f"{dk.value} memory",
                    call,
                )
            for a in (da, sa) if (src_dev or dst_dev) else ():
                if a is not None and a.kind is DEVICE and a.device != s.device:
                    fail(
                        C.INVALID_VALUE,
                        f"{a.base:#x} is memory of device {a.device} but the stream is on device {s.device}; "
                        "copy between devices with memcpy_peer_async",
                        call,
                    )
            pageable = da is None or sa is None
            opkind = _COPY_OPS[actual]
            duration = self._memset_fixed_us + n * (self._pageable_rate if pageable else self._copy_rate[actual])
            engine = actual if self._serialize_engines and (actual == "h2d" or actual == "d2h") else None
            refs = (da, sa)
            if s.capture is not None or self._hz is not None:
                accesses: list[Any] = []
                if sa is not None:
                    accesses.append((sa, sp, sp + n, READ))
                if da is not None:
                    accesses.append((da, d, d + n, WRITE))
                if s.capture is not None:
                    if pageable:
                        self._violation(
                            [s.capture],
                            C.CAPTURE_UNSUPPORTED,
                            "a copy from or to pageable host memory cannot be captured",
                            call,
                        )
                    self._capture_node(
                        tls,
                        s,
                        opkind,
                        call,
                        nbytes=n,
                        duration_us=duration,
                        gap_after_us=self._profile.graph_node_gap_us,
                        engine=engine,
                        fn=ctypes.memmove,
                        args=(d, sp, n),
                        refs=refs,
                        accesses=tuple(accesses),
                    )
                    return
                self._hazard_check(s, opkind, self._seq + 1, accesses, call)
            self._seq = seq = self._seq + 1
            op = self._enqueue(
                tls,
                s,
                opkind,
                seq,
                duration=duration,
                work=True,
                gap_after=self._gap_us,
                fn=ctypes.memmove,
                args=(d, sp, n),
                refs=refs,
                nbytes=n,
                engine=engine,
            )
        if pageable:
            self._wait(tls, [op], op.end_us, call)

    def memcpy_peer_async(self, dst: int, dst_device: int, src: int, src_device: int, nbytes: int, stream: int) -> None:
        """Copy ``nbytes`` of device memory from ``src`` (on ``src_device``) to ``dst`` (on ``dst_device``).

        Stream-ordered on ``stream``, a stream of any device; the device of that
        stream runs it (real bytes). Both pointers must lie in device memory of
        the devices named. Costs: see :meth:`SimProfile.peer_copy_us` (direct
        when peer access is enabled between the two devices in either
        direction, staged otherwise; one queue per link direction with
        ``serialize_copy_engines``); between two buffers of one device, a D2D copy.
        Captured as a graph node on a capturing stream.
        """
        call = "memcpy_peer_async"
        tls = self._enter(call)
        n = check_count(nbytes, "nbytes", call)
        d = check_count(dst, "dst", call)
        sp = check_count(src, "src", call)
        dd = self._check_device(dst_device, call)
        sd = self._check_device(src_device, call)
        with self._lock:
            s = self._stream(stream, tls, call)
            if n == 0:
                self._charge(tls)
                return
            da = self._region(d, n, "destination", call, "copy_peer", s)
            sa = self._region(sp, n, "source", call, "copy_peer", s)
            for a, ptr, dev, what in ((da, d, dd, "destination"), (sa, sp, sd, "source")):
                if a is None or a.kind is not DEVICE:
                    kind = "pinned host" if a is not None else "pageable host"
                    fail(C.INVALID_VALUE, f"the {what} {ptr:#x} is {kind} memory; peer copies move device memory", call)
                if a.device != dev:
                    fail(
                        C.INVALID_VALUE,
                        f"the {what} {ptr:#x} is memory of device {a.device}, not of device {dev}",
                        call,
                    )
            p = self._profile
            link: tuple[int, int] | None = None
            if sd == dd:
                duration = p.copy_us("d2d", n)
            else:
                direct = (sd, dd) in self._peer_access or (dd, sd) in self._peer_access
                duration = p.peer_copy_us(n, peer_access=direct)
                if self._serialize_engines:
                    link = (sd, dd)
            accesses = [(sa, sp, sp + n, READ), (da, d, d + n, WRITE)]
            if s.capture is not None:
                self._capture_node(
                    tls,
                    s,
                    "copy_peer",
                    call,
                    nbytes=n,
                    duration_us=duration,
                    gap_after_us=p.graph_node_gap_us,
                    fn=ctypes.memmove,
                    args=(d, sp, n),
                    refs=(da, sa),
                    accesses=tuple(accesses),
                )
                return
            seq = self._seq + 1
            if self._hz is not None:
                self._hazard_check(s, "copy_peer", seq, accesses, call)
            self._seq = seq
            op = self._enqueue(
                tls,
                s,
                "copy_peer",
                seq,
                duration=duration,
                work=True,
                gap_after=self._gap_us,
                fn=ctypes.memmove,
                args=(d, sp, n),
                refs=(da, sa),
                nbytes=n,
                wait_us=self._link_free.get(link, 0.0) if link is not None else 0.0,
            )
            if link is not None:
                self._link_free[link] = op.end_us
