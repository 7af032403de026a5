"""The model, data and sizes of demos/train_loop.py: a small varlen transformer over packed batches.

The model is a decoder-only transformer over *packed* variable-length
sequences: each batch holds ``seqs`` sequences of random length packed into
a fixed token budget, described by ``cu_seqlens`` (int32, ``seqs + 1``
prefix sums, the varlen convention of FlashAttention and the FMHA backward).
Attention is torch's ``scaled_dot_product_attention`` with a block-diagonal
causal mask built on the device from ``cu_seqlens`` (padding + mask: the
portable form of varlen attention). The data is a synthetic token stream
(arithmetic progressions modulo the vocabulary with some noise, fixed seed),
so the loss falls quickly from ``ln(vocab)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from streamrt.recipes.fmha_bwd import WorkspaceParams

IGNORE = -100

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
    log_group: int = 8
    depth: int = 2
    prefetch_group: int = 8
    prepare_strategy: str = "fork"  # how (b) and (c) launch the prepare ("fork" or "fork_graph")
    deferred_prepare: bool = True  # "fork" only: the prepare's calls made by the runtime's submission thread
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
    return step_body(model, opt, tokens, targets, cu)


def step_body(model: VarlenLM, opt: torch.optim.Optimizer, tokens: torch.Tensor, targets: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    """:func:`train_step` without ``zero_grad`` (a captured step's gradients stay where the capture put them)."""
    loss = forward_loss(model, tokens, targets, cu)
    backward_and_step(opt, loss)
    return loss.detach()


def forward_loss(model: VarlenLM, tokens: torch.Tensor, targets: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
    # The math attention backend: its backward is matmuls, bitwise reproducible, where the fused
    # kernels' backward accumulates with atomics; so the variants can be compared closely.
    with sdpa_kernel(SDPBackend.MATH):
        return F.cross_entropy(model(tokens, cu), targets, ignore_index=IGNORE)


def backward(loss: torch.Tensor) -> None:
    with sdpa_kernel(SDPBackend.MATH):
        loss.backward()


def backward_and_step(opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    backward(loss)
    opt.step()
