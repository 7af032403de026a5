"""What the training-loop demo's variants share: the Result, the driver of a variant's loop, trace
spans, the metadata check and the workspace with its prepare (``train_loop.py`` runs the variants)."""

from __future__ import annotations

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
    reference_metadata,
    workspace_size,
)
from train_model import Config

__all__ = [
    "PACK", "MetadataCheck", "Result", "StepHook", "Steps", "drive", "host_copies", "num_cus", "pack_on_this_thread", "span", "wait",
    "workspace",
]

#: The host pack both ways use: the C one where it was built (no GIL while it runs), else numpy.
PACK = "native" if native_pack_available() else "python"
pack_on_this_thread = pack_metadata_native if PACK == "native" else pack_metadata


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


def span(rt: srt.Runtime | None, name: str, fn: Callable[..., Any], *args: Any) -> Any:
    """torch work as a span on streamrt's timeline while ``rt`` is traced (else just ``fn(*args)``)."""
    return fn(*args) if rt is None else st.trace_torch(rt, name, fn, *args)


def wait(rt: srt.Runtime | None, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """A host-blocking call, recorded as such while ``rt`` is traced."""
    return fn(*args) if rt is None else st.trace_host_wait(rt, what, fn, *args)


def num_cus(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 132  # the simulated H200


def host_copies(batches: Iterator[dict[str, torch.Tensor]], keep: deque[np.ndarray] | list[np.ndarray]) -> Iterator[dict[str, torch.Tensor]]:
    """Pass batches through, keeping a host copy of each ``cu_seqlens`` (for the metadata check)."""
    for b in batches:
        keep.append(b["cu_seqlens"].numpy().copy())
        yield b


class MetadataCheck:
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


def workspace(cfg: Config, device: torch.device, rt: srt.Runtime, seq: torch.Tensor) -> tuple[WorkspaceParams, torch.Tensor, WorkspacePrepare | None]:
    """The workspace (zeroed) and its prepare over ``seq`` (``None`` without ``cfg.prepare``).

    Device memory of the runtime: torch CUDA tensors, or simulator memory aliased by CPU tensors.
    """
    params = cfg.workspace_params(num_cus(device))
    ws = st.device_empty(rt, workspace_size(params), torch.uint8)
    ws.zero_()
    prep = WorkspacePrepare(rt, params, seq, seq, ws, pack=PACK) if cfg.prepare else None
    return params, ws, prep
