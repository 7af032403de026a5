"""The FMHA host pack in C: the oracle's bytes and result, its argument checks, and its place in a pipeline."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import streamrt as srt
from streamrt.recipes.fmha_bwd import (
    NativePack,
    PrepareResult,
    WorkspaceParams,
    WorkspacePrepare,
    native_pack_available,
    pack_metadata_native,
    reference_metadata,
    reference_result,
    workspace_size,
)
from streamrt.recipes.fmha_bwd.native import native_pack_unavailable_reason

needs_native = pytest.mark.skipif(not native_pack_available(), reason=f"{native_pack_unavailable_reason()}")


def test_the_c_pack_is_built_where_ci_requires_it() -> None:
    """CI sets STREAMRT_REQUIRE_NATIVE=1: a failed build must not pass unnoticed there."""
    if os.environ.get("STREAMRT_REQUIRE_NATIVE") != "1":
        pytest.skip("STREAMRT_REQUIRE_NATIVE is not set")
    assert native_pack_available(), native_pack_unavailable_reason()


def _seqstart(lengths: list[int], first: int = 0) -> np.ndarray:
    return np.concatenate([[first], first + np.cumsum(lengths, dtype=np.int64)]).astype(np.int32)


def assert_oracles(p: WorkspaceParams, q: np.ndarray, k: np.ndarray) -> None:
    record = np.full(16, 0xEE, np.uint8)
    np.testing.assert_array_equal(pack_metadata_native(p, q, k, result=record), reference_metadata(p, q, k))
    assert PrepareResult.from_record(record) == reference_result(p, q, k)


@needs_native
@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    batch=st.integers(1, 24),
    nhead=st.integers(1, 8),
    kM0=st.sampled_from([1, 16, 64]),
    kN0=st.sampled_from([1, 16, 64]),
    num_cus=st.integers(1, 200),
    deterministic=st.booleans(),
)
def test_random_inputs_give_the_oracles_bytes(
    data: st.DataObject, batch: int, nhead: int, kM0: int, kN0: int, num_cus: int, deterministic: bool
) -> None:
    # Lengths up to a little past the limits, negative lengths now and then: the idle images too.
    sq = data.draw(st.lists(st.integers(-1, 140), min_size=batch, max_size=batch))
    sk = data.draw(st.lists(st.integers(-1, 140), min_size=batch, max_size=batch))
    p = WorkspaceParams(
        batch=batch, nhead=nhead, hdim_q=data.draw(st.integers(1, 128)), kM0=kM0, kN0=kN0, num_cus=num_cus,
        deterministic=deterministic, max_seqlen_q=128, max_seqlen_k=128,
        total_q_padded=data.draw(st.integers(0, 128 * batch + 50)),
    )  # fmt: skip
    assert_oracles(p, _seqstart(sq, data.draw(st.integers(0, 50))), _seqstart(sk, data.draw(st.integers(0, 5))))


@needs_native
def test_large_batches_and_many_workers() -> None:
    rng = np.random.default_rng(7)
    for batch, num_cus in ((1024, 304), (4096, 132), (3, 1 << 12)):
        p = WorkspaceParams(
            batch=batch, nhead=16, hdim_q=128, kM0=64, kN0=64, num_cus=num_cus, deterministic=True,
            max_seqlen_q=4096, max_seqlen_k=4096, total_q_padded=4096 * batch,
        )  # fmt: skip
        assert_oracles(p, _seqstart(list(rng.integers(0, 4097, batch))), _seqstart(list(rng.integers(0, 4097, batch))))


@needs_native
def test_extreme_invalid_lengths_give_the_idle_image() -> None:
    # Lengths near 2**32 with one-row key blocks and many heads: the C code must neither overflow
    # nor read past the arrays; the result is the oracle's idle image and status.
    p = WorkspaceParams(
        batch=2, nhead=2**19, hdim_q=1, kM0=1, kN0=1, num_cus=7, deterministic=True,
        max_seqlen_q=2**10, max_seqlen_k=2**10, total_q_padded=16,
    )  # fmt: skip
    q = np.array([0, 5, 9], np.int32)
    k = np.array([-(2**31), 2**31 - 1, 2**31 - 1], np.int32)
    for kk, qq in ((k, q), (q, k), (k, k)):
        assert_oracles(p, qq, kk)


@needs_native
def test_lengths_near_the_32_bit_limits_are_exact_and_flagged() -> None:
    p = WorkspaceParams(
        batch=2, nhead=1, hdim_q=1, kM0=64, kN0=128, num_cus=304, deterministic=True,
        max_seqlen_q=2**31 - 1, max_seqlen_k=2**31 - 1, total_q_padded=2**31 - 1,
    )  # fmt: skip
    for q, k in (([0, 2**31 - 2, 2**31 - 1], [0, 1, 2**31 - 1]), ([0, 0, 2**31 - 1], [0, 2**31 - 200, 2**31 - 1])):
        qq, kk = np.array(q, np.int32), np.array(k, np.int32)
        assert reference_result(p, qq, kk).ck_int32_overflow
        assert_oracles(p, qq, kk)


P = WorkspaceParams(batch=2, nhead=2, hdim_q=8, kM0=16, kN0=16, num_cus=4, deterministic=True, max_seqlen_q=64, max_seqlen_k=64, total_q_padded=128)


@needs_native
def test_output_and_arguments_are_checked_before_the_c_code_runs() -> None:
    q = np.array([0, 3, 9], np.int32)
    with pytest.raises(ValueError, match="batch \\+ 1"):
        pack_metadata_native(P, [0, 3], q)
    with pytest.raises(ValueError, match="uint8"):
        pack_metadata_native(P, q, q, out=np.zeros(P.metadata_region_bytes - 1, np.uint8))
    with pytest.raises(ValueError, match="contiguous"):
        pack_metadata_native(P, q, q, out=np.zeros(2 * P.metadata_region_bytes, np.uint8)[::2])
    with pytest.raises(ValueError, match="16-byte aligned"):
        pack_metadata_native(P, q, q, out=np.zeros(P.metadata_region_bytes + 16, np.uint8)[1 : P.metadata_region_bytes + 1])
    with pytest.raises(ValueError, match="result"):
        pack_metadata_native(P, q, q, result=np.zeros(8, np.uint8))
    with pytest.raises(ValueError, match="int32"):
        pack_metadata_native(P, np.array([0, 1, 2**31], np.int64), q)
    with pytest.raises(TypeError, match="WorkspaceParams"):
        NativePack({"batch": 2}, 1, 1, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-null"):
        NativePack(P, 0, 8, 16)
    with pytest.raises(ValueError, match="aligned"):
        NativePack(P, 8, 8, 16, 4)
    out = np.full(P.metadata_region_bytes, 0xEE, np.uint8)
    assert pack_metadata_native(P, q, q, out=out) is out
    np.testing.assert_array_equal(out, reference_metadata(P, q, q))  # every byte written


def test_without_the_c_module_native_is_refused_with_the_reason(sim_rt: srt.Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamrt.recipes.fmha_bwd import native, pipeline

    reason = "streamrt.recipes.fmha_bwd._pack_c was not built (no compiler)"
    monkeypatch.setattr(pipeline, "native_pack_unavailable_reason", lambda: reason)
    monkeypatch.setattr(native, "native_pack_unavailable_reason", lambda: reason)
    native._function.cache_clear()
    ws = sim_rt.device_allocator.allocate(workspace_size(P))
    seq = sim_rt.device_allocator.allocate(12)
    before = sim_rt.host_allocator.statistics().in_use_bytes
    try:
        with pytest.raises(RuntimeError, match="no compiler"):
            WorkspacePrepare(sim_rt, P, seq, seq, ws, pack="native")
        with pytest.raises(RuntimeError, match="no compiler"):
            pack_metadata_native(P, [0, 1, 2], [0, 1, 2])
    finally:
        native._function.cache_clear()
    assert sim_rt.host_allocator.statistics().in_use_bytes == before  # nothing allocated


def test_unknown_pack_is_refused_before_anything_is_allocated(sim_rt: srt.Runtime) -> None:
    ws = sim_rt.device_allocator.allocate(workspace_size(P))
    seq = sim_rt.device_allocator.allocate(12)
    before = sim_rt.host_allocator.statistics().in_use_bytes
    with pytest.raises(ValueError, match="unknown pack"):
        WorkspacePrepare(sim_rt, P, seq, seq, ws, pack="cython")
    assert sim_rt.host_allocator.statistics().in_use_bytes == before


@needs_native
def test_a_native_pack_is_one_native_host_node(sim_rt: srt.Runtime) -> None:
    ws = sim_rt.device_allocator.allocate(workspace_size(P))
    seq = sim_rt.device_allocator.allocate(12)
    with WorkspacePrepare(sim_rt, P, seq, seq, ws, pack="native") as native, WorkspacePrepare(sim_rt, P, seq, seq, ws) as python:
        assert (native.pack, python.pack) == ("native", "python")
        nodes = {n.name: n for n in native.pipeline.nodes}
        assert nodes["pack"].is_native  # type: ignore[attr-defined]
        assert not {n.name: n for n in python.pipeline.nodes}["pack"].is_native  # type: ignore[attr-defined]
        s = sim_rt.create_stream()
        s.memset(seq, 0)  # every sequence empty
        run = native.launch(s)
        run.result(10)
        with pytest.raises(KeyError, match="not a Python host node"):
            run.host_result("pack")  # a native function returns nothing
        staged = native.staging.view(128, P.metadata_region_bytes + 16).numpy(np.uint8)
        np.testing.assert_array_equal(staged[:-16], reference_metadata(P, [0, 0, 0], [0, 0, 0]))
        assert native.result(s) == PrepareResult.from_record(staged[-16:]) == PrepareResult(0, 0, 0)
        s.close()
