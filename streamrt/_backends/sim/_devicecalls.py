"""Device calls of the sim backend: selection, capabilities, device-wide synchronize, peers.

See ``_backend`` for the behaviour.
"""

from __future__ import annotations

from ..protocol import Capabilities
from . import _codes as C
from ._codes import fail
from ._core import SimCore

__all__ = ["DeviceCalls"]


class DeviceCalls(SimCore):
    """device_count / set_device / ensure_device / capabilities / device_synchronize / mem_get_info /
    can_access_peer / enable_peer_access."""

    # == devices ==================================================================================
    def device_count(self) -> int:
        """Number of simulated devices (the ``devices`` option)."""
        self._enter("device_count")
        return self._ndev

    def set_device(self, device: int) -> None:
        """Make ``device`` current on the calling thread (affects the null stream, new streams, allocations)."""
        call = "set_device"
        tls = self._enter(call)
        tls.device = self._check_device(device, call)

    def ensure_device(self, device: int) -> None:
        """Same as :meth:`set_device` (cheap either way)."""
        call = "ensure_device"
        tls = self._enter(call)
        tls.device = self._check_device(device, call)

    def capabilities(self, device: int) -> Capabilities:
        call = "capabilities"
        self._enter(call)
        self._check_device(device, call)
        p = self._profile
        return Capabilities(
            backend="sim",
            device_name=f"streamrt simulated {p.name}",
            architecture="sim",
            is_simulated=True,
            supports_graphs=True,
            supports_stream_ordered_alloc=True,
            supports_pageable_async_copy=True,
            supports_stream_signals=True,
            priority_range=(0, -5),
            virtual_clock=True,
            total_memory=p.total_memory,
            multiprocessor_count=p.multiprocessor_count,
        )

    def device_synchronize(self) -> None:
        """Wait for all work on the current device; prohibited while one of its streams captures."""
        call = "device_synchronize"
        tls = self._enter(call)
        with self._lock:
            caps = [c for c in self._captures if c.device == tls.device]
            if caps:
                self._violation(
                    caps, C.CAPTURE_UNSUPPORTED, "device_synchronize would wait for a capturing stream", call
                )
        self._sync_device(tls, tls.device, call)
        self._raise_async_error(tls.device, call)

    def mem_get_info(self) -> tuple[int, int]:
        """``(free, total)`` simulated bytes of the current device (stream-ordered frees count once executed)."""
        tls = self._enter("mem_get_info")
        with self._lock:
            used = self._mem.used[tls.device]
        total = self._profile.total_memory
        return total - used, total

    # == several devices ==========================================================================
    def can_access_peer(self, device: int, peer: int) -> bool:
        """``True`` for any two different devices (the simulated machine is a full peer mesh)."""
        call = "can_access_peer"
        self._enter(call)
        return self._check_device(device, call) != self._check_device(peer, call)

    def enable_peer_access(self, peer: int) -> None:
        """Let the current device access ``peer``'s memory: its peer copies run at ``peer_bandwidth_gbps``.

        Idempotent. ``peer`` equal to the current device raises ``simErrorInvalidDevice`` (as on CUDA).
        """
        call = "enable_peer_access"
        tls = self._enter(call)
        p = self._check_device(peer, call)
        if p == tls.device:
            fail(C.INVALID_DEVICE, f"device {p} cannot be its own peer", call)
        with self._lock:
            self._peer_access.add((tls.device, p))
            self._charge(tls)
