"""Backend objects shared by the runtimes of one process, reference counted.

Runtimes of different devices must talk to *one* backend object: a stream of
one device may then wait on an event of another, and a copy between their
buffers is a peer copy. A runtime holds a :class:`BackendLease`; the backend is
closed when the last lease is released.

Which runtimes share is decided by the backend module, without the runtime
knowing which backend it is: a module may define ``share_key(**options)``,
returning a hashable key or ``None``. Runtimes opened with the same backend
name and a key that is not ``None`` share one backend object; ``None`` (or a
module without ``share_key``) gives the runtime a private backend object.

* ``cuda`` and ``hip``: one backend object per process (the driver is
  process-wide).
* ``sim``: one simulator per ``(profile, devices, options)`` when
  ``devices >= 2`` (one simulated machine); a one-device simulator stays
  private to its runtime, so independent runtimes keep independent virtual
  clocks, op logs and hazard records.

Thread rules: :func:`acquire_backend` and :meth:`BackendLease.release` may be
called from any thread. A shared backend is created under this module's lock
(two runtimes opening at once get one object) and closed outside it.
"""

from __future__ import annotations

import threading
from typing import Any

from . import _module
from .protocol import Backend

__all__ = ["BackendLease", "acquire_backend", "shared_backend_users"]

_lock = threading.Lock()
# (name, key) -> [backend, number of leases]
_shared: dict[tuple[str, object], list[Any]] = {}


class BackendLease:
    """One runtime's hold on a backend object. :meth:`release` once; idempotent."""

    __slots__ = ("_key", "_released", "backend")

    def __init__(self, backend: Backend, key: tuple[str, object] | None) -> None:
        self.backend = backend
        self._key = key
        self._released = False

    @property
    def is_shared(self) -> bool:
        """Whether other runtimes may hold the same backend object."""
        return self._key is not None

    def release(self) -> None:
        """Drop the hold; the last holder closes the backend (outside the registry lock)."""
        with _lock:
            if self._released:
                return
            self._released = True
            close = True
            if self._key is not None:
                entry = _shared.get(self._key)
                if entry is not None and entry[0] is self.backend:
                    entry[1] -= 1
                    close = entry[1] == 0
                    if close:
                        del _shared[self._key]
        if close:
            self.backend.close()


def acquire_backend(name: str, **options: Any) -> BackendLease:
    """A lease on backend ``name`` with ``options``: the shared object when the module shares, else a new one.

    Raises what the module's ``create`` raises (``BackendUnavailableError``,
    ``TypeError``/``ValueError`` for bad options); nothing is leased then.
    """
    module = _module(name)
    key_of = getattr(module, "share_key", None)
    key = key_of(**options) if key_of is not None else None
    if key is None:
        return BackendLease(module.create(**options), None)
    full = (name, key)
    with _lock:
        entry = _shared.get(full)
        if entry is None:
            entry = _shared[full] = [module.create(**options), 0]
        entry[1] += 1
        return BackendLease(entry[0], full)


def shared_backend_users(backend: Backend) -> int:
    """How many leases hold ``backend`` through the registry (0: private, or closed)."""
    with _lock:
        for entry in _shared.values():
            if entry[0] is backend:
                return int(entry[1])
    return 0
