"""The numpy oracle of the workspace metadata, and the fast host pack that must match it byte for byte.

Algorithm (DESIGN §8), with ``sq_b = seqstart_q[b+1] - seqstart_q[b]``,
``sk_b = seqstart_k[b+1] - seqstart_k[b]`` and ``nc_b = ceil(sk_b / kN0)``:

Validation. The ``status`` bits of :mod:`.layout` are set when a length is
negative, when ``seqstart_q[batch] - seqstart_q[0] > total_q_padded``, when
some ``sk_b > max_seqlen_k`` or some ``sq_b > max_seqlen_q``. Any set bit
produces the error block (nothing used, every worker idle).

Non-deterministic mode. ``nsplits[b] = 1`` for every batch (also when
``sk_b = 0``); no workers are recorded.

Deterministic mode.

1. Work units are the pairs (head, key-block) of each batch, ``nhead * nc_b``
   of them, each of weight ``w_b = roundup(max(sq_b, 1), kM0)``. They are laid
   out batch by batch, within a batch head by head, within a head by key block:
   unit ``(b, h, j)`` has index ``sum_{b'<b} nhead*nc_b' + h*nc_b + j`` and
   starting weight ``P(b, h, j)`` = the sum of the weights of all units before it.
2. ``W`` = the total weight, ``q = ceil(W / num_cus)`` (``0`` when ``W = 0``).
   Unit ``u`` goes to worker ``floor(P_u / q)``; so worker ``i`` gets the
   units whose starting weight lies in ``[i*q, (i+1)*q)``: a contiguous range of
   about ``q`` weight. Units are never split; a worker whose range holds no
   unit start is idle. Every worker index is ``< num_cus`` because ``P_u < W <= num_cus*q``.
3. Each (batch, head) pair's units are contiguous, so the workers that touch
   it, ``floor(P(b,h,j)/q)`` for ``j = 0 .. nc_b-1``, form a non-decreasing
   sequence. A worker's *split index* in (b, h) is the number of distinct
   workers that touched (b, h) before it: each worker accumulates its key
   blocks of (b, h) into its own partial dq slice, so no two workers write the
   same slice and the reduction order is fixed. Closed forms, with
   ``first(b,h) = floor(P(b,h,0)/q)`` and ``last(b,h) = floor(P(b,h,nc_b-1)/q)``:
   if ``w_b >= q`` every unit of the pair goes to its own worker (idle workers
   may lie between them), so the split index of unit ``j``'s worker is ``j``
   and ``nc_b`` workers touch the pair; if ``w_b < q`` consecutive units'
   workers differ by at most one, so the split index is ``i - first(b,h)`` and
   ``last(b,h) - first(b,h) + 1`` workers touch the pair.
4. ``nsplits[b]`` = the largest number of workers touching any (b, h), and
   ``0`` when ``nc_b = 0`` (no keys, no units, nothing accumulated: dq of that
   batch is 0). This is at most ``nc_b <= ceil(max_seqlen_k / kN0) = nsplits_bound``,
   which is what keeps the used dq_acc inside the workspace's upper bound.
   (Counting the workers that touch the whole *batch* instead can exceed that
   bound: with ``nhead = 8``, ``nc_b = 1``, ``num_cus = 8`` each worker takes one
   head, 8 workers touch the batch, but ``nsplits_bound = 1``.)
5. ``worker_start[i] = (b, split, h, j)`` of worker ``i``'s first unit
   ``(b, h, j)``; ``worker_units[i]`` = its unit count. A worker that moves on
   to another (batch, head) starts there at split 0: it is that pair's first worker.

Both modes: ``offsets[0] = 0``, ``offsets[b+1] = offsets[b] + nhead * nsplits[b] * sq_b * hdim_q``
(fp32 elements); ``dq_acc_used_bytes = 4 * offsets[batch]``.

:func:`reference_metadata` follows these steps literally, unit by unit (slow,
obviously right). :func:`pack_metadata` computes the same bytes in
``O(batch * nhead + num_cus)`` vectorized numpy: it is what the host-pack node
runs, and what a device kernel would mirror.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .layout import (
    IDLE,
    STATUS_NEGATIVE_LENGTH,
    STATUS_OK,
    STATUS_SEQLEN_K_EXCEEDED,
    STATUS_SEQLEN_Q_EXCEEDED,
    STATUS_TOTAL_Q_EXCEEDED,
    WorkspaceParams,
    write_metadata,
)

__all__ = ["as_seqstart", "pack_metadata", "reference_metadata"]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def as_seqstart(values: Any, batch: int, what: str) -> np.ndarray:
    """``values`` as an int64 array of ``batch + 1`` entries; ``ValueError`` on a wrong shape or non-int32 values."""
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.shape[0] != batch + 1:
        raise ValueError(f"{what} must have batch + 1 = {batch + 1} entries, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{what} must hold integers, not {arr.dtype}")
    out = arr.astype(np.int64)
    if arr.dtype.itemsize > 4 or arr.dtype == np.uint32:  # narrower types fit by construction
        if out.size and (out.min() < _INT32_MIN or out.max() > _INT32_MAX):
            raise ValueError(f"{what} values must fit in int32")
    return out


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# -- the oracle ------------------------------------------------------------------------------------


def reference_metadata(params: WorkspaceParams, seqstart_q: Any, seqstart_k: Any) -> np.ndarray:
    """The metadata region (``params.metadata_region_bytes`` uint8) for these seqstart arrays.

    A literal, unit-by-unit implementation of the module docstring: the oracle
    the host pack and the device kernel are tested against. Invalid seqlens
    give the error block (``status != 0``); a wrong array shape raises ``ValueError``.
    """
    p = params
    ssq = [int(x) for x in as_seqstart(seqstart_q, p.batch, "seqstart_q")]
    ssk = [int(x) for x in as_seqstart(seqstart_k, p.batch, "seqstart_k")]
    sq = [ssq[b + 1] - ssq[b] for b in range(p.batch)]
    sk = [ssk[b + 1] - ssk[b] for b in range(p.batch)]

    status = STATUS_OK
    if min(sq) < 0 or min(sk) < 0:
        status |= STATUS_NEGATIVE_LENGTH
    if ssq[p.batch] - ssq[0] > p.total_q_padded:
        status |= STATUS_TOTAL_Q_EXCEEDED
    if max(sk) > p.max_seqlen_k:
        status |= STATUS_SEQLEN_K_EXCEEDED
    if max(sq) > p.max_seqlen_q:
        status |= STATUS_SEQLEN_Q_EXCEEDED

    nw = p.num_workers
    nsplits = [0] * p.batch
    worker_start = [[IDLE] * 4 for _ in range(nw)]
    worker_units = [0] * nw
    total_units = total_weight = quota = 0
    if status == STATUS_OK:
        if not p.deterministic:
            nsplits = [1] * p.batch
        else:
            units = []  # (b, h, j, weight) in layout order
            for b in range(p.batch):
                nc = _ceil_div(sk[b], p.kN0)
                weight = _ceil_div(max(sq[b], 1), p.kM0) * p.kM0
                for h in range(p.nhead):
                    for j in range(nc):
                        units.append((b, h, j, weight))
            total_units = len(units)
            total_weight = sum(u[3] for u in units)
            quota = _ceil_div(total_weight, nw) if total_weight else 0
            touching: dict[tuple[int, int], list[int]] = {}  # (b, h) -> workers, in order
            start = 0
            for b, h, j, weight in units:
                worker = start // quota
                seen = touching.setdefault((b, h), [])
                if not seen or seen[-1] != worker:
                    seen.append(worker)
                if worker_units[worker] == 0:
                    worker_start[worker] = [b, len(seen) - 1, h, j]
                worker_units[worker] += 1
                start += weight
            for (b, _h), workers in touching.items():
                nsplits[b] = max(nsplits[b], len(workers))
    offsets = [0]
    for b in range(p.batch):
        offsets.append(offsets[-1] + p.nhead * nsplits[b] * max(sq[b], 0) * p.hdim_q)

    out = np.zeros(p.metadata_region_bytes, dtype=np.uint8)
    write_metadata(
        out,
        p,
        status=status,
        offsets=offsets,
        nsplits=nsplits,
        worker_start=np.array(worker_start, dtype=np.int64).reshape(nw, 4),
        worker_units=worker_units,
        total_units=total_units,
        total_weight=total_weight,
        unit_quota=quota,
    )
    return out


# -- the fast host pack ------------------------------------------------------------------------------


def pack_metadata(params: WorkspaceParams, seqstart_q: Any, seqstart_k: Any, out: np.ndarray | None = None) -> np.ndarray:
    """Compute the metadata region into ``out`` (a uint8 array of ``metadata_region_bytes``; new if ``None``).

    Byte-identical to :func:`reference_metadata`, vectorized. Returns ``out``.
    Never raises for invalid seqlens (it writes the error block; check
    ``status`` with :func:`~.layout.parse_metadata`); raises ``ValueError`` for
    a wrong array shape or a wrong ``out``.
    """
    p = params
    ssq = as_seqstart(seqstart_q, p.batch, "seqstart_q")
    ssk = as_seqstart(seqstart_k, p.batch, "seqstart_k")
    if out is None:
        out = np.empty(p.metadata_region_bytes, dtype=np.uint8)
    sq = ssq[1:] - ssq[:-1]
    sk = ssk[1:] - ssk[:-1]
    status = STATUS_OK
    if p.batch:
        sq_min, sq_max, sk_min, sk_max = int(sq.min()), int(sq.max()), int(sk.min()), int(sk.max())
        if sq_min < 0 or sk_min < 0:
            status |= STATUS_NEGATIVE_LENGTH
        if sk_max > p.max_seqlen_k:
            status |= STATUS_SEQLEN_K_EXCEEDED
        if sq_max > p.max_seqlen_q:
            status |= STATUS_SEQLEN_Q_EXCEEDED
    if int(ssq[-1]) - int(ssq[0]) > p.total_q_padded:
        status |= STATUS_TOTAL_Q_EXCEEDED
    nw = p.num_workers
    worker_start = np.full((nw, 4), IDLE, dtype=np.int64)
    worker_units = np.zeros(nw, dtype=np.int64)
    total_units = total_weight = quota = 0
    if status != STATUS_OK:
        nsplits = np.zeros(p.batch, dtype=np.int64)
    elif not p.deterministic:
        nsplits = np.ones(p.batch, dtype=np.int64)
    else:
        nsplits, total_units, total_weight, quota = _deterministic_split(p, sq, sk, worker_start, worker_units)
    offsets = np.zeros(p.batch + 1, dtype=np.int64)
    if status == STATUS_OK:
        np.cumsum(p.nhead * nsplits * sq * p.hdim_q, out=offsets[1:])
    write_metadata(
        out,
        p,
        status=status,
        offsets=offsets,
        nsplits=nsplits,
        worker_start=worker_start,
        worker_units=worker_units,
        total_units=total_units,
        total_weight=total_weight,
        unit_quota=quota,
    )
    return out


def _deterministic_split(
    p: WorkspaceParams, sq: np.ndarray, sk: np.ndarray, worker_start: np.ndarray, worker_units: np.ndarray
) -> tuple[np.ndarray, int, int, int]:
    """Steps 1-5 of the module docstring over batches and workers; fills the worker arrays."""
    nc = -(-sk // p.kN0)  # key blocks per batch
    w = -(-np.maximum(sq, 1) // p.kM0) * p.kM0  # unit weight per batch
    units = p.nhead * nc  # units per batch
    batch_weight = units * w
    ends = np.cumsum(batch_weight)
    starts = ends - batch_weight  # P of each batch's first unit
    total_weight = int(ends[-1])
    total_units = int(units.sum())
    if total_weight == 0:
        return np.zeros(p.batch, dtype=np.int64), 0, 0, 0
    q = -(-total_weight // p.num_cus)

    # Splits: first/last worker of every (batch, head) with units.
    heads = np.arange(p.nhead, dtype=np.int64)
    p_first = starts[:, None] + heads[None, :] * (nc * w)[:, None]
    p_last = p_first + ((nc - 1) * w)[:, None]
    first_worker = p_first // q
    spread = w >= q  # each unit of the pair on its own worker
    touching = np.where(spread[:, None], nc[:, None], p_last // q - first_worker + 1)
    nsplits = np.where(nc > 0, touching.max(axis=1), 0)

    # Workers: units with starting weight in [i*q, (i+1)*q).
    unit_ends = np.cumsum(units)
    unit_starts = unit_ends - units  # global index of each batch's first unit
    ne = np.flatnonzero(units > 0)  # batches with units: their start weights strictly increase
    ne_start, ne_units, ne_w, ne_ustart = starts[ne], units[ne], w[ne], unit_starts[ne]

    def units_before(x: np.ndarray) -> np.ndarray:
        """Number of units whose starting weight is < x (x >= 0)."""
        k = np.searchsorted(ne_start, x, side="left") - 1  # last non-empty batch starting below x
        kk = np.maximum(k, 0)
        inside = np.minimum(ne_units[kk], -(-(x - ne_start[kk]) // ne_w[kk]))
        return np.where(k >= 0, ne_ustart[kk] + inside, 0)

    lo = np.arange(p.num_cus, dtype=np.int64) * q
    first_unit = units_before(lo)
    count = units_before(lo + q) - first_unit
    busy = np.flatnonzero(count > 0)
    g = first_unit[busy]
    b = np.searchsorted(unit_ends, g, side="right")
    k = g - unit_starts[b]
    h = k // nc[b]
    j = k % nc[b]
    worker_start[busy, 0] = b
    worker_start[busy, 1] = np.where(spread[b], j, busy - first_worker[b, h])
    worker_start[busy, 2] = h
    worker_start[busy, 3] = j
    worker_units[busy] = count[busy]
    return nsplits, total_units, total_weight, int(q)
