"""Helpers for the multi-device tests: moving bytes to and from one device's memory, gates."""

from __future__ import annotations

import threading

import numpy as np

import streamrt as srt


def upload(rt: srt.Runtime, s: srt.Stream, data: np.ndarray) -> srt.Buffer:
    """A device buffer of ``rt`` holding ``data``'s bytes (enqueued on ``s``; waits for the copy)."""
    data = np.ascontiguousarray(data).view(np.uint8).ravel()
    dst = rt.device_allocator.allocate(data.nbytes, stream=s)
    stage = rt.host_allocator.allocate(data.nbytes)
    stage.numpy()[:] = data
    s.copy(dst, stage)
    s.synchronize()
    stage.release()
    return dst


def download(rt: srt.Runtime, s: srt.Stream, src: srt.Buffer) -> np.ndarray:
    """``src``'s bytes after the work enqueued so far on ``s`` (a stream of ``rt``)."""
    stage = rt.host_allocator.allocate(src.nbytes)
    s.copy(stage, src)
    s.synchronize()
    out = stage.numpy().copy()
    stage.release()
    return out


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
