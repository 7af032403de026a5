"""Training-loop benchmark: plain torch (a), streamrt (b), a captured step (c), the whole step captured (d).

Runs ``demos/train_loop.py``'s four variants side by side in one process, for
each model size of a sweep, with (e), the eager floor: the torch step alone on
batches already on the device, with no prepare, no logging and no host wait
(:func:`floor_steps`; (b) against (e) is what (b)'s helpers and waits cost).
It measures per variant:

* **step time**, over ``--steps`` steps after ``--warmup`` steps. By default
  the variants of a round run at once, each loop a generator on the main
  thread, and take turns of ``--turn`` steps (the order reversing every
  cycle), so that a drift of the host's speed during the round weighs on every
  variant alike. Each turn starts and ends with a device synchronization and
  is timed from the end of its first step to the end of its last (timing
  events on the loop's stream): the steady state, without the start from an
  idle GPU or the closing wait. ``--turn 0`` times one whole run after another
  between two ``torch.cuda.synchronize()`` calls instead (runs up to 131 did);
* **host enqueue time per step**: from the start of each window to the host's
  last enqueue in it (for (b)/(c) the host runs ahead);
* **host-synchronizing calls per step**, in a separate run of up to 20 steps
  (counting costs the host time: each warning, each wrapped call): torch's
  own, counted with ``torch.cuda.set_sync_debug_mode("warn")`` (each
  ``.item()``, ``.cpu()``, pageable ``.to(device)`` warns once), plus
  streamrt's blocking calls (``Stream/Event/Runtime.synchronize``, and
  ``Completion.wait`` on a Completion not yet done), counted by wrapping them;
* **GPU idle fraction per step**, two ways. *Profiled*: from a torch profiler
  (CUPTI, GPU activity only) trace of ``--profile-steps`` further steps (a
  separate run): ``1 - (union of kernel, memcpy and memset intervals) / (first
  start to last end)``, with the GPU busy time per step. The profiler slows the
  host (its window's wall time per step is reported too), which inflates the
  idle of a run whose host barely keeps ahead of the GPU. *Timed*: ``1 - (GPU
  busy per step) / (step time)``, the profiled busy time over the unprofiled
  step time;
* for (d), the host's time per replayed step, split into making the batch,
  the replay (``CUDAGraph.replay``) and the rest;
* the losses of the variants are compared (they must agree).

The summary names, for each size, (b)'s speedup over (a); a size is
"host-bound" for (a) when (a)'s GPU idles at least ``--host-bound-idle`` of
the time. With ``--images`` it also writes streamrt timelines of a few steps of
(a) and (b) at the headline size (``rt.trace()``; torch's work shows as one
span per step, host waits as blocking records): ``docs/img/train-a.png``,
``docs/img/train-b.png`` and ``docs/img/train-d.png``.

    python demos/bench/train_loop_bench.py --out train_loop.json --images

Needs torch with CUDA and a GPU runtime (``--backend auto``). ``--device cpu``
runs a functional smoke version on the simulator (no profiler, no sync
counting: those need CUDA).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

try:
    import torch
except ImportError:  # `streamrt bench` reads exit status 77 as "skipped", the last stderr line as why
    print("needs torch: pip install 'streamrt[torch]'", file=sys.stderr)
    sys.exit(77)

import streamrt as srt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _loop_probes.py, beside this file
from _loop_probes import GpuProfile, SyncCounter  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SIZES = {
    # name: (d_model, n_layers, n_heads, seqs, max_seqlen, vocab)
    "xs": (32, 1, 2, 4, 16, 64),  # the demo's CI size: a functional check
    "s": (256, 2, 4, 16, 128, 512),  # the demo's FULL size
    # between s and sm (GPU work per step 4.2, 5.3, 5.7 ms on the H200): where (a)'s GPU idles 25-60 %
    "t1": (288, 2, 4, 18, 128, 576),
    "t2": (320, 2, 5, 20, 128, 640),
    "t3": (320, 2, 5, 22, 128, 640),
    "sm": (384, 2, 6, 28, 128, 768),  # GPU time near (a)'s host time: where (a)'s syncs serialize the two
    "m": (512, 2, 8, 32, 128, 1024),
    "l": (768, 4, 12, 32, 256, 1024),
}


def _load_demo() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_loop_demo", ROOT / "demos" / "train_loop.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


demo: Any = _load_demo()  # the demo module (loaded by path: its functions are looked up at run time)


def config(size: str, steps: int) -> Any:
    d, layers, heads, seqs, max_len, vocab = SIZES[size]
    return dataclasses.replace(demo.FULL, d_model=d, n_layers=layers, n_heads=heads, seqs=seqs, max_seqlen=max_len, vocab=vocab, steps=steps)


# -- the eager floor ----------------------------------------------------------------------------------------------------


def floor_steps(cfg: Any, device: torch.device) -> Any:
    """(e), the eager floor: the demo's torch step alone, on batches copied to the device before the loop;
    no prepare, no logging, no host wait. No eager loop of this model goes faster: (b) against (e) is what
    its helpers and waits cost. A generator like ``demo.*_steps``; its losses are (a)'s."""
    model, opt = demo.build(cfg, device)
    batches = [{k: t.to(device) for k, t in b.items()} for b in demo.synthetic_batches(cfg)]
    losses = []
    for step, batch in enumerate(batches):
        losses.append(demo.train_step(model, opt, batch["tokens"], batch["targets"], batch["cu_seqlens"]).detach())
        yield step
    return demo.Result("e", [float(x) for x in losses], 0.0)


def _loop(variant: str, cfg: Any, device: torch.device, rt: srt.Runtime, *, trace: bool = False) -> Any:
    """Variant ``variant``'s loop as a generator ((b*), (b**), ...: (b), with their Config)."""
    base = "b" if variant.startswith("b") else variant
    if base == "a":
        return demo.plain_steps(cfg, device, rt=rt if trace else None)
    if base == "e":
        return floor_steps(cfg, device)
    if base == "d":
        return demo.whole_graph_steps(cfg, device, rt)
    return demo.streamrt_steps(cfg, device, rt, graph=base == "c")


# -- one measured run -----------------------------------------------------------------------------------------------------


def _sync(device: torch.device, rt: srt.Runtime | None) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif rt is not None:
        rt.synchronize()


def run_once(
    variant: str,
    cfg: Any,
    device: torch.device,
    *,
    warmup: int,
    steps: int,
    mode: str,
    backend: str,
    trace_path: Path | None = None,
    runtime_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One run of ``variant``: ``mode`` is ``"time"``, ``"count"`` (host-synchronizing calls), ``"profile"``,
    ``"trace"``, or ``"paced"`` (the host waits for the GPU after every step, so that (d)'s host split measures
    its calls, not the driver's back-pressure on a host that runs ahead)."""
    total = warmup + steps
    cfg = dataclasses.replace(cfg, steps=total, warmup=min(cfg.warmup, max(warmup - 1, 1)))
    out: dict[str, Any] = {}
    counter = SyncCounter(device.type == "cuda")
    prof = GpuProfile()
    marks: dict[str, float] = {}
    rt_holder: list[srt.Runtime] = []
    region: list[Any] = []

    def on_step(step: int) -> None:
        rt = rt_holder[0] if rt_holder else None
        if mode == "paced":
            _sync(device, rt)
        elif step == warmup - 1:
            _sync(device, rt)
            if mode == "time":
                marks["t0"] = time.perf_counter()
            elif mode == "count":
                counter.start()
            elif mode == "profile":
                prof.start()
            elif mode == "trace" and rt is not None:
                region.append(rt.trace(name=f"({variant}) {steps} steps"))
                region[0].__enter__()
        elif step == total - 1:
            if mode == "time":
                marks["host"] = time.perf_counter()
                _sync(device, rt)
                marks["t1"] = time.perf_counter()
            elif mode == "count":
                counter.stop()
            elif mode == "profile":
                prof.stop(steps)
            elif mode == "trace" and region:
                region[0].__exit__(None, None, None)

    rt = demo.open_runtime_for(device, None if backend == "auto" else backend, **(runtime_options or {}))
    rt_holder.append(rt)
    try:
        res = demo.drive(_loop(variant, cfg, device, rt, trace=mode == "trace"), on_step)
        if mode == "trace" and region and trace_path is not None:
            trace = region[0].trace
            trace.save_timeline(trace_path, title=f"train_loop variant ({variant}), {steps} steps")
            rep = trace.report()
            out["trace"] = {"path": str(trace_path), "records": len(trace.records), "report": str(rep)[:2000]}
    finally:
        rt.close()
    out["losses"] = res.losses
    if mode == "time":
        out["step_ms"] = (marks["t1"] - marks["t0"]) * 1e3 / steps
        out["host_enqueue_ms_per_step"] = (marks["host"] - marks["t0"]) * 1e3 / steps
        out["stats"] = res.stats
    if mode == "count":
        out["torch_syncs_per_step"] = counter.torch_syncs / steps
        out["streamrt_syncs_per_step"] = counter.streamrt_syncs / steps
        out["host_syncs_per_step"] = (counter.torch_syncs + counter.streamrt_syncs) / steps
        out["sync_kinds"] = counter.kinds
    if mode == "profile":
        out.update(prof.result)
    if mode == "paced":
        out["stats"] = res.stats
    return out


def turn_order(variants: Sequence[str], steps: int, turn: int) -> Iterator[tuple[str, int]]:
    """The turns of a round: ``(variant, steps)``, each variant ``turn`` steps at a time (the last turn
    what is left of ``steps``), the order reversing every cycle (a b c, c b a, a b c, ...)."""
    done, cycle = 0, 0
    while done < steps:
        n = min(turn, steps - done)
        for v in variants if cycle % 2 == 0 else variants[::-1]:
            yield v, n
        done, cycle = done + n, cycle + 1


def run_turns(
    variants: list[str], cfgs: dict[str, Any], device: torch.device, *, warmup: int, steps: int, turn: int, backend: str,
    runtime_options: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """One timing round of all ``variants`` at once, in turns of ``turn`` (≥ 2) steps (mode ``"time"``).

    Every variant's loop runs as a generator (``demo.*_steps``) on this thread. After each one's warm-up,
    they take turns of ``turn`` steps, each turn between two device synchronizations, the order reversing
    every cycle (a b c d, d c b a, ...), so that a drift of the host's speed weighs on every variant
    alike. A turn's time is the time between the end of its first step and the end of its last, each
    marked by a timing event on the loop's stream (on CPU, the host's clock): the steady state, without
    the start from an idle GPU or the final wait. Torch's current stream is each loop's own between its
    turns. Per variant: ``step_ms``, ``host_enqueue_ms_per_step`` (from a turn's start to the last
    enqueue), the per-turn ``turn_ms`` (per step), the losses and the stats.
    """
    total = warmup + steps
    rts: dict[str, srt.Runtime] = {}
    loops: dict[str, Any] = {}
    cuda = device.type == "cuda"
    default: Any = torch.cuda.current_stream(device) if cuda else None
    streams: dict[str, Any] = {}
    host = dict.fromkeys(variants, 0.0)
    turns: dict[str, list[tuple[float, int]]] = {v: [] for v in variants}  # (ms between the marks, steps between them)

    def mark() -> Any:
        if not cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def advance(v: str, n: int, marked: bool = False) -> list[Any]:
        """``n`` steps of ``v``; with ``marked``, the marks after its first and its last step."""
        marks = []
        if cuda:
            torch.cuda.set_stream(streams[v])
        try:
            for i in range(n):
                next(loops[v])
                if marked and i in (0, n - 1):
                    marks.append(mark())
        finally:
            if cuda:
                streams[v] = torch.cuda.current_stream(device)
                torch.cuda.set_stream(default)
        return marks

    try:
        for v in variants:
            cfg = dataclasses.replace(cfgs[v], steps=total, warmup=min(cfgs[v].warmup, max(warmup - 1, 1)))
            rt = rts[v] = demo.open_runtime_for(device, None if backend == "auto" else backend, **(runtime_options or {}))
            loops[v] = _loop(v, cfg, device, rt)
            streams[v] = default
            advance(v, warmup)
            _sync(device, rt)
        for v, n in turn_order(variants, steps, turn):
            t0 = time.perf_counter()
            first, *rest = advance(v, n, marked=True)
            host[v] += time.perf_counter() - t0
            _sync(device, rts[v])
            if rest:
                last = rest[-1]
                turns[v].append((first.elapsed_time(last) if cuda else (last - first) * 1e3, n - 1))
        out: dict[str, dict[str, Any]] = {}
        for v in variants:
            res = demo.drive(loops[v])  # the loop's end: flush, verify, close
            ms, between = (sum(x) for x in zip(*turns[v])) if turns[v] else (0.0, 0)
            out[v] = {
                "step_ms": ms / max(between, 1),
                "host_enqueue_ms_per_step": host[v] * 1e3 / steps,
                "turn_ms": [t / k for t, k in turns[v]],
                "losses": res.losses,
                "stats": res.stats,
            }
        return out
    finally:
        for loop in loops.values():
            loop.close()
        for rt in rts.values():
            rt.close()


# -- the sweep --------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None, help="torch's device (default: cpu with --backend sim, else cuda)")
    ap.add_argument("--backend", default="auto", help="streamrt backend for (b)/(c) (default auto; sim with --device cpu)")
    ap.add_argument("--sizes", default=None, help=f"model sizes, a subset of {','.join(SIZES)} (default s,sm,m,l; xs on cpu)")
    ap.add_argument("--variants", default="a,b,c,d,e", help="of a, b, c, d (the demo's) and e (the eager floor)")
    ap.add_argument("--warmup", type=int, default=None, help="steps before every measured window (default 15; 2 on cpu)")
    ap.add_argument("--steps", type=int, default=None, help="steps in the timing window (default 60; 5 on cpu)")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds per size, the variants interleaved in each (default 3)")
    ap.add_argument(
        "--turn",
        type=int,
        default=10,
        help="in a round, the variants run at once and take turns of this many steps (at least 2; default 10); 0: one whole run after another",
    )
    ap.add_argument("--profile-steps", type=int, default=20, help="steps in the profiler window (0: no profile)")
    ap.add_argument("--host-bound-idle", type=float, default=0.25, help="(a) is host-bound when its GPU idles at least this fraction")
    ap.add_argument("--images", action="store_true", help="write docs/img/train-{a,b,d}.png (needs matplotlib)")
    ap.add_argument("--image-dir", default=str(ROOT / "docs" / "img"))
    ap.add_argument(
        "--switch-interval-us",
        default=None,
        help="open_runtime(python_host_switch_interval=...) for (b)/(c), in µs, or 'off' to leave the interpreter's (default: streamrt's)",
    )
    ap.add_argument(
        "--b-star",
        action="append",
        default=[],
        metavar="FIELD=VALUE,...",
        help="also time (b*): (b) with these demo Config fields changed, interleaved with the other variants "
        "(e.g. prefetch_group=8,prepare_strategy=fork_graph); given again: (b**), (b***), ...",
    )
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.turn == 1 or args.turn < 0:
        ap.error("--turn: 0, or at least 2 steps (a turn is timed between the ends of its first and last step)")
    stars = {"b" + "*" * i: config_changes(text) for i, text in enumerate(args.b_star, 1)}  # variant: Config changes
    device = torch.device(args.device or ("cpu" if args.backend == "sim" else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"torch {torch.__version__} has no CUDA device here; --device cpu (or --backend sim) runs a functional version on the simulator", file=sys.stderr)
        return 77
    smoke = device.type == "cpu"  # a functional run: the demo's CI size, a few steps
    args.sizes = args.sizes or ("xs" if smoke else "s,sm,m,l")
    args.warmup = args.warmup if args.warmup is not None else (2 if smoke else 15)
    args.steps = args.steps if args.steps is not None else (5 if smoke else 60)
    backend = "sim" if device.type == "cpu" else args.backend
    options: dict[str, Any] = {}
    if args.switch_interval_us is not None:
        off = args.switch_interval_us == "off"
        options["python_host_switch_interval"] = None if off else float(args.switch_interval_us) * 1e-6
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if set(variants) - set("abcde"):
        ap.error(f"--variants: unknown {sorted(set(variants) - set('abcde'))}; of a, b, c, d, e")
    at = variants.index("b") + 1 if "b" in variants else len(variants)
    variants[at:at] = list(stars)
    if device.type != "cuda":
        variants = [v for v in variants if v not in ("c", "d")]
    results: dict[str, Any] = {
        "machine": {
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (simulator)",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "streamrt_backend": backend,
            "host_pack": demo.PACK,
        },
        "args": vars(args),
        "sizes": {},
    }
    for size in sizes:
        cfg = config(size, args.warmup + args.steps)
        entry: dict[str, Any] = {"config": {k: getattr(cfg, k) for k in ("d_model", "n_layers", "n_heads", "seqs", "max_seqlen", "vocab", "token_budget")}}

        def run(v: str, steps: int, mode: str, cfg: Any = cfg) -> dict[str, Any]:
            """``run_once`` of variant ``v`` ((b*), (b**), ...: (b) with their Config changes)."""
            base, vcfg = ("b", dataclasses.replace(cfg, **stars[v])) if v in stars else (v, cfg)
            return run_once(base, vcfg, device, warmup=args.warmup, steps=steps, mode=mode, backend=backend, runtime_options=options)

        cfgs = {v: dataclasses.replace(cfg, **stars[v]) if v in stars else cfg for v in variants}
        for r in range(args.rounds):  # interleaved: every round times each variant once
            if args.turn > 0:
                print(f"[{size}] timing {', '.join(variants)} in turns of {args.turn} steps, round {r + 1}/{args.rounds} ...", flush=True)
                timed = run_turns(variants, cfgs, device, warmup=args.warmup, steps=args.steps, turn=args.turn, backend=backend, runtime_options=options)
            else:
                timed = {}
                for v in variants:
                    print(f"[{size}] ({v}) timing, round {r + 1}/{args.rounds} ...", flush=True)
                    timed[v] = run(v, args.steps, "time")
            for v in variants:
                if r == 0:
                    entry[v] = timed[v]
                    entry[v]["step_ms_rounds"] = []
                entry[v]["step_ms_rounds"].append(timed[v]["step_ms"])
        for v in variants:
            rounds = entry[v]["step_ms_rounds"]
            entry[v]["step_ms"] = sorted(rounds)[len(rounds) // 2]  # the median round
            print(f"[{size}] ({v}) counting host syncs ...", flush=True)
            entry[v].update({k: w for k, w in run(v, min(args.steps, 20), "count").items() if k != "losses"})
            if args.profile_steps and device.type == "cuda":
                print(f"[{size}] ({v}) profiling ...", flush=True)
                try:
                    p = run(v, args.profile_steps, "profile")
                    entry[v]["profile"] = {k: p[k] for k in p if k != "losses"}
                    busy_ms = p["gpu_busy_us_per_step"] / 1e3
                    entry[v]["gpu_idle_timed"] = max(0.0, 1.0 - busy_ms / entry[v]["step_ms"])
                except Exception as exc:  # noqa: BLE001 - report and keep measuring
                    entry[v]["profile"] = {"error": f"{type(exc).__name__}: {exc}"}
        if "d" in variants:
            print(f"[{size}] (d) paced host split ...", flush=True)
            entry["d"]["stats"] = run_once("d", cfg, device, warmup=args.warmup, steps=args.steps, mode="paced", backend=backend, runtime_options=options)["stats"]
        present = [entry[v] for v in variants]
        rtol, atol = demo.tolerances(device)
        res_objs = [demo.Result(v, entry[v]["losses"], 0.0) for v in variants]
        entry["losses_agree"] = demo.compare(res_objs, rtol=rtol, atol=atol) == []
        entry["loss_mismatches"] = demo.compare(res_objs, rtol=rtol, atol=atol)
        for x, y in _PAIRS + [(v, w) for v in stars for w in ("a", "b")]:
            if x in entry and y in entry:  # the median, and the range over the rounds
                ratios = [p / q for p, q in zip(entry[y]["step_ms_rounds"], entry[x]["step_ms_rounds"])]
                entry[f"speedup_{x}_over_{y}"] = entry[y]["step_ms"] / entry[x]["step_ms"]
                entry[f"speedup_{x}_over_{y}_range"] = [min(ratios), max(ratios)]
        if "a" in entry and "b" in entry:
            idle_a = entry["a"].get("profile", {}).get("gpu_idle_fraction")
            entry["a_host_bound"] = idle_a is not None and idle_a >= args.host_bound_idle
        for r in present:
            r["losses"] = [round(x, 6) for x in r["losses"]]
        results["sizes"][size] = entry

    headline = _headline(results["sizes"])
    results["headline_size"] = headline
    _print_table(results, variants)
    if args.images and headline is not None:
        img = Path(args.image_dir)
        img.mkdir(parents=True, exist_ok=True)
        cfg = config(headline, args.warmup + 6)
        for v in [v for v in ("a", "b", "d") if v in variants]:
            path = img / f"train-{v}.png"
            print(f"[{headline}] ({v}) tracing -> {path}", flush=True)
            t = run_once(v, cfg, device, warmup=args.warmup, steps=6, mode="trace", backend=backend, trace_path=path, runtime_options=options)
            results.setdefault("images", {})[v] = t.get("trace")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2, default=str))
        print(f"wrote {args.out}")
    ok = all(e.get("losses_agree", True) for e in results["sizes"].values())
    return 0 if ok else 1


_PAIRS = [("b", "a"), ("c", "a"), ("d", "a"), ("d", "c"), ("b", "e")]  # (x, y): x's speed over y's, reported where both ran


def config_changes(text: str) -> dict[str, Any]:
    """``"field=value,..."`` as demo Config changes, each value converted to its field's type."""
    types = {f.name: f.type for f in dataclasses.fields(demo.Config)}
    changes: dict[str, Any] = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        name = name.strip()
        if name not in types or not value:
            raise SystemExit(f"{item!r} is not FIELD=VALUE with a field of the demo's Config ({', '.join(types)})")
        kind = types[name] if isinstance(types[name], str) else getattr(types[name], "__name__", "")
        changes[name] = value == "true" if kind == "bool" else int(value) if kind == "int" else float(value) if kind == "float" else value
    return changes


def _headline(sizes: dict[str, Any]) -> str | None:
    """The largest size where (a) is host-bound (by its GPU idle fraction), else the one (b) speeds up most."""
    bound = [s for s, e in sizes.items() if e.get("a_host_bound")]
    if bound:
        return bound[-1]
    ranked = sorted((e.get("speedup_b_over_a", 0.0), s) for s, e in sizes.items())
    return ranked[-1][1] if ranked else None


def _fmt(x: Any, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if x is None else format(x, f">{width}{spec}")


def _print_table(results: dict[str, Any], variants: list[str]) -> None:
    print()
    print(f"machine: {results['machine']}")
    head = (
        f"{'size':<5}{'var':<5}{'step ms':>9}{'host ms':>9}{'syncs/step':>11}{'idle prof':>10}{'prof ms':>9}"
        f"{'idle timed':>11}{'GPU busy ms':>12}{'vs (a)':>8}"
    )
    print(head)
    print("-" * len(head))
    for size, e in results["sizes"].items():
        for v in variants:
            r = e.get(v)
            if r is None:
                continue
            prof = r.get("profile", {})
            speed = e["a"]["step_ms"] / r["step_ms"] if "a" in e else None
            busy = prof.get("gpu_busy_us_per_step")
            print(
                f"{size:<5}{'(' + v + ')':<5}{r['step_ms']:>9.3f}{r['host_enqueue_ms_per_step']:>9.3f}{r['host_syncs_per_step']:>11.2f}"
                f"{_fmt(prof.get('gpu_idle_fraction'), '.1%', 10)}{_fmt(prof.get('profiled_step_ms'), '.3f', 9)}"
                f"{_fmt(r.get('gpu_idle_timed'), '.1%', 11)}{_fmt(None if busy is None else busy / 1e3, '.3f', 12)}{_fmt(speed, '.2f', 7)}x"
            )
        for v in variants:
            for us, n, names in e.get(v, {}).get("profile", {}).get("idle_gaps", [])[:3]:
                print(f"      ({v}) GPU idle {us:.1f} µs/step in {n:.1f} gaps/step: {names}")
        split = e.get("d", {}).get("stats", {}).get("host_us_per_step")
        if split:
            print(
                f"      (d) host per replayed step: batch {split['batch']:.1f} µs, replay {split['replay']:.1f} µs, rest {split['rest']:.1f} µs"
                f" (fetches {split['fetch']:.1f}, polls {split['poll']:.1f})"
            )
        stars = [v for v in variants if v.startswith("b*")]
        for x, y in [p for p in _PAIRS if p != ("c", "a")] + [(v, w) for v in stars for w in ("a", "b")]:
            if f"speedup_{x}_over_{y}" in e:
                lo, hi = e[f"speedup_{x}_over_{y}_range"]
                print(f"      ({x}) vs ({y}): {e[f'speedup_{x}_over_{y}']:.3f}x (rounds {lo:.3f}-{hi:.3f}x)")
        flag = " (a) host-bound" if e.get("a_host_bound") else ""
        print(f"      losses agree: {e['losses_agree']}{flag}")
    if results.get("headline_size"):
        print(f"headline size: {results['headline_size']}")


if __name__ == "__main__":
    sys.exit(main())
