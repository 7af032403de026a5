"""Helpers for the multi-device tests: byte patterns and gates (moving bytes: support.transfer)."""

from __future__ import annotations

import threading

import numpy as np


def pattern(nbytes: int, seed: int) -> np.ndarray:
    """Bytes that differ from one seed to the next and from position to position."""
    return ((np.arange(nbytes, dtype=np.uint64) * 2654435761 + seed * 97 + 13) >> 7).astype(np.uint8)


class HostGate:
    """A Python host function that holds its stream until :meth:`open` (and says when it started)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self._open = threading.Event()

    def __call__(self) -> None:
        self.started.set()
        if not self._open.wait(30):
            raise TimeoutError("HostGate was never opened")

    def open(self) -> None:
        self._open.set()
