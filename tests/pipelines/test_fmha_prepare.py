"""The FMHA backward workspace prepare on a device: every strategy and pack uploads CK's metadata image,
reports the oracle's result, and zeroes what CK zeroes (the used prefix when deterministic, the bound otherwise)."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipeline_helpers import Gate, eventually
from support.transfer import download, upload

import streamrt as srt
from streamrt.recipes.fmha_bwd import (
    STATUS_SEQLEN_K_EXCEEDED,
    DevicePrepare,
    PrepareResult,
    WorkspaceInputError,
    WorkspaceParams,
    WorkspacePrepare,
    native_pack_available,
    prepare_workspace,
    prepare_workspace_sync,
    reference_metadata,
    reference_result,
    workspace_size,
)

BATCH = 6
PARAMS = WorkspaceParams(
    batch=BATCH, nhead=3, hdim_q=16, kM0=32, kN0=32, num_cus=8, deterministic=True, max_seqlen_q=200, max_seqlen_k=200, total_q_padded=1300
)
FILL = 0xAB


def seqstart(lengths: list[int] | np.ndarray, first: int = 0) -> np.ndarray:
    return np.concatenate([[first], first + np.cumsum(lengths)]).astype(np.int32)


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
        self.fill()

    def fill(self) -> None:
        self.s.memset(self.ws, FILL)

    def set_seqlens(self, sq: np.ndarray, sk: np.ndarray, q_first: int = 0, k_first: int = 0) -> tuple[np.ndarray, np.ndarray]:
        q, k = seqstart(sq, q_first), seqstart(sk, k_first)
        upload(self.rt, self.s, q, dst=self.q)
        upload(self.rt, self.s, k, dst=self.k)
        return q, k

    def close(self) -> None:
        self.s.synchronize()
        for b in (self.q, self.k, self.ws):
            b.release()
        self.s.close()

    def workspace(self) -> np.ndarray:
        return download(self.rt, self.s, self.ws)

    def metadata(self) -> np.ndarray:
        return self.workspace()[: self.params.metadata_region_bytes]

    def check(self, q: np.ndarray, k: np.ndarray) -> None:
        """CK's image in the metadata region; dq_acc zero exactly where CK zeroes it, the pattern after."""
        p = self.params
        ws = self.workspace()
        region = p.metadata_region_bytes
        assert np.array_equal(ws[:region], reference_metadata(p, q, k))
        zero = reference_result(p, q, k).dq_acc_used_bytes if p.deterministic else p.dq_acc_bound_bytes
        assert (ws[region : region + zero] == 0).all(), "dq_acc not zeroed where CK zeroes it"
        assert (ws[region + zero :] == FILL).all(), "dq_acc written past the used prefix"


def _run(prep: WorkspacePrepare, s: srt.Stream, strategy: str) -> PrepareResult | None:
    """Run one prepare; the result the pack returned (``None``: a native pack's eager runs return nothing)."""
    if strategy == "sync":
        return prep.run_sync(s)
    run = prep.replay(s) if strategy == "graph" else prep.launch(s, strategy)
    run.result(10)
    return run.host_result("pack") if prep.pack == "python" else None


STRATEGIES = ["stream", "fork", "graph", "fork_graph", "sync"]
PACKS = [
    "python",
    pytest.param("native", marks=pytest.mark.skipif(not native_pack_available(), reason="the C pack was not built")),
]


@pytest.fixture(params=PACKS)
def pack(request: pytest.FixtureRequest) -> str:
    """The host pack of the prepare: the Python one on a runtime worker, or the C one on the driver's thread."""
    return str(request.param)


@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_uploads_cks_image_and_zeroes_what_ck_zeroes(rt: srt.Runtime, strategy: str, pack: str, deterministic: bool) -> None:
    params = dataclasses.replace(PARAMS, deterministic=deterministic)
    env = Setup(rt, params)
    q, k = env.set_seqlens(np.array([5, 0, 200, 33, 1, 64]), np.array([40, 7, 0, 200, 1, 64]), q_first=17)
    with WorkspacePrepare(rt, params, env.q, env.k, env.ws, pack=pack) as prep:
        returned = _run(prep, env.s, strategy)
        assert prep.result(env.s) == reference_result(params, q, k)
        assert [n.name for n in prep.pipeline.nodes][-1] == ("prezero" if deterministic else "h2d_meta")
    expected = reference_result(params, q, k)
    assert expected.ok and expected.dq_acc_used_bytes > 0 and returned in (expected, None)
    env.check(q, k)


@pytest.mark.parametrize("strategy", ["fork", "fork_graph"])
@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize("wait_for", ["stream", None])
def test_fork_runs_the_round_trip_off_the_callers_stream(rt: srt.Runtime, strategy: str, deterministic: bool, wait_for: str | None) -> None:
    """Under "fork" the round trip runs on a side stream: beside the memset (non-deterministic), or the whole
    memset-free chain (deterministic), which then is not on the caller's stream at all. "fork_graph" replays
    the whole captured prepare on the side stream."""
    params = dataclasses.replace(PARAMS, deterministic=deterministic)
    env = Setup(rt, params)
    q, k = env.set_seqlens(np.array([5, 0, 200, 33, 1, 64]), np.array([40, 7, 0, 200, 1, 64]))
    gate = Gate()
    on_callers = strategy == "fork" and not deterministic  # the memset
    with WorkspacePrepare(rt, params, env.q, env.k, env.ws) as prep:
        prep.launch(env.s, strategy, wait_for=wait_for).result(10)  # warm: a first kernel launch may wait for the device (HIP-on-CUDA)
        env.s.launch_host_func(gate)  # holds the caller's stream
        try:
            run = prep.launch(env.s, strategy, wait_for=wait_for, join=False)
            assert (env.s in run.streams) == on_callers
            if wait_for == "stream" or on_callers:
                assert not run.is_done  # ordered after the held stream (wait_for), or partly on it (the memset)
            # else nothing orders it after the held stream: whether it can finish meanwhile depends on the
            # driver's host-callback threads (CUDA and the simulator run host functions one at a time)
        finally:
            gate.open()
        run.join(env.s)
        run.result(10)
        if strategy == "fork_graph":
            assert prep.graph is not None and prep.graph.replays == 2
    env.check(q, k)


@pytest.mark.parametrize("deterministic", [True, False])
def test_a_deferred_fork_gives_the_same_image_with_its_calls_made_by_the_submission_thread(
    rt: srt.Runtime, deterministic: bool, pack: str
) -> None:
    """The seed's prepare with ``deferred=True``: every branch on side streams, its calls made by the runtime's
    submission thread where it can be deferred (no Python host node), else made here as without it."""
    params = dataclasses.replace(PARAMS, deterministic=deterministic)
    env = Setup(rt, params)
    with WorkspacePrepare(rt, params, env.q, env.k, env.ws, pack=pack) as prep:
        for first in (17, 3):  # changed seqlens: each launch reads what the caller's stream wrote before it
            q, k = env.set_seqlens(np.array([5, 0, 200, 33, 1, 64]), np.array([40, 7, 0, 200, 1, 64]), q_first=first)
            run = prep.launch(env.s, "fork", join=False, deferred=True)
            run.join(env.s)
            run.result(10)
            assert prep.result(env.s) == reference_result(params, q, k)
            env.check(q, k)
        assert bool(run.gate) == (pack == "native")  # the Python pack is a Python host node: not deferred
        if run.gate:
            assert run.streams[0] is env.s and env.s not in run.streams[1:]
        with pytest.raises(ValueError, match="join=False"):
            prep.launch(env.s, "fork", deferred=True)


SEQ_Q = np.array([5, 0, 200, 33, 1, 64])
SEQ_K = np.array([40, 7, 0, 200, 1, 64])


@pytest.mark.parametrize("deterministic", [True, False])
@pytest.mark.parametrize(("strategy", "deferred"), [("stream", False), ("fork", False), ("fork", True)])
def test_a_launch_reads_the_seqstart_it_is_given_and_the_next_one_its_own_again(
    rt: srt.Runtime, strategy: str, deferred: bool, deterministic: bool, pack: str
) -> None:
    """``seqstart_q=``/``seqstart_k=``: the launch reads that memory (the seed's per-call seqstart pointers); a
    later launch without them reads the buffers the prepare was built with."""
    params = dataclasses.replace(PARAMS, deterministic=deterministic)
    env = Setup(rt, params)
    own_q, own_k = env.set_seqlens(SEQ_Q, SEQ_K, q_first=3)
    n = 4 * (params.batch + 1)
    given = [rt.device_allocator.allocate(n, stream=env.s) for _ in range(3)]
    join = not deferred
    with WorkspacePrepare(rt, params, env.q, env.k, env.ws, pack=pack) as prep:
        prep.launch(env.s, strategy, join=join, deferred=deferred).join(env.s)  # compiles the plans
        for i, buf in enumerate(given):
            q = seqstart(np.roll(SEQ_Q, i), first=i)
            upload(rt, env.s, q, dst=buf)
            env.fill()
            if i == 1:  # the same memory for both
                run = prep.launch(env.s, strategy, seqstart_q=buf, seqstart_k=buf, join=join, deferred=deferred)
                k = q
            else:  # q only: k is the prepare's own
                run = prep.launch(env.s, strategy, seqstart_q=buf, join=join, deferred=deferred)
                k = download(rt, env.s, env.k).view(np.int32)
            run.join(env.s)
            run.result(10)
            env.check(q, k)
        assert np.array_equal(download(rt, env.s, env.q).view(np.int32), own_q)  # neither read nor written
        own_q, own_k = env.set_seqlens(SEQ_K, SEQ_Q, q_first=1)
        env.fill()
        run = prep.launch(env.s, strategy, join=join, deferred=deferred)
        run.join(env.s)
        run.result(10)
        env.check(own_q, own_k)
        env.fill()
        run = prep.launch(env.s, strategy, seqstart_k=given[0], join=join, deferred=deferred)
        run.join(env.s)
        run.result(10)
        env.check(own_q, seqstart(SEQ_Q))
    env.s.synchronize()
    for buf in given:
        buf.release()


def test_launches_in_flight_read_each_its_own_seqstart(rt: srt.Runtime, pack: str) -> None:
    """Deferred launches queued behind a held stream, alternately with and without ``seqstart_q=``: each reads
    what it was given (the last one's image stays)."""
    env = Setup(rt)
    own_q, own_k = env.set_seqlens(SEQ_Q, SEQ_K)
    given = rt.device_allocator.allocate(4 * (PARAMS.batch + 1), stream=env.s)
    other_q = seqstart(SEQ_K, first=9)
    upload(rt, env.s, other_q, dst=given)
    with WorkspacePrepare(rt, PARAMS, env.q, env.k, env.ws, pack=pack) as prep:
        prep.launch(env.s, "fork", join=False, deferred=True).join(env.s)
        for last_given in (True, False):
            gate = Gate()
            env.s.launch_host_func(gate)
            try:
                runs = [prep.launch(env.s, "fork", seqstart_q=given if i % 2 == last_given else None, join=False, deferred=True)
                        for i in range(4)]
            finally:
                gate.open()
            for run in runs:
                run.join(env.s)
                run.result(10)
            # (the metadata: each launch zeroed the dq_acc prefix its own seqlens use)
            assert np.array_equal(env.metadata(), reference_metadata(PARAMS, other_q if last_given else own_q, own_k))
    env.s.synchronize()
    given.release()


def test_seqstart_released_after_the_launch_is_not_reused_before_the_prepare_read_it(rt: srt.Runtime, pack: str) -> None:
    """The launch notes the given memory's streams: released at once, the allocator keeps it until the prepare
    (behind a held stream) has read it."""
    env = Setup(rt)
    own_q, own_k = env.set_seqlens(SEQ_Q, SEQ_K)
    n = 4 * (PARAMS.batch + 1)
    with WorkspacePrepare(rt, PARAMS, env.q, env.k, env.ws, pack=pack) as prep:
        prep.launch(env.s, "fork", join=False, deferred=True).join(env.s)
        other = rt.create_stream()
        given = rt.device_allocator.allocate(n)
        q = seqstart(SEQ_K, first=2)
        upload(rt, other, q, dst=given)
        other.synchronize()  # only the launch keeps it from reuse now
        env.fill()
        gate = Gate()
        env.s.launch_host_func(gate)
        try:
            run = prep.launch(env.s, "fork", seqstart_q=given, join=False, deferred=True)
            given.release()
            reused = [rt.device_allocator.allocate(n) for _ in range(4)]
            for b in reused:
                other.memset(b, 0xFF)
        finally:
            gate.open()
        run.join(env.s)
        run.result(10)
        env.check(q, own_k)
    other.synchronize()
    for b in reused:
        b.release()
    other.close()


def test_bad_seqstart_for_one_launch_raises_and_enqueues_nothing(rt: srt.Runtime) -> None:
    env = Setup(rt)
    env.set_seqlens(SEQ_Q, SEQ_K)
    small = rt.device_allocator.allocate(16)
    host = rt.host_allocator.allocate(64)
    with WorkspacePrepare(rt, PARAMS, env.q, env.k, env.ws) as prep:
        prep.launch(env.s, "fork").result(10)
        before = prep.pipeline._chain.last
        cases = [
            ("batch \\+ 1", {"seqstart_q": small}),
            ("overlaps the workspace", {"seqstart_k": env.ws.view(64, 28)}),
            ("device memory", {"seqstart_q": host}),
            ("wait_for='stream'", {"seqstart_q": env.k, "wait_for": None}),
        ]
        for match, kwargs in cases:
            with pytest.raises(ValueError, match=match):
                prep.launch(env.s, "fork", **kwargs)
        with pytest.raises(ValueError, match="captured prepare"):
            prep.launch(env.s, "fork_graph", seqstart_q=env.k)
        with srt.open_runtime("sim") as other:
            foreign = other.device_allocator.allocate(64)
            with pytest.raises(ValueError, match="another runtime"):
                prep.launch(env.s, "fork", seqstart_q=foreign)
            foreign.release()
        assert prep.pipeline._chain.last is before  # nothing was launched
    small.release()
    host.release()


def test_the_deterministic_fork_keeps_its_side_stream_per_callers_stream_until_close(rt: srt.Runtime) -> None:
    """Launches from one stream reuse one side stream (its launch plan stays compiled); close gives it back."""
    params = dataclasses.replace(PARAMS, deterministic=True)
    env = Setup(rt, params)
    q, k = env.set_seqlens(np.array([5, 0, 200, 33, 1, 64]), np.array([40, 7, 0, 200, 1, 64]))
    other = rt.create_stream()
    with WorkspacePrepare(rt, params, env.q, env.k, env.ws) as prep:
        runs = [prep.launch(s, "fork") for s in (env.s, env.s, other, env.s)]
        for run in runs:
            run.result(10)
        sides = [run.streams for run in runs]
        assert sides[0] == sides[1] == sides[3] != sides[2]
        assert env.s not in sides[0] and other not in sides[2]
        assert len(prep.pipeline._plans) == 2  # one plan per side stream
    again = WorkspacePrepare(rt, params, env.q, env.k, env.ws)
    run = again.launch(env.s, "fork")
    assert run.streams in (sides[0], sides[2])  # the pool had them back
    run.result(10)
    again.close()
    other.close()
    env.check(q, k)


@pytest.mark.parametrize("strategy", ["stream", "fork", "graph", "fork_graph"])
def test_replays_with_changed_seqlens_give_the_new_image_and_zeroing(rt: srt.Runtime, strategy: str, pack: str) -> None:
    env = Setup(rt)
    rng = np.random.default_rng(3)
    with WorkspacePrepare(rt, PARAMS, env.q, env.k, env.ws, pack=pack) as prep:
        for i in range(8):
            sk = rng.integers(0, 200, BATCH) * (i != 5)  # one round without keys: nothing used
            q, k = env.set_seqlens(rng.integers(0, 200, BATCH), sk, k_first=i)
            env.fill()
            _run(prep, env.s, strategy)
            env.check(q, k)
            assert prep.result(env.s) == reference_result(PARAMS, q, k)
        if strategy in ("graph", "fork_graph"):
            assert prep.graph is not None and prep.graph.replays == 8


def test_every_strategy_and_pack_writes_the_same_bytes_in_replays_with_changing_seqlens(rt: srt.Runtime) -> None:
    """sync, stream, fork, graph (both packs), device and device_graph: one workspace each round, byte for byte."""
    env = Setup(rt)
    packs = ["python"] + (["native"] if native_pack_available() else [])
    preps = {f"{st}/{pk}": (WorkspacePrepare(rt, PARAMS, env.q, env.k, env.ws, pack=pk), st) for st in STRATEGIES for pk in packs}
    device = DevicePrepare(rt, PARAMS, env.q, env.k, env.ws)
    rng = np.random.default_rng(24)
    try:
        for _ in range(3):
            q, k = env.set_seqlens(rng.integers(0, 200, BATCH), rng.integers(0, 200, BATCH) * (rng.random(BATCH) > 0.3))
            images = {}
            for name, (prep, strategy) in preps.items():
                env.fill()
                _run(prep, env.s, strategy)
                images[name] = env.workspace()
            for name, run in (("device", device.launch), ("device_graph", device.replay)):
                env.fill()
                run(env.s).result(10)
                images[name] = env.workspace()
            env.check(q, k)
            first = next(iter(images.values()))
            assert all(np.array_equal(first, img) for img in images.values()), [n for n, img in images.items() if not np.array_equal(first, img)]
    finally:
        device.close()
        for prep, _ in preps.values():
            prep.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sq=st.lists(st.one_of(st.just(0), st.integers(0, 200)), min_size=BATCH, max_size=BATCH),
    sk=st.lists(st.one_of(st.just(0), st.integers(0, 200)), min_size=BATCH, max_size=BATCH),
    q_first=st.sampled_from([0, 0, 50]),
    strategy=st.sampled_from(STRATEGIES),
)
def test_random_and_edge_case_seqlens_match_the_oracle(
    sim_rt: srt.Runtime, sq: list[int], sk: list[int], q_first: int, strategy: str, pack: str
) -> None:
    env = Setup(sim_rt)
    q, k = env.set_seqlens(np.array(sq), np.array(sk), q_first=q_first)
    with WorkspacePrepare(sim_rt, PARAMS, env.q, env.k, env.ws, pack=pack) as prep:
        _run(prep, env.s, strategy)
    env.check(q, k)
    env.close()


@pytest.mark.parametrize(
    "batch, sq, sk, k_first",
    [
        (1, [0], [0], 0),  # batch 1, empty sequences
        (1, [77], [0], 0),  # seqlen_k = 0
        (3, [5, 9, 2], [0, 0, 0], 4),  # every seqlen_k = 0 with seqstart_k[0] != 0 (CK divides by zero)
        (4, [0, 0, 0, 0], [10, 20, 0, 30], 0),  # empty query sequences
        (4, [10, 20, 5, 9], [0, 20, 0, 30], 0),  # seqlen_k = 0 for some batches: nsplits 1 for them
        (1024, None, None, 0),  # batch 1024
    ],
)
@pytest.mark.parametrize("strategy", ["fork", "graph"])
def test_edge_cases(rt: srt.Runtime, batch: int, sq: list[int] | None, sk: list[int] | None, k_first: int, strategy: str, pack: str) -> None:
    rng = np.random.default_rng(batch)
    sq_arr = rng.integers(0, 64, batch) if sq is None else np.array(sq)
    sk_arr = rng.integers(0, 64, batch) if sk is None else np.array(sk)
    params = WorkspaceParams(
        batch=batch, nhead=2, hdim_q=8, kM0=16, kN0=16, num_cus=304, deterministic=True,
        max_seqlen_q=128, max_seqlen_k=128, total_q_padded=max(1, int(sq_arr.sum())),
    )  # fmt: skip
    env = Setup(rt, params)
    q, k = env.set_seqlens(sq_arr, sk_arr, k_first=k_first)
    with WorkspacePrepare(rt, params, env.q, env.k, env.ws, pack=pack) as prep:
        _run(prep, env.s, strategy)
        assert prep.result(env.s).ck_divide_by_zero == (k_first != 0)
    env.check(q, k)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_invalid_seqlens_raise_and_upload_the_idle_image(rt: srt.Runtime, strategy: str) -> None:
    env = Setup(rt)
    q, k = env.set_seqlens(np.array([1, 1, 1, 1, 1, 1]), np.array([1, 1, 500, 1, 1, 1]))  # 500 > max_seqlen_k
    with WorkspacePrepare(rt, PARAMS, env.q, env.k, env.ws) as prep, pytest.raises(WorkspaceInputError) as info:
        _run(prep, env.s, strategy)
    assert info.value.status == STATUS_SEQLEN_K_EXCEEDED
    env.check(q, k)  # the idle image, and the prezero zeroed nothing
    assert reference_result(PARAMS, q, k).dq_acc_used_bytes == 0


@pytest.mark.skipif(not native_pack_available(), reason="the C pack was not built")
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_invalid_seqlens_with_the_native_pack_are_in_the_result(rt: srt.Runtime, strategy: str) -> None:
    # A native host function cannot raise: the eager and graph runs succeed with the idle image
    # uploaded and the status in the result record (as the device kernel does); the synchronous path raises.
    env = Setup(rt)
    q, k = env.set_seqlens(np.array([1, 1, 1, 1, 1, 1]), np.array([1, 1, 500, 1, 1, 1]))
    with WorkspacePrepare(rt, PARAMS, env.q, env.k, env.ws, pack="native") as prep:
        if strategy == "sync":
            with pytest.raises(WorkspaceInputError):
                _run(prep, env.s, strategy)
        else:
            assert _run(prep, env.s, strategy) is None
        assert prep.result(env.s).status == STATUS_SEQLEN_K_EXCEEDED
    env.check(q, k)


def test_one_shot_prepare_keeps_its_staging_in_flight_until_the_run_completes(rt: srt.Runtime, pack: str) -> None:
    env = Setup(rt)
    q, k = env.set_seqlens(np.array([5, 6, 7, 8, 9, 10]), np.array([10, 9, 8, 7, 6, 5]))
    gate = Gate()
    stats = rt.host_allocator.statistics
    # Warm first: loading a kernel may wait for the device, and with CUDA's lazy loading (the
    # HIP-on-CUDA harness's cudaLibraryGetKernel) that happens at the first launch: not behind the gate.
    prepare_workspace(rt, env.s, PARAMS, env.q, env.k, env.ws, strategy="stream", pack=pack).result(10)
    env.s.synchronize()  # the warm prepare's staging fence (recorded after its Run's tail) has passed too
    try:
        env.s.launch_host_func(gate)
        before = stats().in_flight_bytes
        run = prepare_workspace(rt, env.s, PARAMS, env.q, env.k, env.ws, strategy="stream", pack=pack)
        staging = 2 * 64 + PARAMS.metadata_region_bytes + 16
        assert stats().in_flight_bytes >= before + staging  # released by the recipe, still used by the stream
        assert not run.is_done
    finally:
        gate.open()
    run.result(10)
    eventually(lambda: stats().in_flight_bytes <= before)
    env.check(q, k)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_one_shot_prepare_for_every_strategy(rt: srt.Runtime, strategy: str) -> None:
    env = Setup(rt)
    q, k = env.set_seqlens(np.array([3, 0, 9, 2, 2, 2]), np.array([0, 3, 9, 2, 2, 2]))
    done = prepare_workspace(rt, env.s, PARAMS, env.q, env.k, env.ws, strategy=strategy)
    expected = reference_result(PARAMS, q, k)
    assert done.result(10) == (expected if strategy == "sync" else None)
    env.check(q, k)
    assert prepare_workspace_sync(rt, env.s, PARAMS, env.q, env.k, env.ws) == expected
    with pytest.raises(ValueError, match="strategy"):
        prepare_workspace(rt, env.s, PARAMS, env.q, env.k, env.ws, strategy="threads")


def test_bad_recipe_inputs(rt: srt.Runtime) -> None:
    env = Setup(rt)
    small = rt.device_allocator.allocate(16)
    with pytest.raises(ValueError, match="workspace_size"):
        WorkspacePrepare(rt, PARAMS, env.q, env.k, small)
    with pytest.raises(ValueError, match="batch \\+ 1"):
        WorkspacePrepare(rt, PARAMS, small, env.k, env.ws)
    with pytest.raises(ValueError, match="overlaps the workspace"):
        WorkspacePrepare(rt, PARAMS, env.ws.view(64, 28), env.k, env.ws)
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
                given = prep.launch(other, "fork", seqstart_q=env.k, join=False, deferred=True)  # seqstart given
                given.join(other)
                runs.append(given)
                runs.append(prep.launch(env.s, "stream", seqstart_k=env.q))
            for run in runs:
                run.result(10)
        assert rt.backend.hazards() == ()  # type: ignore[attr-defined]


def test_threads_launching_with_and_without_seqstart_given_neither_deadlock_nor_race(pack: str) -> None:
    """Launches of one prepare from three threads, each on its own stream, with seqstart given and without,
    eager and deferred: they finish, and the simulator's hazard checker sees no unordered access."""
    rt = srt.open_runtime("sim", check_hazards=True)
    env = Setup(rt)
    env.set_seqlens(np.array([5, 0, 9, 2, 2, 2]), np.array([0, 3, 9, 2, 2, 2]))
    env.s.synchronize()
    errors: list[BaseException] = []
    prep = WorkspacePrepare(rt, PARAMS, env.q, env.k, env.ws, pack=pack)

    def launches(n: int) -> None:
        s = rt.create_stream()
        try:
            for i in range(12):
                seq = {"seqstart_q": env.k} if (i + n) % 2 else {}
                run = prep.launch(s, "fork", join=False, deferred=i % 3 == n, **seq)
                run.join(s)
            s.synchronize()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=launches, args=(n,), daemon=True) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if any(t.is_alive() for t in threads):  # (the runtime stays open: closing it would wait for their locks)
        pytest.fail("launches of one prepare deadlocked")
    prep.close()
    rt.close()
    assert errors == []
    assert rt.backend.hazards() == ()  # type: ignore[attr-defined]
