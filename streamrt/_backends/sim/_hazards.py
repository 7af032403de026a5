"""Hazard checking for the simulated device (``create(check_hazards=True)``).

Happens-before is tracked with vector clocks, independent of how the real
threads happened to run, so the same program reports the same hazards every run:

* every stream has a clock; an op that touches memory gets the next *epoch* of
  its stream, and its accesses are remembered (per allocation, the last
  ``history`` accesses) as ``(stream, epoch, byte range, read/write)``;
* an event record snapshots the stream's clock; ``stream_wait_event`` merges
  the snapshot into the waiting stream's clock;
* the host has a clock too: synchronizing on a stream, an event or the device
  (or a query that reports completion) merges what was waited for, and work
  enqueued afterwards happens after it. The host is one agent: a
  synchronization by any host thread orders later enqueues by every thread
  (ordering between host threads is not tracked).

Reported hazards (:class:`Hazard` ``kind``):

``race``
    two streams touch overlapping bytes, at least one writes, and neither op
    happens before the other.
``host_access``
    the host reads or writes (``check_host_access``) bytes that enqueued work,
    not yet synchronized with, still writes or (for a host write) reads.
``use_after_free``
    an access to freed memory, or a stream-ordered free that may run before
    another stream's access to the same allocation has completed.

Ops on the same stream are ordered, as are ops enqueued after a host access
(the enqueue happens after it). Kernel accesses are whole-allocation ranges
from each pointer argument to the end of its allocation. Graph replays check
all their nodes' accesses as one op of the launch stream.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..._errors import BackendError
from ._codes import HAZARD, error_name

__all__ = ["Hazard", "HazardError", "HazardChecker", "READ", "WRITE", "FREE"]

READ = "r"
WRITE = "w"
FREE = "free"


@dataclass(frozen=True)
class Hazard:
    """One detected hazard.

    Attributes:
        kind: ``"race"``, ``"host_access"`` or ``"use_after_free"``.
        message: what happened, naming the ops and the byte range.
        ops: descriptions of the accesses involved (``"memset#12 on stream 0x5100000002"``).
        address: first overlapping byte.
        nbytes: number of overlapping bytes.
    """

    kind: str
    message: str
    ops: tuple[str, ...]
    address: int = 0
    nbytes: int = 0


class HazardError(BackendError):
    """Raised in ``check_hazards="raise"`` mode; the offending call enqueued nothing.

    Attributes:
        hazards: the :class:`Hazard` records that caused it.
    """

    def __init__(self, hazards: Sequence[Hazard], call: str = "") -> None:
        self.hazards = tuple(hazards)
        super().__init__("sim", HAZARD, error_name(HAZARD), "; ".join(h.message for h in self.hazards), call)


class _Access:
    __slots__ = ("lo", "hi", "mode", "stream", "epoch", "desc")

    def __init__(self, lo: int, hi: int, mode: str, stream: int, epoch: int, desc: str) -> None:
        self.lo = lo
        self.hi = hi
        self.mode = mode
        self.stream = stream
        self.epoch = epoch
        self.desc = desc


# (allocation, lo, hi, mode) as the backend describes an op's accesses
AccessSpec = tuple[Any, int, int, str]


def merge(into: dict[int, int], other: dict[int, int]) -> None:
    """Element-wise max of vector clocks, in place."""
    for k, v in other.items():
        if into.get(k, 0) < v:
            into[k] = v


class HazardChecker:
    """Vector clocks and bounded access history. Called under the backend lock.

    Args:
        raise_on_hazard: raise :class:`HazardError` (before anything is recorded
            or enqueued) instead of only recording.
        history: accesses remembered per allocation (older ones are forgotten,
            which can hide a hazard between very distant ops).
        limit: how many hazards :meth:`found` keeps (the oldest are dropped).
    """

    def __init__(self, raise_on_hazard: bool, history: int = 256, limit: int = 10_000) -> None:
        self.raise_on_hazard = raise_on_hazard
        self.history = history
        self.host_vc: dict[int, int] = {}
        self.host_version = 0  # bumped whenever host_vc grows; streams merge it lazily
        self._found: deque[Hazard] = deque(maxlen=limit)

    # -- results -------------------------------------------------------------------------------
    def found(self) -> tuple[Hazard, ...]:
        return tuple(self._found)

    def clear(self) -> None:
        self._found.clear()

    def report(self, hazards: Iterable[Hazard], call: str) -> None:
        """Record ``hazards``; raise :class:`HazardError` in raise mode."""
        hazards = list(hazards)
        if not hazards:
            return
        if self.raise_on_hazard:
            raise HazardError(hazards, call)
        self._found.extend(hazards)

    # -- clocks -----------------------------------------------------------------------------------
    def host_observe(self, vc: dict[int, int] | None) -> None:
        """The host has seen everything ``vc`` covers complete."""
        if vc:
            host_vc = self.host_vc
            for k, v in vc.items():
                if host_vc.get(k, 0) < v:
                    host_vc[k] = v
                    self.host_version += 1

    def stream_clock(self, stream: Any) -> dict[int, int]:
        """``stream.vc`` brought up to date with the host's clock.

        Work enqueued by the host happens after everything the host has
        synchronized with so far (the host is modelled as one agent, whichever
        thread synchronized).
        """
        vc: dict[int, int] = stream.vc
        if stream.hv != self.host_version:
            merge(vc, self.host_vc)
            stream.hv = self.host_version
        return vc

    def next_epoch(self, stream: int, vc: dict[int, int]) -> int:
        epoch = vc.get(stream, 0) + 1
        vc[stream] = epoch
        return epoch

    # -- checks -------------------------------------------------------------------------------------
    def device_access(
        self,
        stream: int,
        vc: dict[int, int],
        accesses: Sequence[AccessSpec],
        desc: str,
        call: str,
        *,
        epoch: int | None = None,
    ) -> tuple[int, list[Hazard]]:
        """Check and record the accesses of one op on ``stream`` (clock ``vc``).

        ``epoch`` ``None`` takes the stream's next epoch (bumping ``vc``);
        otherwise the accesses belong to an op that already has one (a host
        function reporting its accesses). Returns the epoch and the hazards
        found (already recorded). In raise mode a hazard raises before ``vc``
        or any history changes.
        """
        hazards: list[Hazard] = []
        reported: set[str] = set()  # one hazard per pair of ops
        for alloc, lo, hi, mode in accesses:
            hist = alloc.history
            if not hist:
                continue
            for r in hist:
                if r.stream == stream or r.hi <= lo or hi <= r.lo:
                    continue
                if mode == READ and r.mode == READ:
                    continue
                if vc.get(r.stream, 0) >= r.epoch or r.desc in reported:
                    continue
                reported.add(r.desc)
                hazards.append(self._conflict(alloc, lo, hi, mode, desc, r))
        if hazards and self.raise_on_hazard:
            raise HazardError(hazards, call)
        if epoch is None:
            epoch = self.next_epoch(stream, vc)
        for alloc, lo, hi, mode in accesses:
            if alloc.history is None:
                alloc.history = deque(maxlen=self.history)
            alloc.history.append(_Access(lo, hi, mode, stream, epoch, desc))
        self._found.extend(hazards)
        return epoch, hazards

    def host_access(self, alloc: Any, lo: int, hi: int, write: bool, desc: str) -> list[Hazard]:
        """Hazards of a host access of ``[lo, hi)`` in ``alloc`` against unsynchronized work."""
        hazards: list[Hazard] = []
        hist = alloc.history
        if not hist:
            return hazards
        host_vc = self.host_vc
        reported: set[str] = set()
        for r in hist:
            if r.hi <= lo or hi <= r.lo:
                continue
            if not write and r.mode == READ:
                continue
            if host_vc.get(r.stream, 0) >= r.epoch or r.desc in reported:
                continue
            reported.add(r.desc)
            a, b = max(lo, r.lo), min(hi, r.hi)
            verb = "writes" if write else "reads"
            hazards.append(
                Hazard(
                    "host_access",
                    f"the host {verb} bytes [{a:#x}, {a + (b - a):#x}) of the {alloc.describe()} that "
                    f"{r.desc} ({_mode_word(r.mode)}) may still be using: synchronize first",
                    (desc, r.desc),
                    a,
                    b - a,
                )
            )
        return hazards

    def freed_access(self, alloc: Any, lo: int, hi: int, desc: str) -> Hazard:
        """The hazard for an access to the freed allocation ``alloc``."""
        return Hazard(
            "use_after_free",
            f"{desc} touches bytes [{lo:#x}, {hi:#x}) of the {alloc.describe()}, which has been freed",
            (desc,),
            lo,
            hi - lo,
        )

    @staticmethod
    def _conflict(alloc: Any, lo: int, hi: int, mode: str, desc: str, r: _Access) -> Hazard:
        a, b = max(lo, r.lo), min(hi, r.hi)
        if mode == FREE or r.mode == FREE:
            freer, user = (desc, r.desc) if mode == FREE else (r.desc, desc)
            return Hazard(
                "use_after_free",
                f"{freer} frees the {alloc.describe()} while {user} on another stream may still use "
                f"bytes [{a:#x}, {b:#x}); no event orders them",
                (desc, r.desc),
                a,
                b - a,
            )
        return Hazard(
            "race",
            f"{desc} ({_mode_word(mode)}) and {r.desc} ({_mode_word(r.mode)}) touch bytes [{a:#x}, {b:#x}) "
            f"of the {alloc.describe()} from different streams with no event between them",
            (desc, r.desc),
            a,
            b - a,
        )


def _mode_word(mode: str) -> str:
    return {READ: "reads", WRITE: "writes", FREE: "frees"}[mode]
