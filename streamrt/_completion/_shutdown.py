"""Shutdown of completion engines: giving up a lane's work, joining lanes, the ``atexit`` hook.

Every engine registers itself in ``_live_engines`` when created and leaves it
when closed; at interpreter exit :func:`_close_all_at_exit` closes the ones
left, each with its ``exit_timeout``, so exit with work in flight neither
hangs nor crashes. Work given up by a forced close keeps its keepalives in
``_leaked_keepalives`` for good (the device may still use them).
"""

from __future__ import annotations

import atexit
import logging
import os
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .._errors import ClosedError
from ._lane import _Lane

if TYPE_CHECKING:
    from ._engine import CompletionEngine

_log = logging.getLogger("streamrt")

# Engines not yet closed (closed at exit by _close_all_at_exit).
_live_engines: weakref.WeakSet[CompletionEngine] = weakref.WeakSet()

# Keepalives of work given up by a forced close: never released (the device may still use them).
_leaked_keepalives: list[object] = []


def _default_exit_timeout() -> float:
    try:
        return float(os.environ.get("STREAMRT_EXIT_TIMEOUT", "5"))
    except ValueError:
        return 5.0


def _lane_join_timeout(lane: _Lane, join_timeout: float | None) -> float | None:
    """How long close() joins a stopped lane: briefly if it was failed (its thread may never return)."""
    if lane.dead is not None:
        return 0.1 if join_timeout is None else min(join_timeout, 0.1)
    return join_timeout


def _busy(waitable: Any) -> bool:
    if isinstance(waitable, _Lane):
        return waitable.outstanding > 0
    return bool(waitable.in_flight > 0)


def _abandon_lane(lane: _Lane) -> None:
    """Forced close: resolve everything still queued on ``lane`` with ClosedError.

    The queue is left to the (daemon) lane thread, which may still retire it
    if the device ever gets there. Keepalives are *leaked*, not dropped: the
    GPU may still be using what they hold.
    """
    exc = ClosedError("the runtime closed before this work completed")
    for entry in list(lane._queue):
        if entry.keepalive is not None:
            _leaked_keepalives.append(entry.keepalive)
        try:
            entry._retire(exc, None)
        except Exception:  # noqa: BLE001
            _log.exception("could not give up %r", entry)


def _close_all_at_exit(engines: Iterable[CompletionEngine] | None = None) -> None:
    """``atexit``: close every live engine, giving in-flight work ``exit_timeout`` seconds."""
    for engine in list(_live_engines if engines is None else engines):
        try:
            engine.close(timeout=engine.exit_timeout)
        except Exception:  # noqa: BLE001 - never fail interpreter exit
            _log.debug("closing a completion engine at exit failed", exc_info=True)


atexit.register(_close_all_at_exit)
