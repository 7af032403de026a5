"""Main-thread time of the workspace prepare's launch inside a training loop, three ways (issues 21, 22).

The demo's model and prepare (``demos/train_loop.py``) at one size of
``train_loop_bench.py``, batches already on the device (no Prefetcher, no
logger), so a step is: order torch after the previous prepare, ``seq.copy_``,
launch the prepare, the torch step. Variants, in turns of ``--turn`` steps,
``--rounds`` rounds after a warm-up round:

* ``none``: no prepare (the floor of the other pieces);
* ``fork``: the demo's launch, ``prep.launch(s, "fork", join=False)``, and
  ``streamrt.torch.order_after``;
* ``deferred``: the same with ``deferred=True``: the runtime's submission
  thread makes the launch's backend calls;
* ``raw`` (GPU backends): those backend calls alone, the deferred plan's
  program run as one native call on the loop's thread, and one raw wait per
  tail instead of ``order_after``: what the calls cost there, cold, with no
  streamrt bookkeeping around them.

Each step's pieces are timed on the main thread; the table shows, per
variant, the median over rounds of each turn's median, and the range. The
metadata the prepares wrote is checked against the numpy oracle at each
turn's end. Where ``fork`` costs more than ``raw``, the difference is
streamrt's Python; where ``deferred`` costs more than nothing, it is too.

    PYTHONPATH=. python demos/bench/prepare_in_loop.py --size s --out prepare_in_loop.json
    python demos/bench/prepare_in_loop.py --backend sim --device cpu     # functional run (CI)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "demos"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import torch
except ImportError:  # `streamrt bench` reads exit status 77 as "skipped", the last stderr line as why
    print("needs torch: pip install 'streamrt[torch]'", file=sys.stderr)
    sys.exit(77)

import train_loop as demo  # noqa: E402
from train_common import MetadataCheck, workspace  # noqa: E402
from train_loop_bench import SIZES, config  # noqa: E402

import streamrt.torch as st  # noqa: E402
from streamrt._streampool import pool_for  # noqa: E402

PIECES = ("order", "copy", "prepare", "step")


def measure(size: str, backend: str, device: torch.device, rounds: int, turn: int) -> dict[str, Any]:
    """Per variant and piece, the per-round medians in µs (``step`` in ms); raises if a metadata check fails."""
    cfg = config(size, turn)
    rt = demo.open_runtime_for(device, backend)
    model, opt = demo.build(cfg, device)
    seq = st.device_empty(rt, cfg.seqs + 1, torch.int32)
    seq.zero_()
    params, ws, prep = workspace(cfg, device, rt, seq)
    assert prep is not None
    meta = ws[: params.metadata_region_bytes]
    batches = [(b["cu_seqlens"].numpy().copy(), {k: t.to(device) for k, t in b.items()}) for b in demo.synthetic_batches(cfg, steps=32)]
    cur = st.current_stream(rt)
    prep.launch(cur, "fork", join=False).result(30)
    prep.launch(cur, "fork", join=False, deferred=True).result(30)
    launches: dict[str, Callable[[], Any]] = {
        "fork": lambda: prep.launch(cur, "fork", join=False),
        "deferred": lambda: prep.launch(cur, "fork", join=False, deferred=True),
    }
    orders: dict[str, Callable[[Any], None]] = {"fork": lambda run: st.order_after(rt, run, cur)}
    orders["deferred"] = orders["fork"]
    ops = rt.backend.native_ops
    tails: list[Any] = []
    plan = prep.pipeline._plans.get((cur, "stream", False, True))
    if ops is not None and plan is not None and plan.deferred:  # the deferred plan's calls, made here
        pool = pool_for(rt)
        tails = [pool.acquire_event() for _ in plan.sides]
        program = plan._deferred_work([], [ev.handle for ev in tails])
        wait = rt.backend.stream_wait_event

        def raw() -> bool:
            failed = ops.run(program)
            if failed is not None:
                raise failed[1] or RuntimeError("the loop's stream is capturing")
            return True

        def raw_order(_run: Any) -> None:
            for ev in tails:
                wait(cur.handle, ev.handle)

        launches["raw"] = raw
        orders["raw"] = raw_order
    variants = ["none", *launches]
    samples: dict[str, dict[str, list[float]]] = {v: {p: [] for p in PIECES} for v in variants}
    check = MetadataCheck(params)
    step = 0
    for rnd in range(rounds + 1):
        for variant in variants[rnd % len(variants) :] + variants[: rnd % len(variants)]:
            if device.type == "cuda":
                torch.cuda.synchronize()
            launch, order = launches.get(variant), orders.get(variant)
            prev = None
            times: dict[str, list[float]] = {p: [] for p in PIECES}
            for _ in range(turn):
                cu_host, batch = batches[step % len(batches)]
                step += 1
                t0 = time.perf_counter()
                if prev is not None and order is not None:
                    order(prev)
                t1 = time.perf_counter()
                seq.copy_(batch["cu_seqlens"])
                t2 = time.perf_counter()
                if launch is not None:
                    prev = launch()
                t3 = time.perf_counter()
                demo.train_step(model, opt, batch["tokens"], batch["targets"], batch["cu_seqlens"])
                t4 = time.perf_counter()
                for piece, us in zip(PIECES, ((t1 - t0) * 1e6, (t2 - t1) * 1e6, (t3 - t2) * 1e6, (t4 - t3) * 1e3)):
                    times[piece].append(us)  # (the step in ms)
            if launch is not None and order is not None:
                order(prev)  # the metadata is fetched on the loop's stream: after the last prepare
                check.add(step, cu_host, st.fetch(rt, meta, cur))
            if rnd:  # the first round warms up
                for piece in PIECES:
                    samples[variant][piece].append(statistics.median(times[piece]))
    check.verify()
    for ev in tails:
        pool_for(rt).release_event(ev)
    prep.close()
    rt.close()
    return {"size": size, "backend": backend, "rounds": rounds, "turn": turn, "verified": len(check.verified), "samples": samples}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default=None, help="streamrt backend (default: auto with --device cuda, sim with cpu)")
    ap.add_argument("--device", default=None, choices=("cuda", "cpu"), help="torch's device (default: cpu with --backend sim, else cuda)")
    ap.add_argument("--size", default="s", choices=sorted(SIZES), help="the model size (train_loop_bench.py's)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds after the warm-up round (default 12; 2 on cpu)")
    ap.add_argument("--turn", type=int, default=10, help="steps per variant per round")
    ap.add_argument("--out", help="write the per-round samples as JSON here")
    args = ap.parse_args(argv)
    on_gpu = (args.device or ("cpu" if args.backend == "sim" else "cuda")) == "cuda"
    if on_gpu and not torch.cuda.is_available():
        print(f"torch {torch.__version__} has no CUDA device here; --backend sim --device cpu runs the benchmark on the simulator", file=sys.stderr)
        return 77
    if args.turn < 2 or (args.rounds is not None and args.rounds < 1):
        ap.error("--turn must be at least 2 and --rounds at least 1")
    backend = args.backend or ("auto" if on_gpu else "sim")
    result = measure(args.size, backend, torch.device("cuda" if on_gpu else "cpu"), args.rounds or (12 if on_gpu else 2), args.turn)
    print(f"size {args.size} ({backend}), {result['rounds']} rounds of turns of {args.turn} steps; per-turn medians, median [min-max];")
    print(f"metadata verified at {result['verified']} turn ends (the warm-up round's too)")
    print(f"{'variant':<9} {'order us':>20} {'copy us':>20} {'prepare us':>20} {'step ms':>20}")
    for variant, pieces in result["samples"].items():
        cells = [f"{statistics.median(xs):7.1f} [{min(xs):.1f}-{max(xs):.1f}]" for xs in pieces.values()]
        print(f"{variant:<9} " + " ".join(f"{c:>20}" for c in cells))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
