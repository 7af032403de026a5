"""The shipped kernels' specs, simulator twins and Python launchers.

Registered when this module is imported, which :class:`~._library.KernelLibrary` does before its
first compile (so ``import streamrt`` does not import the simulator):

=====================  ============================  ==========================================
kernel                 source                        twin
=====================  ============================  ==========================================
``fill_u32``           ``verify.hip``                numpy fill; ~3 µs + 4 bytes/word at 3 TB/s
``checksum_u32``       ``verify.hip``                :func:`checksum_words`; same cost
``spin_sleep``         ``sleep.hip``                 writes the requested time; costs it
=====================  ============================  ==========================================

The twins run on the simulator's executor thread in stream order; their cost
models depend on the launch arguments only (the simulator's rule). The FMHA
recipe's kernels are registered by the recipe (:mod:`streamrt.recipes.fmha_bwd`,
through :func:`~._register.register_kernel`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .._backends.sim import register_twin
from ._launch import launch_kernel
from ._reference import checksum_words, fill_words
from ._spec import KernelArgs, KernelSpec, register_kernel_spec

if TYPE_CHECKING:
    from .._buffer import Buffer
    from .._stream import Stream
    from ._library import KernelLibrary

__all__ = ["checksum_u32", "fill_u32", "spin_sleep"]

_LAUNCH_US = 3.0  # an empty kernel in a stream (measured on the H200)
_BYTES_PER_US = 3.0e6  # ~3 TB/s of device memory traffic
_CHUNK = 1 << 20  # words per numpy step (bounds the twins' temporary memory)


def _one_dimensional(kernel: str, grid: tuple[int, int, int], block: tuple[int, int, int]) -> None:
    if grid[1:] != (1, 1) or block[1:] != (1, 1):
        raise ValueError(f"{kernel} uses x dimensions only: launch it with grid (n, 1, 1) and block (m, 1, 1), got {grid}, {block}")


def _stream_cost(nbytes: int) -> float:
    return _LAUNCH_US + nbytes / _BYTES_PER_US


# -- fill / checksum ------------------------------------------------------------------------------


def _fill_twin(ctx: Any, grid: Any, block: Any, out: int, count: int, value: int, step: int) -> None:
    for lo in range(0, count, _CHUNK):
        n = min(_CHUNK, count - lo)
        ctx.view(out + 4 * lo, n, np.uint32)[:] = fill_words(n, value, step, lo)


def _checksum_twin(ctx: Any, grid: Any, block: Any, data: int, count: int, result: int) -> None:
    total = 0
    for lo in range(0, count, _CHUNK):
        n = min(_CHUNK, count - lo)
        total += checksum_words(ctx.view(data + 4 * lo, n, np.uint32), lo)
    r = ctx.view(result, 1, np.uint64)
    r[0] = (int(r[0]) + total) % 2**64


def _check_fill(args: KernelArgs, grid: Any, block: Any, smem: int) -> None:
    _one_dimensional("fill_u32", grid, block)


def _check_checksum(args: KernelArgs, grid: Any, block: Any, smem: int) -> None:
    _one_dimensional("checksum_u32", grid, block)


# -- sleep --------------------------------------------------------------------------------------


def _sleep_twin(ctx: Any, grid: Any, block: Any, out: int, microseconds: float, ticks_per_us: float) -> None:
    if out:
        rate = ticks_per_us if ticks_per_us > 0 else 1000.0
        ticks = math.floor(microseconds * rate + 0.5) if microseconds > 0 else 0
        ctx.view(out, 2, np.float64)[:] = (ticks / rate, rate)


def _check_sleep(args: KernelArgs, grid: Any, block: Any, smem: int) -> None:
    us = args.microseconds
    if not math.isfinite(us) or us < 0 or us > 60e6:
        raise ValueError(f"spin_sleep: microseconds must be in [0, 6e7] (one minute), got {us}")
    if not math.isfinite(args.ticks_per_us) or args.ticks_per_us < 0:
        raise ValueError(f"spin_sleep: ticks_per_us must be >= 0 (0: the device default), got {args.ticks_per_us}")
    if grid != (1, 1, 1) or block != (1, 1, 1):
        raise ValueError(f"spin_sleep runs on one thread: launch it with grid 1 and block 1, got {grid}, {block}")


# -- registration ------------------------------------------------------------------------------------


def _register() -> None:
    register_kernel_spec(KernelSpec("fill_u32", sizes={"out": lambda a: 4 * a.count}, access={"out": "w"}, check=_check_fill))
    register_kernel_spec(
        KernelSpec(
            "checksum_u32",
            sizes={"data": lambda a: 4 * a.count, "result": lambda a: 8},
            access={"data": "r", "result": "rw"},
            check=_check_checksum,
        )
    )
    register_kernel_spec(
        KernelSpec("spin_sleep", sizes={"out": lambda a: 16}, access={"out": "w"}, nullable=frozenset({"out"}), check=_check_sleep)
    )
    register_twin("fill_u32", ("ptr:w", "u64", "u32", "u32"), _fill_twin, cost_us=lambda g, b, out, n, v, s: _stream_cost(4 * n))
    register_twin("checksum_u32", ("ptr:r", "u64", "ptr:rw"), _checksum_twin, cost_us=lambda g, b, data, n, res: _stream_cost(4 * n))
    register_twin("spin_sleep", ("ptr:w", "f64", "f64"), _sleep_twin, cost_us=lambda g, b, out, us, rate: max(float(us), 0.0))


_register()


# -- launchers (the KernelLibrary methods) -------------------------------------------------------------------


def _words(buf: Buffer, count: int | None, what: str) -> int:
    if count is None:
        if buf.nbytes % 4:
            raise ValueError(f"{what} has {buf.nbytes} bytes, not a whole number of uint32 words; pass count=")
        return buf.nbytes // 4
    return count


def _grid_for(words: int, multiprocessor_count: int) -> int:
    return max(1, min(-(-words // 256), 4 * max(multiprocessor_count, 1)))


def fill_u32(lib: KernelLibrary, stream: Stream, dst: Any, value: int, step: int, *, count: int | None) -> None:
    rt = lib.runtime
    buf = rt.as_buffer(dst)
    n = _words(buf, count, "dst")
    launch_kernel(stream, lib.get("fill_u32"), _grid_for(n, rt.capabilities.multiprocessor_count), 256, [buf, n, value, step])


def checksum_u32(lib: KernelLibrary, stream: Stream, src: Any, result: Any, *, count: int | None) -> None:
    rt = lib.runtime
    buf = rt.as_buffer(src)
    res = rt.as_buffer(result)
    n = _words(buf, count, "src")
    kernel = lib.get("checksum_u32")
    kernel.bind([buf, n, res])  # check before the memset is enqueued
    stream.memset(res, 0, 8)
    launch_kernel(stream, kernel, _grid_for(n, rt.capabilities.multiprocessor_count), 256, [buf, n, res])


def spin_sleep(lib: KernelLibrary, stream: Stream, microseconds: float, *, out: Buffer | None) -> None:
    rate = float(getattr(lib.runtime.capabilities, "timer_ticks_per_us", 0.0) or 0.0)
    launch_kernel(stream, lib.get("spin_sleep"), 1, 1, [out, microseconds, rate])
