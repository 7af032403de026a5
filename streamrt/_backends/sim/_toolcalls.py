"""The sim backend's own tools, beyond the backend protocol: op log, clocks, hazards, peer state.

See ``_backend`` for the behaviour, ``_ops`` for the op records and ``_hazards`` for hazard checking.
"""

from __future__ import annotations

from . import _codes as C
from ._codes import fail
from ._core import SimCore, check_count
from ._hazards import READ, WRITE, Hazard
from ._ops import OpRecord
from ._profile import SimProfile

__all__ = ["ToolCalls"]


class ToolCalls(SimCore):
    """profile / op_log / clear_op_log / peer_access_enabled / device_time_us / host_now_us /
    advance_host_clock / hazards / clear_hazards / check_host_access."""

    # == simulator tools =============================================================================
    @property
    def profile(self) -> SimProfile:
        """The cost model in use."""
        return self._profile

    def op_log(self) -> list[OpRecord]:
        """Records of completed ops (the last ``op_log_limit``), in enqueue (``seq``) order."""
        with self._lock:
            rows = list(self._sched.log or ())
        rows.sort(key=lambda row: row[0])
        return [OpRecord(*row) for row in rows]

    def clear_op_log(self) -> None:
        with self._lock:
            if self._sched.log is not None:
                self._sched.log.clear()

    def peer_access_enabled(self, device: int, peer: int) -> bool:
        """Whether :meth:`enable_peer_access` made ``peer``'s memory accessible from ``device``."""
        with self._lock:
            return (device, peer) in self._peer_access

    def device_time_us(self, device: int) -> float:
        """The virtual end of the latest work enqueued on ``device`` (its timeline's tail), µs.

        Each device has its own timeline: work on one device does not move another's,
        except through a cross-device event wait or a peer copy it runs.
        """
        call = "device_time_us"
        self._check_device(device, call)
        with self._lock:
            return self._devices[device].time_us

    def host_now_us(self) -> float:
        """The calling thread's host virtual time, µs (with ``charge_host_time``, its real work so far included)."""
        tls = self._tls
        if self._charge_host_time:
            self._charge_real(tls)
        return tls.host_us

    def advance_host_clock(self, us: float) -> float:
        """Model ``us`` of host work on the calling thread's virtual clock; returns the new time."""
        if not us >= 0:
            raise ValueError(f"us must be >= 0, got {us!r}")
        self._tls.host_us += float(us)
        return self._tls.host_us

    def hazards(self) -> tuple[Hazard, ...]:
        """Hazards recorded so far (empty unless created with ``check_hazards``)."""
        if self._hz is None:
            return ()
        with self._lock:
            return self._hz.found()

    def clear_hazards(self) -> None:
        if self._hz is not None:
            with self._lock:
                self._hz.clear()

    def check_host_access(self, ptr: int, nbytes: int, write: bool, *, stream: int | None = None) -> tuple[Hazard, ...]:
        """Report a host access of ``[ptr, ptr+nbytes)``; returns the hazards it causes (also recorded).

        Without ``stream`` the access is the host program's: it conflicts with
        enqueued work it has not synchronized with. With ``stream``, it is made on
        behalf of the latest host function of that stream that has started (for
        example by a runtime worker that the host function woke with ``sem_post``):
        it is ordered after the work before that host function on the stream and
        conflicts, like a device op, with unordered work on other streams.
        Pageable addresses are not tracked. A no-op returning ``()`` when hazard
        checking is off. Raises :class:`HazardError` in ``"raise"`` mode.
        """
        call = "check_host_access"
        tls = self._enter(call)
        n = check_count(nbytes, "nbytes", call)
        p = check_count(ptr, "ptr", call)
        hz = self._hz
        if hz is None or n == 0:
            return ()
        with self._lock:
            alloc = self._mem.find(p)
            if alloc is None:
                tomb = self._mem.find_freed(p)
                if tomb is None:
                    return ()
                found = [hz.freed_access(tomb, p, p + n, "host access")]
                hz.report(found, call)
                return tuple(found)
            if p + n > alloc.end:
                fail(C.INVALID_VALUE, f"{n} bytes at {p:#x} overrun the {alloc.describe()}", call)
            if stream is None:
                found = hz.host_access(alloc, p, p + n, bool(write), "host access")
                hz.report(found, call)
                return tuple(found)
            s = self._stream(stream, tls, call)
            running = self._devices[s.device].executor.host_started.get(s.handle)
            if running is None or running.hz is None:
                fail(C.INVALID_VALUE, f"no host function of stream {s.handle:#x} has started yet", call)
            key, vc, epoch = running.hz
            _, found = hz.device_access(
                key,
                vc,
                [(alloc, p, p + n, WRITE if write else READ)],
                f"host_func#{running.seq} on stream {s.handle:#x}",
                call,
                epoch=epoch,
            )
            return tuple(found)
