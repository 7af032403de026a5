"""The process-wide lowering of the interpreter's switch interval while Python host calls are in flight.

A worker thread needs the GIL to run a Python host function while its stream
is held; CPython hands the GIL over only every switch interval (5 ms by
default), so engines lower it while they have such calls in flight (see
:mod:`streamrt._hostcall`, "GIL latency"). The interval is interpreter-wide,
hence one reference-counted guard per process.
"""

from __future__ import annotations

import sys
import threading

__all__ = ["DEFAULT_SWITCH_INTERVAL", "SwitchIntervalGuard", "switch_interval_guard"]

#: The switch interval (s) applied while Python host calls are in flight, unless the runtime is told otherwise.
DEFAULT_SWITCH_INTERVAL = 1e-5


class SwitchIntervalGuard:
    """Process-wide, reference-counted lowering of ``sys.setswitchinterval``.

    Every holder (one per engine with Python host calls in flight) asks for an
    interval; the lowest asked-for value is applied while any holder exists.
    When the last holder releases, the value seen before the first acquire is
    restored, unless someone else changed the interval meanwhile (then their
    value is left in place). Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._saved: float | None = None
        self._applied: float | None = None

    @property
    def is_lowered(self) -> bool:
        """``True`` while at least one holder exists and the interval was lowered."""
        return self._applied is not None

    def acquire(self, interval: float) -> None:
        """Add a holder asking for ``interval`` seconds."""
        with self._lock:
            current = sys.getswitchinterval()
            if self._holders == 0:
                self._saved = current
                self._applied = None
            self._holders += 1
            if self._applied is not None and current != self._applied:
                return  # changed by someone else while lowered: respect it
            if current > interval:
                sys.setswitchinterval(interval)
                self._applied = sys.getswitchinterval()

    def release(self) -> None:
        """Remove a holder; the last one restores the saved interval."""
        with self._lock:
            if self._holders <= 0:
                return
            self._holders -= 1
            if self._holders:
                return
            if self._applied is not None and self._saved is not None and sys.getswitchinterval() == self._applied:
                sys.setswitchinterval(self._saved)
            self._saved = self._applied = None


#: The one guard of this process (the switch interval is interpreter-wide).
switch_interval_guard = SwitchIntervalGuard()
