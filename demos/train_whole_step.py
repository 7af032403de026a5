"""Variant (d) of the training-loop demo: the whole step, prepare included, in one ``torch.cuda.graph``.

The host makes the batch and replays; everything else is a node of the graph (see :class:`_WholeStep`).
``train_loop.py`` runs it beside the other variants.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np
import torch

import streamrt as srt
import streamrt.torch as st
from streamrt.recipes.fmha_bwd import WorkspacePrepare
from train_common import MetadataCheck, Result, StepHook, Steps, drive, host_copies, span, workspace
from train_model import Config, VarlenLM, backward, build, forward_loss, synthetic_batches

__all__ = ["run_whole_graph", "whole_graph_steps"]


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
    params, ws, prep = workspace(cfg, device, rt, _carve(block, cfg)["cu_seqlens"])
    meta = ws[: params.metadata_region_bytes]  # the fetched metadata: one view for the whole loop
    whole = _WholeStep(cfg, model, opt, rt, prep, block)
    check = MetadataCheck(params)
    host_cu: list[np.ndarray] = []
    spent = np.zeros(5)  # making the batch, the replay, the rest, and of the rest the fetches and the polls
    t0 = time.perf_counter()
    batches = host_copies(synthetic_batches(cfg), host_cu)
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
            span(rt, "warmup step" if step < cfg.warmup else "graph replay", whole, step)
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
