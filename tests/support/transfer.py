"""Moving bytes to and from a runtime's memory in tests, through pinned staging; each call waits for its copy."""

from __future__ import annotations

from typing import Any

import numpy as np

import streamrt as srt


def upload(rt: srt.Runtime, s: srt.Stream, arr: np.ndarray, dst: srt.Buffer | None = None) -> srt.Buffer:
    """``arr``'s bytes in (new or given) device memory of ``rt``, copied on ``s``; waits for the copy."""
    raw = np.ascontiguousarray(arr).view(np.uint8).ravel()
    if dst is None:
        dst = rt.device_allocator.allocate(max(raw.nbytes, 1), stream=s)
    if raw.nbytes:
        stage = rt.host_allocator.allocate(raw.nbytes)
        stage.numpy(np.uint8)[:] = raw
        s.copy(dst, stage, raw.nbytes)
        s.synchronize()
        stage.release()
    return dst


def download(rt: srt.Runtime, s: srt.Stream, src: srt.Buffer, dtype: Any = np.uint8) -> np.ndarray:
    """A copy of ``src``'s bytes (any kind of memory) after the work enqueued so far on ``s``."""
    stage = rt.host_allocator.allocate(src.nbytes)
    try:
        s.copy(stage, src)
        s.synchronize()
        return stage.numpy(dtype).copy()
    finally:
        stage.release()
