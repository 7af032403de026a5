"""How long each Python host function runs, measured on its worker: what a simulated stream waits for.

On the simulator (a backend with ``expect_host_work``) the engine keeps a
:class:`HostWorkEstimates`; workers time each run of a function into its
:class:`HostWorkEstimate`, and the engine announces the estimate to the
simulator before the call's hold is enqueued (see :mod:`streamrt._hostcall`,
"Simulated time").
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["HostWorkEstimate", "HostWorkEstimates"]


class HostWorkEstimates:
    """The :class:`HostWorkEstimate` of each Python host function.

    Keyed weakly by the function (a bound method by its function), so it keeps
    no callable alive; a callable that takes no weak reference (a builtin)
    gets a fresh estimate each time (its runs are not remembered).
    """

    def __init__(self) -> None:
        self._by_function: weakref.WeakKeyDictionary[Any, HostWorkEstimate] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def for_function(self, fn: Callable[..., Any]) -> HostWorkEstimate:
        key = getattr(fn, "__func__", fn)
        with self._lock:
            try:
                est = self._by_function.get(key)
                if est is None:
                    est = self._by_function[key] = HostWorkEstimate()
            except TypeError:
                return HostWorkEstimate()
        return est


class HostWorkEstimate:
    """How long one Python host function runs (CPU time of its worker), as measured: ``us``, a running mean.

    The mean of the first 8 runs, then an exponential average with weight 1/8
    for the newest run. Written by worker threads, read by the simulator.
    """

    __slots__ = ("runs", "us")

    def __init__(self) -> None:
        self.us = 0.0
        self.runs = 0

    def add(self, us: float) -> None:
        self.runs += 1
        self.us += (us - self.us) / min(self.runs, 8)
