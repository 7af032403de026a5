"""The recipe's two kernels: their specs, simulator twins, launch shapes and arguments. Registered on import.

=============================  ==========================  ==========================================
kernel                         source                      simulator twin
=============================  ==========================  ==========================================
``fmha_bwd_prepare``           ``fmha_bwd_prepare.hip``    :func:`~.reference.pack_metadata` + the
                                                           result record
``fmha_bwd_dq_acc_prezero``    ``fmha_bwd_prezero.hip``    reads the count, zeroes that many floats
=============================  ==========================  ==========================================

The sources name this package in a ``// streamrt-register:`` line, so loading them
imports it (and so registers these) first. The twins' cost models depend on the
launch arguments only (the simulator's rule): the prezero is charged for the dq_acc
*bound*, not the used prefix it cannot know at enqueue.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._kernel import KernelArgs, KernelSpec, register_kernel
from .layout import WorkspaceParams
from .reference import pack_metadata
from .result import RESULT_BYTES

__all__ = ["PREPARE_THREADS", "PREZERO_THREADS", "prepare_params", "prepare_scalars", "prezero_args", "prezero_grid"]

PREPARE_THREADS = 256  # SRT_PREP_THREADS of fmha_bwd_prepare.hip
PREZERO_THREADS = 256  # SRT_PREZERO_THREADS of fmha_bwd_prezero.hip
_LAUNCH_US = 3.0  # an empty kernel in a stream (measured on the H200)
_BYTES_PER_US = 3.0e6  # ~3 TB/s of device memory traffic


def prepare_params(args: KernelArgs) -> WorkspaceParams:
    """The ``WorkspaceParams`` of a ``fmha_bwd_prepare`` launch (``ValueError``/``TypeError`` if invalid)."""
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


def prepare_scalars(params: WorkspaceParams) -> list[int]:
    """The ten scalar arguments of a ``fmha_bwd_prepare`` launch, in the kernel's order (after the
    seqstart_q, seqstart_k, workspace and result pointers); the inverse of :func:`prepare_params`."""
    p = params
    return [p.batch, p.nhead, p.hdim_q, p.kM0, p.kN0, p.num_cus, int(p.deterministic), p.max_seqlen_q, p.max_seqlen_k, p.total_q_padded]


def prezero_args(params: WorkspaceParams) -> tuple[int, int, int]:
    """``(count_offset, dq_acc_offset, max_count)`` of the prezero for a deterministic workspace:
    the count is ``offsets[batch]``, the fp32 elements are zeroed from the metadata region's end."""
    return params.metadata_layout.total_offset, params.metadata_region_bytes, params.dq_acc_bound_bytes // 4


def prezero_grid(bound_bytes: int, multiprocessor_count: int) -> tuple[int, int, int]:
    """Blocks for the prezero: enough to zero ``bound_bytes`` in about eight 16-byte stores per
    thread, at most two per SM, at least one."""
    per_block = PREZERO_THREADS * 16 * 8
    return (max(1, min(-(-bound_bytes // per_block), 2 * max(int(multiprocessor_count), 1))), 1, 1)


# -- fmha_bwd_prepare ---------------------------------------------------------------------------------


def _params_of(scalars: tuple[int, ...]) -> WorkspaceParams:
    """The params of a launch's ten scalar arguments (:func:`prepare_scalars`' order; checked by the spec)."""
    batch, nhead, hdim_q, kM0, kN0, num_cus, det, max_q, max_k, total_q = scalars
    return WorkspaceParams(batch, nhead, hdim_q, kM0, kN0, num_cus, bool(det), max_q, max_k, total_q)


def _prepare_twin(ctx: Any, grid: Any, block: Any, seqstart_q: int, seqstart_k: int, workspace: int, result: int, *scalars: int) -> None:
    params = _params_of(scalars)
    q = np.array(ctx.view(seqstart_q, params.batch + 1, np.int32))
    k = np.array(ctx.view(seqstart_k, params.batch + 1, np.int32))
    record = ctx.view(result, RESULT_BYTES, np.uint8) if result else None
    pack_metadata(params, q, k, out=ctx.view(workspace, params.metadata_region_bytes, np.uint8), result=record)


def _prepare_cost(grid: Any, block: Any, q: int, k: int, ws: int, res: int, *scalars: int) -> float:
    """Launch + writing the metadata region at memory bandwidth + ~1 ns per batch entry and per CU."""
    params = _params_of(scalars)
    return _LAUNCH_US + params.metadata_region_bytes / _BYTES_PER_US + 1e-3 * (params.batch + params.num_cus)


def _check_prepare(args: KernelArgs, grid: Any, block: Any, smem: int) -> None:
    params = prepare_params(args)
    ws_lo, ws_hi = args.workspace, args.workspace + params.metadata_region_bytes
    for name, size in (("seqstart_q", 4 * (params.batch + 1)), ("seqstart_k", 4 * (params.batch + 1)), ("result", RESULT_BYTES)):
        lo = args[name]
        if lo and lo < ws_hi and ws_lo < lo + size:
            raise ValueError(f"fmha_bwd_prepare: {name} overlaps the workspace the kernel writes")
    if block != (PREPARE_THREADS, 1, 1):
        raise ValueError(f"fmha_bwd_prepare runs with block ({PREPARE_THREADS}, 1, 1), got {block}")
    if grid != (1, 1, 1):
        raise ValueError(f"fmha_bwd_prepare runs as one block: launch it with grid (1, 1, 1), got {grid}")


# -- fmha_bwd_dq_acc_prezero ------------------------------------------------------------------------------


def _prezero_twin(ctx: Any, grid: Any, block: Any, workspace: int, count_offset: int, dq_acc_offset: int, max_count: int) -> None:
    count = min(max(int(ctx.view(workspace + count_offset, 1, np.int64)[0]), 0), max_count)
    ctx.view(workspace + dq_acc_offset, count, np.float32)[:] = 0


def _check_prezero(args: KernelArgs, grid: Any, block: Any, smem: int) -> None:
    count_offset, dq_acc_offset, max_count = args.count_offset, args.dq_acc_offset, args.max_count
    if count_offset < 0 or count_offset % 8 or count_offset + 8 > dq_acc_offset:
        raise ValueError(f"fmha_bwd_dq_acc_prezero: count_offset must be 8-byte aligned and before dq_acc, got {count_offset}")
    if dq_acc_offset % 16:
        raise ValueError(f"fmha_bwd_dq_acc_prezero: dq_acc_offset must be 16-byte aligned, got {dq_acc_offset}")
    if max_count < 0:
        raise ValueError(f"fmha_bwd_dq_acc_prezero: max_count must be >= 0, got {max_count}")
    if block != (PREZERO_THREADS, 1, 1) or grid[1:] != (1, 1):
        raise ValueError(f"fmha_bwd_dq_acc_prezero runs with a 1-D grid and block ({PREZERO_THREADS}, 1, 1), got {grid}, {block}")


# -- registration ------------------------------------------------------------------------------------


def _register() -> None:
    seq_bytes = lambda a: 4 * (a.batch + 1)  # noqa: E731
    register_kernel(
        KernelSpec(
            "fmha_bwd_prepare",
            sizes={
                "seqstart_q": seq_bytes,
                "seqstart_k": seq_bytes,
                "workspace": lambda a: prepare_params(a).metadata_region_bytes,
                "result": lambda a: RESULT_BYTES,
            },
            access={"seqstart_q": "r", "seqstart_k": "r", "workspace": "w", "result": "w"},
            nullable=frozenset({"result"}),
            align={"workspace": 16, "result": 8},
            check=_check_prepare,
        ),
        twin=_prepare_twin,
        signature=("ptr:r", "ptr:r", "ptr:w", "ptr:w") + ("i32",) * 10,
        cost_us=_prepare_cost,
    )
    register_kernel(
        KernelSpec(
            "fmha_bwd_dq_acc_prezero",
            sizes={"workspace": lambda a: a.dq_acc_offset + 4 * max(a.max_count, 0)},
            access={"workspace": "rw"},
            align={"workspace": 16},
            check=_check_prezero,
        ),
        twin=_prezero_twin,
        signature=("ptr:rw", "i64", "i64", "i64"),
        cost_us=lambda grid, block, ws, count_offset, dq_acc_offset, max_count: _LAUNCH_US + 4 * max(max_count, 0) / _BYTES_PER_US,
    )


_register()
