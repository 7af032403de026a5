"""Where the host time of a training step goes, variant (a) against (b) (issue 8).

Runs ``demos/train_loop.py``'s plain-torch variant (a) and streamrt variant (b)
at one model size of ``train_loop_bench.py`` for ``--passes`` passes, and times
each call of the pieces below on the main thread over ``--steps`` steps after
``--warmup`` untimed ones (wall time, so a piece that waits for the GIL is
charged that wait). In a pass, (a) and (b) run at once and take turns of
``--turn`` steps, each turn ending with a device synchronization, as
``train_loop_bench.py`` times them (``--turn 0``: (a)'s whole run, then (b)'s):

* ``batch gen``: the demo's synthetic batch generator;
* ``train_step``: torch's forward, backward and optimizer step;
* (b) only: ``prefetch next`` (includes ``batch gen`` and ``prefetch stage``),
  ``hand_off``, ``tensor_buffer`` (the batch's ``cu_seqlens`` for the prepare), ``prepare launch``,
  ``logger.log``, ``fetch``, ``order_after``, ``check.poll``;
* (a) only: ``copy_``, ``item``.

For (b) it also reports the runtime threads' work per step: completion-lane
batches (each a lane thread waking and taking the GIL, or a poll that retired
work on the loop's thread: the Prefetcher's before it allocates) and the CPU time of
streamrt's threads (lanes, workers, watchdog, releaser); and the Prefetcher's
device blocks allocated per step (near 0 where its slots' memory is reused),
and the sum of its main-thread pieces outside ``train_step`` and ``batch gen``.

``--profile N`` then runs each variant once more under cProfile (without the
timers; from Python 3.12 cProfile sees every thread, before it only the main
thread) and prints its N functions of most own time per step, overall and
among streamrt's own.

Prints ms per step per piece (``--out``: also as JSON), and (b)'s ``train_step``
over (a)'s per pass: the median and range over the passes after the first
(which warms the process up).

    python demos/bench/train_loop_breakdown.py --size s --out breakdown.json

Needs torch with CUDA and a GPU runtime; ``--device cpu`` times the same
pieces with CPU torch and the simulator (torch then computes on the host, so
only streamrt's own pieces are comparable with a GPU run).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import cProfile
import json
import pstats
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

try:
    import torch
except ImportError:  # `streamrt bench` reads exit status 77 as "skipped", the last stderr line as why
    print("needs torch: pip install 'streamrt[torch]'", file=sys.stderr)
    sys.exit(77)
from train_loop_bench import SIZES, config, config_changes, demo, turn_order

import streamrt as srt
import streamrt.torch as st
from streamrt.recipes.fmha_bwd import WorkspacePrepare
from streamrt.torch import _slots


class Timers:
    """Wraps functions so that their main-thread calls add their wall time to a named total."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = collections.defaultdict(float)
        self._saved: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        timers = self
        main = threading.main_thread()

        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is not main:
                return original(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                timers.totals[label] += time.perf_counter() - t0

        self._saved.append((owner, name, original))
        setattr(owner, name, timed)

    def timed_batches(self, make: Callable[[Any], Iterator[Any]]) -> Callable[[Any], Iterator[Any]]:
        timers = self

        def batches(cfg: Any) -> Iterator[Any]:
            it = make(cfg)
            while True:
                t0 = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                timers.totals["batch gen"] += time.perf_counter() - t0
                yield batch

        return batches

    def restore(self) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()


def _runtime_thread_cpu() -> dict[str, float]:
    """CPU seconds used so far by each live streamrt thread (Linux thread CPU clocks)."""
    out = {}
    for t in threading.enumerate():
        if t.name.startswith("streamrt-") and t.ident is not None:
            try:
                out[f"{t.name}/{t.ident}"] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except (OSError, AttributeError):  # exited meanwhile, or no thread CPU clocks here
                pass
    return out


#: (b)'s pieces outside torch's step, none timed inside another ("prefetch stage" and "hand_off" run inside
#: "prefetch next"; "item" only inside torch's optimizer step, on the CPU).
_OUTSIDE = ("prefetch next", "tensor_buffer", "prepare launch", "logger.log", "order_after", "fetch", "check.poll", "copy_")


def _outside_the_step(totals: dict[str, float]) -> float:
    """(b)'s main-thread ms per step outside torch's step and the batch generator: its :data:`_OUTSIDE`
    pieces, with ``prefetch next`` less the batch generation it ran."""
    return sum(totals.get(k, 0.0) for k in _OUTSIDE) - totals.get("batch gen", 0.0)


def _step_ratios(rows: list[dict[str, Any]]) -> list[float]:
    """(b)'s ``train_step`` time per step over (a)'s, per pass (each (a) row and the (b) row after it)."""
    out = []
    for a, b in zip(rows[::2], rows[1::2]):
        ta, tb = a["pieces_ms_per_step"].get("train_step"), b["pieces_ms_per_step"].get("train_step")
        if ta and tb:
            out.append(tb / ta)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default=None, choices=sorted(SIZES), help="model size (default s; xs on cpu)")
    ap.add_argument("--steps", type=int, default=None, help="steps timed per run (default 60; 5 on cpu)")
    ap.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="steps before the timed ones, not counted (default 80: past a stream's first 64 launches, which create "
        "the tail events that a lazy completion lane holds until it retires them; 1 on cpu)",
    )
    ap.add_argument("--device", default=None, choices=("cuda", "cpu"), help="torch's device (default: cpu with --backend sim, else cuda; cpu: the simulator runs (b))")
    ap.add_argument("--backend", default=None, help="streamrt backend of (b) (default: auto on cuda, sim on cpu)")
    ap.add_argument("--passes", type=int, default=2, help="passes of (a) and (b) (default 2; the first is a warm-up of the process)")
    ap.add_argument(
        "--turn",
        type=int,
        default=10,
        help="in a pass, (a) and (b) run at once and take turns of this many steps (default 10); 0: (a)'s whole run, then (b)'s",
    )
    ap.add_argument("--set", default="", metavar="FIELD=VALUE,...", help="demo Config fields changed for both variants (e.g. prepare_strategy=fork_graph)")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="also print each variant's top N functions (cProfile)")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    on_gpu = (args.device or ("cpu" if args.backend == "sim" else "cuda")) == "cuda"
    if on_gpu and not torch.cuda.is_available():
        print(f"torch {torch.__version__} has no CUDA device here; --device cpu (or --backend sim) times the pieces on the simulator", file=sys.stderr)
        return 77
    args.size = args.size or ("s" if on_gpu else "xs")
    args.steps = args.steps if args.steps is not None else (60 if on_gpu else 5)
    args.warmup = args.warmup if args.warmup is not None else (80 if on_gpu else 1)
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    backend = args.backend or ("auto" if on_gpu else "sim")
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    cfg = config(args.size, args.warmup + args.steps)
    if args.set:
        cfg = dataclasses.replace(cfg, **config_changes(args.set))
    timers = Timers()
    rows: list[dict[str, Any]] = []
    make_batches = demo.synthetic_batches
    demo.synthetic_batches = timers.timed_batches(make_batches)
    for owner, name, label in (
        (demo, "train_step", "train_step"),
        (st.Prefetcher, "__next__", "prefetch next"),
        (st.Prefetcher, "_stage", "prefetch stage"),
        (_slots.Slots, "hand_off", "hand_off"),
        (st, "tensor_buffer", "tensor_buffer"),
        (WorkspacePrepare, "launch", "prepare launch"),
        (st.MetricsLogger, "log", "logger.log"),
        (demo.MetadataCheck, "poll", "check.poll"),
        (st, "order_after", "order_after"),
        (st, "fetch", "fetch"),
        (torch.Tensor, "copy_", "copy_"),
        (torch.Tensor, "item", "item"),
    ):
        timers.wrap(owner, name, label)

    steps = args.steps

    def run(variant: str, start: list[float]) -> dict[str, float]:
        """One whole run of ``variant``, between two device synchronizations; the timers and ``start`` (the
        wall clock) restart after the warm-up steps. Returns (b)'s runtime-thread work per timed step."""
        marks: dict[str, Any] = {}

        def restart() -> None:
            timers.totals.clear()
            if "rt" in marks:
                marks["batches"], marks["cpu"] = marks["rt"]._engine.statistics().batches, _runtime_thread_cpu()
            start[0] = time.perf_counter()

        def after(step: int) -> None:
            if step == args.warmup - 1:
                restart()

        sync()
        if variant == "a":
            restart()
            demo.run_plain(cfg, device, on_step=after)
            sync()
            return {}
        with srt.open_runtime(backend) as rt:
            marks["rt"] = rt
            restart()
            result = demo.run_streamrt(cfg, device, rt, on_step=after)
            sync()
            lane_batches = rt._engine.statistics().batches - marks["batches"]
            cpu_s = sum(t - marks["cpu"].get(name, 0.0) for name, t in _runtime_thread_cpu().items())
        return {
            "lane batches": lane_batches / steps,
            "runtime threads cpu us": cpu_s * 1e6 / steps,
            "prefetch device blocks": result.stats["prefetch"]["device_blocks"] / (args.warmup + steps),
        }

    def run_in_turns() -> dict[str, tuple[float, dict[str, float], dict[str, float]]]:
        """(a) and (b) at once, in turns of ``--turn`` steps (see ``train_loop_bench.run_turns``), each turn
        between two device synchronizations, each variant's pieces timed into its own totals.
        Per variant: (ms per step, the totals, (b)'s runtime-thread work per timed step)."""
        per: dict[str, dict[str, float]] = {v: collections.defaultdict(float) for v in "ab"}
        wall = dict.fromkeys("ab", 0.0)
        with srt.open_runtime(backend) as rt:
            loops = {"a": demo.plain_steps(cfg, device), "b": demo.streamrt_steps(cfg, device, rt)}
            try:
                for v in "ab":
                    timers.totals = per[v]
                    for _ in range(args.warmup):
                        next(loops[v])
                    sync()
                    per[v].clear()
                batches, cpu = rt._engine.statistics().batches, _runtime_thread_cpu()
                for v, n in turn_order("ab", steps, args.turn):
                    timers.totals = per[v]
                    t0 = time.perf_counter()
                    for _ in range(n):
                        next(loops[v])
                    sync()
                    wall[v] += time.perf_counter() - t0
                lane_batches = rt._engine.statistics().batches - batches
                cpu_s = sum(t - cpu.get(name, 0.0) for name, t in _runtime_thread_cpu().items())
                timers.totals = collections.defaultdict(float)
                result = demo.drive(loops["b"])
                demo.drive(loops["a"])
            finally:
                for loop in loops.values():
                    loop.close()
        threads = {
            "lane batches": lane_batches / steps,
            "runtime threads cpu us": cpu_s * 1e6 / steps,
            "prefetch device blocks": result.stats["prefetch"]["device_blocks"] / (args.warmup + steps),
        }
        return {v: (wall[v] * 1e3 / steps, dict(per[v]), threads if v == "b" else {}) for v in "ab"}

    def one_by_one() -> dict[str, tuple[float, dict[str, float], dict[str, float]]]:
        out = {}
        for v in "ab":
            start = [0.0]
            threads = run(v, start)
            out[v] = ((time.perf_counter() - start[0]) * 1e3 / steps, dict(timers.totals), threads)
        return out

    try:
        for variant, (per_step, raw, threads) in (
            item for _ in range(max(args.passes, 1)) for item in (run_in_turns() if args.turn > 0 else one_by_one()).items()
        ):
            totals = {k: v * 1e3 / steps for k, v in raw.items()}
            pieces = ", ".join(f"{k} {v:.3f}" for k, v in sorted(totals.items()))
            extra = "".join(f"; {k} {v:.2f}/step" for k, v in threads.items())
            own = _outside_the_step(totals) if variant == "b" else None
            mine = "" if own is None else f"; outside train_step and batch gen {own * 1e3:.0f} us"
            print(f"[{args.size}] ({variant}) {per_step:.3f} ms/step: {pieces}{extra}{mine}", flush=True)
            rows.append(
                {
                    "variant": variant,
                    "ms_per_step": per_step,
                    "pieces_ms_per_step": totals,
                    "runtime_threads_per_step": threads,
                    "outside_step_ms_per_step": own,
                }
            )
    finally:
        timers.restore()
        demo.synthetic_batches = make_batches
    step_ratios = _step_ratios(rows)
    if step_ratios:
        later = step_ratios[1:] or step_ratios
        print(
            f"[{args.size}] (b)'s train_step over (a)'s, passes after the first: median {statistics.median(later):.3f}"
            f" [{min(later):.3f}-{max(later):.3f}]; all: {', '.join(f'{r:.3f}' for r in step_ratios)}"
        )
    for variant in ("a", "b") if args.profile else ():
        profile = cProfile.Profile()
        with profile:
            run(variant, [0.0])
        print(f"[{args.size}] ({variant}) under cProfile, top {args.profile} by own time, us per step:")
        stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
        by_own = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)
        streamrt_own = [kv for kv in by_own if "/streamrt/" in kv[0][0]]
        for title, rows_by_own in (("all", by_own), ("streamrt's own functions", streamrt_own)):
            print(f"  -- {title}")
            for (file, line, fn), (_cc, ncalls, own, total, _callers) in rows_by_own[: args.profile]:
                where = f"{file.rsplit('/', 1)[-1]}:{line}({fn})"
                print(f"  {own * 1e6 / cfg.steps:9.1f} own {total * 1e6 / cfg.steps:9.1f} total {ncalls / cfg.steps:7.1f} calls  {where}")
    if args.out:
        with open(args.out, "w") as f:
            device_name = torch.cuda.get_device_name(device) if on_gpu else "cpu (sim)"
            json.dump({"size": args.size, "steps": args.steps, "device": device_name, "rows": rows, "train_step_ratios": step_ratios}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
