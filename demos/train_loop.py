"""A small varlen transformer trained three ways: plain torch, streamrt, streamrt + a captured step.

The model is a decoder-only transformer over *packed* variable-length
sequences: each batch holds ``seqs`` sequences of random length packed into
a fixed token budget, described by ``cu_seqlens`` (int32, ``seqs + 1``
prefix sums, the varlen convention of FlashAttention and the FMHA backward).
Attention is torch's ``scaled_dot_product_attention`` with a block-diagonal
causal mask built on the device from ``cu_seqlens`` (padding + mask: the
portable form of varlen attention). The data is a synthetic token stream
(arithmetic progressions modulo the vocabulary with some noise, fixed seed),
so the loss falls quickly from ``ln(vocab)``.

Variants (same data, same initial weights, same optimizer, so the same losses):

(a) plain torch: ``.to(device)`` copies of each batch, ``loss.item()`` every
    step, and the FMHA workspace metadata prepared the old way (``cu_seqlens``
    copied to the host, packed, copied back): the host waits for the GPU
    several times per step. The pack is the recipe's C pack where it was built
    (``PACK``), as in (b), so the two differ in how they wait, not in how they pack.
(b) streamrt: a :class:`~streamrt.torch.Prefetcher` stages the next batches on
    a side stream and hands them over with events; a
    :class:`~streamrt.torch.MetricsLogger` logs each loss two steps late; the
    seed's workspace prepare pipeline (:mod:`streamrt.recipes.fmha_bwd`) runs
    every step on the step's ``cu_seqlens`` (fork policy: the D2H -> pack -> H2D
    chain on a side stream; the pack a native host function where the C pack
    was built, so it takes no GIL from the loop), and every ``verify_every`` steps the metadata it
    produced is fetched asynchronously and checked against the numpy oracle.
    Nothing in the loop waits for the GPU (on the simulator, where CPU torch
    computes on the host, hand-offs wait on the host instead of a stream).
(c) (b) with the training step (forward, backward, optimizer) captured into a
    CUDA graph after ``warmup`` eager steps and replayed on static input
    buffers (static shapes: every batch is padded to the token budget).
    Needs CUDA: skipped on CPU.

On CPU (``--device cpu``, CI) streamrt runs on its simulator and CPU torch
computes on tensors that alias the simulated device's memory (see
``streamrt.torch``): the same streamrt code path as on a GPU.

    python demos/train_loop.py --device cpu --reduced          # CI size, a few seconds
    python demos/train_loop.py --device cuda --steps 200       # the full form on a GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

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

VARIANTS = ("a", "b", "c")
IGNORE = -100


#: The host pack both ways use: the C one where it was built (no GIL while it runs), else numpy.
PACK = "native" if native_pack_available() else "python"
_pack_on_this_thread = pack_metadata_native if PACK == "native" else pack_metadata


# -- configuration -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """Model, data and loop sizes. ``token_budget`` is the padded length of every batch."""

    vocab: int = 256
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 2
    seqs: int = 16
    min_seqlen: int = 8
    max_seqlen: int = 128
    steps: int = 200
    lr: float = 3e-3
    seed: int = 0
    lag: int = 2
    depth: int = 2
    verify_every: int = 10
    warmup: int = 3
    prepare: bool = True

    @property
    def token_budget(self) -> int:
        return -(-self.seqs * self.max_seqlen // 64) * 64

    def workspace_params(self, num_cus: int) -> WorkspaceParams:
        return WorkspaceParams(
            batch=self.seqs,
            nhead=self.n_heads,
            hdim_q=self.d_model // self.n_heads,
            kM0=64,
            kN0=64,
            num_cus=num_cus,
            deterministic=True,
            max_seqlen_q=self.max_seqlen,
            max_seqlen_k=self.max_seqlen,
            total_q_padded=self.token_budget,
        )


FULL = Config()
REDUCED = Config(vocab=64, d_model=32, n_heads=2, n_layers=1, seqs=4, min_seqlen=2, max_seqlen=16, steps=12, verify_every=4, warmup=2)


# -- data ----------------------------------------------------------------------------------------------------


def synthetic_batches(cfg: Config, steps: int | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """``steps`` packed varlen batches (CPU tensors): ``tokens``, ``targets`` (int64, ``token_budget``)
    and ``cu_seqlens`` (int32, ``seqs + 1``). Deterministic in ``cfg.seed``.

    Sequence ``i`` is ``(start_i + stride_i * t) mod vocab`` with 5% of tokens replaced at
    random; the target of a token is the next token of its sequence (``-100`` at the end of
    a sequence and in the padding).
    """
    rng = np.random.default_rng(cfg.seed)
    n = cfg.steps if steps is None else steps
    budget = cfg.token_budget
    for _ in range(n):
        lengths = rng.integers(cfg.min_seqlen, cfg.max_seqlen + 1, size=cfg.seqs)
        cu = np.zeros(cfg.seqs + 1, dtype=np.int32)
        np.cumsum(lengths, out=cu[1:])
        total = int(cu[-1])
        seq = np.repeat(np.arange(cfg.seqs), lengths)
        pos = np.arange(total) - cu[seq]
        start = rng.integers(0, cfg.vocab, size=cfg.seqs)
        stride = rng.integers(1, 4, size=cfg.seqs)
        tok = (start[seq] + stride[seq] * pos) % cfg.vocab
        noise = rng.random(total) < 0.05
        tok[noise] = rng.integers(0, cfg.vocab, size=int(noise.sum()))
        tokens = np.zeros(budget, dtype=np.int64)
        tokens[:total] = tok
        targets = np.full(budget, IGNORE, dtype=np.int64)
        targets[: total - 1] = tok[1:]
        targets[cu[1:] - 1] = IGNORE  # the last token of each sequence predicts nothing
        yield {"tokens": torch.from_numpy(tokens), "targets": torch.from_numpy(targets), "cu_seqlens": torch.from_numpy(cu)}


# -- the model -----------------------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(t, 3, self.heads, d // self.heads).permute(1, 2, 0, 3).unsqueeze(1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [1, heads, t, d/heads]
        x = x + self.proj(a.squeeze(0).transpose(0, 1).reshape(t, d))
        return x + self.mlp(self.norm2(x))


class VarlenLM(nn.Module):
    """A pre-LN decoder over packed sequences; attention is block-diagonal causal (from ``cu_seqlens``).

    The token embedding is a one-hot matmul: its backward is a plain matmul, so a
    training step has no data-dependent kernel and no host synchronization anywhere.
    """

    vocab_ids: torch.Tensor
    freqs: torch.Tensor

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.d = cfg.d_model
        self.embed = nn.Parameter(torch.randn(cfg.vocab, cfg.d_model) * 0.02)
        self.register_buffer("vocab_ids", torch.arange(cfg.vocab), persistent=False)
        self.register_buffer("freqs", torch.exp(torch.arange(0, cfg.d_model, 2) * (-math.log(10000.0) / cfg.d_model)), persistent=False)
        self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.n_heads) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[0]
        pos = torch.arange(t, device=tokens.device)
        cu = cu_seqlens.long()
        seg = torch.searchsorted(cu[1:], pos, right=True)  # sequence of each token; padding gets its own
        pos_in_seq = (pos - cu[seg]).float()
        angles = pos_in_seq[:, None] * self.freqs[None, :]
        x = (tokens[:, None] == self.vocab_ids[None, :]).float() @ self.embed
        x = x + torch.cat([angles.sin(), angles.cos()], dim=1)
        mask = (seg[:, None] == seg[None, :]) & (pos[None, :] <= pos[:, None])  # True = may attend
        for blk in self.blocks:
            x = blk(x, mask)
        return self.head(self.norm(x))


def build(cfg: Config, device: torch.device) -> tuple[VarlenLM, torch.optim.Optimizer]:
    """The model (same initial weights for every variant) and its optimizer."""
    torch.manual_seed(cfg.seed)
    model = VarlenLM(cfg).to(device)
    # capturable: the step count lives on the device (no host value per step; a graph can replay it)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0, capturable=device.type == "cuda")
    return model, opt


def train_step(model: VarlenLM, opt: torch.optim.Optimizer, tokens: torch.Tensor, targets: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """Forward, backward, optimizer step; returns the loss tensor (on the device). No host sync."""
    opt.zero_grad(set_to_none=True)
    return _step_body(model, opt, tokens, targets, cu)


def _step_body(model: VarlenLM, opt: torch.optim.Optimizer, tokens: torch.Tensor, targets: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    # The math attention backend: its backward is matmuls, bitwise reproducible, where the fused
    # kernels' backward accumulates with atomics; so the variants can be compared closely.
    with sdpa_kernel(SDPBackend.MATH):
        loss = F.cross_entropy(model(tokens, cu), targets, ignore_index=IGNORE)
        loss.backward()
    opt.step()
    return loss.detach()


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


def _host_copies(batches: Iterator[dict[str, torch.Tensor]], keep: deque[np.ndarray]) -> Iterator[dict[str, torch.Tensor]]:
    """Pass batches through, keeping a host copy of each ``cu_seqlens`` (for the metadata check)."""
    for b in batches:
        keep.append(b["cu_seqlens"].numpy().copy())
        yield b


class _MetadataCheck:
    """Checks fetched workspace metadata against the numpy oracle without slowing the loop.

    In the loop, :meth:`poll` only collects the copies that have landed (never
    blocks); the comparison with the (slow, pure-Python) oracle runs in
    :meth:`verify`, after the loop, so it is not part of the measured steps.
    """

    def __init__(self, params: WorkspaceParams) -> None:
        self.params = params
        self.pending: deque[tuple[int, np.ndarray, st.FetchFuture]] = deque()
        self.landed: list[tuple[int, np.ndarray, np.ndarray]] = []
        self.verified: list[int] = []

    def add(self, step: int, cu: np.ndarray, fut: st.FetchFuture) -> None:
        self.pending.append((step, cu, fut))
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
        if on_step is not None:
            on_step(step)
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
                self.loss = _step_body(self.model, self.opt, self.tokens, self.targets, self.cu)
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
    variant = "c" if graph else "b"
    if graph and device.type != "cuda":
        raise ValueError("variant (c) captures a CUDA graph: it needs --device cuda")
    model, opt = build(cfg, device)
    params = cfg.workspace_params(_num_cus(device))
    region = params.metadata_region_bytes
    # Device memory of the runtime: torch CUDA tensors, or simulator memory aliased by CPU tensors.
    ws = st.device_empty(rt, workspace_size(params), torch.uint8)
    seq = st.device_empty(rt, cfg.seqs + 1, torch.int32)
    ws.zero_()
    seq.zero_()
    prep = WorkspacePrepare(rt, params, seq, seq, ws, pack=PACK) if cfg.prepare else None
    check = _MetadataCheck(params)
    host_cu: deque[np.ndarray] = deque()
    logger = st.MetricsLogger(rt, lag=cfg.lag, sink=sink)
    stepper = _GraphStep(cfg, model, opt, device) if graph else None
    prev: tuple[int, Any, np.ndarray] | None = None  # (step, Run, host cu_seqlens) of the last prepare
    notes: list[str] = []
    t0 = time.perf_counter()
    with st.Prefetcher(_host_copies(synthetic_batches(cfg), host_cu), rt, depth=cfg.depth) as batches:
        for step, batch in enumerate(batches):
            cu_host = host_cu.popleft()
            if prep is not None:
                if prev is not None:
                    # The previous prepare read `seq` and wrote the metadata: order torch after it
                    # (one step later it has long finished: the wait costs nothing).
                    prev_step, prev_run, prev_cu = prev
                    st.order_after(rt, prev_run)
                    if prev_step % cfg.verify_every == 0:
                        check.add(prev_step, prev_cu, st.fetch(rt, ws[:region]))
                seq.copy_(batch["cu_seqlens"])
                prev = (step, prep.launch(st.current_stream(rt), "fork", join=False), cu_host)
                check.poll()
            if stepper is None:
                loss = _span(rt, "fwd+bwd+step", train_step, model, opt, batch["tokens"], batch["targets"], batch["cu_seqlens"])
            elif step < cfg.warmup:
                loss = _span(rt, "warmup step", stepper.eager_warmup, batch)
            else:
                loss = _span(rt, "graph replay", stepper, batch)
            logger.log(step, loss)
            if on_step is not None:
                on_step(step)
        pstats = batches.statistics()
    if prev is not None:
        prev_step, prev_run, prev_cu = prev
        prev_run.result()
        if prev_step % cfg.verify_every == 0:
            check.add(prev_step, prev_cu, st.fetch(rt, ws[:region]))
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


def run_variant(variant: str, cfg: Config, device: str | torch.device = "cpu", *, backend: str | None = None) -> Result | None:
    """Run one variant; ``None`` (with the reason printed) for (c) on CPU."""
    dev = torch.device(device)
    if variant == "a":
        return run_plain(cfg, dev)
    if variant == "c" and dev.type != "cuda":
        return None
    with open_runtime_for(dev, backend) as rt:
        return run_streamrt(cfg, dev, rt, graph=variant == "c")


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
    ap.add_argument("--variants", default="a,b,c", help="comma-separated subset of a,b,c")
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
        if v == "a":
            res = run_plain(cfg, device)
        elif v == "c" and device.type != "cuda":
            print("(c) skipped: capturing the step into a CUDA graph needs --device cuda")
            continue
        else:
            sink = (lambda step, value, v=v: print(f"  ({v}) step {step}: loss {value:.4f}")) if args.print_losses else None
            with open_runtime_for(device, args.backend) as rt:
                res = run_streamrt(cfg, device, rt, graph=v == "c", sink=sink)
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
