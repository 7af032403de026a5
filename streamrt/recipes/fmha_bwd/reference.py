"""The numpy oracle of the workspace metadata, written from Composable Kernel's code, and the fast host pack.

Upstream: ROCm/rocm-libraries at commit ``40bda5c94c135c56b58540d7c30bd90bec53b848``,
``projects/composablekernel/include/ck_tile/ops/fmha/kernel/fmha_bwd_kernel.hpp``:
``FmhaBwdWorkspaceManager::PrepareWorkspace`` for group mode (the host pack that
``fmha_bwd_launcher::prepare_workspace_async`` of ``example/ck_tile/01_fmha/fmha_bwd.hpp``
at ``0b85deea1022129557784cf52bee71de83f30889`` runs as a host function, and that
the newest ``fmha_bwd.hpp`` runs as a one-thread device kernel). With
``sq_b = seqstart_q[b+1] - seqstart_q[b]``, ``sk_b`` likewise:

Non-deterministic mode. ``nsplits[0] = 1``. Batch ``b``'s dq_acc starts at element
``seqstart_q[b] * nhead * hdim_q``: the *absolute* seqstart, so the used size is
``4 * nhead * seqstart_q[batch] * hdim_q``.

Deterministic mode (the persistent kernel). A batch's work is ``nhead`` heads of
``nc_b = ceil(sk_b / kN0)`` key chunks, each of weight ``sq_w_b = roundup(sq_b, kM0)``
(``kM0`` when ``sq_b = 0``, so CUs are still dispatched to write dK/dV). Chunks are
laid out batch by batch, head by head: batch ``b`` spans ``[pb_b, pb_b + nhead * hw_b)``
with ``hw_b = nc_b * sq_w_b`` and ``pb_b`` the prefix sum. With the total ``W`` and
``target_w = ceil(W / num_cus)``, logical CU ``c`` owns ``[c * target_w, (c+1) * target_w)``:

* the CUs of batch ``b`` are ``c`` in ``[ceil(pb_b / target_w), ceil(pb_next / target_w))``
  (capped at ``num_cus``); each starts at the first chunk boundary at or after
  ``c * target_w``: ``head_start = (c * target_w - pb_b) // hw_b``,
  ``wc_start = c * target_w - pb_b - head_start * hw_b``,
  ``c_start = ceil(wc_start / sq_w_b)`` (may equal ``nc_b``: a start at the end of its head),
  ``w_lo = pb_b + head_start * hw_b + c_start * sq_w_b``;
* ``isplit = min(ceil(wc_start / max(sq_w_b, target_w)), nc_b - 1)``: the partial dq slice
  it accumulates the first head into (a CU that moves on to the next head starts there at 0);
* ``w_hi`` = the next logical CU's ``w_lo`` (the last: ``W``); ``w_lo == w_hi`` is an idle CU;
  CUs past the last batch are inactive: ``{W, W, batch, 0, 0, 0}`` (``ibatch = batch``);
* ``nsplits[b] = max(1, max(isplit + 1))`` over the CUs of ``b`` with ``c_start < nc_b``;
* ``offsets[b+1] = offsets[b] + nhead * nsplits[b] * sq_b * hdim_q``; batch ``b``'s
  dq_acc is ``[nhead][nsplits[b]][sq_b][hdim_q]`` at element ``offsets[b]``;
* ``batch_state[b] = {sq_w_b, nc_b, nsplits[b]}``;
* every ``sk_b = 0``: nothing accumulates; ``nsplits`` all 1, ``offsets`` all 0, every
  CU ``{0, 0, batch, 0, 0, 0}``, ``batch_state`` ``{0, 0, 1}`` (CK's short-circuit).

streamrt's additions (see :mod:`.result`): invalid input (a ``STATUS_*`` bit) gets
that short-circuit image too (the *idle image*: a kernel that trusts it does nothing)
and is reported out of band; where CK's ``int32`` arithmetic would overflow or divide
by zero, the values are computed exactly and ``ck_hazards`` says so.

:func:`reference_metadata` / :func:`reference_result` follow CK's loop literally, with
every ``index_t`` operation checked (slow, obviously CK's). :func:`pack_metadata`
computes the same bytes vectorized in ``O(batch + num_cus)``: it is what the
Python host node runs; the C pack and the device kernel compute them too.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .layout import WorkspaceParams, write_metadata
from .result import (
    CK_DIVIDE_BY_ZERO,
    CK_INT32_OVERFLOW,
    STATUS_NEGATIVE_LENGTH,
    STATUS_NEGATIVE_SEQSTART,
    STATUS_OK,
    STATUS_SEQLEN_K_EXCEEDED,
    STATUS_SEQLEN_Q_EXCEEDED,
    STATUS_TOTAL_Q_EXCEEDED,
    PrepareResult,
)

__all__ = ["as_seqstart", "check_seqstart", "pack_into", "pack_metadata", "reference_metadata", "reference_result"]

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


def check_seqstart(params: WorkspaceParams, ssq: np.ndarray, ssk: np.ndarray) -> int:
    """The ``STATUS_*`` bits of int64 seqstart arrays against ``params`` (streamrt's validation)."""
    sq, sk = np.diff(ssq), np.diff(ssk)
    status = STATUS_OK
    if (sq < 0).any() or (sk < 0).any():
        status |= STATUS_NEGATIVE_LENGTH
    if ssq[0] < 0 or ssk[0] < 0:
        status |= STATUS_NEGATIVE_SEQSTART
    if ssq[-1] > params.total_q_padded:
        status |= STATUS_TOTAL_Q_EXCEEDED
    if sk.max() > params.max_seqlen_k:
        status |= STATUS_SEQLEN_K_EXCEEDED
    if sq.max() > params.max_seqlen_q:
        status |= STATUS_SEQLEN_Q_EXCEEDED
    return status


def _idle_image(out: np.ndarray, p: WorkspaceParams) -> None:
    """CK's all-``seqlen_k = 0`` image: nothing to accumulate, every CU on the ``ibatch = batch`` sentinel."""
    write_metadata(
        out,
        p,
        nsplits=np.ones(p.batch, np.int64),
        offsets=np.zeros(p.batch + 1, np.int64),
        cu_state=np.array([[0, 0, p.batch, 0, 0, 0]], np.int64),
        batch_state=np.array([[0, 0, 1]], np.int64),
    )


# -- the oracle: CK's PrepareWorkspace, literally ------------------------------------------------------


class _DivideByZero(Exception):
    """Where CK's code divides by zero."""


class _IndexT:
    """CK's ``index_t`` (int32) arithmetic on exact Python ints: a result outside int32 sets
    ``overflow``; a division by zero raises :class:`_DivideByZero`."""

    def __init__(self) -> None:
        self.overflow = False

    def _r(self, x: int) -> int:
        if not _INT32_MIN <= x <= _INT32_MAX:
            self.overflow = True
        return x

    def add(self, a: int, b: int) -> int:
        return self._r(a + b)

    def sub(self, a: int, b: int) -> int:
        return self._r(a - b)

    def mul(self, a: int, b: int) -> int:
        return self._r(a * b)

    def div(self, a: int, b: int) -> int:  # C's division truncates toward zero
        if b == 0:
            raise _DivideByZero
        q = abs(a) // abs(b)
        return self._r(q if (a >= 0) == (b > 0) else -q)

    def ceil_div(self, a: int, b: int) -> int:  # ck_tile::integer_divide_ceil: (a + b - 1) / b
        return self.div(self.sub(self.add(a, b), 1), b)

    def least_multiple(self, a: int, b: int) -> int:  # ck_tile::integer_least_multiple: b * ceil(a / b)
        return self.mul(b, self.ceil_div(a, b))


def _logical_to_output(logical: int, num_cus: int) -> int:
    """CK's ``CuStateLogicalToOutput``, transcribed."""
    ids_per_xcd = (num_cus + 8 - 1) // 8
    tall_xcds = 8 if num_cus % 8 == 0 else num_cus % 8
    tall_span = tall_xcds * ids_per_xcd
    if logical < tall_span:
        xcd, local_id = logical // ids_per_xcd, logical % ids_per_xcd
    else:
        short_len = max(ids_per_xcd - 1, 1)
        r = logical - tall_span
        xcd, local_id = tall_xcds + r // short_len, r % short_len
    return local_id * 8 + xcd


def _ck_group_deterministic(p: WorkspaceParams, ssq: list[int], ssk: list[int], ix: _IndexT) -> tuple[list[Any], ...]:
    """Steps 1-4 of CK's deterministic group-mode ``PrepareWorkspace`` (after its short-circuit).

    Returns ``(nsplits, offsets, cu_state in slot order, batch_state)``.
    """
    batch, num_cus, nhead, hdim_q, kM0, kN0 = p.batch, p.num_cus, p.nhead, p.hdim_q, p.kM0, p.kN0

    def sq_work(sq: int) -> int:
        return kM0 if sq == 0 else ix.least_multiple(sq, kM0)

    total_w = 0
    for b in range(batch):
        sq = ix.sub(ssq[b + 1], ssq[b])
        nc = ix.ceil_div(ix.sub(ssk[b + 1], ssk[b]), kN0)
        total_w = ix.add(total_w, ix.mul(ix.mul(nhead, nc), sq_work(sq)))
    target_w = ix.ceil_div(total_w, num_cus)

    cu_states: list[list[int]] = [[] for _ in range(num_cus)]
    prev_out = -1

    def emit(c: int, st: list[int]) -> None:
        nonlocal prev_out
        out = _logical_to_output(c, num_cus)
        cu_states[out] = st
        if prev_out >= 0:
            cu_states[prev_out][1] = st[0]  # the previous CU's w_hi
        prev_out = out

    nsplits: list[int] = []
    offsets = [0]
    batch_states: list[tuple[int, int, int]] = []
    cu_lo = pb = 0
    for b in range(batch):
        sq = ix.sub(ssq[b + 1], ssq[b])
        sq_w = sq_work(sq)
        nc = ix.ceil_div(ix.sub(ssk[b + 1], ssk[b]), kN0)
        hw = ix.mul(nc, sq_w)
        pb_next = ix.add(pb, ix.mul(nhead, hw))
        cu_hi = min(num_cus, ix.ceil_div(pb_next, target_w))
        ns = 1
        for c in range(cu_lo, cu_hi):
            w_lo = ix.mul(c, target_w)
            st = [0, 0, b, 0, 0, 0]  # w_lo, w_hi, ibatch, isplit, head_start, c_start
            if hw > 0:
                head_start = max(ix.div(ix.sub(w_lo, pb), hw), 0)
                w_head = ix.add(pb, ix.mul(head_start, hw))
                wc_start = max(ix.sub(w_lo, w_head), 0)
                c_start = ix.ceil_div(wc_start, sq_w) if wc_start > 0 else 0
                denom = max(sq_w, target_w)
                raw_isp = ix.ceil_div(wc_start, denom) if wc_start > 0 else 0
                st[3] = min(raw_isp, max(ix.sub(nc, 1), 0))
                st[4] = head_start
                st[5] = c_start
                st[0] = ix.add(ix.add(pb, ix.mul(head_start, hw)), ix.mul(c_start, sq_w))
                if c_start < nc:
                    ns = max(ns, ix.add(st[3], 1))
            else:
                st[0] = pb
            emit(c, st)
        cu_lo = cu_hi
        nsplits.append(ns)
        batch_states.append((sq_w, nc, ns))
        offsets.append(offsets[b] + nhead * ns * sq * hdim_q)  # long_index_t
        pb = pb_next
    for c in range(cu_lo, num_cus):
        emit(c, [total_w, total_w, batch, 0, 0, 0])
    if prev_out >= 0:
        cu_states[prev_out][1] = total_w
    return nsplits, offsets, cu_states, batch_states


def _reference(p: WorkspaceParams, seqstart_q: Any, seqstart_k: Any) -> tuple[np.ndarray, PrepareResult]:
    q = as_seqstart(seqstart_q, p.batch, "seqstart_q")
    k = as_seqstart(seqstart_k, p.batch, "seqstart_k")
    status = check_seqstart(p, q, k)
    ssq, ssk = [int(x) for x in q], [int(x) for x in k]
    out = np.zeros(p.metadata_region_bytes, np.uint8)
    if not p.deterministic:
        write_metadata(out, p, nsplits=[1], offsets=(), cu_state=(), batch_state=())
        used = 4 * p.nhead * ssq[p.batch] * p.hdim_q if status == STATUS_OK else 0
        return out, PrepareResult(status, 0, used)
    if status != STATUS_OK:
        _idle_image(out, p)
        return out, PrepareResult(status, 0, 0)
    ix = _IndexT()
    ix.ceil_div(p.max_seqlen_k, p.kN0)  # GetWorkspaceDeviceSizeUpperBound's nsplits_factor
    hazards = 0
    used = 0
    if ssk[p.batch] == 0:  # CK's short-circuit
        _idle_image(out, p)
    else:
        try:
            nsplits, offsets, cu_state, batch_state = _ck_group_deterministic(p, ssq, ssk, ix)
        except _DivideByZero:  # every seqlen_k = 0 but seqstart_k[0] != 0: CK misses its short-circuit
            hazards |= CK_DIVIDE_BY_ZERO
            _idle_image(out, p)
        else:
            write_metadata(out, p, nsplits=nsplits, offsets=offsets, cu_state=cu_state, batch_state=batch_state)
            used = 4 * offsets[-1]
    if ix.overflow:
        hazards |= CK_INT32_OVERFLOW
    return out, PrepareResult(STATUS_OK, hazards, used)


def reference_metadata(params: WorkspaceParams, seqstart_q: Any, seqstart_k: Any) -> np.ndarray:
    """The metadata region (``params.metadata_region_bytes`` uint8) for these seqstart arrays.

    CK's loop, transcribed (see the module docstring): the oracle the packs are tested
    against. Invalid seqlens give the idle image; a wrong array shape raises ``ValueError``.
    """
    return _reference(params, seqstart_q, seqstart_k)[0]


def reference_result(params: WorkspaceParams, seqstart_q: Any, seqstart_k: Any) -> PrepareResult:
    """The :class:`~.result.PrepareResult` the packs must report for these seqstart arrays."""
    return _reference(params, seqstart_q, seqstart_k)[1]


# -- the fast host pack ------------------------------------------------------------------------------


def pack_metadata(
    params: WorkspaceParams, seqstart_q: Any, seqstart_k: Any, out: np.ndarray | None = None, *, result: np.ndarray | None = None
) -> np.ndarray:
    """Compute the metadata region into ``out`` (a uint8 array of ``metadata_region_bytes``; new if ``None``).

    Byte-identical to :func:`reference_metadata`, vectorized. Returns ``out``; ``result``
    (a writable uint8 array of 16 bytes, if given) receives the result record. Never raises
    for invalid seqlens (the idle image is written and ``status`` reported); raises
    ``ValueError`` for a wrong array shape or a wrong ``out``.
    """
    ssq = as_seqstart(seqstart_q, params.batch, "seqstart_q")
    ssk = as_seqstart(seqstart_k, params.batch, "seqstart_k")
    if out is None:
        out = np.empty(params.metadata_region_bytes, dtype=np.uint8)
    res = pack_into(params, ssq, ssk, out)
    if result is not None:
        res.write_record(result)
    return out


def pack_into(p: WorkspaceParams, ssq: np.ndarray, ssk: np.ndarray, out: np.ndarray) -> PrepareResult:
    """The pack on checked int64 seqstart arrays (:func:`as_seqstart`): writes ``out``, returns the result."""
    status = check_seqstart(p, ssq, ssk)
    if not p.deterministic:
        write_metadata(out, p, nsplits=(1,), offsets=(), cu_state=(), batch_state=())
        used = 4 * p.nhead * int(ssq[-1]) * p.hdim_q if status == STATUS_OK else 0
        return PrepareResult(status, 0, used)
    if status != STATUS_OK:
        _idle_image(out, p)
        return PrepareResult(status, 0, 0)
    sq, sk = np.diff(ssq), np.diff(ssk)
    hazards = CK_INT32_OVERFLOW if p.ck_int32_overflow else 0
    any_k = bool((sk > 0).any())
    if (any_k or ssk[-1] != 0) and (((sq > 0) & (sq + p.kM0 > _INT32_MAX)).any() or (sk + p.kN0 > _INT32_MAX).any()):
        hazards |= CK_INT32_OVERFLOW  # roundup(sq, kM0) or ceil(sk / kN0) of some batch
    if not any_k:
        _idle_image(out, p)
        return PrepareResult(STATUS_OK, hazards | (CK_DIVIDE_BY_ZERO if ssk[-1] != 0 else 0), 0)
    nsplits, offsets, cu_state, batch_state, split_hazards = _deterministic_split(p, sq, sk)
    write_metadata(out, p, nsplits=nsplits, offsets=offsets, cu_state=cu_state, batch_state=batch_state)
    return PrepareResult(STATUS_OK, hazards | split_hazards, 4 * int(offsets[-1]))


def _deterministic_split(p: WorkspaceParams, sq: np.ndarray, sk: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """CK's split (the module docstring), vectorized over batches and CUs, for valid input with keys.

    Returns ``(nsplits, offsets, cu_state in slot order, batch_state, ck_hazards)``.
    """
    n, big = p.num_cus, _INT32_MAX
    nc = -(-sk // p.kN0)
    sq_w = np.where(sq == 0, p.kM0, -(-sq // p.kM0) * p.kM0)
    hw = nc * sq_w
    pb_next = np.cumsum(p.nhead * hw)
    pb = pb_next - p.nhead * hw
    total = int(pb_next[-1])
    target = -(-total // n)
    hazards = CK_INT32_OVERFLOW if total > big or total + n > big or total + target > big else 0

    # Active CUs: batch b owns c in [cu_hi[b-1], cu_hi[b]); a batch without keys owns none (hw > 0 below).
    cu_hi = np.minimum(n, -(-pb_next // target))
    cu_end = int(cu_hi[-1])
    b = np.repeat(np.arange(p.batch), np.diff(cu_hi, prepend=0))
    x = np.arange(cu_end, dtype=np.int64) * target
    pb_c, hw_c, sq_w_c, nc_c = pb[b], hw[b], sq_w[b], nc[b]
    head = (x - pb_c) // hw_c
    w_head = pb_c + head * hw_c
    wc = x - w_head
    c_start = -(-wc // sq_w_c)
    denom = np.maximum(sq_w_c, target)
    isplit = np.minimum(-(-wc // denom), nc_c - 1)
    if ((wc > 0) & (wc + denom > big)).any():
        hazards |= CK_INT32_OVERFLOW
    counted = c_start < nc_c
    nsplits = np.ones(p.batch, np.int64)
    np.maximum.at(nsplits, b[counted], isplit[counted] + 1)

    logical = np.zeros((n, 6), np.int64)
    logical[:, 0] = total  # w_lo; the inactive CUs keep {W, W, batch, 0, 0, 0}
    logical[:cu_end, 0] = w_head + c_start * sq_w_c
    logical[:, 1] = np.append(logical[1:, 0], total)  # w_hi = the next CU's w_lo
    logical[:, 2] = p.batch
    logical[:cu_end, 2] = b
    logical[:cu_end, 3] = isplit
    logical[:cu_end, 4] = head
    logical[:cu_end, 5] = c_start
    cu_state = np.empty_like(logical)
    cu_state[p.cu_slots] = logical

    offsets = np.zeros(p.batch + 1, np.int64)
    np.cumsum(p.nhead * nsplits * sq * p.hdim_q, out=offsets[1:])
    batch_state = np.stack([sq_w, nc, nsplits], axis=1)
    return nsplits, offsets, cu_state, batch_state, hazards
