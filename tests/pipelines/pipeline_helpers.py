"""Helpers shared by the pipeline tests: moving bytes to and from the device, blocking gates."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

import streamrt as srt


def upload(rt: srt.Runtime, s: srt.Stream, arr: np.ndarray, dst: srt.Buffer | None = None) -> srt.Buffer:
    """``arr``'s bytes in device memory (``dst`` or a new buffer); waits for the copy."""
    arr = np.ascontiguousarray(arr)
    if dst is None:
        dst = rt.device_allocator.allocate(arr.nbytes, stream=s)
    stage = rt.host_allocator.allocate(arr.nbytes)
    stage.numpy(np.uint8)[:] = arr.view(np.uint8).ravel()
    s.copy(dst, stage)
    s.synchronize()
    stage.release()
    return dst


def download(rt: srt.Runtime, s: srt.Stream, src: srt.Buffer, dtype: object = np.uint8) -> np.ndarray:
    """A copy of ``src``'s bytes, after the work enqueued so far on ``s``."""
    stage = rt.host_allocator.allocate(src.nbytes)
    s.copy(stage, src)
    s.synchronize()
    out = stage.numpy(dtype).copy()
    stage.release()
    return out


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
