"""numpy references of the verification kernels (``kernels/verify.hip``): what ``fill_u32`` writes and
what ``checksum_u32`` adds. Used by their simulator twins and by tests. Pure numpy; no device."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["checksum_words", "fill_words"]

_CHUNK = 1 << 20  # words per numpy step (bounds the temporary memory)
_MASK32 = np.uint64(0xFFFFFFFF)


def fill_words(count: int, value: int, step: int, start: int = 0) -> np.ndarray:
    """``value + step * i`` (uint32, mod 2**32) for ``i`` in ``[start, start + count)``: what ``fill_u32`` writes."""
    i = np.arange(start, start + count, dtype=np.uint64) & _MASK32
    return ((np.uint64(value) + np.uint64(step) * i) & _MASK32).astype(np.uint32)


def checksum_words(words: Any, start: int = 0) -> int:
    """The ``checksum_u32`` sum of uint32 ``words`` whose first word has index ``start`` (mod 2**64)."""
    w = np.ascontiguousarray(words, dtype=np.uint32).ravel()
    total = np.uint64(0)
    with np.errstate(over="ignore"):
        for lo in range(0, w.size, _CHUNK):
            part = w[lo : lo + _CHUNK]
            i = np.arange(start + lo, start + lo + part.size, dtype=np.uint64)
            z = part.astype(np.uint64) + i * np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z ^= z >> np.uint64(31)
            total = total + z.sum(dtype=np.uint64)
    return int(total)
