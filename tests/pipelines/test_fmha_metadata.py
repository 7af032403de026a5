"""The FMHA backward workspace metadata: CK's byte map, the oracle against hand-computed images, the packs against it.

The hand-computed images cover every row of the issue's CK-versus-streamrt table: ``max(1, ...)``
splits, the all-``seqlen_k = 0`` short-circuit, CK's byte image and region size, a start record at
the end of its head, idle CUs, absolute seqstart in non-deterministic mode, and the int32 hazards.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrt.recipes.fmha_bwd import (
    CK_DIVIDE_BY_ZERO,
    STATUS_NEGATIVE_LENGTH,
    STATUS_NEGATIVE_SEQSTART,
    STATUS_SEQLEN_K_EXCEEDED,
    STATUS_SEQLEN_Q_EXCEEDED,
    STATUS_TOTAL_Q_EXCEEDED,
    PrepareResult,
    WorkspaceInputError,
    WorkspaceParams,
    cu_state_slots,
    native_pack_available,
    pack_metadata,
    pack_metadata_native,
    parse_metadata,
    reference_metadata,
    reference_result,
    workspace_size,
)


def params(**kw: object) -> WorkspaceParams:
    base: dict[str, object] = {
        "batch": 3, "nhead": 2, "hdim_q": 4, "kM0": 16, "kN0": 16, "num_cus": 4,
        "deterministic": True, "max_seqlen_q": 64, "max_seqlen_k": 64, "total_q_padded": 100,
    }  # fmt: skip
    base.update(kw)
    return WorkspaceParams(**base)  # type: ignore[arg-type]


def seqstart(lengths: list[int], first: int = 0) -> np.ndarray:
    return np.concatenate([[first], first + np.cumsum(lengths, dtype=np.int64)]).astype(np.int32)


def packs(p: WorkspaceParams, ssq: object, ssk: object) -> tuple[np.ndarray, PrepareResult]:
    """The oracle's bytes and result, after checking the fast pack (and the C pack, where built) agree."""
    ref, res = reference_metadata(p, ssq, ssk), reference_result(p, ssq, ssk)
    assert ref.dtype == np.uint8 and ref.size == p.metadata_region_bytes
    record = np.zeros(16, np.uint8)
    np.testing.assert_array_equal(pack_metadata(p, ssq, ssk, result=record), ref)
    assert PrepareResult.from_record(record) == res
    if native_pack_available():
        record[:] = 0xEE
        np.testing.assert_array_equal(pack_metadata_native(p, ssq, ssk, result=record), ref)
        assert PrepareResult.from_record(record) == res
    return ref, res


def cu_records(raw: bytes, offset: int, count: int) -> list[tuple[int, ...]]:
    """The cu_state records' six fields, checking each record's 8 padding bytes are zero."""
    out = []
    for i in range(count):
        rec = struct.unpack_from("<8i", raw, offset + 32 * i)
        assert rec[6:] == (0, 0)
        out.append(rec[:6])
    return out


# -- hand-computed images ---------------------------------------------------------------------------------


def test_hand_computed_deterministic_image_byte_by_byte() -> None:
    # sq = (10, 5, 30) -> sq_w (16, 16, 32); sk = (33, 0, 16) -> nc (3, 0, 1); per-head work hw (48, 0, 32)
    # batches span [0, 96), [96, 96), [96, 160): W = 160, target_w = 40; CUs 0-2 in batch 0, CU 3 in batch 2.
    #   CU 0: x=0              -> head 0, chunk 0, isplit 0, w_lo 0
    #   CU 1: x=40 -> wc 40    -> chunk ceil(40/16) = 3 = nc: a start at the end of head 0 (w_lo 48), not counted
    #   CU 2: x=80 -> head 1, wc 32 -> chunk 2, isplit ceil(32/40) = 1, w_lo 80: nsplits[0] = 2
    #   CU 3: x=120 -> batch 2, wc 24 -> chunk 1 = nc (w_lo 128), isplit min(1, nc - 1) = 0: nsplits[2] = 1
    # Batch 1 has no keys and no CU: nsplits[1] = max(1, ...) = 1, so its 5 query rows take dq_acc space.
    p = params()
    raw_arr, res = packs(p, seqstart([10, 5, 30]), seqstart([33, 0, 16]))
    raw = raw_arr.tobytes()
    assert len(raw) == 4096 == p.metadata_region_bytes
    assert struct.unpack_from("<3i", raw, 0) == (2, 1, 1) and raw[12:16] == bytes(4)  # nsplits, aligned to 16
    assert struct.unpack_from("<4q", raw, 16) == (0, 2 * 2 * 10 * 4, 160 + 2 * 1 * 5 * 4, 200 + 2 * 1 * 30 * 4)
    assert cu_records(raw, 48, 4) == [(0, 48, 0, 0, 0, 0), (48, 80, 0, 1, 0, 3), (80, 128, 0, 1, 1, 2), (128, 160, 2, 0, 0, 1)]
    assert [struct.unpack_from("<4i", raw, 176 + 16 * b) for b in range(3)] == [(16, 3, 2, 0), (16, 0, 1, 0), (32, 1, 1, 0)]
    assert raw[224:] == bytes(4096 - 224)  # nothing after batch_state
    assert res == PrepareResult(0, 0, 4 * 440)
    m = parse_metadata(p, raw)
    assert m.nsplits.tolist() == [2, 1, 1] and m.offsets.tolist() == [0, 160, 200, 440]
    assert m.dq_acc_used_bytes == m.dq_acc_zero_bytes == 1760
    assert m.cu_state["c_start"].tolist() == [0, 3, 2, 1] and m.batch_state["sq_w"].tolist() == [16, 16, 32]


def test_idle_cus_inside_a_batch_and_past_the_work() -> None:
    # One head of 3 chunks of weight 32 (sq 20 -> sq_w 32), 5 CUs: target_w = ceil(96/5) = 20.
    # x = 0, 20, 40, 60, 80 -> chunks 0, 1, 2, 2, 3; isplit 0, 1, 2, 2, min(3, 2). CU 2 starts where CU 3
    # starts (w_lo == w_hi: idle); CU 4 starts at the end of the head (idle). nsplits = 3.
    p = params(batch=1, nhead=1, hdim_q=1, num_cus=5, total_q_padded=20)
    raw, res = packs(p, seqstart([20]), seqstart([40]))
    m = parse_metadata(p, raw)
    fields = ("w_lo", "w_hi", "ibatch", "isplit", "head_start", "c_start")
    assert [tuple(int(r[f]) for f in fields) for r in m.cu_state] == [
        (0, 32, 0, 0, 0, 0),
        (32, 64, 0, 1, 0, 1),
        (64, 64, 0, 2, 0, 2),
        (64, 96, 0, 2, 0, 2),
        (96, 96, 0, 2, 0, 3),
    ]
    assert m.nsplits.tolist() == [3] and m.offsets.tolist() == [0, 3 * 20] and res.dq_acc_used_bytes == 240
    # Past the work: 16 weight on 5 CUs, target_w = 4, ceil(16 / 4) = 4 CUs in the batch, CU 4 on the sentinel.
    m = parse_metadata(p, packs(p, seqstart([16]), seqstart([16]))[0])
    assert [tuple(int(r[f]) for f in fields) for r in m.cu_state] == [(0, 16, 0, 0, 0, 0)] + [(16, 16, 0, 0, 0, 1)] * 3 + [(16, 16, 1, 0, 0, 0)]


def test_every_seqlen_k_zero_is_cks_short_circuit() -> None:
    p = params(batch=3, num_cus=3)
    for first, hazards in ((0, 0), (7, CK_DIVIDE_BY_ZERO)):  # seqstart_k[0] != 0: CK divides by target_w = 0
        raw, res = packs(p, seqstart([5, 0, 9]), seqstart([0, 0, 0], first))
        assert res == PrepareResult(0, hazards, 0) and res.ck_divide_by_zero == bool(hazards)
        m = parse_metadata(p, raw)
        assert m.nsplits.tolist() == [1, 1, 1] and not m.offsets.any()
        assert m.cu_state[["w_lo", "w_hi", "ibatch", "isplit", "head_start", "c_start"]].tolist() == [(0, 0, 3, 0, 0, 0)] * 3
        assert m.batch_state[["sq_w", "nc", "nsplits"]].tolist() == [(0, 0, 1)] * 3


def test_cu_state_is_in_cks_xcd_order() -> None:
    # 10 CUs on 8 XCDs: XCDs 0-1 hold two logical CUs each (0,1 and 2,3), XCDs 2-7 one; slot 8 x + xcd.
    assert cu_state_slots(10).tolist() == [0, 8, 1, 9, 2, 3, 4, 5, 6, 7]
    assert cu_state_slots(5).tolist() == list(range(5))
    c = np.arange(304)
    assert (cu_state_slots(304) == (c % 38) * 8 + c // 38).all()

    def output_to_logical(b: int, n: int) -> int:  # CK's CuStateOutputToLogical, the forward map
        per, tall = -(-n // 8), n % 8 or 8
        xcd, local = b % 8, b // 8
        return xcd * per + local if xcd < tall else tall * per + (xcd - tall) * (per - 1) + local

    for n in (1, 7, 8, 9, 10, 132, 304, 1000):
        slots = cu_state_slots(n)
        assert sorted(slots.tolist()) == list(range(n))
        assert all(output_to_logical(int(slots[c]), n) == c for c in range(n))
    p = params(batch=1, nhead=1, num_cus=10, total_q_padded=64)
    m = parse_metadata(p, packs(p, seqstart([64]), seqstart([64]))[0])
    logical = m.cu_state_logical
    assert (logical["w_lo"] == np.sort(logical["w_lo"])).all()  # logical CUs start in order
    assert m.cu_state[8] == logical[1] and m.cu_state[1] == logical[2]


def test_non_deterministic_image_and_absolute_seqstart() -> None:
    p = params(deterministic=False, batch=2, nhead=3, hdim_q=8, total_q_padded=20)
    raw, res = packs(p, seqstart([5, 8], 7), seqstart([0, 36]))
    assert raw.size == 4096 and struct.unpack_from("<i", raw.tobytes(), 0) == (1,) and not raw[4:].any()
    assert res == PrepareResult(0, 0, 4 * 3 * 20 * 8)  # batch b's dq_acc at seqstart_q[b] * nhead * hdim_q
    m = parse_metadata(p, raw)
    assert m.nsplits.tolist() == [1] and m.dq_acc_used_bytes is None and m.dq_acc_zero_bytes == p.dq_acc_bound_bytes
    assert packs(p, seqstart([5, 9], 7), seqstart([0, 36]))[1].status == STATUS_TOTAL_Q_EXCEEDED  # 21 > 20 (absolute)


def test_region_size_is_cks_host_size() -> None:
    assert params(batch=1, num_cus=304).metadata_region_bytes == 12288  # 16 + 16 + 32*304 + 16 = 9776
    lay = params(batch=1024, num_cus=304).metadata_layout
    assert (lay.offsets_offset, lay.cu_state_offset, lay.batch_state_offset) == (4096, 4096 + 8208, 4096 + 8208 + 9728)
    assert lay.metadata_bytes == 38416 and lay.region_bytes == 40960 and lay.total_offset == 4096 + 8 * 1024
    assert params(batch=1024, num_cus=304, deterministic=False).metadata_region_bytes == 4096


def test_cks_int32_hazards_are_computed_exactly_and_flagged() -> None:
    # 128 sequences of 8k x 8k at 32 heads: W = 128 * 32 * 64 * 8192 = 2**31.
    def case(batch: int) -> tuple[WorkspaceParams, np.ndarray]:
        p = WorkspaceParams(
            batch=batch, nhead=32, hdim_q=128, kM0=64, kN0=128, num_cus=304, deterministic=True,
            max_seqlen_q=8192, max_seqlen_k=8192, total_q_padded=8192 * batch,
        )  # fmt: skip
        return p, seqstart([8192] * batch)

    p, s = case(127)
    assert packs(p, s, s)[1].ck_hazards == 0  # W = 2**31 - 2**24 (+ target_w) still fits
    p, s = case(128)
    raw, res = packs(p, s, s)
    m = parse_metadata(p, raw)
    assert res.ck_int32_overflow and not res.ck_divide_by_zero and res.ok
    assert res.dq_acc_used_bytes == 4 * int(m.offsets[-1]) == 4 * 32 * 8192 * 128 * int(m.nsplits.sum())
    assert int(m.cu_state_logical["w_hi"][-1]) == -(2**31)  # W = 2**31, stored in an int32 field
    # roundup(sq, kM0) of a length near 2**31, and a chunk start + sq_w past 2**31 on one CU
    p = params(batch=1, nhead=1, hdim_q=1, kM0=64, max_seqlen_q=2**31 - 1, total_q_padded=2**31 - 1)
    assert packs(p, seqstart([2**31 - 1]), seqstart([8]))[1].ck_int32_overflow
    p = params(batch=1, nhead=1, hdim_q=1, kM0=1, kN0=1, max_seqlen_q=3 * 2**29, max_seqlen_k=1, total_q_padded=3 * 2**29)
    assert packs(p, seqstart([3 * 2**29]), seqstart([1]))[1].ck_int32_overflow  # W = 1.5 * 2**30 fits; CU 3's wc + sq_w does not
    assert params(max_seqlen_k=2**31 - 1).ck_int32_overflow  # ceil(max_seqlen_k / kN0) in the size bound
    assert packs(params(max_seqlen_k=2**31 - 1), seqstart([1, 1, 1]), seqstart([1, 1, 1]))[1].ck_int32_overflow


# -- the persistent kernel's view of the image -----------------------------------------------------------


def dispatch(p: WorkspaceParams, raw: np.ndarray) -> list[tuple[int, int, int, int, int]]:
    """CK's group-mode persistent dispatch loop (FmhaBwdDQDKDVKernel) run over the image:
    ``(slot, batch, head, chunk, isplit)`` of every chunk some CU processes."""
    m = parse_metadata(p, raw)
    done = []
    for slot, cs in enumerate(m.cu_state):
        w_hi, ibatch, isplit, head, c, w = (int(cs[f]) for f in ("w_hi", "ibatch", "isplit", "head_start", "c_start", "w_lo"))
        while ibatch < p.batch:
            bs = m.batch_state[ibatch]
            while head < p.nhead:
                while c < int(bs["nc"]) and w < w_hi:
                    assert isplit < int(bs["nsplits"])
                    done.append((slot, ibatch, head, c, isplit))
                    w += int(bs["sq_w"])
                    c += 1
                if w >= w_hi:
                    break
                c, isplit, head = 0, 0, head + 1
            if w >= w_hi:
                break
            head, ibatch = 0, ibatch + 1
    return done


@st.composite
def cases(draw: st.DrawFn) -> tuple[WorkspaceParams, np.ndarray, np.ndarray]:
    batch = draw(st.integers(1, 12))
    lengths = st.one_of(st.just(0), st.integers(0, 300))
    sq = draw(st.lists(lengths, min_size=batch, max_size=batch))
    sk = draw(st.lists(lengths, min_size=batch, max_size=batch))
    if draw(st.integers(0, 9)) == 0:
        sk = [0] * batch
    ssq, ssk = seqstart(sq, draw(st.integers(0, 50))), seqstart(sk, draw(st.integers(0, 50)))
    p = WorkspaceParams(
        batch=batch,
        nhead=draw(st.integers(1, 5)),
        hdim_q=draw(st.sampled_from([1, 8, 64, 128])),
        kM0=draw(st.sampled_from([1, 16, 64, 128])),
        kN0=draw(st.sampled_from([1, 16, 64, 128])),
        num_cus=draw(st.integers(1, 320)),
        deterministic=draw(st.booleans()),
        max_seqlen_q=max(draw(st.integers(0, 300)), max(sq) if draw(st.booleans()) else 0),
        max_seqlen_k=max(draw(st.integers(0, 300)), max(sk) if draw(st.booleans()) else 0),
        total_q_padded=max(0, int(ssq[-1]) + draw(st.sampled_from([0, 0, 7, -1]))),
    )
    return p, ssq, ssk


@settings(max_examples=200, deadline=None)
@given(cases())
def test_packs_match_the_oracle_and_the_kernel_covers_every_chunk_once(case: tuple[WorkspaceParams, np.ndarray, np.ndarray]) -> None:
    p, ssq, ssk = case
    raw, res = packs(p, ssq, ssk)
    sq, sk = np.diff(ssq.astype(np.int64)), np.diff(ssk.astype(np.int64))
    misses_short_circuit = p.deterministic and res.ok and not sk.any() and ssk[-1] != 0
    assert res.ck_hazards == (CK_DIVIDE_BY_ZERO if misses_short_circuit else 0)
    assert res.dq_acc_used_bytes <= p.dq_acc_bound_bytes
    if not (p.deterministic and res.ok):
        return
    nc = -(-sk // p.kN0)
    done = dispatch(p, raw)
    chunks = [(b, h, c) for _s, b, h, c, _i in done]
    assert sorted(chunks) == [(b, h, c) for b in range(p.batch) for h in range(p.nhead) for c in range(int(nc[b]))]
    owner: dict[tuple[int, int, int], int] = {}
    for slot, b, h, _c, isplit in done:  # each dq_acc slice (batch, head, split) is one CU's
        assert owner.setdefault((b, h, isplit), slot) == slot
    m = parse_metadata(p, raw)
    assert (m.nsplits <= np.maximum(nc, 1)).all() and (m.nsplits >= 1).all()
    if sk.any():
        assert (np.diff(m.offsets) == p.nhead * m.nsplits * sq * p.hdim_q).all()
    else:  # the short-circuit: nothing accumulates, nothing is used
        assert not m.offsets.any() and res.dq_acc_used_bytes == 0


# -- validation, sizes and params --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ssq, ssk, bit",
    [
        ([0, 10, 5, 20], [0, 1, 2, 3], STATUS_NEGATIVE_LENGTH),
        ([0, 10, 20, 30], [0, 5, 4, 6], STATUS_NEGATIVE_LENGTH),
        ([0, 50, 100, 101], [0, 1, 2, 3], STATUS_TOTAL_Q_EXCEEDED),
        ([0, 1, 2, 3], [0, 65, 66, 67], STATUS_SEQLEN_K_EXCEEDED),
        ([0, 65, 66, 67], [0, 1, 2, 3], STATUS_SEQLEN_Q_EXCEEDED),
        ([-1, 1, 2, 3], [0, 1, 2, 3], STATUS_NEGATIVE_SEQSTART),
        ([0, 1, 2, 3], [-5, 1, 2, 3], STATUS_NEGATIVE_SEQSTART),
    ],
)
@pytest.mark.parametrize("deterministic", [True, False])
def test_invalid_seqlens_give_the_idle_image_and_the_status_out_of_band(ssq: list[int], ssk: list[int], bit: int, deterministic: bool) -> None:
    p = params(deterministic=deterministic)
    raw, res = packs(p, ssq, ssk)
    assert res.status & bit and res.dq_acc_used_bytes == 0 and res.ck_hazards == 0
    assert np.array_equal(raw, packs(p, [0, 0, 0, 0], [0, 0, 0, 0])[0])  # the image holds no status: the idle one
    with pytest.raises(WorkspaceInputError, match="status"):
        res.raise_for_status()


def test_wrong_seqstart_shape_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="batch \\+ 1"):
        reference_metadata(params(), [0, 1, 2], [0, 1, 2, 3])
    with pytest.raises(ValueError, match="batch \\+ 1"):
        pack_metadata(params(), [0, 1, 2, 3], [[0, 1, 2, 3]])
    with pytest.raises(TypeError, match="integers"):
        pack_metadata(params(), [0.0, 1, 2, 3], [0, 1, 2, 3])


def test_workspace_size_is_cks_host_size_plus_device_bound() -> None:
    p = params(batch=16, nhead=16, hdim_q=128, kN0=128, max_seqlen_k=4096, total_q_padded=8192)
    assert p.nsplits_bound == 32
    assert workspace_size(p) == 4096 + 4 * 16 * 32 * 8192 * 128
    assert workspace_size(params(deterministic=False, total_q_padded=10)) == 4096 + 4 * 2 * 1 * 10 * 4
    assert params(max_seqlen_k=0).dq_acc_bound_bytes == 0
    with pytest.raises(TypeError):
        workspace_size({"batch": 1})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kw, err",
    [
        ({"batch": 0}, ValueError),
        ({"nhead": 0}, ValueError),
        ({"kN0": 0}, ValueError),
        ({"num_cus": 0}, ValueError),
        ({"max_seqlen_k": -1}, ValueError),
        ({"total_q_padded": 2**31}, ValueError),
        ({"batch": 2.0}, TypeError),
        ({"deterministic": 1}, TypeError),
        ({"nhead": True}, TypeError),
        ({"layout": "streamrt"}, ValueError),
        ({"nhead": 2**20, "hdim_q": 2**20, "total_q_padded": 2**30, "deterministic": False}, ValueError),  # 2**62 bytes
        ({"batch": 1 << 24, "nhead": 2**30, "kN0": 1, "max_seqlen_k": 2**30, "total_q_padded": 0}, ValueError),  # weights
    ],
)
def test_bad_params_are_rejected(kw: dict[str, object], err: type[Exception]) -> None:
    with pytest.raises(err):
        params(**kw)


def test_parse_needs_the_params_and_enough_bytes() -> None:
    p = params()
    with pytest.raises(ValueError, match="at least 224"):
        parse_metadata(p, bytes(200))
    with pytest.raises(TypeError, match="WorkspaceParams"):
        parse_metadata(bytes(4096), p)  # type: ignore[arg-type]
    assert parse_metadata(p, bytes(224)).nsplits.tolist() == [0, 0, 0]
