"""The FMHA backward workspace prepare on a device: every strategy uploads the reference metadata and zeroes dq_acc."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipeline_helpers import Gate, eventually
from support.transfer import download, upload

import streamrt as srt
from streamrt.recipes.fmha_bwd import (
    STATUS_SEQLEN_K_EXCEEDED,
    WorkspaceInputError,
    WorkspaceParams,
    WorkspacePrepare,
    native_pack_available,
    parse_metadata,
    prepare_workspace,
    prepare_workspace_sync,
    reference_metadata,
    workspace_size,
)

BATCH = 6
PARAMS = WorkspaceParams(
    batch=BATCH, nhead=3, hdim_q=16, kM0=32, kN0=32, num_cus=8, deterministic=True, max_seqlen_q=200, max_seqlen_k=200, total_q_padded=1200
)


def seqstart(lengths: list[int] | np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


class Setup:
    """Device seqstart buffers and a workspace filled with 0xAB (so zeroing is visible)."""

    def __init__(self, rt: srt.Runtime, params: WorkspaceParams = PARAMS) -> None:
        self.rt = rt
        self.params = params
        self.s = rt.create_stream()
        n = 4 * (params.batch + 1)
        self.q = rt.device_allocator.allocate(n, stream=self.s)
        self.k = rt.device_allocator.allocate(n, stream=self.s)
        self.ws = rt.device_allocator.allocate(workspace_size(params), stream=self.s)
        self.s.memset(self.ws, 0xAB)

    def set_seqlens(self, sq: np.ndarray, sk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q, k = seqstart(sq), seqstart(sk)
        upload(self.rt, self.s, q, dst=self.q)
        upload(self.rt, self.s, k, dst=self.k)
        return q, k

    def close(self) -> None:
        self.s.synchronize()
        for b in (self.q, self.k, self.ws):
            b.release()
        self.s.close()

    def metadata(self) -> np.ndarray:
        return download(self.rt, self.s, self.ws.view(0, self.params.metadata_region_bytes))

    def dq_acc(self) -> np.ndarray:
        p = self.params
        return download(self.rt, self.s, self.ws.view(p.metadata_region_bytes, p.dq_acc_bound_bytes))


def _run(prep: WorkspacePrepare, s: srt.Stream, strategy: str) -> int | None:
    """Run one prepare; ``dq_acc_used_bytes`` as the pack returned it (``None``: a native pack returns nothing)."""
    if strategy == "sync":
        return prep.run_sync(s)
    run = prep.replay(s) if strategy == "graph" else prep.launch(s, strategy)
    run.result(10)
    return int(run.host_result("pack")) if prep.pack == "python" else None


STRATEGIES = ["stream", "fork", "graph", "sync"]
PACKS = [
    "python",
    pytest.param("native", marks=pytest.mark.skipif(not native_pack_available(), reason="the C pack was not built")),
]


@pytest.fixture(params=PACKS)
def pack(request: pytest.FixtureRequest) -> str:
    """The host pack of the prepare: the Python one on a runtime worker, or the C one on the driver's thread."""
    return str(request.param)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_uploads_the_reference_metadata_and_zeroes_dq_acc(rt: srt.Runtime, strategy: str, pack: str) -> None:
    env = Setup(rt)
    q, k = env.set_seqlens(np.array([5, 0, 200, 33, 1, 64]), np.array([40, 7, 0, 200, 1, 64]))
    with WorkspacePrepare(rt, PARAMS, env.q, env.k, env.ws, pack=pack) as prep:
        returned = _run(prep, env.s, strategy)
    ref = reference_metadata(PARAMS, q, k)
    assert np.array_equal(env.metadata(), ref)
    used = parse_metadata(ref).dq_acc_used_bytes
    assert used > 0 and returned in (used, None)
    dq = env.dq_acc()
    assert (dq[:used] == 0).all()
    if strategy == "sync":
        assert (dq[used:] == 0xAB).all()  # the baseline zeroes only the used region
    else:
        assert (dq == 0).all()  # the async pack zeroes the upper bound


@pytest.mark.parametrize("strategy", ["stream", "fork", "graph"])
def test_replays_with_changed_seqlens_give_the_new_metadata(rt: srt.Runtime, strategy: str, pack: str) -> None:
    env = Setup(rt)
    rng = np.random.default_rng(3)
    with WorkspacePrepare(rt, PARAMS, env.q, env.k, env.ws, pack=pack) as prep:
        for _ in range(8):
            q, k = env.set_seqlens(rng.integers(0, 200, BATCH), rng.integers(0, 200, BATCH))
            _run(prep, env.s, strategy)
            assert np.array_equal(env.metadata(), reference_metadata(PARAMS, q, k))
        if strategy == "graph":
            assert prep.graph is not None and prep.graph.replays == 8


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sq=st.lists(st.one_of(st.just(0), st.integers(0, 200)), min_size=BATCH, max_size=BATCH),
    sk=st.lists(st.one_of(st.just(0), st.integers(0, 200)), min_size=BATCH, max_size=BATCH),
    strategy=st.sampled_from(STRATEGIES),
)
def test_random_and_edge_case_seqlens_match_the_reference(sim_rt: srt.Runtime, sq: list[int], sk: list[int], strategy: str, pack: str) -> None:
    env = Setup(sim_rt)
    q, k = env.set_seqlens(np.array(sq), np.array(sk))
    with WorkspacePrepare(sim_rt, PARAMS, env.q, env.k, env.ws, pack=pack) as prep:
        _run(prep, env.s, strategy)
    assert np.array_equal(env.metadata(), reference_metadata(PARAMS, q, k))
    env.close()


@pytest.mark.parametrize(
    "batch, sq, sk",
    [
        (1, [0], [0]),  # batch 1, empty sequences
        (1, [77], [0]),  # seqlen_k = 0
        (4, [0, 0, 0, 0], [10, 20, 0, 30]),  # empty query sequences
        (1024, None, None),  # batch 1024
    ],
)
@pytest.mark.parametrize("strategy", ["fork", "graph"])
def test_edge_cases(rt: srt.Runtime, batch: int, sq: list[int] | None, sk: list[int] | None, strategy: str, pack: str) -> None:
    rng = np.random.default_rng(batch)
    sq_arr = rng.integers(0, 64, batch) if sq is None else np.array(sq)
    sk_arr = rng.integers(0, 64, batch) if sk is None else np.array(sk)
    params = WorkspaceParams(
        batch=batch, nhead=2, hdim_q=8, kM0=16, kN0=16, num_cus=304, deterministic=True,
        max_seqlen_q=128, max_seqlen_k=128, total_q_padded=max(1, int(sq_arr.sum())),
    )  # fmt: skip
    env = Setup(rt, params)
    q, k = env.set_seqlens(sq_arr, sk_arr)
    with WorkspacePrepare(rt, params, env.q, env.k, env.ws, pack=pack) as prep:
        _run(prep, env.s, strategy)
    assert np.array_equal(env.metadata(), reference_metadata(params, q, k))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_invalid_seqlens_raise_and_upload_the_error_block(rt: srt.Runtime, strategy: str) -> None:
    env = Setup(rt)
    env.set_seqlens(np.array([1, 1, 1, 1, 1, 1]), np.array([1, 1, 500, 1, 1, 1]))  # 500 > max_seqlen_k
    with WorkspacePrepare(rt, PARAMS, env.q, env.k, env.ws) as prep, pytest.raises(WorkspaceInputError) as info:
        _run(prep, env.s, strategy)
    assert info.value.status == STATUS_SEQLEN_K_EXCEEDED
    meta = parse_metadata(env.metadata())
    assert meta.status == STATUS_SEQLEN_K_EXCEEDED and meta.dq_acc_used_bytes == 0


@pytest.mark.skipif(not native_pack_available(), reason="the C pack was not built")
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_invalid_seqlens_with_the_native_pack_upload_the_error_block(rt: srt.Runtime, strategy: str) -> None:
    # A native host function cannot raise: the eager and graph runs succeed with the error block
    # uploaded (as the device kernel does); the synchronous path reads the status and raises.
    env = Setup(rt)
    env.set_seqlens(np.array([1, 1, 1, 1, 1, 1]), np.array([1, 1, 500, 1, 1, 1]))
    with WorkspacePrepare(rt, PARAMS, env.q, env.k, env.ws, pack="native") as prep:
        if strategy == "sync":
            with pytest.raises(WorkspaceInputError):
                _run(prep, env.s, strategy)
        else:
            assert _run(prep, env.s, strategy) is None
    meta = parse_metadata(env.metadata())
    assert meta.status == STATUS_SEQLEN_K_EXCEEDED and meta.dq_acc_used_bytes == 0


def test_one_shot_prepare_keeps_its_staging_in_flight_until_the_run_completes(rt: srt.Runtime, pack: str) -> None:
    env = Setup(rt)
    q, k = env.set_seqlens(np.array([5, 6, 7, 8, 9, 10]), np.array([10, 9, 8, 7, 6, 5]))
    gate = Gate()
    stats = rt.host_allocator.statistics
    try:
        env.s.launch_host_func(gate)
        before = stats().in_flight_bytes
        run = prepare_workspace(rt, env.s, PARAMS, env.q, env.k, env.ws, strategy="stream", pack=pack)
        staging = 2 * 64 + PARAMS.metadata_region_bytes
        assert stats().in_flight_bytes >= before + staging  # released by the recipe, still used by the stream
        assert not run.is_done
    finally:
        gate.open()
    run.result(10)
    eventually(lambda: stats().in_flight_bytes <= before)
    assert np.array_equal(env.metadata(), reference_metadata(PARAMS, q, k))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_one_shot_prepare_for_every_strategy(rt: srt.Runtime, strategy: str) -> None:
    env = Setup(rt)
    q, k = env.set_seqlens(np.array([3, 0, 9, 2, 2, 2]), np.array([0, 3, 9, 2, 2, 2]))
    done = prepare_workspace(rt, env.s, PARAMS, env.q, env.k, env.ws, strategy=strategy)
    assert done.result(10) == parse_metadata(reference_metadata(PARAMS, q, k)).dq_acc_used_bytes or strategy != "sync"
    assert np.array_equal(env.metadata(), reference_metadata(PARAMS, q, k))
    assert prepare_workspace_sync(rt, env.s, PARAMS, env.q, env.k, env.ws) == parse_metadata(env.metadata()).dq_acc_used_bytes
    with pytest.raises(ValueError, match="strategy"):
        prepare_workspace(rt, env.s, PARAMS, env.q, env.k, env.ws, strategy="threads")


def test_bad_recipe_inputs(rt: srt.Runtime) -> None:
    env = Setup(rt)
    small = rt.device_allocator.allocate(16)
    with pytest.raises(ValueError, match="workspace_size"):
        WorkspacePrepare(rt, PARAMS, env.q, env.k, small)
    with pytest.raises(ValueError, match="batch \\+ 1"):
        WorkspacePrepare(rt, PARAMS, small, env.k, env.ws)
    with pytest.raises(ValueError, match="device memory"):
        WorkspacePrepare(rt, PARAMS, rt.host_allocator.allocate(64), env.k, env.ws)
    with pytest.raises(TypeError):
        WorkspacePrepare(rt, {"batch": 6}, env.q, env.k, env.ws)  # type: ignore[arg-type]
    prep = WorkspacePrepare(rt, PARAMS, env.q, env.k, env.ws)
    with pytest.raises(ValueError, match="strategy"):
        prep.launch(env.s, "graph")
    prep.close()
    with pytest.raises(ValueError, match="closed"):
        prep.launch(env.s)


def test_mixed_strategies_and_streams_in_flight_leave_no_race_in_the_simulator(pack: str) -> None:
    # Relaunches of one prepare, on two streams, eager and replayed, joined now or later, are
    # serialized by events: the simulator's vector-clock hazard checker sees no unordered access.
    with srt.open_runtime("sim", check_hazards=True) as rt:
        env = Setup(rt)
        env.set_seqlens(np.array([5, 0, 9, 2, 2, 2]), np.array([0, 3, 9, 2, 2, 2]))
        other = rt.create_stream()
        runs: list[srt.Run] = []
        with WorkspacePrepare(rt, PARAMS, env.q, env.k, env.ws, pack=pack) as prep:
            for _ in range(3):
                runs.append(prep.launch(env.s, "fork"))
                runs.append(prep.launch(other, "fork", wait_for=None))
                runs.append(prep.launch(env.s))
                runs.append(prep.replay(other))
                late = prep.launch(env.s, "fork", join=False)
                late.join(env.s)
                runs.append(late)
            for run in runs:
                run.result(10)
        assert rt.backend.hazards() == ()  # type: ignore[attr-defined]
