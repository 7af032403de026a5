"""The workspace prepare as a streamrt pipeline, with the old synchronous path beside it.

The stream-async prepare (DESIGN §1, §8) is the pipeline::

    zero_dq_acc:  memset(dq_acc region, 0)                      (caller's stream)
    d2h_q, d2h_k: seqstart_q/k (device) -> pinned staging        \\
    pack:         host: pack_metadata(staging) -> pinned metadata  } one chain (a side stream under "fork")
    h2d_meta:     pinned metadata -> workspace metadata region    /

Nothing in it blocks the host; the workspace size comes from
:class:`~.layout.WorkspaceParams` alone. Staging is one pinned block from
``rt.host_allocator``.

Zeroing. The host pack learns the used dq_acc size only when it runs, after
every node has been enqueued, and a memset's size is fixed when it is
enqueued (or captured). So the async pipeline zeroes the dq_acc *upper bound*
(the whole region), which always covers the used prefix and runs on the
device in parallel with the host round trip. The synchronous baseline knows
the used size before it enqueues its memset and zeroes only
``dq_acc_used_bytes``; so does a device-side pack kernel, which computes the
size on the device.

Strategies (:func:`prepare_workspace` and :class:`WorkspacePrepare`):

* ``"stream"`` — the pipeline on the caller's stream (the seed's behaviour);
* ``"fork"`` — the round trip on a pooled side stream, joined by an event;
* ``"graph"`` — the pipeline captured once, replayed per prepare (each replay
  re-reads seqstart on the device and re-runs the pack);
* ``"sync"`` — the old path: two blocking D2H copies (each drains the stream),
  the pack on the calling thread, then memset(used bytes) and H2D enqueued;
* ``"device"`` / ``"device_graph"`` — no host round trip: one kernel computes the
  metadata and zeroes the used dq_acc on the device (:mod:`.device`), eager or captured.

Packs (``pack=``). ``"python"`` (the default) runs :func:`~.reference.pack_metadata`
on a runtime worker: a Python host node, which costs the stream two host
functions and holds the GIL while it packs. ``"native"`` runs the C pack of
:mod:`.native` as a native host node on the driver's thread: one host function,
no GIL, no runtime thread (it needs the C module, built by ``pip install``).

Errors. Seqlens that do not fit the params (see ``STATUS_*``) make the pack
write the error block (the kernel then touches nothing). The Python pack also
raises :class:`~.layout.WorkspaceInputError`, which surfaces on the Run (and is
raised directly by ``"sync"``); a native function cannot raise, so with
``pack="native"`` only ``"sync"`` raises and the eager and graph strategies
leave the status in the metadata, as the device kernel does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..._buffer import DEVICE, Buffer
from ..._completion import Completion
from ..._pipeline import Pipeline
from ..._run import Run, record_tail
from ..._streampool import pool_for
from ._plan import PreparePlan
from .layout import STATUS_OK, WorkspaceInputError, WorkspaceParams, parse_metadata
from .native import NativePack, native_pack_unavailable_reason
from .reference import pack_metadata

if TYPE_CHECKING:
    from ..._runtime import Runtime
    from ..._stream import Stream

__all__ = ["PACKS", "STRATEGIES", "WorkspacePrepare", "prepare_workspace", "prepare_workspace_sync"]

STRATEGIES = ("stream", "fork", "graph", "sync", "device", "device_graph")  # the last two: .device
PACKS = ("python", "native")


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _pack(params: WorkspaceParams, seqstart_q: np.ndarray, seqstart_k: np.ndarray, out: np.ndarray) -> int:
    """The host node: seqstart staging -> metadata block. Returns ``dq_acc_used_bytes``.

    Takes numpy views of the pinned staging made when the pipeline was built,
    so a one-shot prepare may release its staging right after the enqueue
    (the allocator keeps the memory until the stream has passed the prepare).
    Raises :class:`WorkspaceInputError` (after writing the error block) for invalid seqlens.
    """
    pack_metadata(params, seqstart_q, seqstart_k, out=out)
    status = int(out[12:16].view("<u4")[0])
    if status != STATUS_OK:
        raise WorkspaceInputError(status)
    return int(out[48:56].view("<i8")[0])


class WorkspacePrepare(PreparePlan):
    """A reusable prepare of one workspace: the pipeline, its pinned staging, optionally its graph.

    Args:
        rt: the runtime.
        params: workspace parameters.
        seqstart_q, seqstart_k: device buffers of ``batch + 1`` int32 each.
        workspace: a device buffer of at least ``workspace_size(params)`` bytes.
        pack: ``"python"`` or ``"native"`` (the module docstring); ``"native"``
            raises ``RuntimeError`` when the C pack was not built.

    Build once, launch per step: :meth:`launch` (``"stream"``/``"fork"``),
    :meth:`replay` (``"graph"``; captures on first use), :meth:`run_sync`
    (the baseline). Launching again while an earlier prepare is in flight is
    safe (launches of one prepare are serialized). :meth:`close` releases
    the staging (reuse waits for the streams) and the graph.
    """

    def __init__(
        self, rt: Runtime, params: WorkspaceParams, seqstart_q: Any, seqstart_k: Any, workspace: Any, *, pack: str = "python"
    ) -> None:
        if not isinstance(params, WorkspaceParams):
            raise TypeError(f"params must be WorkspaceParams, not {type(params).__name__}")
        if pack not in PACKS:
            raise ValueError(f"unknown pack {pack!r}: use 'python' or 'native'")
        if pack == "native" and native_pack_unavailable_reason() is not None:
            raise RuntimeError(f"pack='native' is not available: {native_pack_unavailable_reason()}")
        q = rt.as_buffer(seqstart_q)
        k = rt.as_buffer(seqstart_k)
        ws = rt.as_buffer(workspace)
        seq_bytes = 4 * (params.batch + 1)
        for what, buf in (("seqstart_q", q), ("seqstart_k", k), ("workspace", ws)):
            if buf.kind != DEVICE:
                raise ValueError(f"{what} must be device memory, got {buf.kind}")
        if q.nbytes < seq_bytes or k.nbytes < seq_bytes:
            raise ValueError(f"seqstart_q/k need {seq_bytes} bytes (batch + 1 int32), got {q.nbytes} and {k.nbytes}")
        if ws.nbytes < params.workspace_bytes:
            raise ValueError(f"workspace has {ws.nbytes} bytes; workspace_size(params) is {params.workspace_bytes}")
        self._rt = rt
        self._params = params
        region = params.metadata_region_bytes
        seq_slot = _align(seq_bytes, 64)
        self._staging = rt.host_allocator.allocate(2 * seq_slot + region)
        stage_q = self._staging.view(0, seq_bytes)
        stage_k = self._staging.view(seq_slot, seq_bytes)
        meta = self._staging.view(2 * seq_slot, region)
        self._meta_host = meta
        self._stage = (stage_q, stage_k)
        self._arrays = (stage_q.numpy(np.int32), stage_k.numpy(np.int32), meta.numpy(np.uint8))
        self._dq_acc = ws.view(region, params.dq_acc_bound_bytes)
        self._meta_dev = ws.view(0, region)
        self._seq = (q.view(0, seq_bytes), k.view(0, seq_bytes))
        self._native = NativePack(params, stage_q.ptr, stage_k.ptr, meta.ptr) if pack == "native" else None
        p = Pipeline(f"fmha_bwd_prepare[batch={params.batch}]")
        p.memset(self._dq_acc, 0, name="zero_dq_acc")
        d2h_q = p.copy(dst=stage_q, src=self._seq[0], name="d2h_q")
        # A declared edge keeps both small copies on one chain (one side stream under "fork").
        p.copy(dst=stage_k, src=self._seq[1], after=[d2h_q], name="d2h_k")
        if self._native is not None:
            p.host(self._native.function, self._native.args, reads=[stage_q, stage_k], writes=[meta], name="pack")
        else:
            p.host(_pack, params, *self._arrays, reads=[stage_q, stage_k], writes=[meta], name="pack")
        p.copy(dst=self._meta_dev, src=meta, name="h2d_meta")
        super().__init__(params, p)  # 5 nodes: memset ∥ D2H q → D2H k → pack → H2D

    @property
    def pack(self) -> str:
        """``"python"`` or ``"native"``: which host pack the pipeline runs."""
        return "python" if self._native is None else "native"

    @property
    def staging(self) -> Buffer:
        """The pinned staging block (seqstart q | seqstart k | metadata)."""
        return self._staging

    def launch(self, stream: Stream, strategy: str = "stream", **launch_options: Any) -> Run:
        """Enqueue one prepare (``"stream"`` or ``"fork"``; ``launch_options`` go to ``Pipeline.launch``)."""
        self._check_open()
        if strategy not in ("stream", "fork"):
            raise ValueError(f"launch takes strategy 'stream' or 'fork', got {strategy!r} (use replay() or run_sync())")
        return self._pipeline.launch(stream, policy=strategy, **launch_options)

    def run_sync(self, stream: Stream) -> int:
        """The old synchronous path; returns ``dq_acc_used_bytes``. Blocks the host twice.

        Two D2H copies, each followed by ``stream.synchronize()`` (draining
        the stream, as ``hipMemcpy`` does), the pack (this prepare's) on this thread, then
        memset(used dq_acc bytes) and the H2D enqueued on ``stream``.
        Raises :class:`WorkspaceInputError` for invalid seqlens (after
        uploading the error block).
        """
        self._check_open()
        stage_q, stage_k = self._stage
        chain = self._pipeline._chain  # ordered with the pipeline's runs and its graph's replays
        with chain.lock:
            chain.wait_previous((stream,))
            stream.copy(stage_q, self._seq[0])
            stream.synchronize()
            stream.copy(stage_k, self._seq[1])
            stream.synchronize()
            q_arr, k_arr, out = self._arrays
            if self._native is not None:
                self._native()
            else:
                pack_metadata(self._params, q_arr, k_arr, out=out)
            meta = parse_metadata(out)
            stream.memset(self._dq_acc, 0, meta.dq_acc_used_bytes)
            stream.copy(self._meta_dev, self._meta_host)
            # A later launch must not overwrite the staging before this H2D has read it.
            pool = pool_for(self._rt)
            chain.last = Run(self._pipeline.name, "sync", (stream,), [], [record_tail(stream, pool, None)], pool)
        meta.raise_for_status()
        return meta.dq_acc_used_bytes

    def _release(self) -> None:
        """Release the staging (its reuse waits for the streams that used it)."""
        self._staging.release()


def prepare_workspace(
    rt: Runtime,
    stream: Stream,
    params: WorkspaceParams,
    seqstart_q: Any,
    seqstart_k: Any,
    workspace: Any,
    strategy: str = "stream",
    *,
    pack: str = "python",
) -> Completion:
    """One prepare of ``workspace`` on ``stream``; returns its Run (or, for ``"sync"``, a resolved Completion).

    Builds a :class:`WorkspacePrepare`, launches it once and closes it at
    once: the staging is released right after the enqueue, and the caching
    allocator keeps it in flight until the stream has passed the prepare.
    For repeated prepares, keep a :class:`WorkspacePrepare` instead. ``pack``
    as for :class:`WorkspacePrepare` (ignored by the device strategies).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")
    if strategy in ("device", "device_graph"):
        from .device import prepare_workspace_device

        return prepare_workspace_device(rt, stream, params, seqstart_q, seqstart_k, workspace, strategy)
    prep = WorkspacePrepare(rt, params, seqstart_q, seqstart_k, workspace, pack=pack)
    try:
        if strategy == "sync":
            done = Completion()
            done._set_result(prep.run_sync(stream))
            return done
        if strategy == "graph":
            return prep.replay(stream)
        return prep.launch(stream, strategy)
    finally:
        prep.close()


def prepare_workspace_sync(
    rt: Runtime, stream: Stream, params: WorkspaceParams, seqstart_q: Any, seqstart_k: Any, workspace: Any
) -> int:
    """The old synchronous prepare (see :meth:`WorkspacePrepare.run_sync`); returns ``dq_acc_used_bytes``."""
    with WorkspacePrepare(rt, params, seqstart_q, seqstart_k, workspace) as prep:
        return prep.run_sync(stream)
