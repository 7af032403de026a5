"""Prefetcher: batches staged ahead on a side stream, in order, with back-pressure, handed over by events."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import pytest

import streamrt as srt

torch = pytest.importorskip("torch", reason="torch is not installed (make test installs torch==2.13.0, the CPU build)")
from training_helpers import wait_until

import streamrt.torch as st
from streamrt.recipes.fmha_bwd import WorkspaceParams, WorkspacePrepare, native_pack_available, workspace_size
from streamrt.torch._context import context


class Pair(NamedTuple):
    first: Any
    second: Any


def varlen_batches(n: int, seed: int = 0) -> Iterator[dict[str, Any]]:
    """Packed varlen batches: a different number of sequences and tokens every time."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        lengths = rng.integers(0, 40, size=int(rng.integers(1, 6)))
        cu = np.zeros(lengths.size + 1, dtype=np.int32)
        np.cumsum(lengths, out=cu[1:])
        tokens = torch.from_numpy(rng.integers(0, 1000, size=int(cu[-1])))
        yield {
            "tokens": tokens,
            "cu_seqlens": torch.from_numpy(cu),
            "weights": rng.random(int(cu[-1])).astype(np.float32),  # a numpy leaf
            "pair": Pair(torch.full((2, 3), float(i), dtype=torch.bfloat16), [torch.tensor(i), "label"]),
            "step": i,
        }


def _host(x: Any) -> np.ndarray:
    return x.cpu().float().numpy() if x.dtype == torch.bfloat16 else x.cpu().numpy()


def _in_device_memory(rt: srt.Runtime, t: torch.Tensor) -> bool:
    if t.is_cuda:
        return True
    return t.numel() == 0 or rt.backend.pointer_kind(t.data_ptr()).value == "device"


def test_batches_arrive_in_order_with_their_values(trt: srt.Runtime) -> None:
    """Every leaf (tensors, numpy arrays, inside dicts, named tuples and lists; varlen cu_seqlens) arrives
    on the device with the host's values and dtype, in the iterable's order; other leaves pass through."""
    got = list(st.Prefetcher(varlen_batches(12), trt, depth=3))
    want = list(varlen_batches(12))
    assert [b["step"] for b in got] == list(range(12))
    for g, w in zip(got, want):
        for key in ("tokens", "cu_seqlens"):
            assert g[key].dtype == w[key].dtype and _in_device_memory(trt, g[key])
            assert np.array_equal(_host(g[key]), w[key].numpy())
        assert g["weights"].dtype == torch.float32 and np.array_equal(_host(g["weights"]), w["weights"])
        assert isinstance(g["pair"], Pair) and g["pair"].second[1] == "label"
        assert g["pair"].first.dtype == torch.bfloat16
        assert np.array_equal(_host(g["pair"].first), _host(w["pair"].first))
        assert int(_host(g["pair"].second[0])) == g["step"]
        cu = _host(g["cu_seqlens"])
        assert cu[0] == 0 and cu[-1] == g["tokens"].numel()


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_back_pressure_with_a_slow_consumer(trt: srt.Runtime, depth: int) -> None:
    """Never more than ``depth`` batches taken from the iterable ahead of the consumer; order kept."""
    pulled = [0]

    def source() -> Iterator[torch.Tensor]:
        for i in range(10):
            pulled[0] += 1
            yield torch.full((1000,), i, dtype=torch.int32)

    pf = st.Prefetcher(source(), trt, depth=depth)
    delivered = 0
    ahead = []
    for batch in pf:
        delivered += 1
        ahead.append(pulled[0] - delivered)
        assert int(_host(batch)[0]) == delivered - 1
        time.sleep(0.01)  # a slow step
    assert delivered == 10
    assert max(ahead) == depth
    assert all(a <= depth for a in ahead)
    stats = pf.statistics()
    assert stats.max_in_flight == depth and stats.staged == stats.delivered == 10 and stats.in_flight == 0


def test_staging_slots_are_reused_and_given_back_at_close(trt: srt.Runtime, gate: Callable[[srt.Stream], Any]) -> None:
    """Each batch in flight holds a pinned staging slot; a slot is reused once its copy has landed, so eight
    batches need at most depth + 2 slots; close gives the blocks back to the pinned allocator."""
    alloc = trt.host_allocator
    before = alloc.statistics()
    copies = trt.create_stream()
    release = gate(copies)
    pf = st.Prefetcher((torch.full((1 << 18,), float(i)) for i in range(8)), trt, depth=2, stream=copies)
    assert pf.prefetch() == 2
    assert alloc.statistics().in_use_bytes >= before.in_use_bytes + 2 * (1 << 20)
    assert pf.statistics().staging_slots == 2
    release.set()
    copies.synchronize()
    assert [float(_host(b)[0]) for b in pf] == [float(i) for i in range(8)]
    assert 3 <= pf.statistics().staging_slots <= 4
    pf.close()
    copies.synchronize()
    assert wait_until(lambda: alloc.statistics().in_flight_bytes == before.in_flight_bytes)
    assert alloc.statistics().in_use_bytes == before.in_use_bytes


def test_staging_slots_stop_at_depth_plus_two_while_copies_are_held(trt: srt.Runtime, gate: Callable[[srt.Stream], Any]) -> None:
    """With every copy held back on the device, handing batches out makes new slots up to depth + 2; past
    that the oldest slot's block goes back to the allocator after its copy, and every batch keeps its values."""
    if context(trt).host_computes:
        pytest.skip("the simulator's hand-off waits on the host for the copy (torch computes on the host)")
    alloc = trt.host_allocator
    before = alloc.statistics()
    copies = trt.create_stream()
    release = gate(copies)
    pf = st.Prefetcher((torch.full((1 << 18,), float(i)) for i in range(10)), trt, depth=2, stream=copies)
    got = [next(pf) for _ in range(6)]
    assert pf.statistics().staging_slots == 4
    assert alloc.statistics().in_flight_bytes >= before.in_flight_bytes + 2 * (1 << 20)  # two dropped blocks
    release.set()
    got += list(pf)
    torch.cuda.synchronize()
    assert [float(_host(b)[0]) for b in got] == [float(i) for i in range(10)]
    pf.close()
    copies.synchronize()
    assert wait_until(lambda: alloc.statistics().in_use_bytes == before.in_use_bytes)


def test_a_loop_that_drops_its_batches_reuses_its_device_memory(trt: srt.Runtime) -> None:
    """Batches dropped by the next step give their slot's device memory back to the Prefetcher: twenty batches
    take at most depth + 2 device blocks, with every value right; reuse_memory=False takes one per batch."""
    got = []
    with st.Prefetcher((torch.full((1024,), float(i)) for i in range(20)), trt, depth=2) as pf:
        for batch in pf:
            got.append(float(_host(batch)[0]))
        assert got == [float(i) for i in range(20)]
        assert 1 <= pf.statistics().device_blocks <= 4
    with st.Prefetcher((torch.full((1024,), float(i)) for i in range(20)), trt, depth=2, reuse_memory=False) as pf:
        assert [float(_host(b)[0]) for b in pf] == [float(i) for i in range(20)]
        assert pf.statistics().device_blocks == 20


def test_a_batch_still_referenced_keeps_its_device_memory(trt: srt.Runtime) -> None:
    """The loop holding a batch, one of its leaves, a view derived from a leaf, or a tensor autograd saved
    for backward keeps that memory out of reuse: later batches never overwrite it."""
    batches = ({"x": torch.full((256,), float(i)), "n": torch.full((4,), i, dtype=torch.int32)} for i in range(14))
    pf = st.Prefetcher(batches, trt, depth=2)
    whole = next(pf)
    leaf = next(pf)["x"]
    derived = next(pf)["x"][10:20]
    x = next(pf)["x"]
    w = torch.ones(256, device=x.device, requires_grad=True)
    product = (x * w).sum()  # autograd saves x to compute w's gradient
    del x
    rest = [int(_host(b["n"])[0]) for b in pf]
    assert rest == list(range(4, 14))
    assert np.all(_host(whole["x"]) == 0.0) and np.all(_host(whole["n"]) == 0)
    assert np.all(_host(leaf) == 1.0) and np.all(_host(derived) == 2.0)
    product.backward()
    assert np.all(_host(w.grad) == 3.0)
    assert pf.statistics().device_blocks >= 6  # the four held batches' memory, and the loop's own
    pf.close()


@pytest.mark.parametrize("pack", ["python", pytest.param("native", marks=pytest.mark.skipif(not native_pack_available(), reason="the C pack was not built"))])
def test_a_batch_held_only_by_finished_streamrt_work_gives_its_memory_back(trt: srt.Runtime, pack: str) -> None:
    """A batch whose last reference is the keepalive of a launch that has finished on the device, but that
    nobody has retired yet (here the workspace prepare that read the batch's cu_seqlens; a lazy lane retires
    it later): the Prefetcher retires that work rather than allocate. It never waits for it (a lane
    thread busy retiring is left to it), so thirty batches take a few device blocks, not one each
    (29 without the retire, on the simulator)."""
    params = WorkspaceParams(
        batch=4, nhead=2, hdim_q=16, kM0=32, kN0=32, num_cus=4, deterministic=True, max_seqlen_q=64, max_seqlen_k=64, total_q_padded=256
    )
    s = st.current_stream(trt)
    ws = trt.device_allocator.allocate(workspace_size(params), stream=s)
    seq = trt.device_allocator.allocate(4 * (params.batch + 1), stream=s)
    s.memset(seq, 0)
    batches = ({"cu_seqlens": torch.arange(params.batch + 1, dtype=torch.int32) * (i % 7), "step": i} for i in range(30))
    with WorkspacePrepare(trt, params, seq, seq, ws, pack=pack) as prep, st.Prefetcher(batches, trt, depth=2) as pf:
        for batch in pf:
            given = st.tensor_buffer(trt, batch["cu_seqlens"])
            prep.launch(s, "fork", seqstart_q=given, seqstart_k=given, join=False, deferred=True)
            s.settle()
            trt.backend.device_synchronize()  # finished on the device: nothing here retires it
            time.sleep(0.001)  # a step's work
        assert pf.statistics().device_blocks <= 15  # depth + 2 when nothing races it; 9 once on hip (run 149)
    s.synchronize()
    ws.release()
    seq.release()


@pytest.mark.parametrize("own_consumer", [True, False], ids=["own-stream", "torch-stream"])
def test_reused_device_memory_waits_for_the_consumers_work(
    trt: srt.Runtime, gate: Callable[[srt.Stream], Any], own_consumer: bool
) -> None:
    """A dropped batch's memory is written again only after the work enqueued on the stream it was handed to
    (a stream of its own, or torch's current one: on a GPU the legacy default stream, handle 0): a read of
    batch 0 still held back on the consumer (by raw address: no reference kept) reads batch 0."""
    copies = trt.create_stream()
    consumer = trt.create_stream() if own_consumer else st.current_stream(trt)
    n = 1 << 16
    pf = st.Prefetcher(
        (torch.full((n,), float(i)) for i in range(4)), trt, depth=1, stream=copies, device_stream=consumer if own_consumer else None
    )
    out = trt.host_allocator.allocate(4 * n)
    release = gate(consumer)
    batch = next(pf)  # batch 0; batch 1 is staged
    address = batch.data_ptr()
    trt.backend.memcpy_async(out.ptr, address, 4 * n, srt.MemcpyKind.DEVICE_TO_HOST, consumer.handle)
    del batch
    held = next(pf)  # batch 1; batch 2 is staged into batch 0's slot, its copy behind the consumer's read
    time.sleep(0.05)
    assert not copies.is_idle
    release.set()
    consumer.synchronize()
    assert np.all(out.numpy(np.float32) == 0.0)
    assert float(_host(held)[0]) == 1.0
    again = next(pf)
    assert again.data_ptr() == address and float(_host(again)[0]) == 2.0
    pf.close()
    out.release()


def test_simulator_device_blocks_come_back(sim_rt: srt.Runtime) -> None:
    """On the simulator the batches' device blocks return to the device allocator once the batches are dropped."""
    alloc = sim_rt.device_allocator
    base = alloc.statistics().in_use_bytes
    with st.Prefetcher(varlen_batches(6), sim_rt, depth=2) as pf:
        kept = [next(pf) for _ in range(3)]
        assert alloc.statistics().in_use_bytes > base
    del kept
    gc.collect()
    sim_rt.releaser.drain()
    assert alloc.statistics().in_use_bytes == base


def test_hand_off_waits_for_the_copy(trt: srt.Runtime, gate: Callable[[srt.Stream], Any]) -> None:
    """The consumer's stream waits for the batch's copy. On a GPU the host does not wait (work on the
    consumer stream is held back instead); on the simulator, where torch computes on the host, the host
    waits (counted in host_waits)."""
    copies = trt.create_stream()
    consumer = trt.create_stream()
    release = gate(copies)
    pf = st.Prefetcher((torch.full((64,), 5.0) for _ in range(2)), trt, depth=1, stream=copies, device_stream=consumer)
    if trt.capabilities.is_simulated:
        timer = threading.Timer(0.2, release.set)
        timer.start()
        t0 = time.perf_counter()
        batch = next(pf)
        assert time.perf_counter() - t0 >= 0.15
        assert pf.statistics().host_waits == 1
        assert np.array_equal(batch.numpy(), np.full(64, 5.0, dtype=np.float32))
        timer.join()
    else:
        batch = next(pf)  # returns at once
        out = trt.host_allocator.allocate(256)
        consumer.copy(out, st.tensor_buffer(trt, batch))
        time.sleep(0.05)
        assert not consumer.is_idle
        release.set()
        consumer.synchronize()
        assert np.array_equal(out.numpy(np.float32), np.full(64, 5.0, dtype=np.float32))
        assert pf.statistics().host_waits == 0
    pf.close()


def test_iterable_errors_surface_after_the_staged_batches(trt: srt.Runtime) -> None:
    def source() -> Iterator[torch.Tensor]:
        yield torch.zeros(4)
        yield torch.ones(4)
        raise KeyError("bad sample")

    pf = st.Prefetcher(source(), trt, depth=4)
    assert float(_host(next(pf)).sum()) == 0.0
    assert float(_host(next(pf)).sum()) == 4.0
    with pytest.raises(KeyError, match="bad sample"):
        next(pf)
    with pytest.raises(StopIteration):
        next(pf)


def test_close_with_batches_in_flight(trt: srt.Runtime) -> None:
    pf = st.Prefetcher(varlen_batches(8), trt, depth=3)
    first = next(pf)
    assert pf.in_flight == 3
    pf.close()
    pf.close()
    with pytest.raises(StopIteration):
        next(pf)
    assert first["step"] == 0
    trt.synchronize()


def test_prefetcher_arguments(trt: srt.Runtime) -> None:
    with pytest.raises(ValueError, match="depth"):
        st.Prefetcher([], trt, depth=0)
    with srt.open_runtime("sim") as other, pytest.raises(ValueError, match="this runtime"):
        st.Prefetcher([], trt, stream=other.create_stream())
    assert list(st.Prefetcher([], trt)) == []


def _counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Count calls of ``Slots.<name>`` (``copy``: one copy and event per slot; ``hand_off``: one wait)."""
    from streamrt.torch._slots import Slots

    count = [0]
    original = getattr(Slots, name)

    def counted(self: Any, *args: Any) -> Any:
        count[0] += 1
        return original(self, *args)

    monkeypatch.setattr(Slots, name, counted)
    return count


def test_a_group_stages_its_batches_in_one_copy_and_hands_them_off_once(trt: srt.Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """group=4: every batch arrives in order with its values (varlen: a plan per group), with one copy and one
    hand-off per four batches; the last group is a partial one."""
    copies, hand_offs = _counting(monkeypatch, "copy"), _counting(monkeypatch, "hand_off")
    with st.Prefetcher(varlen_batches(10), trt, depth=2, group=4) as pf:
        got = list(pf)
        stats = pf.statistics()
    want = list(varlen_batches(10))
    assert [b["step"] for b in got] == list(range(10))
    for g, w in zip(got, want):
        assert np.array_equal(_host(g["tokens"]), w["tokens"].numpy()) and _in_device_memory(trt, g["tokens"])
        assert np.array_equal(_host(g["cu_seqlens"]), w["cu_seqlens"].numpy())
        assert np.array_equal(_host(g["weights"]), w["weights"])
        assert np.array_equal(_host(g["pair"].first), _host(w["pair"].first)) and g["pair"].second[1] == "label"
    assert copies[0] == 3 and hand_offs[0] == 3
    assert (stats.staged, stats.delivered, stats.in_flight) == (10, 10, 0)


def test_a_group_is_staged_once_fewer_than_depth_batches_are_left(trt: srt.Runtime) -> None:
    pulled = [0]

    def source() -> Iterator[torch.Tensor]:
        for i in range(12):
            pulled[0] += 1
            yield torch.full((100,), i, dtype=torch.int32)

    ahead = []
    with st.Prefetcher(source(), trt, depth=2, group=4) as pf:
        for delivered, batch in enumerate(pf, 1):
            ahead.append(pulled[0] - delivered)
            assert int(_host(batch)[0]) == delivered - 1
    assert ahead == [3, 2, 5, 4, 3, 2, 5, 4, 3, 2, 1, 0]  # depth - 1 + group at most


def test_dropped_groups_reuse_their_slots(trt: srt.Runtime) -> None:
    with st.Prefetcher((torch.full((1024,), float(i)) for i in range(40)), trt, depth=2, group=4) as pf:
        assert [float(_host(b)[0]) for b in pf] == [float(i) for i in range(40)]
        stats = pf.statistics()
    assert stats.staging_slots <= 4 and stats.device_blocks <= 4


def test_a_group_handed_to_two_streams_is_reused_after_both(trt: srt.Runtime, gate: Callable[[srt.Stream], Any]) -> None:
    """The slot's reuse waits for its last consumer's work, so a later batch of a group handed to another
    stream makes that stream wait for the earlier consumer's work first: a read of batch 0 held back on
    the first stream (by raw address: no reference kept) still reads batch 0 after the slot was reused."""
    first, second = trt.create_stream(), trt.create_stream()
    n = 1 << 14
    pf = st.Prefetcher((torch.full((n,), float(i)) for i in range(6)), trt, depth=1, group=2, device_stream=first)
    out = trt.host_allocator.allocate(4 * n)
    batch = next(pf)
    address = batch.data_ptr()
    release = gate(first)
    trt.backend.memcpy_async(out.ptr, address, 4 * n, srt.MemcpyKind.DEVICE_TO_HOST, first.handle)
    del batch
    pf._device_stream = second  # (the device_stream argument, changed between two batches of one group)
    # The reads below run on torch's current stream, which the hand-offs do not order: each waits for
    # the copy stream first (only the last group's copy waits for the gate).
    pf.stream.synchronize()
    assert float(_host(next(pf))[0]) == 1.0
    two = next(pf)
    pf.stream.synchronize()
    three = next(pf)  # stages the last group: it took batch 0's slot again
    assert [float(_host(b)[0]) for b in (two, three)] == [2.0, 3.0]
    release.set()
    first.synchronize()
    assert np.all(out.numpy(np.float32) == 0.0)
    pf.stream.synchronize()
    rest = list(pf)
    assert rest[0].data_ptr() == address  # batch 0's slot, reused
    assert [float(_host(b)[0]) for b in rest] == [4.0, 5.0]
    pf.close()
    out.release()


def test_an_iterable_error_surfaces_after_a_partial_group(trt: srt.Runtime) -> None:
    def source() -> Iterator[torch.Tensor]:
        for i in range(3):
            yield torch.full((4,), float(i))
        raise KeyError("bad sample")

    pf = st.Prefetcher(source(), trt, depth=1, group=2)
    assert [float(_host(next(pf))[0]) for _ in range(3)] == [0.0, 1.0, 2.0]
    with pytest.raises(KeyError, match="bad sample"):
        next(pf)
    with pytest.raises(StopIteration):
        next(pf)
    with pytest.raises(ValueError, match="group"):
        st.Prefetcher([], trt, group=0)
