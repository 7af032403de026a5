"""Gradient all-reduce on a communication stream, overlapped with a streamrt pipeline on the compute stream.

Each rank (one process per GPU, ``torch.multiprocessing.spawn``; NCCL on CUDA,
RCCL on ROCm) runs a few training-like steps. Per step and per gradient
bucket, the compute stream "runs backward" (torch work that writes the
bucket) and records an event; the communication stream waits for that event
and all-reduces the bucket (``torch.distributed.all_reduce``) while the
compute stream goes on with the next bucket's backward and the seed's
workspace prepare pipeline (:mod:`streamrt.recipes.fmha_bwd`, fork policy).
Nothing in the loop blocks the host.

The overlap is reported through streamrt's study tools: each rank traces its
steps with ``rt.trace()``; ``t.report()`` gives the per-stream table, bubbles
and the copy/compute overlap, and the trace records give how much of the
all-reduce time ran while the compute side was busy. On a GPU the torch work
(backward, all-reduce) appears in the trace as spans (``streamrt.torch.trace_torch``).

``--sim`` runs the streamrt side on an N-device simulator in one process,
without torch: one runtime per simulated device, and the all-reduce as the
traffic of a ring all-reduce (reduce-scatter then all-gather, one chunk per
step, peer copies between devices ordered by cross-device events). The
simulator moves the bytes but does not add them: each hop overwrites, so
after the collective every device holds chunk ``c`` of rank ``c`` — which is
what the demo checks. The times are the simulator's virtual clock.

    python demos/multi_gpu_allreduce.py                 # every GPU of the machine (needs 2 or more)
    python demos/multi_gpu_allreduce.py --sim           # 2 simulated devices, no torch needed
    python demos/multi_gpu_allreduce.py --sim --devices 4 --steps 3

NVLink multicast (NVLS, symmetric-memory multicast) stays off: the two
variables below are set before torch is imported, and nothing here creates
multicast objects. With fewer than two GPUs (or without torch) the GPU mode
prints why and exits with status 0.
"""

from __future__ import annotations

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"  # before torch (and NCCL) are imported: no NVLink SHARP / multicast
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

import argparse
import contextlib
import socket
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import streamrt as srt
from streamrt.recipes.fmha_bwd import WorkspaceParams, WorkspacePrepare, workspace_size

WORK_CATEGORIES = frozenset({"copy", "memset", "kernel", "graph", "other"})

PARAMS = WorkspaceParams(
    batch=8,
    nhead=8,
    hdim_q=64,
    kM0=64,
    kN0=64,
    num_cus=64,
    deterministic=True,
    max_seqlen_q=512,
    max_seqlen_k=512,
    total_q_padded=4096,
)
SEQLENS = np.array([512, 17, 256, 0, 333, 128, 64, 511], np.int32)


# -- overlap from a trace -----------------------------------------------------------------------------------


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def _intersection(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


@dataclass(frozen=True)
class Overlap:
    """How much of the communication stream's busy time ran while the compute side was busy too."""

    comm_us: float
    compute_us: float
    both_us: float

    @property
    def hidden(self) -> float:
        return self.both_us / self.comm_us if self.comm_us else 0.0

    def line(self, who: str) -> str:
        return (
            f"{who}: all-reduce busy {self.comm_us:.1f} us, compute side busy {self.compute_us:.1f} us, "
            f"both at once {self.both_us:.1f} us -> {self.hidden:.0%} of the all-reduce hidden behind compute"
        )


def comm_overlap(trace: Any, comm: str, compute: Iterable[str]) -> Overlap:
    """Overlap of the work on stream ``comm`` with the work on the ``compute`` streams (trace stream labels)."""
    mine = set(compute)
    spans: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for r in trace.records:
        if not r.on_device or r.category not in WORK_CATEGORIES:
            continue
        if r.stream == comm:
            spans[True].append((r.device_start_us, r.device_end_us))
        elif r.stream in mine:
            spans[False].append((r.device_start_us, r.device_end_us))
    c, w = _union(spans[True]), _union(spans[False])
    return Overlap(round(_length(c), 3), round(_length(w), 3), round(_intersection(c, w), 3))


# -- the simulator: N devices in one process ----------------------------------------------------------------


def _seqstart() -> np.ndarray:
    return np.concatenate([[0], np.cumsum(SEQLENS)]).astype(np.int32)


def _upload(rt: srt.Runtime, s: srt.Stream, data: np.ndarray, dst: srt.Buffer) -> None:
    stage = rt.host_allocator.allocate(data.nbytes)
    stage.numpy()[:] = np.ascontiguousarray(data).view(np.uint8).ravel()
    s.copy(dst, stage)
    s.synchronize()
    stage.release()


class SimRank:
    """One simulated device: its runtime, compute and communication streams, gradient buckets, prepare."""

    def __init__(self, rt: srt.Runtime, rank: int, buckets: int, bucket_bytes: int, activation_bytes: int) -> None:
        self.rt = rt
        self.rank = rank
        self.compute = rt.create_stream(name=f"rank{rank}-compute")
        self.comm = rt.create_stream(name=f"rank{rank}-comm")
        self.grads = [rt.device_allocator.allocate(bucket_bytes, stream=self.compute) for _ in range(buckets)]
        self.activations = rt.device_allocator.allocate(activation_bytes, stream=self.compute)
        n = 4 * (PARAMS.batch + 1)
        self.seq_q = rt.device_allocator.allocate(n, stream=self.compute)
        self.seq_k = rt.device_allocator.allocate(n, stream=self.compute)
        _upload(rt, self.compute, _seqstart(), self.seq_q)
        _upload(rt, self.compute, _seqstart(), self.seq_k)
        self.workspace = rt.device_allocator.allocate(workspace_size(PARAMS), stream=self.compute)
        self.prepare = WorkspacePrepare(rt, PARAMS, self.seq_q, self.seq_k, self.workspace)

    def backward(self, bucket: int) -> srt.Event:
        """The compute stream "runs backward" for ``bucket`` (memsets stand for kernels) and marks it ready."""
        for _ in range(4):  # four "layers", each writing the activations once
            self.compute.memset(self.activations, self.rank + 1)
        self.compute.memset(self.grads[bucket], self.rank + 1)
        return self.compute.record()

    def close(self) -> None:
        self.prepare.close()
        for b in (*self.grads, self.activations, self.seq_q, self.seq_k, self.workspace):
            b.release()


class Board:
    """Where the ranks' host threads exchange the events of one collective step (as NCCL ranks exchange
    their progress through device memory): post, then read the neighbours' after a barrier."""

    def __init__(self, n: int) -> None:
        self.events: list[srt.Event | None] = [None] * n
        self.barrier = threading.Barrier(n, timeout=60)

    def exchange(self, rank: int, event: srt.Event) -> None:
        """Publish ``event`` as ``rank``'s latest step once every rank has read the previous ones."""
        self.barrier.wait()
        self.events[rank] = event
        self.barrier.wait()

    def of(self, rank: int) -> srt.Event:
        event = self.events[rank]
        assert event is not None
        return event


def ring_all_reduce(r: SimRank, n: int, ranks: list[SimRank], bucket: int, ready: srt.Event, board: Board) -> None:
    """Rank ``r``'s part of the traffic of a ring all-reduce of ``bucket`` (see the module docstring).

    Step k of each phase: rank r pushes one chunk into rank r+1's bucket with a peer copy on its own
    communication stream, after the previous step of rank r-1 (which delivered that chunk) and of rank
    r+1 (which read the chunk being overwritten); the events travel through ``board``. Runs on rank r's
    host thread; every rank calls it for the same bucket.
    """
    size = r.grads[bucket].nbytes
    chunk = size // n
    left, right = (r.rank - 1) % n, (r.rank + 1) % n
    r.comm.wait(ready)
    mine = r.comm.record()
    board.exchange(r.rank, mine)
    schedule = [(r.rank - k) % n for k in range(n - 1)]  # reduce-scatter: the chunk rank r sends at step k
    schedule += [(r.rank + 1 - k) % n for k in range(n - 1)]  # all-gather
    for c in schedule:
        r.comm.wait(board.of(left))
        r.comm.wait(board.of(right))
        length = chunk if c < n - 1 else size - c * chunk
        r.comm.copy(ranks[right].grads[bucket].view(c * chunk, length), r.grads[bucket].view(c * chunk, length))
        previous, mine = mine, r.comm.record()
        board.exchange(r.rank, mine)
        previous.close()  # every wait on it is enqueued (waits bind at enqueue)
    r.comm.wait(board.of(left))  # rank r-1's last copy wrote into this bucket: later work waits for it
    board.exchange(r.rank, mine)
    mine.close()


def rank_loop(r: SimRank, ranks: list[SimRank], steps: int, buckets: int, board: Board) -> None:
    """What one rank's host thread enqueues: never waits for its device."""
    n = len(ranks)
    for _ in range(steps):
        # Backward of bucket b+1 is enqueued before the all-reduce of bucket b (as gradient hooks fire
        # during backward), so the collective runs under the next bucket's compute.
        ready = r.backward(0)
        for b in range(buckets):
            following = r.backward(b + 1) if b + 1 < buckets else None
            ring_all_reduce(r, n, ranks, b, ready, board)
            ready.close()
            if following is not None:
                ready = following
        r.prepare.launch(r.compute, "fork")  # the seed's prepare pipeline on the compute stream
        r.compute.wait_stream(r.comm)  # the next step writes the buckets again


def run_sim(
    devices: int,
    steps: int,
    buckets: int,
    bucket_mib: int,
    activation_mib: int = 64,
    check_hazards: bool = False,
    out: Any = None,
) -> int:
    """The simulated version: one host thread per simulated device (as one process per GPU).

    Returns the exit status (0: the collective's bytes are right and, with ``check_hazards``, no races).
    """
    out = out or sys.stdout
    bucket_bytes = bucket_mib << 20
    rts = [srt.open_runtime("sim", device=d, devices=devices, check_hazards=check_hazards) for d in range(devices)]
    ranks = [SimRank(rt, d, buckets, bucket_bytes, activation_mib << 20) for d, rt in enumerate(rts)]
    try:
        with contextlib.ExitStack() as tracing:
            traces = [tracing.enter_context(rt.trace(name=f"rank{rt.device}")) for rt in rts]
            board = Board(devices)
            errors: list[BaseException] = []

            def run(r: SimRank) -> None:
                try:
                    rank_loop(r, ranks, steps, buckets, board)
                except BaseException as exc:  # noqa: BLE001 - reported below; the others must not wait forever
                    errors.append(exc)
                    board.barrier.abort()

            threads = [threading.Thread(target=run, args=(r,), name=f"rank{r.rank}") for r in ranks]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for rt in rts:
                rt.synchronize()
            if errors:
                raise errors[0]
        print(
            f"multi_gpu_allreduce --sim: {devices} simulated devices (one host thread each), {steps} steps x "
            f"{buckets} buckets of {bucket_mib} MiB, {activation_mib} MiB of activations per layer",
            file=out,
        )
        print(traces[0].report(), file=out)
        legend = ", ".join(f"{s.name} = stream {s.handle:#x}" for r in ranks[1:] for s in (r.compute, r.comm))
        print(f"(one simulated machine: rank 0's trace shows every device; other ranks' streams by handle: {legend})", file=out)
        print(file=out)
        for r, t in zip(ranks, traces):
            compute = {s.name for s in r.rt._streams if s is not r.comm}
            print(comm_overlap(t, r.comm.name, compute).line(f"rank {r.rank}"), file=out)
        chunk = bucket_bytes // devices
        expected = np.concatenate(
            [np.full(chunk if c < devices - 1 else bucket_bytes - c * chunk, c + 1, np.uint8) for c in range(devices)]
        )
        ok = True
        for r in ranks:
            stage = r.rt.host_allocator.allocate(bucket_bytes)
            for g in r.grads:
                r.compute.copy(stage, g)
                r.compute.synchronize()
                ok &= bool(np.array_equal(stage.numpy(), expected))
            stage.release()
        hazards = rts[0].backend.hazards()
        if check_hazards:
            print(f"hazards found by the simulator: {len(hazards)}", file=out)
        print("all-reduce traffic check: " + ("every device holds chunk c of rank c" if ok else "WRONG BYTES"), file=out)
        return 0 if ok and not hazards else 1
    finally:
        for r in ranks:
            r.close()
        for rt in reversed(rts):
            rt.close()


# -- GPUs: one process per GPU -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gpu_worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    """One rank: NCCL/RCCL process group, a streamrt runtime on this GPU, traced steps, a check."""
    import torch
    import torch.distributed as dist

    import streamrt.torch as st

    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, device_id=device)
    rt = srt.open_runtime(args.backend, device=rank)
    try:
        compute_t, comm_t = torch.cuda.Stream(device), torch.cuda.Stream(device)
        compute = rt.wrap_stream(compute_t, name=f"rank{rank}-compute")
        comm = rt.wrap_stream(comm_t, name=f"rank{rank}-comm")
        numel = (args.bucket_mib << 20) // 4
        grads = [torch.zeros(numel, dtype=torch.float32, device=device) for _ in range(args.buckets)]
        x = torch.randn(args.matmul, args.matmul, device=device, dtype=torch.bfloat16)
        w = torch.randn(args.matmul, args.matmul, device=device, dtype=torch.bfloat16)
        n = 4 * (PARAMS.batch + 1)
        seq = torch.from_numpy(_seqstart()).to(device)
        seq_k = seq.clone()
        workspace = torch.empty(workspace_size(PARAMS), dtype=torch.uint8, device=device)
        prepare = WorkspacePrepare(rt, PARAMS, rt.as_buffer(seq, n), rt.as_buffer(seq_k, n), rt.as_buffer(workspace))
        torch.cuda.synchronize(device)

        def backward(b: int) -> None:
            with torch.cuda.stream(compute_t):
                for _ in range(args.layers):
                    torch.mm(x, w)
                grads[b].fill_(float(rank + 1))

        def all_reduce(b: int) -> None:
            with torch.cuda.stream(comm_t):
                work = dist.all_reduce(grads[b], async_op=True)
                work.wait()  # the communication stream (not the host) waits for NCCL

        def step() -> None:
            # Backward of bucket b+1 is enqueued before the all-reduce of bucket b (as gradient hooks
            # fire during backward), so the collective runs under the next bucket's compute.
            st.trace_torch(rt, "backward[0]", backward, 0, stream=compute)
            ready = compute.record()
            for b in range(args.buckets):
                following = None
                if b + 1 < args.buckets:
                    st.trace_torch(rt, f"backward[{b + 1}]", backward, b + 1, stream=compute)
                    following = compute.record()
                comm.wait(ready)
                st.trace_torch(rt, f"all_reduce[{b}]", all_reduce, b, stream=comm)
                ready = following
            st.trace_torch(rt, "prepare", lambda: prepare.launch(compute, "fork"), stream=compute)
            compute.wait_stream(comm)  # the next step writes the buckets again

        step()  # warm-up: NCCL communicators, cuBLAS handles, streamrt pools
        torch.cuda.synchronize(device)
        dist.barrier()
        with rt.trace(name=f"rank{rank}") as t:
            for _ in range(args.steps):
                step()
            rt.synchronize()
            torch.cuda.synchronize(device)
        expected = float(world * (world + 1) // 2)
        ok = all(bool((g == expected).all().item()) for g in grads)
        lines = [
            f"rank {rank} ({torch.cuda.get_device_name(device)}):",
            str(t.report()),
            comm_overlap(t, comm.name, [compute.name]).line(f"rank {rank}"),
            f"rank {rank} all-reduce check: {'ok' if ok else 'WRONG SUM'}",
        ]
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, "\n".join(lines))
        if rank == 0:
            print("\n\n".join(str(g) for g in gathered), flush=True)
        prepare.close()
        if not ok:
            raise SystemExit(1)
    finally:
        rt.close()
        dist.destroy_process_group()


def run_gpus(args: argparse.Namespace) -> int:
    try:
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp
    except ImportError:
        print("multi_gpu_allreduce: torch is not installed; the GPU mode needs torch with CUDA or ROCm "
              "(try --sim for the simulated version)")
        return 0
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2:
        print(f"multi_gpu_allreduce: needs at least 2 GPUs for torch.distributed, found {count}; nothing to run "
              "(try --sim for the simulated version)")
        return 0
    if not dist.is_nccl_available():
        print("multi_gpu_allreduce: this torch build has no NCCL/RCCL backend; nothing to run (try --sim)")
        return 0
    world = min(count, args.gpus) if args.gpus else count
    print(f"multi_gpu_allreduce: {world} GPUs, {'RCCL' if torch.version.hip else 'NCCL'}, "
          f"NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}, "
          f"TORCH_SYMM_MEM_DISABLE_MULTICAST={os.environ['TORCH_SYMM_MEM_DISABLE_MULTICAST']}", flush=True)
    mp.spawn(gpu_worker, args=(world, _free_port(), args), nprocs=world, join=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--sim", action="store_true", help="run the streamrt side on a simulator, without torch")
    parser.add_argument("--devices", type=int, default=2, help="simulated devices (--sim)")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs to use (default: all)")
    parser.add_argument("--backend", default="auto", help="streamrt backend on the GPUs: auto, cuda or hip")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--bucket-mib", type=int, default=16)
    parser.add_argument("--layers", type=int, default=4, help="matmuls per bucket of backward (GPU mode)")
    parser.add_argument("--matmul", type=int, default=4096, help="matmul size (GPU mode)")
    parser.add_argument("--activation-mib", type=int, default=64, help="--sim: bytes each backward layer writes")
    parser.add_argument("--check-hazards", action="store_true", help="--sim: let the simulator check for races")
    args = parser.parse_args(argv)
    if args.sim:
        if args.devices < 2:
            parser.error("--devices must be at least 2")
        return run_sim(args.devices, args.steps, args.buckets, args.bucket_mib, args.activation_mib, args.check_hazards)
    return run_gpus(args)


if __name__ == "__main__":
    sys.exit(main())
