"""The FMHA backward workspace metadata: the numpy oracle, the fast pack, and the documented byte layout."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrt.recipes.fmha_bwd import (
    METADATA_MAGIC,
    STATUS_NEGATIVE_LENGTH,
    STATUS_SEQLEN_K_EXCEEDED,
    STATUS_SEQLEN_Q_EXCEEDED,
    STATUS_TOTAL_Q_EXCEEDED,
    WorkspaceInputError,
    WorkspaceParams,
    native_pack_available,
    pack_metadata,
    pack_metadata_native,
    parse_metadata,
    reference_metadata,
    workspace_size,
)


def params(**kw: object) -> WorkspaceParams:
    base: dict[str, object] = {
        "batch": 3, "nhead": 2, "hdim_q": 4, "kM0": 16, "kN0": 16, "num_cus": 4,
        "deterministic": True, "max_seqlen_q": 64, "max_seqlen_k": 64, "total_q_padded": 100,
    }  # fmt: skip
    base.update(kw)
    return WorkspaceParams(**base)  # type: ignore[arg-type]


def seqstart(lengths: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def both(p: WorkspaceParams, ssq: object, ssk: object) -> np.ndarray:
    """The oracle's bytes, after checking the fast pack (and the C pack, where built) writes the same bytes."""
    ref = reference_metadata(p, ssq, ssk)
    fast = pack_metadata(p, ssq, ssk)
    assert ref.dtype == np.uint8 and ref.size == p.metadata_region_bytes
    np.testing.assert_array_equal(fast, ref)
    if native_pack_available():
        np.testing.assert_array_equal(pack_metadata_native(p, ssq, ssk), ref)
    return ref


# -- hand-checked examples ----------------------------------------------------------------------------


def test_hand_checked_deterministic_example_byte_by_byte() -> None:
    # batch 0: sq=10, sk=33 -> 3 key blocks, weight 16, units (h0: P=0,16,32) (h1: P=48,64,80)
    # batch 1: empty (sq=0, sk=0) -> no units, nsplits 0
    # batch 2: sq=30, sk=16 -> 1 key block, weight 32, units (h0: P=96) (h1: P=128)
    # W = 160, q = 40: workers 0,0,0 | 1,1 | 2 (b0 h1 j2), 2 (b2 h0) | 3 (b2 h1)
    p = params()
    raw = both(p, [0, 10, 10, 40], [0, 33, 33, 49]).tobytes()
    assert len(raw) == 4096
    magic, version, header_bytes, status = struct.unpack_from("<4I", raw, 0)
    assert (magic, version, header_bytes, status) == (METADATA_MAGIC, 1, 128, 0)
    assert raw[:4] == b"FBWM"
    assert struct.unpack_from("<8i", raw, 16) == (3, 2, 4, 16, 16, 4, 1, 2)  # batch..nsplits_max
    used, dq_off, bound, units, weight, quota = struct.unpack_from("<6q", raw, 48)
    assert (used, dq_off, bound) == (4 * 400, 4096, 4 * 2 * 4 * 100 * 4)
    assert (units, weight, quota) == (8, 160, 40)
    off_o, nsp_o, ws_o, wu_o, md_bytes, region = struct.unpack_from("<6I", raw, 96)
    assert (off_o, nsp_o) == (128, 128 + 8 * 4)
    assert ws_o == 128 + 32 + 16  # align8(160 + 12) = 176
    assert (wu_o, md_bytes, region) == (176 + 64, 256, 4096)
    assert struct.unpack_from("<2I", raw, 120) == (0, 0)
    assert struct.unpack_from("<4q", raw, off_o) == (0, 160, 160, 400)  # 2 heads*2 splits*10*4, +0, +2*1*30*4
    assert struct.unpack_from("<3i", raw, nsp_o) == (2, 0, 1)
    assert struct.unpack_from("<16i", raw, ws_o) == (0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 1, 2, 2, 0, 1, 0)
    assert struct.unpack_from("<4i", raw, wu_o) == (3, 2, 2, 1)
    assert struct.unpack_from("<4i", raw, wu_o) == (3, 2, 2, 1) and wu_o + 16 == md_bytes
    assert raw[md_bytes:] == bytes(4096 - md_bytes)  # tail padding is zero


def test_hand_checked_non_deterministic_example() -> None:
    p = params(deterministic=False, batch=2, nhead=3, hdim_q=8)
    m = parse_metadata(both(p, [0, 5, 12], [0, 0, 100 % 64]))
    assert m.ok and m.num_workers == 0 and m.worker_start.shape == (0, 4)
    assert m.nsplits.tolist() == [1, 1]  # 1 even for seqlen_k = 0
    assert m.offsets.tolist() == [0, 3 * 5 * 8, 3 * 5 * 8 + 3 * 7 * 8]
    assert m.dq_acc_used_bytes == 4 * m.offsets[-1]
    assert (m.total_units, m.total_weight, m.unit_quota) == (0, 0, 0)
    assert p.dq_acc_bound_bytes == 4 * 3 * 1 * 100 * 8


def test_splits_count_per_head_so_the_bound_holds() -> None:
    # 8 heads of one key block on 8 workers: each worker gets one head. Counting the
    # workers of the whole batch would give 8 splits; the bound ceil(max_seqlen_k/kN0) is 1.
    p = params(batch=1, nhead=8, num_cus=8, max_seqlen_k=16, total_q_padded=32)
    m = parse_metadata(both(p, [0, 32], [0, 16]))
    assert m.nsplits.tolist() == [1]
    assert m.worker_start.tolist() == [[0, 0, h, 0] for h in range(8)]
    assert m.dq_acc_used_bytes <= p.dq_acc_bound_bytes


def test_one_head_spread_over_workers_gets_one_split_per_worker() -> None:
    p = params(batch=1, nhead=1, num_cus=4, kN0=16, max_seqlen_k=128, total_q_padded=16)
    m = parse_metadata(both(p, [0, 16], [0, 128]))  # 8 key blocks of weight 16 -> 2 per worker
    assert m.nsplits.tolist() == [4]
    assert m.worker_start.tolist() == [[0, s, 0, 2 * s] for s in range(4)]
    assert m.worker_units.tolist() == [2, 2, 2, 2]
    assert m.offsets.tolist() == [0, 1 * 4 * 16 * 4]


# -- edge cases ---------------------------------------------------------------------------------------


def test_empty_query_sequences_still_weigh_one_tile() -> None:
    p = params(batch=2, nhead=1, num_cus=2)
    m = parse_metadata(both(p, [0, 0, 0], [0, 16, 32]))
    assert m.total_weight == 2 * 16  # roundup(max(0, 1), kM0) each
    assert m.nsplits.tolist() == [1, 1]
    assert m.offsets.tolist() == [0, 0, 0] and m.dq_acc_used_bytes == 0


def test_seqlen_k_zero_everywhere_leaves_every_worker_idle() -> None:
    p = params(batch=4, num_cus=3)
    m = parse_metadata(both(p, seqstart([5, 7, 0, 9]), seqstart([0, 0, 0, 0])))
    assert m.ok and m.total_units == 0 and m.unit_quota == 0
    assert m.nsplits.tolist() == [0, 0, 0, 0] and m.dq_acc_used_bytes == 0
    assert m.worker_start.tolist() == [[-1] * 4] * 3 and m.worker_units.tolist() == [0, 0, 0]


def test_more_workers_than_units_marks_the_rest_idle() -> None:
    p = params(batch=1, nhead=1, num_cus=5)
    m = parse_metadata(both(p, [0, 20], [0, 40]))  # 3 units of weight 32, q = ceil(96/5) = 20
    assert m.worker_units.tolist() == [1, 1, 0, 1, 0]  # starts 0, 32, 64 -> workers 0, 1, 3
    assert m.worker_start[2].tolist() == [-1] * 4 and m.worker_start[4].tolist() == [-1] * 4
    assert m.nsplits.tolist() == [3]
    # Worker 3 is the third worker touching (batch 0, head 0): split 2, although worker 2 lies between.
    assert m.worker_start[3].tolist() == [0, 2, 0, 2]


def test_batch_one() -> None:
    p = params(batch=1, nhead=4, num_cus=3, max_seqlen_k=64)
    m = parse_metadata(both(p, [0, 37], [0, 50]))
    assert m.worker_units.sum() == m.total_units == 4 * 4
    assert m.offsets[-1] == 4 * int(m.nsplits[0]) * 37 * 4


@pytest.mark.parametrize("deterministic", [True, False])
def test_batch_1024(deterministic: bool) -> None:
    rng = np.random.default_rng(1024)
    sq = rng.integers(0, 64, 1024)
    sk = rng.integers(0, 64, 1024)
    sq[::7] = 0
    sk[::11] = 0
    p = params(batch=1024, nhead=2, num_cus=304, deterministic=deterministic, total_q_padded=int(sq.sum()))
    m = parse_metadata(both(p, seqstart(list(sq)), seqstart(list(sk))))
    assert m.ok
    if deterministic:
        assert m.worker_units.sum() == m.total_units
        assert (m.nsplits[sk == 0] == 0).all()
    assert m.dq_acc_used_bytes <= p.dq_acc_bound_bytes


@pytest.mark.parametrize(
    "ssq, ssk, bit",
    [
        ([0, 10, 5, 20], [0, 1, 2, 3], STATUS_NEGATIVE_LENGTH),
        ([0, 10, 20, 30], [0, 5, 4, 6], STATUS_NEGATIVE_LENGTH),
        ([0, 50, 100, 101], [0, 1, 2, 3], STATUS_TOTAL_Q_EXCEEDED),
        ([0, 1, 2, 3], [0, 65, 66, 67], STATUS_SEQLEN_K_EXCEEDED),
        ([0, 65, 66, 67], [0, 1, 2, 3], STATUS_SEQLEN_Q_EXCEEDED),
    ],
)
def test_invalid_seqlens_give_the_error_block(ssq: list[int], ssk: list[int], bit: int) -> None:
    p = params()
    m = parse_metadata(both(p, ssq, ssk))
    assert m.status & bit
    assert m.dq_acc_used_bytes == 0 and m.nsplits_max == 0 and m.total_units == 0
    assert not m.offsets.any() and not m.nsplits.any()
    assert (m.worker_start == -1).all() and not m.worker_units.any()
    with pytest.raises(WorkspaceInputError, match="status"):
        m.raise_for_status()


def test_wrong_seqstart_shape_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="batch \\+ 1"):
        reference_metadata(params(), [0, 1, 2], [0, 1, 2, 3])
    with pytest.raises(ValueError, match="batch \\+ 1"):
        pack_metadata(params(), [0, 1, 2, 3], [[0, 1, 2, 3]])
    with pytest.raises(TypeError, match="integers"):
        pack_metadata(params(), [0.0, 1, 2, 3], [0, 1, 2, 3])


# -- sizes and params -------------------------------------------------------------------------------------


def test_workspace_size_is_metadata_region_plus_dq_acc_bound() -> None:
    p = params(batch=16, nhead=16, hdim_q=128, kN0=128, max_seqlen_k=4096, total_q_padded=8192)
    assert p.nsplits_bound == 32
    assert p.metadata_region_bytes % 4096 == 0
    assert workspace_size(p) == p.metadata_region_bytes + 4 * 16 * 32 * 8192 * 128
    assert workspace_size(params(deterministic=False, total_q_padded=10)) == 4096 + 4 * 2 * 1 * 10 * 4
    with pytest.raises(TypeError):
        workspace_size({"batch": 1})  # type: ignore[arg-type]


def test_metadata_region_grows_past_4k_for_large_batches() -> None:
    p = params(batch=1024, num_cus=304)
    lay = p.layout
    assert lay.metadata_bytes == 128 + 8 * 1025 + 4096 + 16 * 304 + 8 * 152
    assert lay.metadata_bytes == 18504 and lay.region_bytes == 20480


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
        ({"batch": 1 << 20, "nhead": 64, "kN0": 1, "max_seqlen_k": 1 << 12}, ValueError),
    ],
)
def test_bad_params_are_rejected(kw: dict[str, object], err: type[Exception]) -> None:
    with pytest.raises(err):
        params(**kw)


def test_parse_rejects_foreign_bytes() -> None:
    with pytest.raises(ValueError, match="magic"):
        parse_metadata(bytes(4096))
    with pytest.raises(ValueError, match="at least"):
        parse_metadata(b"FBWM")
    good = reference_metadata(params(), [0, 1, 2, 3], [0, 1, 2, 3])
    with pytest.raises(ValueError, match="truncated"):
        parse_metadata(good[:200])


# -- random seqlens (hypothesis) -------------------------------------------------------------------------------


@st.composite
def cases(draw: st.DrawFn) -> tuple[WorkspaceParams, np.ndarray, np.ndarray]:
    batch = draw(st.integers(1, 12))
    max_q = draw(st.integers(0, 300))
    max_k = draw(st.integers(0, 300))
    lengths = st.integers(0, 300)
    sq = draw(st.lists(st.one_of(st.just(0), lengths), min_size=batch, max_size=batch))
    sk = draw(st.lists(st.one_of(st.just(0), lengths), min_size=batch, max_size=batch))
    q0 = draw(st.integers(0, 50))
    k0 = draw(st.integers(0, 50))
    p = WorkspaceParams(
        batch=batch,
        nhead=draw(st.integers(1, 5)),
        hdim_q=draw(st.sampled_from([1, 8, 64, 128])),
        kM0=draw(st.sampled_from([1, 16, 64, 128])),
        kN0=draw(st.sampled_from([1, 16, 64, 128])),
        num_cus=draw(st.integers(1, 40)),
        deterministic=draw(st.booleans()),
        max_seqlen_q=max(max_q, max(sq) if draw(st.booleans()) else 0),
        max_seqlen_k=max(max_k, max(sk) if draw(st.booleans()) else 0),
        total_q_padded=draw(st.integers(0, 400 * batch)),
    )
    return p, q0 + seqstart(sq), k0 + seqstart(sk)


@settings(max_examples=150, deadline=None)
@given(cases())
def test_fast_pack_matches_the_oracle_and_stays_in_bounds(case: tuple[WorkspaceParams, np.ndarray, np.ndarray]) -> None:
    p, ssq, ssk = case
    m = parse_metadata(both(p, ssq, ssk))
    assert m.dq_acc_used_bytes <= p.dq_acc_bound_bytes
    assert (m.nsplits <= p.nsplits_bound).all()
    if m.ok and p.deterministic:
        assert m.worker_units.sum() == m.total_units
        busy = m.worker_units > 0
        assert ((m.worker_start[~busy] == -1).all()) and (m.worker_start[busy] >= 0).all()
        # Every split index a worker starts at is a valid slice of its batch.
        assert (m.worker_start[busy, 1] < m.nsplits[m.worker_start[busy, 0]]).all()
