"""A small varlen transformer trained four ways: plain torch, streamrt, and two captured forms.

The model, its data and its sizes are in ``train_model.py`` beside this file.

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
    D2H -> pack -> H2D chain on a side stream; the pack a native host function where the C pack
    was built, so it takes no GIL from the loop), and every ``verify_every`` steps the metadata it
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
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import streamrt as srt
import streamrt.torch as st
from streamrt.recipes.fmha_bwd import (
    WorkspaceParams,
    WorkspacePrepare,
    native_pack_available,
    pack_metadata,
    pack_metadata_native,
    parse_metadata,
    reference_metadata,
    workspace_size,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # train_model.py, beside this file
from train_model import (  # noqa: E402
    FULL,
    IGNORE,
    REDUCED,
    Config,
    VarlenLM,
    backward,
    build,
    forward_loss,
    step_body,
    synthetic_batches,
    train_step,
)

__all__ = [
    "FULL", "REDUCED", "VARIANTS", "Config", "Result", "Steps", "compare", "drive", "main", "plain_steps", "run_plain", "run_streamrt",
    "run_whole_graph", "streamrt_steps", "synthetic_batches", "whole_graph_steps",
]

VARIANTS = ("a", "b", "c", "d")

#: The host pack both ways use: the C one where it was built (no GIL while it runs), else numpy.
PACK = "native" if native_pack_available() else "python"
_pack_on_this_thread = pack_metadata_native if PACK == "native" else pack_metadata


# -- helpers shared by the variants ------------------------------------------------------------------------------------


@dataclass
class Result:
    """What one variant produced."""

    variant: str
    losses: list[float]
    seconds: float
    verified_steps: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)


StepHook = Callable[[int], None]

#: A variant's loop as a generator: it yields each step's index once the step is enqueued and returns
#: the :class:`Result`. A benchmark can so run several variants in turns, a few steps each.
Steps = Generator[int, None, Result]


def drive(steps: Steps, on_step: StepHook | None = None) -> Result:
    """Run a variant's loop to its end, calling ``on_step(step)`` after each step; its Result."""
    while True:
        try:
            step = next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        if on_step is not None:
            on_step(step)


def _span(rt: srt.Runtime | None, name: str, fn: Callable[..., Any], *args: Any) -> Any:
    """torch work as a span on streamrt's timeline while ``rt`` is traced (else just ``fn(*args)``)."""
    return fn(*args) if rt is None else st.trace_torch(rt, name, fn, *args)


def _wait(rt: srt.Runtime | None, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """A host-blocking call, recorded as such while ``rt`` is traced."""
    return fn(*args) if rt is None else st.trace_host_wait(rt, what, fn, *args)


def _num_cus(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 132  # the simulated H200


def _host_copies(batches: Iterator[dict[str, torch.Tensor]], keep: deque[np.ndarray] | list[np.ndarray]) -> Iterator[dict[str, torch.Tensor]]:
    """Pass batches through, keeping a host copy of each ``cu_seqlens`` (for the metadata check)."""
    for b in batches:
        keep.append(b["cu_seqlens"].numpy().copy())
        yield b


class _MetadataCheck:
    """Checks fetched workspace metadata against the numpy oracle without slowing the loop.

    In the loop, :meth:`add` collects the copies that have landed only once
    more than ``depth`` are pending (never blocking): nothing needs a result
    sooner, and a host that runs many steps ahead of the GPU (29 replays at
    size s) would otherwise poll a copy still in flight on almost every step.
    The comparison with the (slow, pure-Python) oracle runs in :meth:`verify`,
    after the loop, so it is not part of the measured steps.
    """

    def __init__(self, params: WorkspaceParams, depth: int = 4) -> None:
        self.params = params
        self.depth = depth
        self.pending: deque[tuple[int, np.ndarray, st.FetchFuture]] = deque()
        self.landed: list[tuple[int, np.ndarray, np.ndarray]] = []
        self.verified: list[int] = []

    def add(self, step: int, cu: np.ndarray, fut: st.FetchFuture) -> None:
        self.pending.append((step, cu, fut))
        if len(self.pending) > self.depth:
            self.poll()

    def poll(self, *, block: bool = False) -> None:
        while self.pending and (block or self.pending[0][2].is_done):
            step, cu, fut = self.pending.popleft()
            self.landed.append((step, cu, fut.result()))

    def verify(self) -> None:
        """Wait for every copy and compare each with the oracle; ``AssertionError`` on a difference."""
        self.poll(block=True)
        for step, cu, got in self.landed:
            if not np.array_equal(got, reference_metadata(self.params, cu, cu)):
                raise AssertionError(f"workspace metadata of step {step} differs from the reference")
            self.verified.append(step)
        self.landed.clear()


# -- variant (a): plain torch ----------------------------------------------------------------------------------------


def run_plain(cfg: Config, device: torch.device, *, rt: srt.Runtime | None = None, on_step: StepHook | None = None) -> Result:
    """(a): ``.to(device)`` copies, ``loss.item()`` each step, the metadata prepared through the host.

    ``rt`` is used only to put the step on a streamrt trace (the bench's timeline).
    """
    return drive(plain_steps(cfg, device, rt=rt), on_step)


def plain_steps(cfg: Config, device: torch.device, *, rt: srt.Runtime | None = None) -> Steps:
    """:func:`run_plain`'s loop, step by step (see :data:`Steps`)."""
    model, opt = build(cfg, device)
    params = cfg.workspace_params(_num_cus(device))
    region = params.metadata_region_bytes
    ws = torch.zeros(workspace_size(params), dtype=torch.uint8, device=device)
    meta_host = np.zeros(region, dtype=np.uint8)
    losses: list[float] = []
    t0 = time.perf_counter()
    for step, host in enumerate(synthetic_batches(cfg)):
        tokens = _wait(rt, "tokens.to(device)", host["tokens"].to, device)
        targets = _wait(rt, "targets.to(device)", host["targets"].to, device)
        cu = _wait(rt, "cu_seqlens.to(device)", host["cu_seqlens"].to, device)
        if cfg.prepare:  # the old prepare: seqstart to the host (a blocking D2H), pack, back
            cu_host = _wait(rt, "cu_seqlens.cpu()", cu.cpu).numpy()
            _pack_on_this_thread(params, cu_host, cu_host, out=meta_host)
            used = parse_metadata(params, meta_host).dq_acc_zero_bytes
            ws[region : region + used].zero_()
            _wait(rt, "metadata.to(device)", ws[:region].copy_, torch.from_numpy(meta_host))
        loss = _span(rt, "fwd+bwd+step", train_step, model, opt, tokens, targets, cu)
        losses.append(_wait(rt, "loss.item()", loss.item))
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


def _workspace(cfg: Config, device: torch.device, rt: srt.Runtime, seq: torch.Tensor) -> tuple[WorkspaceParams, torch.Tensor, WorkspacePrepare | None]:
    """The workspace (zeroed) and its prepare over ``seq`` (``None`` without ``cfg.prepare``).

    Device memory of the runtime: torch CUDA tensors, or simulator memory aliased by CPU tensors.
    """
    params = cfg.workspace_params(_num_cus(device))
    ws = st.device_empty(rt, workspace_size(params), torch.uint8)
    ws.zero_()
    prep = WorkspacePrepare(rt, params, seq, seq, ws, pack=PACK) if cfg.prepare else None
    return params, ws, prep


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
    seq = st.device_empty(rt, cfg.seqs + 1, torch.int32)
    seq.zero_()
    params, ws, prep = _workspace(cfg, device, rt, seq)
    meta = ws[: params.metadata_region_bytes]  # the fetched metadata: one view for the whole loop
    check = _MetadataCheck(params)
    host_cu: deque[np.ndarray] = deque()
    # (c)'s loss is the graph's static output, which the next replay overwrites: copied out every step.
    logger = st.MetricsLogger(rt, lag=cfg.lag, sink=sink, group=1 if graph else cfg.log_group)
    stepper = _GraphStep(cfg, model, opt, device) if graph else None
    prev: tuple[int, Any, np.ndarray] | None = None  # (step, Run, host cu_seqlens) of the last prepare
    notes: list[str] = []
    t0 = time.perf_counter()
    with st.Prefetcher(_host_copies(synthetic_batches(cfg), host_cu), rt, depth=cfg.depth, group=cfg.prefetch_group) as batches:
        for step, batch in enumerate(batches):
            cu_host = host_cu.popleft()
            if prep is not None:
                current = st.current_stream(rt)
                if prev is not None:
                    # The previous prepare read `seq` and wrote the metadata: order torch after it
                    # (one step later it has long finished: the wait costs nothing).
                    prev_step, prev_run, prev_cu = prev
                    st.order_after(rt, prev_run, current)
                    if prev_step % cfg.verify_every == 0:
                        check.add(prev_step, prev_cu, st.fetch(rt, meta, current))
                seq.copy_(batch["cu_seqlens"])
                prev = (step, prep.launch(current, cfg.prepare_strategy, join=False), cu_host)
            if stepper is None:
                loss = _span(rt, "fwd+bwd+step", train_step, model, opt, batch["tokens"], batch["targets"], batch["cu_seqlens"])
            elif step < cfg.warmup:
                loss = _span(rt, "warmup step", stepper.eager_warmup, batch)
            else:
                loss = _span(rt, "graph replay", stepper, batch)
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


# -- variant (d): the whole step in one torch.cuda.graph -------------------------------------------------------------


def _batch_layout(cfg: Config) -> tuple[list[tuple[str, torch.dtype, int, int]], int]:
    """Where ``cu_seqlens``, ``tokens`` and ``targets`` sit in one block: (name, dtype, offset, bytes) each
    (16-byte aligned), and the block's size."""
    fields, offset = [], 0
    for name, dtype, n in (("cu_seqlens", torch.int32, cfg.seqs + 1), ("tokens", torch.int64, cfg.token_budget), ("targets", torch.int64, cfg.token_budget)):
        nbytes = n * dtype.itemsize
        fields.append((name, dtype, offset, nbytes))
        offset += -(-nbytes // 16) * 16
    return fields, offset


def _carve(block: torch.Tensor, cfg: Config) -> dict[str, torch.Tensor]:
    """The batch's tensors as views of the uint8 ``block`` (see :func:`_batch_layout`)."""
    return {name: block[offset : offset + nbytes].view(dtype) for name, dtype, offset, nbytes in _batch_layout(cfg)[0]}


class _Feed:
    """(d)'s input on the host: batches the loop queued, staged into pinned memory in stream order.

    It runs as a host function recorded into the graph, so it holds no reference to the graph
    (the graph keeps it alive: a reference back would be a cycle no collector sees).
    """

    def __init__(self, staging: dict[str, torch.Tensor]) -> None:
        self.views = {k: t.numpy() for k, t in staging.items()}
        self.pending: deque[dict[str, torch.Tensor]] = deque()

    def stage(self, batch: dict[str, torch.Tensor]) -> None:
        for k, view in self.views.items():
            np.copyto(view, batch[k].numpy())

    def __call__(self) -> None:
        if self.pending:
            self.stage(self.pending.popleft())


class _LossLog:
    """(d)'s losses: a host function recorded into the graph reads the pinned loss of each replay."""

    def __init__(self, pinned: torch.Tensor) -> None:
        self.view = pinned.numpy()
        self.losses: list[float] = []

    def __call__(self) -> None:
        self.losses.append(float(self.view))


class _WholeStep:
    """(d)'s step: one function, run eagerly for the warm-up steps and then captured whole.

    In stream order on ``cap`` (a torch stream; torch's capture stream), forward, backward and
    optimizer on the batch in the static buffers, with forks joined at the end of the step: the
    workspace prepare on ``prep`` (memset ∥ D2H → pack → H2D, recorded into torch's capture); on
    ``feed``, a host function that stages the next batch into pinned memory and, once the backward
    and the prepare have read this batch for the last time, the next batch's H2D into the static
    buffers, which runs beside the optimizer instead of before the next forward; after the
    forward, the loss's D2H and a host function that logs it on ``out``. Eager or replayed the
    order is the same, so neither the staging nor the static buffers are written while something
    reads them, and the losses are logged in step order. The first batch is copied in before the
    first step (:func:`whole_graph_steps`).
    """

    def __init__(self, cfg: Config, model: VarlenLM, opt: torch.optim.Optimizer, rt: srt.Runtime, prep: WorkspacePrepare | None, block: torch.Tensor) -> None:
        self.model, self.opt, self.prep, self.warmup = model, opt, prep, cfg.warmup
        self.block, self.static = block, _carve(block, cfg)
        self.pinned = torch.empty(block.shape, dtype=torch.uint8, pin_memory=True)
        self.feed = _Feed(_carve(self.pinned, cfg))
        self.loss_host = torch.zeros((), dtype=torch.float32, pin_memory=True)
        self.log = _LossLog(self.loss_host)
        self.cap, self.prep_side, self.feed_side, self.out_side = (torch.cuda.Stream(block.device) for _ in range(4))
        self.s_prep, self.s_feed, self.s_out = (rt.wrap_stream(x) for x in (self.prep_side, self.feed_side, self.out_side))
        self.graph: Any = None

    def _body(self) -> None:
        cap = self.cap
        self.prep_side.wait_stream(cap)
        self.feed_side.wait_stream(cap)
        if self.prep is not None:
            self.prep.launch(self.s_prep)
        self.s_feed.launch_host_func(self.feed)  # the last H2D from the staging was the previous step's
        loss = forward_loss(self.model, self.static["tokens"], self.static["targets"], self.static["cu_seqlens"])
        self.out_side.wait_stream(cap)
        with torch.cuda.stream(self.out_side):
            self.loss_host.copy_(loss.detach(), non_blocking=True)
        self.s_out.launch_host_func(self.log)
        backward(loss)
        self.feed_side.wait_stream(cap)  # the backward has read this batch, and the prepare its cu_seqlens
        self.feed_side.wait_stream(self.prep_side)
        with torch.cuda.stream(self.feed_side):
            self.block.copy_(self.pinned, non_blocking=True)  # the next batch, beside the optimizer
        self.opt.step()
        for side in (self.prep_side, self.feed_side, self.out_side):
            cap.wait_stream(side)

    def __call__(self, step: int) -> None:
        """Step ``step`` on ``cap`` (torch's current stream): eager before ``warmup``, then the graph."""
        if step < self.warmup:
            self.opt.zero_grad(set_to_none=True)
            self._body()
            return
        if self.graph is None:
            self.opt.zero_grad(set_to_none=True)
            self.graph = torch.cuda.CUDAGraph()
            # thread_local: streamrt's completion threads keep waiting on events during the capture
            with torch.cuda.graph(self.graph, stream=self.cap, capture_error_mode="thread_local"):
                self._body()
        self.graph.replay()


def run_whole_graph(cfg: Config, device: torch.device, rt: srt.Runtime, *, on_step: StepHook | None = None) -> Result:
    """(d): the whole step, prepare included, in one ``torch.cuda.graph`` (see :class:`_WholeStep`).

    ``stats["host_us_per_step"]``: the host's mean time per replayed step, split into making the
    batch, the replay, and the rest (queueing the batch for the feed, the verification fetches,
    collecting them), with the rest's ``fetch`` and ``poll`` (the collecting) also on their own.
    """
    return drive(whole_graph_steps(cfg, device, rt), on_step)


def whole_graph_steps(cfg: Config, device: torch.device, rt: srt.Runtime) -> Steps:
    """:func:`run_whole_graph`'s loop, step by step (see :data:`Steps`). It runs its steps on its own
    stream: a driver that interleaves variants must restore torch's current stream between turns."""
    if device.type != "cuda":
        raise ValueError("variant (d) captures the step into a CUDA graph: it needs --device cuda")
    model, opt = build(cfg, device)
    block = st.device_empty(rt, _batch_layout(cfg)[1], torch.uint8)  # the static batch: cu_seqlens | tokens | targets
    block.zero_()
    params, ws, prep = _workspace(cfg, device, rt, _carve(block, cfg)["cu_seqlens"])
    meta = ws[: params.metadata_region_bytes]  # the fetched metadata: one view for the whole loop
    whole = _WholeStep(cfg, model, opt, rt, prep, block)
    check = _MetadataCheck(params)
    host_cu: list[np.ndarray] = []
    spent = np.zeros(5)  # making the batch, the replay, the rest, and of the rest the fetches and the polls
    t0 = time.perf_counter()
    batches = _host_copies(synthetic_batches(cfg), host_cu)
    whole.cap.wait_stream(torch.cuda.current_stream(device))  # the weights and buffers made above
    with torch.cuda.stream(whole.cap):
        first = next(batches, None)
        if first is not None:
            whole.feed.stage(first)  # nothing reads the staging yet
            whole.block.copy_(whole.pinned, non_blocking=True)  # each step copies in the next batch
        for step in range(cfg.steps if first is not None else 0):
            t_a = time.perf_counter()
            nxt = next(batches, None)
            t_b = time.perf_counter()
            if nxt is not None:
                whole.feed.pending.append(nxt)
            t_c = time.perf_counter()
            _span(rt, "warmup step" if step < cfg.warmup else "graph replay", whole, step)
            t_d = time.perf_counter()
            fut = st.fetch(rt, meta) if prep is not None and step % cfg.verify_every == 0 else None  # before the next step rewrites it
            t_e = time.perf_counter()
            if fut is not None:
                check.add(step, host_cu[step], fut)
            if step > cfg.warmup:
                t_f = time.perf_counter()
                spent += (t_b - t_a, t_d - t_c, (t_c - t_b) + (t_f - t_d), t_e - t_d, t_f - t_e)
            yield step
        whole.cap.synchronize()
    check.verify()
    seconds = time.perf_counter() - t0
    if prep is not None:
        prep.close()
    replayed = max(cfg.steps - cfg.warmup - 1, 1)
    batch_us, replay_us, rest_us, fetch_us, poll_us = (spent * 1e6 / replayed).tolist()
    stats = {"host_us_per_step": {"batch": batch_us, "replay": replay_us, "rest": rest_us, "fetch": fetch_us, "poll": poll_us}}
    notes = [f"the whole step captured at step {cfg.warmup} after {cfg.warmup} eager steps; host per replayed step: replay {replay_us:.1f} µs, rest {rest_us:.1f} µs"]
    return Result("d", whole.log.losses, seconds, check.verified, notes, stats)


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
