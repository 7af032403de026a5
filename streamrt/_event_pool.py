"""The runtime's pool of idle backend events: one pool for all of streamrt's bookkeeping events.

The completion engine's tail events, the stream pool's ordering events (forks,
joins, captures) and the allocators' fences are all the same kind of event
(non-timing, blocking-sync) and all come from here, so a runtime holds one
set of idle events rather than one per user. ``rt.event_pool`` is the seam
an allocator uses (docs/allocators.md).

Reuse rule: give an event back once every wait on its last record has been
enqueued and nobody will query or synchronize that record any more. Whoever
takes it next records it before anything else, and a wait enqueued earlier
stays bound to the record it saw (CUDA/HIP semantics, modelled by the
simulator), so reusing an event whose last record is still pending is safe.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._backends.protocol import Backend

__all__ = ["EventPool"]

_log = logging.getLogger("streamrt")


class EventPool:
    """Idle non-timing, blocking-sync events of one backend device.

    :meth:`take` and :meth:`give` may be called from any thread and never
    block (``list.pop``/``append`` are atomic). At most ``limit`` idle events
    are kept; more are destroyed. :attr:`idle` is the list itself: the
    completion engine pops from it inline on every launch.
    """

    __slots__ = ("_backend", "_device", "_multi_device", "idle", "limit", "created", "closed")

    def __init__(self, backend: Backend, device: int, *, limit: int = 1024, multi_device: bool = False) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be a non-negative int, got {limit!r}")
        self._backend = backend
        self._device = device
        self._multi_device = multi_device  # events bind to the current device: make ours current first
        self.idle: list[int] = []
        self.limit = limit
        self.created = 0  # events this pool ever created
        self.closed = False

    def take(self) -> int:
        """An idle event, or a new one (made on the pool's device) when none is idle."""
        try:
            return self.idle.pop()
        except IndexError:
            return self._create()

    def give(self, event: int) -> None:
        """Take ``event`` back (see the module docstring's reuse rule); destroyed if the pool is full or closed."""
        if not self.closed and len(self.idle) < self.limit:
            self.idle.append(event)
        else:
            self._destroy(event)

    def reserve(self, count: int) -> None:
        """Make sure at least ``count`` events are idle, creating the missing ones now (before a capture, say)."""
        for _ in range(count - len(self.idle)):
            self.idle.append(self._create())

    def close(self) -> None:
        """Destroy the idle events; events given back later are destroyed at once. Idempotent."""
        self.closed = True
        while self.idle:
            self._destroy(self.idle.pop())

    def _create(self) -> int:
        if self._multi_device:
            self._backend.ensure_device(self._device)
        event = self._backend.event_create(timing=False, blocking_sync=True)
        self.created += 1
        return event

    def _destroy(self, event: int) -> None:
        try:
            self._backend.event_destroy(event)
        except Exception:  # noqa: BLE001 - a failed context (or closed backend): the handle went with it
            _log.debug("event_destroy failed for a pooled event", exc_info=True)
