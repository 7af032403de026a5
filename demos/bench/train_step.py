"""Training-step microbenchmark (issue 5): what one workspace prepare per step costs the step.

Each step enqueues one FMHA-backward workspace prepare and then 8 bf16 4096²
matmuls (torch, on the same stream: streamrt wraps torch's stream). Variants:

    none        no prepare (the reference step)
    sync        the old path: two blocking D2H copies (each drains the stream), pack, H2D
    stream      streamrt, the whole pipeline on the step's stream (host pack in stream order)
    fork        streamrt "fork": the D2H -> pack -> H2D chain on a pooled side stream joined
                by an event; seqstart is static here, so the side stream does not wait for
                the step's stream (wait_for=None) and runs ahead
    fork_gated  "fork" with the default wait_for="stream": the chain starts only when the
                step's stream reaches the prepare, and the join right after it waits for it
    graph       the pipeline captured once, replayed on the step's stream
    fork_graph  that graph replayed on "fork"'s side stream (wait_for=None, as fork): one
                driver call per prepare, off the step's stream
    stream_native, fork_native, graph_native, fork_graph_native
                the same with the C host pack (``pack="native"``: one native host function
                on the driver's thread instead of a Python one on a runtime worker); present
                when the C pack was built
    raw_stream_native, raw_graph_native
                the floors of the two above: the same backend calls made directly (memset,
                two D2H, the C pack as a host function, H2D), or the backend's launch of
                the captured graph, with no Run, keepalive or ordering of relaunches

Measured so that machine drift cancels: the variants are interleaved within each
round (the order rotates), ``--rounds`` rounds of ``--steps`` steps, medians
over rounds. Per variant:

* added GPU time per step: the step stream's elapsed time between two events
  around the steps, divided by the steps, minus the same for ``none`` in the
  same round;
* host time blocked per step: wall time of the prepare call (for the async
  variants this is the enqueue cost: the host never waits);
* enqueue cost: median per-call wall time of the prepare call.

On the simulator (``--backend sim``, or no torch/GPU) the matmuls are
skipped and times are the simulator's virtual clock: a functional run only.

    python demos/bench/train_step.py --backend cuda --out train_step_cuda.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import streamrt as srt
from streamrt._backends.protocol import MemcpyKind
from streamrt._stream import native_function_address
from streamrt.recipes.fmha_bwd import (
    NativePack,
    WorkspaceParams,
    WorkspacePrepare,
    native_pack_available,
    reference_metadata,
    reference_result,
    workspace_size,
)

VARIANTS = ("none", "sync", "stream", "fork", "fork_gated", "graph", "fork_graph")
NATIVE_VARIANTS = ("stream_native", "fork_native", "graph_native", "fork_graph_native", "raw_stream_native", "raw_graph_native")


def add_step_arguments(ap: argparse.ArgumentParser) -> None:
    """The training-step harness's options (backend, interleaved rounds, the matmul step) and the workload's."""
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--matmuls", type=int, default=8)
    ap.add_argument("--size", type=int, default=4096)
    add_workload_arguments(ap)


def add_workload_arguments(ap: argparse.ArgumentParser) -> None:
    """The seed workload's options, shared by the benchmarks that prepare it (see :func:`seed_workload`)."""
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--nhead", type=int, default=8)
    ap.add_argument("--hdim", type=int, default=64)
    ap.add_argument("--seqlen", type=int, default=256, help="longest sequence; lengths are drawn from [seqlen/2, seqlen]")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--seed", type=int, default=0)


def seed_workload(args: argparse.Namespace, num_cus: int = 132) -> tuple[WorkspaceParams, np.ndarray, np.ndarray]:
    """The workspace parameters and the seqstart_q/k arrays (int32, ``batch + 1``) of one seeded draw.

    Lengths are drawn from [seqlen/2, seqlen]; ``total_q_padded`` equals the
    used size, so every strategy zeroes the same bytes.
    """
    rng = np.random.default_rng(args.seed)
    sq = rng.integers(args.seqlen // 2, args.seqlen + 1, args.batch)
    sk = rng.integers(args.seqlen // 2, args.seqlen + 1, args.batch)
    seq_q = np.concatenate([[0], np.cumsum(sq)]).astype(np.int32)
    seq_k = np.concatenate([[0], np.cumsum(sk)]).astype(np.int32)
    params = WorkspaceParams(
        batch=args.batch,
        nhead=args.nhead,
        hdim_q=args.hdim,
        kM0=64,
        kN0=128,
        num_cus=num_cus,
        deterministic=args.deterministic,
        max_seqlen_q=int(sq.max()),
        max_seqlen_k=int(sk.max()),
        total_q_padded=int(seq_q[-1]),
    )
    return params, seq_q, seq_k


def _torch_work(rt: srt.Runtime, size: int, count: int) -> tuple[srt.Stream, Callable[[], None] | None, str]:
    """The step stream and the matmul work (``None`` on the simulator or without torch)."""
    if rt.capabilities.is_simulated:
        return rt.create_stream(), None, "simulator: matmuls skipped, virtual time"
    try:
        import torch
    except ImportError:
        return rt.create_stream(), None, "torch not installed: matmuls skipped"
    if not torch.cuda.is_available():
        return rt.create_stream(), None, "torch sees no GPU: matmuls skipped"
    tstream = torch.cuda.Stream()
    stream = rt.wrap_stream(tstream, name="train-step")
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(size, size, device="cuda", dtype=torch.bfloat16)

    def matmuls() -> None:
        with torch.cuda.stream(tstream):
            for _ in range(count):
                torch.matmul(a, b, out=c)

    return stream, matmuls, f"torch {torch.__version__}: {count} bf16 {size}x{size} matmuls per step"


def _raw_native(
    rt: srt.Runtime, s: srt.Stream, params: WorkspaceParams, q: srt.Buffer, k: srt.Buffer, ws: srt.Buffer, graph: Any
) -> dict[str, Callable[[], None]]:
    """The raw floors of ``stream_native`` and of replaying ``graph`` (pre-converted handles), and ``close``."""
    b, h = rt.backend, s._handle
    region, seq = params.metadata_region_bytes, q.nbytes
    slot = -(-seq // 64) * 64
    staging = rt.host_allocator.allocate(2 * slot + region)
    stage_q, stage_k, meta = staging.ptr, staging.ptr + slot, staging.ptr + 2 * slot
    pack = NativePack(params, stage_q, stage_k, meta)
    fn, user_data = native_function_address(pack.function), ctypes.addressof(pack.args)
    assert fn is not None
    exec_handle = graph._state.exec
    d2h, h2d = MemcpyKind.DEVICE_TO_HOST, MemcpyKind.HOST_TO_DEVICE

    def raw_stream(_keep: NativePack = pack) -> None:  # the argument block must outlive the host functions
        b.memset_async(ws.ptr + region, 0, params.dq_acc_bound_bytes, h)
        b.memcpy_async(stage_q, q.ptr, seq, d2h, h)
        b.memcpy_async(stage_k, k.ptr, seq, d2h, h)
        b.launch_host_func(h, fn, user_data)
        b.memcpy_async(ws.ptr, meta, region, h2d, h)

    def close() -> None:
        s.synchronize()
        staging.release()

    return {"raw_stream_native": raw_stream, "raw_graph_native": lambda: b.graph_launch(exec_handle, h), "close": close}


def run(args: argparse.Namespace) -> dict[str, Any]:
    params, seq_q, seq_k = seed_workload(args)
    with srt.open_runtime(args.backend) as rt:
        s, matmuls, work_note = _torch_work(rt, args.size, args.matmuls)
        q = rt.device_allocator.allocate(seq_q.nbytes, stream=s)
        k = rt.device_allocator.allocate(seq_k.nbytes, stream=s)
        stage = rt.host_allocator.allocate(seq_q.nbytes + seq_k.nbytes)
        stage.numpy(np.int32)[:] = np.concatenate([seq_q, seq_k])
        s.copy(q, stage.view(0, seq_q.nbytes))
        s.copy(k, stage.view(seq_q.nbytes))
        ws = rt.device_allocator.allocate(workspace_size(params), stream=s)
        s.synchronize()
        stage.release()
        variants = VARIANTS + (NATIVE_VARIANTS if native_pack_available() else ())
        preps = {"python": WorkspacePrepare(rt, params, q, k, ws)}
        if native_pack_available():
            preps["native"] = WorkspacePrepare(rt, params, q, k, ws, pack="native")
        for p in preps.values():
            p.capture(s)
        runs: list[srt.Completion] = []
        raw = _raw_native(rt, s, params, q, k, ws, preps["native"].graph) if "native" in preps else {}

        def prepare(variant: str) -> None:
            if variant in raw:
                raw[variant]()
                return
            base = variant.removesuffix("_native")
            prep = preps["python" if base == variant else "native"]
            if base == "sync":
                prep.run_sync(s)
            elif base == "stream":
                runs.append(prep.launch(s, "stream"))
            elif base == "fork":
                runs.append(prep.launch(s, "fork", wait_for=None))
            elif base == "fork_gated":
                runs.append(prep.launch(s, "fork"))
            elif base == "graph":
                runs.append(prep.replay(s))
            elif base == "fork_graph":
                runs.append(prep.launch(s, "fork_graph", wait_for=None))

        t0, t1 = rt.create_event(timing=True), rt.create_event(timing=True)
        rows: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
        for r in range(args.rounds):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for variant in order:
                for _ in range(args.warmup):
                    prepare(variant)
                    if matmuls is not None:
                        matmuls()
                s.synchronize()
                host: list[float] = []
                s.record(t0)
                for _ in range(args.steps):
                    h0 = time.perf_counter()
                    prepare(variant)
                    host.append(time.perf_counter() - h0)
                    if matmuls is not None:
                        matmuls()
                s.record(t1)
                s.synchronize()
                rows[variant].append(
                    {
                        "gpu_us_per_step": t0.elapsed_ms(t1) * 1000 / args.steps,
                        "host_us_per_step": statistics.median(host) * 1e6 if variant != "none" else 0.0,
                    }
                )
            for c in runs:
                c.result(30)
            runs.clear()
        check = rt.host_allocator.allocate(params.metadata_region_bytes)
        s.copy(check, ws.view(0, params.metadata_region_bytes))
        s.synchronize()
        ok = np.array_equal(check.numpy(), reference_metadata(params, seq_q, seq_k))
        used = reference_result(params, seq_q, seq_k).dq_acc_used_bytes
        check.release()
        for p in preps.values():
            p.close()
        if raw:
            raw["close"]()
        device = f"{rt.backend_name}: {rt.capabilities.device_name}"

    base = [row["gpu_us_per_step"] for row in rows["none"]]
    summary: dict[str, dict[str, float]] = {}
    for v in rows:
        added = [row["gpu_us_per_step"] - b for row, b in zip(rows[v], base)]
        summary[v] = {
            "gpu_us_per_step": statistics.median(row["gpu_us_per_step"] for row in rows[v]),
            "added_gpu_us_per_step": statistics.median(added),
            "added_min_us": min(added),
            "added_max_us": max(added),
            "host_blocked_us_per_step": statistics.median(row["host_us_per_step"] for row in rows[v]),
        }
    sync_added = summary["sync"]["added_gpu_us_per_step"]
    return {
        "device": device,
        "work": work_note,
        "params": {f: getattr(params, f) for f in params.__dataclass_fields__},
        "dq_acc_used_bytes": used,
        "metadata_matches_reference": ok,
        "rounds": args.rounds,
        "steps": args.steps,
        "summary": summary,
        "fork_over_sync_ratio": (summary["fork"]["added_gpu_us_per_step"] / sync_added) if sync_added > 0 else None,
        "enqueue_us": {
            "eager_stream": summary["stream"]["host_blocked_us_per_step"],
            "eager_fork": summary["fork"]["host_blocked_us_per_step"],
            "graph_launch": summary["graph"]["host_blocked_us_per_step"],
            **{v: summary[v]["host_blocked_us_per_step"] for v in NATIVE_VARIANTS if v in summary},
        },
        "rows": rows,
    }


def _print(result: dict[str, Any]) -> None:
    print(f"{result['device']} — {result['work']}")
    print(f"{result['rounds']} interleaved rounds x {result['steps']} steps, medians over rounds")
    print(f"{'variant':<18}{'GPU us/step':>13}{'added us':>11}{'(min..max)':>18}{'host blocked us':>17}")
    for v, row in result["summary"].items():
        spread = f"{row['added_min_us']:.0f}..{row['added_max_us']:.0f}"
        print(
            f"{v:<18}{row['gpu_us_per_step']:>13.1f}{row['added_gpu_us_per_step']:>11.1f}{spread:>18}"
            f"{row['host_blocked_us_per_step']:>17.1f}"
        )
    ratio = result["fork_over_sync_ratio"]
    print(f"fork added / sync added: {ratio:.3f}" if ratio is not None else "fork added / sync added: n/a")
    e = result["enqueue_us"]
    print(f"enqueue: eager stream {e['eager_stream']:.1f} us, eager fork {e['eager_fork']:.1f} us, graph launch {e['graph_launch']:.1f} us")
    native = [f"{v} {e[v]:.1f} us" for v in NATIVE_VARIANTS if v in e]
    if native:
        print("enqueue, native pack:", ", ".join(native))
    print("metadata matches the reference:", "yes" if result["metadata_matches_reference"] else "NO")


def report(result: dict[str, Any], out: str | None, print_result: Callable[[dict[str, Any]], None]) -> int:
    """Print ``result``, write it as JSON to ``out`` (if given); the exit status: 1 if the metadata was wrong."""
    print_result(result)
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if result["metadata_matches_reference"] else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(ap)
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    return report(run(args), args.out, _print)


if __name__ == "__main__":
    sys.exit(main())
