"""Device-side workspace prepare (issues 6 and 24): CK's device-side prepare beside the host-pack strategies.

Three measurements, in one run:

1. Training-step microbenchmark (the harness of ``train_step.py``): each step
   enqueues one prepare, then 8 bf16 4096² matmuls (torch) on the same stream. Variants,
   interleaved within each round (the order rotates), medians over rounds of the added GPU
   time per step against ``none``:

       none            no prepare
       host_stream     host pack, the pipeline on the step's stream (D2H -> host fn -> H2D, and
                       the memset of the dq_acc bound, or the prezero kernel when deterministic)
       host_fork       host pack on a side stream joined by an event (wait_for=None)
       host_graph      host pack, captured and replayed
       device          the metadata kernel and the memset (the prezero kernel when deterministic),
                       bare on the step's stream (DevicePrepare.enqueue)
       device_run      the same as a launched pipeline (a Run with its tail event)
       device_graph    the same, captured and replayed
       torch_standin   a few torch ops computing the same sizes (diff, cumsum, fill, zero)

2. End-to-end prepare latency on an idle GPU: host wall time from the call to the end of
   ``stream.synchronize()``, per variant (interleaved; median and p90).

3. Sleep kernel accuracy for 10 .. 10,000 µs: the kernel's own clock (``out[0]``), the
   timing-event interval around it, and that interval minus an empty launch's interval. A
   ``--sleep-hold-us`` sleep is enqueued first each time, so the stream is still busy when the
   first event, the kernel and the second event are enqueued: the events then bracket the GPU's
   work alone, not the host's time to launch the kernel.

On the simulator (or without torch and a GPU) the matmuls and the torch stand-in are skipped
and times are virtual: a functional run only.

    python demos/bench/device_prepare.py --backend cuda --out device_prepare_cuda.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from train_step import (  # the training-step harness (same work, same stream)
    _torch_work,
    add_step_arguments,
    report,
    seed_workload,
)

import streamrt as srt
from streamrt.recipes.fmha_bwd import (
    DevicePrepare,
    WorkspaceParams,
    WorkspacePrepare,
    reference_metadata,
    reference_result,
    workspace_size,
)

STEP_VARIANTS = ("none", "host_stream", "host_fork", "host_graph", "device", "device_run", "device_graph", "torch_standin")
LATENCY_VARIANTS = ("sync", "host_stream", "host_fork", "host_graph", "device", "device_graph")
SLEEP_US = (10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


def _torch_gpu() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


class Setup:
    """seqstart and workspace on the device, both prepares built, the torch stand-in (GPU only)."""

    def __init__(self, rt: srt.Runtime, s: srt.Stream, params: WorkspaceParams, seq_q: np.ndarray, seq_k: np.ndarray) -> None:
        self.rt, self.s, self.params = rt, s, params
        self.seq_q, self.seq_k = seq_q, seq_k
        torch = _torch_gpu() if not rt.capabilities.is_simulated else None
        self.torch = torch
        nbytes = workspace_size(params)
        if torch is not None:
            self.tq = torch.as_tensor(seq_q, device="cuda")
            self.tk = torch.as_tensor(seq_k, device="cuda")
            self.tws = torch.empty(nbytes + 16, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            q, k = rt.as_buffer(self.tq), rt.as_buffer(self.tk)
            ws = rt.as_buffer(self.tws)
            ws = ws.view((-ws.ptr) % 16, nbytes)
        else:
            q = rt.device_allocator.allocate(seq_q.nbytes, stream=s)
            k = rt.device_allocator.allocate(seq_k.nbytes, stream=s)
            ws = rt.device_allocator.allocate(nbytes, stream=s)
            stage = rt.host_allocator.allocate(seq_q.nbytes + seq_k.nbytes)
            stage.numpy(np.int32)[:] = np.concatenate([seq_q, seq_k])
            s.copy(q, stage.view(0, seq_q.nbytes))
            s.copy(k, stage.view(seq_q.nbytes))
            s.synchronize()
            stage.release()
        self.q, self.k, self.ws = q, k, ws
        self.host = WorkspacePrepare(rt, params, q, k, ws)
        self.host.capture(s)
        self.device = DevicePrepare(rt, params, q, k, ws)  # compiles (or loads from the kernel cache)
        self.device.capture(s)
        self.standin = self._standin() if torch is not None else None
        self.runs: list[srt.Completion] = []

    def _standin(self) -> Callable[[], None]:
        torch, p = self.torch, self.params
        lay = p.metadata_layout
        ts = torch.cuda.ExternalStream(self.s.handle)
        base = (-self.tws.data_ptr()) % 16
        meta = self.tws[base : base + lay.region_bytes]
        offsets = meta[lay.offsets_offset : lay.offsets_offset + 8 * lay.offsets_count].view(torch.int64)
        nsplits = meta[: 4 * lay.nsplits_count].view(torch.int32)
        dq_acc = self.tws[base + lay.region_bytes : base + lay.region_bytes + p.dq_acc_bound_bytes]
        tq, tk = self.tq, self.tk

        def standin() -> None:
            with torch.cuda.stream(ts):
                sq = (tq[1:] - tq[:-1]).to(torch.int64)
                sk = tk[1:] - tk[:-1]
                nc = torch.div(sk + (p.kN0 - 1), p.kN0, rounding_mode="floor")
                nsplits.copy_(torch.clamp(nc[: lay.nsplits_count], min=1, max=1))
                if p.deterministic:
                    torch.cumsum(sq * (p.nhead * p.hdim_q), 0, out=offsets[1:])
                dq_acc.zero_()

        return standin

    def prepare(self, variant: str) -> None:
        s = self.s
        if variant == "sync":
            self.host.run_sync(s)
        elif variant == "host_stream":
            self.runs.append(self.host.launch(s, "stream"))
        elif variant == "host_fork":
            self.runs.append(self.host.launch(s, "fork", wait_for=None))
        elif variant == "host_graph":
            self.runs.append(self.host.replay(s))
        elif variant == "device":
            self.device.enqueue(s)
        elif variant == "device_run":
            self.runs.append(self.device.launch(s))
        elif variant == "device_graph":
            self.runs.append(self.device.replay(s))
        elif variant == "torch_standin":
            if self.standin is not None:
                self.standin()
        elif variant != "none":
            raise ValueError(variant)

    def drain(self) -> None:
        self.s.synchronize()
        for c in self.runs:
            c.result(30)
        self.runs.clear()

    def metadata_ok(self) -> bool:
        region = self.params.metadata_region_bytes
        check = self.rt.host_allocator.allocate(region)
        try:
            self.s.copy(check, self.ws.view(0, region))
            self.s.synchronize()
            return bool(np.array_equal(check.numpy(), reference_metadata(self.params, self.seq_q, self.seq_k)))
        finally:
            check.release()

    def close(self) -> None:
        self.drain()
        self.host.close()
        self.device.close()


def bench_train_step(env: Setup, matmuls: Callable[[], None] | None, args: argparse.Namespace) -> dict[str, Any]:
    rt, s = env.rt, env.s
    variants = [v for v in STEP_VARIANTS if v != "torch_standin" or env.standin is not None]
    t0, t1 = rt.create_event(timing=True), rt.create_event(timing=True)
    rows: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for variant in order:
            for _ in range(args.warmup):
                env.prepare(variant)
                if matmuls is not None:
                    matmuls()
            env.drain()
            s.record(t0)
            for _ in range(args.steps):
                env.prepare(variant)
                if matmuls is not None:
                    matmuls()
            s.record(t1)
            env.drain()
            rows[variant].append(t0.elapsed_ms(t1) * 1000 / args.steps)
    base = rows["none"]
    summary: dict[str, dict[str, float]] = {}
    for v in variants:
        added = [x - b for x, b in zip(rows[v], base, strict=False)]
        summary[v] = {
            "gpu_us_per_step": statistics.median(rows[v]),
            "added_us_per_step": statistics.median(added),
            "added_min_us": min(added),
            "added_max_us": max(added),
        }
    return {"rounds": args.rounds, "steps": args.steps, "summary": summary, "rows": rows}


def bench_latency(env: Setup, args: argparse.Namespace) -> dict[str, Any]:
    samples: dict[str, list[float]] = {v: [] for v in LATENCY_VARIANTS}
    for _ in range(args.warmup):
        for v in LATENCY_VARIANTS:
            env.prepare(v)
            env.drain()
    for i in range(args.latency_reps):
        order = LATENCY_VARIANTS[i % len(LATENCY_VARIANTS) :] + LATENCY_VARIANTS[: i % len(LATENCY_VARIANTS)]
        for v in order:
            time.sleep(0.0002)  # let the GPU and the runtime's threads go idle
            h0 = time.perf_counter()
            env.prepare(v)
            env.s.synchronize()
            samples[v].append((time.perf_counter() - h0) * 1e6)
            env.drain()
    out: dict[str, Any] = {}
    for v, xs in samples.items():
        xs.sort()
        out[v] = {"median_us": statistics.median(xs), "p90_us": xs[int(0.9 * (len(xs) - 1))], "min_us": xs[0]}
    best_host = min(out[v]["median_us"] for v in ("host_stream", "host_fork", "host_graph"))
    out["host_over_device"] = best_host / out["device"]["median_us"] if out["device"]["median_us"] > 0 else None
    return out


def bench_sleep(rt: srt.Runtime, s: srt.Stream, args: argparse.Namespace) -> dict[str, Any]:
    lib = rt.kernels  # type: ignore[attr-defined]
    out = rt.host_allocator.allocate(16)
    t0, t1 = rt.create_event(timing=True), rt.create_event(timing=True)

    def one(us: float) -> tuple[float, float]:
        if args.sleep_hold_us > 0:
            lib.spin_sleep(s, args.sleep_hold_us)  # the GPU reaches t0 only after the next two calls are enqueued
        s.record(t0)
        lib.spin_sleep(s, us, out=out)
        s.record(t1)
        s.synchronize()
        return t0.elapsed_ms(t1) * 1000, float(out.numpy(np.float64)[0])

    for _ in range(5):
        one(0.0)
    empty = statistics.median(one(0.0)[0] for _ in range(args.sleep_reps * 2))
    rows = []
    for us in SLEEP_US:
        ev, dev = zip(*(one(float(us)) for _ in range(args.sleep_reps)), strict=False)
        event_us, device_us = statistics.median(ev), statistics.median(dev)
        rows.append(
            {
                "requested_us": us,
                "device_clock_us": device_us,
                "event_us": event_us,
                "event_minus_empty_us": event_us - empty,
                "device_clock_error_pct": 100 * (device_us - us) / us,
                "event_error_pct": 100 * (event_us - us) / us,
                "event_minus_empty_error_pct": 100 * (event_us - empty - us) / us,
            }
        )
    out.release()
    worst = max(abs(r["event_minus_empty_error_pct"]) for r in rows)
    return {"empty_launch_event_us": empty, "rows": rows, "worst_event_minus_empty_error_pct": worst}


def run(args: argparse.Namespace) -> dict[str, Any]:
    with srt.open_runtime(args.backend) as rt:
        params, seq_q, seq_k = seed_workload(args, rt.capabilities.multiprocessor_count)
        s, matmuls, work_note = _torch_work(rt, args.size, args.matmuls)
        env = Setup(rt, s, params, seq_q, seq_k)
        try:
            step = bench_train_step(env, matmuls, args)
            latency = bench_latency(env, args)
            env.device.enqueue(s)
            ok = env.metadata_ok()
            used = reference_result(params, seq_q, seq_k).dq_acc_used_bytes
            sleep = bench_sleep(rt, s, args)
            grids = env.device.grids
        finally:
            env.close()
        device = f"{rt.backend_name}: {rt.capabilities.device_name}"
    summary = step["summary"]
    standin = summary.get("torch_standin", {}).get("added_us_per_step")
    return {
        "device": device,
        "work": work_note,
        "params": {f: getattr(params, f) for f in params.__dataclass_fields__},
        "dq_acc_used_bytes": used,
        "prepare_grids": [list(g) for g in grids],
        "metadata_matches_reference": ok,
        "train_step": step,
        "latency_idle_gpu": latency,
        "sleep": sleep,
        "goals": {
            "device_added_us": summary["device"]["added_us_per_step"],
            "torch_standin_added_us": standin,
            "device_at_most_16us_and_standin": summary["device"]["added_us_per_step"] <= max(16.0, standin or 16.0),
            "latency_ratio_host_over_device": latency["host_over_device"],
            "latency_ratio_at_least_5": (latency["host_over_device"] or 0) >= 5,
            "sleep_within_5pct": sleep["worst_event_minus_empty_error_pct"] <= 5,
        },
    }


def _print(result: dict[str, Any]) -> None:
    print(f"{result['device']} — {result['work']}")
    step = result["train_step"]
    print(f"\ntraining step: {step['rounds']} interleaved rounds x {step['steps']} steps, medians over rounds")
    print(f"{'variant':<15}{'GPU us/step':>13}{'added us':>11}{'(min..max)':>18}")
    for v, row in step["summary"].items():
        spread = f"{row['added_min_us']:.1f}..{row['added_max_us']:.1f}"
        print(f"{v:<15}{row['gpu_us_per_step']:>13.1f}{row['added_us_per_step']:>11.1f}{spread:>18}")
    lat = result["latency_idle_gpu"]
    print("\nend-to-end prepare latency, idle GPU (call -> synchronize returns)")
    print(f"{'variant':<15}{'median us':>11}{'p90 us':>10}{'min us':>10}")
    for v in LATENCY_VARIANTS:
        row = lat[v]
        print(f"{v:<15}{row['median_us']:>11.1f}{row['p90_us']:>10.1f}{row['min_us']:>10.1f}")
    ratio = lat["host_over_device"]
    print(f"best host-pack / device: {ratio:.1f}x" if ratio else "best host-pack / device: n/a")
    sl = result["sleep"]
    print(f"\nsleep kernel (empty launch between events: {sl['empty_launch_event_us']:.2f} us)")
    print(f"{'requested us':>13}{'device clock':>14}{'events':>10}{'events-empty':>14}{'err %':>8}")
    for r in sl["rows"]:
        print(
            f"{r['requested_us']:>13}{r['device_clock_us']:>14.2f}{r['event_us']:>10.2f}"
            f"{r['event_minus_empty_us']:>14.2f}{r['event_minus_empty_error_pct']:>8.2f}"
        )
    print("\nmetadata matches the reference:", "yes" if result["metadata_matches_reference"] else "NO")
    print("goals:", json.dumps(result["goals"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(ap)
    ap.add_argument("--latency-reps", type=int, default=200)
    ap.add_argument("--sleep-reps", type=int, default=20)
    ap.add_argument("--sleep-hold-us", type=float, default=500.0, help="sleep enqueued before each timed one (0: none)")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    return report(run(args), args.out, _print)


if __name__ == "__main__":
    sys.exit(main())
