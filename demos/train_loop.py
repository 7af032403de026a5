"""A small varlen transformer trained four ways: plain torch, streamrt, and two captured forms.

The model, its data and its sizes are in ``train_model.py`` beside this file, variant (d) in
``train_whole_step.py``, and what the variants share in ``train_common.py``.

Variants (same data, same initial weights, same optimizer, so the same losses):

(a) plain torch: ``.to(device)`` copies of each batch, ``loss.item()`` every
    step, and the FMHA workspace metadata prepared the old way (``cu_seqlens``
    copied to the host, packed, copied back): the host waits for the GPU
    several times per step. The pack is the recipe's C pack where it was built
    (``PACK``), as in (b), so the two differ in how they wait, not in how they pack.
(b) streamrt: a :class:`~streamrt.torch.Prefetcher` stages the next batches on
    a side stream and hands them over with events; a
    :class:`~streamrt.torch.MetricsLogger` logs each loss, copying the losses of
    ``log_group`` steps out together, two steps after their group; the
    seed's workspace prepare pipeline (:mod:`streamrt.recipes.fmha_bwd`) runs
    every step on the step's ``cu_seqlens`` (``Config.prepare_strategy``, "fork" by default: the
    D2H -> pack -> H2D chain on a side stream, reading the ``cu_seqlens`` where the Prefetcher put
    them; the pack a native host function where the C pack
    was built, so it takes no GIL from the loop; with ``Config.deferred_prepare``, the default, its
    backend calls are made by the runtime's submission thread), and every ``verify_every`` steps the metadata it
    produced is fetched asynchronously and checked against the numpy oracle.
    Nothing in the loop waits for the GPU (on the simulator, where CPU torch
    computes on the host, hand-offs wait on the host instead of a stream).
(c) (b) with the training step (forward, backward, optimizer) captured into a
    CUDA graph after ``warmup`` eager steps and replayed on static input
    buffers (static shapes: every batch is padded to the token budget).
(d) the whole step in one ``torch.cuda.graph``, replayed once per step: the
    workspace prepare with its host pack (recorded into torch's capture),
    forward, backward, optimizer, the loss to the host, a host function that
    stages the next batch in pinned memory, and that batch's copy into the
    static buffers beside the optimizer. The host only makes the batch and
    replays (see :class:`_WholeStep`).
(c) and (d) need CUDA: they are skipped on CPU.

On CPU (``--device cpu``, CI) streamrt runs on its simulator and CPU torch
computes on tensors that alias the simulated device's memory (see
``streamrt.torch``): the same streamrt code path as on a GPU.

    python demos/train_loop.py --device cpu --reduced          # CI size, a few seconds
    python demos/train_loop.py --device cuda --steps 200       # the full form on a GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import streamrt as srt
import streamrt.torch as st
from streamrt.recipes.fmha_bwd import parse_metadata, workspace_size

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the modules beside this file
from train_common import (  # noqa: E402
    PACK,
    MetadataCheck,
    Result,
    StepHook,
    Steps,
    drive,
    host_copies,
    num_cus,
    pack_on_this_thread,
    span,
    wait,
    workspace,
)
from train_model import (  # noqa: E402
    FULL,
    IGNORE,
    REDUCED,
    Config,
    VarlenLM,
    build,
    step_body,
    synthetic_batches,
    train_step,
)
from train_whole_step import run_whole_graph, whole_graph_steps  # noqa: E402

__all__ = [
    "FULL", "PACK", "REDUCED", "VARIANTS", "Config", "MetadataCheck", "Result", "Steps", "compare", "drive", "main", "plain_steps",
    "run_plain", "run_streamrt", "run_whole_graph", "streamrt_steps", "synthetic_batches", "whole_graph_steps",
]

VARIANTS = ("a", "b", "c", "d")


# -- variant (a): plain torch ----------------------------------------------------------------------------------------


def run_plain(cfg: Config, device: torch.device, *, rt: srt.Runtime | None = None, on_step: StepHook | None = None) -> Result:
    """(a): ``.to(device)`` copies, ``loss.item()`` each step, the metadata prepared through the host.

    ``rt`` is used only to put the step on a streamrt trace (the bench's timeline).
    """
    return drive(plain_steps(cfg, device, rt=rt), on_step)


def plain_steps(cfg: Config, device: torch.device, *, rt: srt.Runtime | None = None) -> Steps:
    """:func:`run_plain`'s loop, step by step (see :data:`Steps`)."""
    model, opt = build(cfg, device)
    params = cfg.workspace_params(num_cus(device))
    region = params.metadata_region_bytes
    ws = torch.zeros(workspace_size(params), dtype=torch.uint8, device=device)
    meta_host = np.zeros(region, dtype=np.uint8)
    losses: list[float] = []
    t0 = time.perf_counter()
    for step, host in enumerate(synthetic_batches(cfg)):
        tokens = wait(rt, "tokens.to(device)", host["tokens"].to, device)
        targets = wait(rt, "targets.to(device)", host["targets"].to, device)
        cu = wait(rt, "cu_seqlens.to(device)", host["cu_seqlens"].to, device)
        if cfg.prepare:  # the old prepare: seqstart to the host (a blocking D2H), pack, back
            cu_host = wait(rt, "cu_seqlens.cpu()", cu.cpu).numpy()
            pack_on_this_thread(params, cu_host, cu_host, out=meta_host)
            used = parse_metadata(params, meta_host).dq_acc_zero_bytes
            ws[region : region + used].zero_()
            wait(rt, "metadata.to(device)", ws[:region].copy_, torch.from_numpy(meta_host))
        loss = span(rt, "fwd+bwd+step", train_step, model, opt, tokens, targets, cu)
        losses.append(wait(rt, "loss.item()", loss.item))
        yield step
    return Result("a", losses, time.perf_counter() - t0)


# -- variants (b) and (c): streamrt ------------------------------------------------------------------------------------


class _GraphStep:
    """(c)'s captured training step: static inputs, one CUDA graph, replayed per step."""

    def __init__(self, cfg: Config, model: VarlenLM, opt: torch.optim.Optimizer, device: torch.device) -> None:
        self.model, self.opt = model, opt
        self.tokens = torch.zeros(cfg.token_budget, dtype=torch.int64, device=device)
        self.targets = torch.full((cfg.token_budget,), IGNORE, dtype=torch.int64, device=device)
        self.cu = torch.zeros(cfg.seqs + 1, dtype=torch.int32, device=device)
        self.graph: Any = None
        self.loss: torch.Tensor | None = None
        self.side = torch.cuda.Stream(device)

    def eager_warmup(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """One eager step on a side stream (torch wants a few before capturing); same math as (b)."""
        cur = torch.cuda.current_stream()
        self.side.wait_stream(cur)
        with torch.cuda.stream(self.side):
            loss = train_step(self.model, self.opt, batch["tokens"], batch["targets"], batch["cu_seqlens"])
        cur.wait_stream(self.side)
        for t in (loss, *batch.values()):
            t.record_stream(cur)
        return loss

    def __call__(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.tokens.copy_(batch["tokens"])
        self.targets.copy_(batch["targets"])
        self.cu.copy_(batch["cu_seqlens"])
        if self.graph is None:
            self.opt.zero_grad(set_to_none=True)
            self.graph = torch.cuda.CUDAGraph()
            # thread_local: streamrt's completion threads keep waiting on events during the capture
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.loss = step_body(self.model, self.opt, self.tokens, self.targets, self.cu)
        self.graph.replay()
        assert self.loss is not None
        return self.loss


def run_streamrt(
    cfg: Config,
    device: torch.device,
    rt: srt.Runtime,
    *,
    graph: bool = False,
    on_step: StepHook | None = None,
    sink: Callable[[int, Any], Any] | None = None,
) -> Result:
    """(b), or (c) with ``graph=True``: prefetch, async metrics, the stream-async metadata prepare."""
    return drive(streamrt_steps(cfg, device, rt, graph=graph, sink=sink), on_step)


def streamrt_steps(
    cfg: Config, device: torch.device, rt: srt.Runtime, *, graph: bool = False, sink: Callable[[int, Any], Any] | None = None
) -> Steps:
    """:func:`run_streamrt`'s loop, step by step (see :data:`Steps`)."""
    if graph and device.type != "cuda":
        raise ValueError("variant (c) captures a CUDA graph: it needs --device cuda")
    variant = "c" if graph else "b"
    model, opt = build(cfg, device)
    seq = st.device_empty(rt, cfg.seqs + 1, torch.int32)  # the prepare's own seqstart: each launch reads the batch's
    seq.zero_()
    params, ws, prep = workspace(cfg, device, rt, seq)
    meta = ws[: params.metadata_region_bytes]  # the fetched metadata: one view for the whole loop
    check = MetadataCheck(params)
    host_cu: deque[np.ndarray] = deque()
    # (c)'s loss is the graph's static output, which the next replay overwrites: copied out every step.
    logger = st.MetricsLogger(rt, lag=cfg.lag, sink=sink, group=1 if graph else cfg.log_group)
    stepper = _GraphStep(cfg, model, opt, device) if graph else None
    prev: tuple[int, Any, np.ndarray] | None = None  # (step, Run, host cu_seqlens) of the last prepare
    notes: list[str] = []
    t0 = time.perf_counter()
    with st.Prefetcher(host_copies(synthetic_batches(cfg), host_cu), rt, depth=cfg.depth, group=cfg.prefetch_group) as batches:
        for step, batch in enumerate(batches):
            cu_host = host_cu.popleft()
            if prep is not None:
                current = st.current_stream(rt)
                if prev is not None:
                    # The previous prepare read its batch's cu_seqlens and wrote the metadata: order torch
                    # after it (one step later it has long finished: the wait costs nothing).
                    prev_step, prev_run, prev_cu = prev
                    st.order_after(rt, prev_run, current)
                    if prev_step % cfg.verify_every == 0:
                        check.add(prev_step, prev_cu, st.fetch(rt, meta, current))
                if cfg.prepare_strategy == "fork_graph":  # a captured prepare reads the buffer it was built with
                    seq.copy_(batch["cu_seqlens"])
                    run = prep.launch(current, "fork_graph", join=False)
                else:  # it reads the batch's cu_seqlens where the Prefetcher put them (the Run keeps them)
                    cu = st.tensor_buffer(rt, batch["cu_seqlens"])
                    run = prep.launch(current, "fork", seqstart_q=cu, seqstart_k=cu, join=False, deferred=cfg.deferred_prepare)
                prev = (step, run, cu_host)
            if stepper is None:
                loss = span(rt, "fwd+bwd+step", train_step, model, opt, batch["tokens"], batch["targets"], batch["cu_seqlens"])
            elif step < cfg.warmup:
                loss = span(rt, "warmup step", stepper.eager_warmup, batch)
            else:
                loss = span(rt, "graph replay", stepper, batch)
            logger.log(step, loss)
            yield step
        pstats = batches.statistics()
    if prev is not None:
        prev_step, prev_run, prev_cu = prev
        prev_run.result()
        if prev_step % cfg.verify_every == 0:
            check.add(prev_step, prev_cu, st.fetch(rt, meta))
    logger.flush()
    check.verify()
    seconds = time.perf_counter() - t0
    if prep is not None:
        prep.close()
    if graph:
        notes.append(f"graph captured at step {cfg.warmup} after {cfg.warmup} eager warm-up steps")
    losses = [float(v) for _s, v in logger.records]
    stats = {"metrics": dataclasses.asdict(logger.statistics()), "prefetch": dataclasses.asdict(pstats)}
    return Result(variant, losses, seconds, check.verified, notes, stats)


# -- running and comparing ----------------------------------------------------------------------------------------------


def open_runtime_for(device: torch.device, backend: str | None = None, **options: Any) -> srt.Runtime:
    """The runtime next to torch: the simulator for CPU torch, a GPU backend on torch's device.

    ``options`` go to :func:`streamrt.open_runtime`.
    """
    if backend is None:
        backend = "sim" if device.type == "cpu" else "auto"
    index = device.index if device.type == "cuda" and device.index is not None else 0
    rt = srt.open_runtime(backend, index if backend != "sim" else 0, **options)
    if device.type == "cuda" and rt.capabilities.is_simulated:
        rt.close()
        raise RuntimeError("CUDA torch needs a GPU runtime (cuda or hip), not the simulator")
    return rt


def run_variant(
    variant: str, cfg: Config, device: str | torch.device = "cpu", *, backend: str | None = None, sink: Callable[[int, Any], Any] | None = None
) -> Result | None:
    """Run one variant; ``None`` for (c) and (d) on CPU (they capture CUDA graphs).

    ``sink(step, loss)`` sees (b)'s and (c)'s losses as they are logged (``MetricsLogger``).
    """
    dev = torch.device(device)
    if variant == "a":
        return run_plain(cfg, dev)
    if variant in ("c", "d") and dev.type != "cuda":
        return None
    with open_runtime_for(dev, backend) as rt:
        if variant == "d":
            return run_whole_graph(cfg, dev, rt)
        return run_streamrt(cfg, dev, rt, graph=variant == "c", sink=sink)


def compare(results: list[Result], *, rtol: float, atol: float) -> list[str]:
    """Differences between the variants' losses beyond the tolerance (empty when they agree)."""
    problems = []
    ref = results[0]
    for r in results[1:]:
        if len(r.losses) != len(ref.losses):
            problems.append(f"({r.variant}) logged {len(r.losses)} losses, ({ref.variant}) {len(ref.losses)}")
            continue
        a, b = np.asarray(ref.losses), np.asarray(r.losses)
        bad = np.flatnonzero(~np.isclose(a, b, rtol=rtol, atol=atol))
        if bad.size:
            i = int(bad[0])
            problems.append(f"({r.variant}) differs from ({ref.variant}) at step {i}: {b[i]:.6f} vs {a[i]:.6f} ({bad.size} steps differ)")
    return problems


def tolerances(device: torch.device) -> tuple[float, float]:
    """(rtol, atol) for comparing losses: CPU kernels are deterministic; GPU attention backward is not bitwise."""
    return (1e-5, 1e-6) if device.type == "cpu" else (2e-3, 2e-3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: 200, or 12 with --reduced)")
    ap.add_argument("--reduced", action="store_true", help="the CI size: a tiny model, a few steps")
    ap.add_argument("--variants", default="a,b,c,d", help="comma-separated subset of a,b,c,d")
    ap.add_argument("--backend", default=None, help="streamrt backend (default: sim for cpu, auto for cuda)")
    ap.add_argument("--no-prepare", action="store_true", help="leave out the FMHA workspace prepare")
    ap.add_argument("--print-losses", action="store_true", help="print each variant's losses as they are logged")
    args = ap.parse_args(argv)
    cfg = REDUCED if args.reduced else FULL
    if args.steps is not None:
        cfg = dataclasses.replace(cfg, steps=args.steps)
    if args.no_prepare:
        cfg = dataclasses.replace(cfg, prepare=False)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("--device cuda: torch has no CUDA device here", file=sys.stderr)
        return 2
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v!r}")
    print(
        f"model: {cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads, vocab {cfg.vocab}; "
        f"{cfg.seqs} sequences of {cfg.min_seqlen}-{cfg.max_seqlen} tokens per batch, budget {cfg.token_budget}; "
        f"{cfg.steps} steps on {device}"
    )
    results: list[Result] = []
    for v in variants:
        sink = (lambda step, value, v=v: print(f"  ({v}) step {step}: loss {value:.4f}")) if args.print_losses else None
        try:
            res = run_variant(v, cfg, device, backend=args.backend, sink=sink)
        except srt.CaptureError as exc:  # (d) where streamrt was built without its C extension
            print(f"({v}) skipped: {exc}")
            continue
        if res is None:
            print(f"({v}) skipped: capturing the step into a CUDA graph needs --device cuda")
            continue
        if v == "d" and sink is not None:  # (d) logs its losses from the graph, not through a MetricsLogger
            for step, value in enumerate(res.losses):
                sink(step, value)
        results.append(res)
        extra = f"; metadata verified at steps {res.verified_steps}" if res.verified_steps else ""
        print(f"({v}) {len(res.losses)} steps in {res.seconds:.2f} s; loss {res.losses[0]:.4f} -> {res.losses[-1]:.4f}{extra}")
        for note in res.notes:
            print(f"    {note}")
    if len(results) > 1:
        rtol, atol = tolerances(device)
        problems = compare(results, rtol=rtol, atol=atol)
        for p in problems:
            print("MISMATCH:", p)
        if problems:
            return 1
        print(f"all variants agree on every loss (rtol {rtol}, atol {atol})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
