"""Helpers shared by the pipeline tests: pinned buffers, blocking gates, polling (moving bytes: support.transfer)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import streamrt as srt


def pinned(rt: srt.Runtime, n: int, fill: int | None = None) -> srt.Buffer:
    buf = rt.host_allocator.allocate(n)
    if fill is not None:
        buf.numpy()[:] = fill
    return buf


class Gate:
    """A host function that holds its stream until :meth:`open` (always opened by the test's finally)."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def __call__(self) -> None:
        if not self._event.wait(10):
            raise TimeoutError("gate never opened")

    def open(self) -> None:
        self._event.set()


def eventually(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``cond`` until true (completion callbacks run on runtime threads, just after a Run resolves)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout} s")
        time.sleep(0.002)
