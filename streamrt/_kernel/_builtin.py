"""The shipped kernels' specs, simulator twins and Python launchers.

Registered when this module is imported, which :class:`~._library.KernelLibrary` does before its
first compile (so ``import streamrt`` does not import the simulator):

=====================  ============================  ==========================================
kernel                 source                        twin
=====================  ============================  ==========================================
``fill_u32``           ``verify.hip``                numpy fill; ~3 µs + 4 bytes/word at 3 TB/s
``checksum_u32``       ``verify.hip``                :func:`checksum_words`; same cost
``spin_sleep``         ``sleep.hip``                 writes the requested time; costs it
``fmha_bwd_prepare``   ``fmha_bwd_prepare.hip``      the recipe's ``pack_metadata`` + zeroing
=====================  ============================  ==========================================

The twins run on the simulator's executor thread in stream order. Their cost
models depend on the launch arguments only (the simulator's rule), so the
prepare is charged for its metadata region and the dq_acc *bound*, not the used
bytes it cannot know at enqueue.
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

__all__ = ["PREPARE_THREADS", "prepare_grid", "prepare_params", "prepare_scalars"]

_LAUNCH_US = 3.0  # an empty kernel in a stream (DESIGN §9)
_BYTES_PER_US = 3.0e6  # ~3 TB/s of device memory traffic
_CHUNK = 1 << 20  # words per numpy step (bounds the twins' temporary memory)
PREPARE_THREADS = 256  # SRT_PREP_THREADS of fmha_bwd_prepare.hip


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


# -- the FMHA backward workspace prepare ---------------------------------------------------------------


def prepare_params(args: KernelArgs) -> Any:
    """The recipe's ``WorkspaceParams`` of a ``fmha_bwd_prepare`` launch (``ValueError``/``TypeError`` if invalid)."""
    from ..recipes.fmha_bwd.layout import WorkspaceParams

    if args.deterministic not in (0, 1):
        raise ValueError(f"fmha_bwd_prepare: deterministic must be 0 or 1, got {args.deterministic}")
    return WorkspaceParams(
        batch=args.batch,
        nhead=args.nhead,
        hdim_q=args.hdim_q,
        kM0=args.kM0,
        kN0=args.kN0,
        num_cus=args.num_cus,
        deterministic=bool(args.deterministic),
        max_seqlen_q=args.max_seqlen_q,
        max_seqlen_k=args.max_seqlen_k,
        total_q_padded=args.total_q_padded,
    )


def prepare_scalars(params: Any) -> list[int]:
    """The ten scalar arguments of a ``fmha_bwd_prepare`` launch for ``params``, in the kernel's order
    (after the seqstart_q, seqstart_k and workspace pointers); the inverse of :func:`prepare_params`."""
    return [
        params.batch,
        params.nhead,
        params.hdim_q,
        params.kM0,
        params.kN0,
        params.num_cus,
        int(params.deterministic),
        params.max_seqlen_q,
        params.max_seqlen_k,
        params.total_q_padded,
    ]


def prepare_grid(params: Any, multiprocessor_count: int) -> tuple[int, int, int]:
    """The grid of a ``fmha_bwd_prepare`` launch: block 0 for the metadata, then enough blocks
    (at most two per SM) to zero the dq_acc bound in a few sweeps of 16-byte stores."""
    per_block = PREPARE_THREADS * 16 * 8  # 32 KiB: eight 16-byte stores per thread
    zero_blocks = min(-(-params.dq_acc_bound_bytes // per_block), 2 * max(int(multiprocessor_count), 1))
    return (1 + zero_blocks, 1, 1)


def _prepare_twin(
    ctx: Any,
    grid: Any,
    block: Any,
    seqstart_q: int,
    seqstart_k: int,
    workspace: int,
    batch: int,
    nhead: int,
    hdim_q: int,
    kM0: int,
    kN0: int,
    num_cus: int,
    deterministic: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
    total_q_padded: int,
) -> None:
    from ..recipes.fmha_bwd.layout import WorkspaceParams
    from ..recipes.fmha_bwd.reference import pack_metadata

    params = WorkspaceParams(
        batch=batch,
        nhead=nhead,
        hdim_q=hdim_q,
        kM0=kM0,
        kN0=kN0,
        num_cus=num_cus,
        deterministic=bool(deterministic),
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        total_q_padded=total_q_padded,
    )
    q = np.array(ctx.view(seqstart_q, batch + 1, np.int32))
    k = np.array(ctx.view(seqstart_k, batch + 1, np.int32))
    region = params.metadata_region_bytes
    meta = ctx.view(workspace, region, np.uint8)
    pack_metadata(params, q, k, out=meta)
    used = int(meta[48:56].view("<i8")[0])
    ctx.view(workspace + region, used, np.uint8)[:] = 0


def _prepare_cost(
    grid: Any,
    block: Any,
    q: int,
    k: int,
    ws: int,
    batch: int,
    nhead: int,
    hdim_q: int,
    kM0: int,
    kN0: int,
    num_cus: int,
    det: int,
    msq: int,
    msk: int,
    tqp: int,
) -> float:
    """Launch + the metadata region + the dq_acc bound at memory bandwidth, + ~1 ns per batch entry."""
    nsplits_bound = -(-msk // max(kN0, 1)) if det else 1
    bound = 4 * nhead * nsplits_bound * tqp * hdim_q
    workers = num_cus if det else 0
    metadata = -(-(-(-(128 + 8 * (batch + 1) + 4 * batch) // 8) * 8 + 20 * workers) // 8) * 8
    region = -(-metadata // 4096) * 4096
    return _stream_cost(region + max(bound, 0)) + 1e-3 * batch


def _prepare_workspace_bytes(args: KernelArgs) -> int:
    return int(prepare_params(args).workspace_bytes)


def _check_prepare(args: KernelArgs, grid: Any, block: Any, smem: int) -> None:
    params = prepare_params(args)
    ws_lo, ws_hi = args.workspace, args.workspace + params.workspace_bytes
    for name in ("seqstart_q", "seqstart_k"):
        lo = args[name]
        if lo and lo < ws_hi and ws_lo < lo + 4 * (params.batch + 1):
            raise ValueError(f"fmha_bwd_prepare: {name} overlaps the workspace the kernel writes")
    if block != (PREPARE_THREADS, 1, 1):
        raise ValueError(f"fmha_bwd_prepare runs with block ({PREPARE_THREADS}, 1, 1), got {block}")
    if grid[1:] != (1, 1):
        raise ValueError(f"fmha_bwd_prepare uses a 1-D grid (1 + zeroing blocks, 1, 1), got {grid}")


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
    seq_bytes = lambda a: 4 * (a.batch + 1)  # noqa: E731
    register_kernel_spec(
        KernelSpec(
            "fmha_bwd_prepare",
            sizes={"seqstart_q": seq_bytes, "seqstart_k": seq_bytes, "workspace": _prepare_workspace_bytes},
            access={"seqstart_q": "r", "seqstart_k": "r", "workspace": "w"},
            align={"workspace": 16},
            check=_check_prepare,
        )
    )
    register_twin("fill_u32", ("ptr:w", "u64", "u32", "u32"), _fill_twin, cost_us=lambda g, b, out, n, v, s: _stream_cost(4 * n))
    register_twin("checksum_u32", ("ptr:r", "u64", "ptr:rw"), _checksum_twin, cost_us=lambda g, b, data, n, res: _stream_cost(4 * n))
    register_twin("spin_sleep", ("ptr:w", "f64", "f64"), _sleep_twin, cost_us=lambda g, b, out, us, rate: max(float(us), 0.0))
    register_twin("fmha_bwd_prepare", ("ptr:r", "ptr:r", "ptr:w") + ("i32",) * 10, _prepare_twin, cost_us=_prepare_cost)


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
