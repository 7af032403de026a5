"""The ``"device"`` strategy: the workspace prepare as one kernel launch, no host round trip.

``kernels/fmha_bwd_prepare.hip`` reads ``seqstart_q/k`` on the device, writes the
metadata region (the bytes of :func:`~.reference.reference_metadata`) and zeroes
only the used dq_acc bytes, in one launch on the caller's stream: no D2H copy,
no host function, no H2D copy, no pinned staging. Compared with the host-pack
pipeline (:mod:`.pipeline`) it costs the stream one kernel (~3-10 µs) instead of
a host function (~50 µs, DESIGN §9), and zeroes ``dq_acc_used_bytes`` rather
than the whole bound, because the kernel knows the used size when it runs.

Strategies: ``"device"`` (:meth:`DevicePrepare.launch`, eager) and
``"device_graph"`` (:meth:`DevicePrepare.replay`, captured once and replayed;
each replay re-reads seqstart). :meth:`DevicePrepare.enqueue` launches the
kernel bare on a stream, with no :class:`~streamrt._run.Run` bookkeeping (for
hot loops that track completion themselves).

Errors. A kernel cannot raise: seqlens that do not fit the params make it
write the error block (``status != 0``, nothing used, every worker idle) and
zero nothing, so a backward kernel that trusts the block touches nothing. Read
the status with :meth:`DevicePrepare.metadata` (blocking) where it matters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..._buffer import DEVICE
from ..._kernel import add_kernel_node, launch_prepared, library_for, prepare_launch
from ..._kernel._builtin import PREPARE_THREADS, prepare_grid, prepare_scalars
from ..._pipeline import Pipeline
from ._plan import PreparePlan
from .layout import WorkspaceMetadata, WorkspaceParams, parse_metadata

if TYPE_CHECKING:
    from ..._run import Run
    from ..._runtime import Runtime
    from ..._stream import Stream

__all__ = ["DEVICE_STRATEGIES", "DevicePrepare", "prepare_workspace_device"]

DEVICE_STRATEGIES = ("device", "device_graph")


class DevicePrepare(PreparePlan):
    """A reusable device-side prepare of one workspace: the kernel, its arguments, a 1-node pipeline.

    Args:
        rt: the runtime.
        params: workspace parameters.
        seqstart_q, seqstart_k: device buffers of ``batch + 1`` int32 each.
        workspace: a 16-byte aligned device buffer of at least ``workspace_size(params)`` bytes.

    Compiles (or loads from the kernel cache) ``fmha_bwd_prepare`` on first use
    in the runtime. Raises ``ValueError`` for host memory, short buffers or a
    misaligned workspace, before anything is enqueued.
    """

    def __init__(self, rt: Runtime, params: WorkspaceParams, seqstart_q: Any, seqstart_k: Any, workspace: Any) -> None:
        if not isinstance(params, WorkspaceParams):
            raise TypeError(f"params must be WorkspaceParams, not {type(params).__name__}")
        q = rt.as_buffer(seqstart_q)
        k = rt.as_buffer(seqstart_k)
        ws = rt.as_buffer(workspace)
        for what, buf in (("seqstart_q", q), ("seqstart_k", k), ("workspace", ws)):
            if buf.kind != DEVICE:
                raise ValueError(f"{what} must be device memory, got {buf.kind}")
        seq_bytes = 4 * (params.batch + 1)
        if ws.nbytes < params.workspace_bytes:
            raise ValueError(f"workspace has {ws.nbytes} bytes; workspace_size(params) is {params.workspace_bytes}")
        self._rt = rt
        self._params = params
        self._kernel = library_for(rt).get("fmha_bwd_prepare")
        self._grid = prepare_grid(params, rt.capabilities.multiprocessor_count)
        self._block = (PREPARE_THREADS, 1, 1)
        self._workspace = ws.view(0, params.workspace_bytes)
        self._args = [
            q.view(0, min(q.nbytes, seq_bytes)),
            k.view(0, min(k.nbytes, seq_bytes)),
            self._workspace,
            *prepare_scalars(params),
        ]
        self._launch = prepare_launch(self._kernel, self._grid, self._block, self._args, 0)  # checks every argument
        p = Pipeline(f"fmha_bwd_prepare_device[batch={params.batch}]")
        add_kernel_node(p, self._kernel, self._grid, self._block, self._args, name="prepare")
        super().__init__(params, p)  # a one-node pipeline: the kernel reads seqstart, writes the workspace

    @property
    def grid(self) -> tuple[int, int, int]:
        """The launch grid: block 0 writes the metadata, the others zero dq_acc."""
        return self._grid

    def enqueue(self, stream: Stream) -> None:
        """Launch the kernel on ``stream`` (no Run, no tail event). Non-blocking."""
        self._check_open()
        launch_prepared(stream, *self._launch)

    def launch(self, stream: Stream) -> Run:
        """One eager prepare on ``stream``: the ``"device"`` strategy. Returns its Run. Non-blocking."""
        self._check_open()
        return self._pipeline.launch(stream)

    def metadata(self, stream: Stream) -> WorkspaceMetadata:
        """Blocking: wait for ``stream``, download the metadata region and decode it."""
        self._check_open()
        region = self._params.metadata_region_bytes
        host = self._rt.host_allocator.allocate(region)
        try:
            stream.copy(host, self._workspace.view(0, region))
            stream.synchronize()
            return parse_metadata(np.array(host.numpy(np.uint8)))
        finally:
            host.release()


def prepare_workspace_device(
    rt: Runtime,
    stream: Stream,
    params: WorkspaceParams,
    seqstart_q: Any,
    seqstart_k: Any,
    workspace: Any,
    strategy: str = "device",
) -> Run:
    """One device-side prepare on ``stream`` (``"device"``: eager; ``"device_graph"``: captured, replayed once)."""
    if strategy not in DEVICE_STRATEGIES:
        raise ValueError(f"unknown device strategy {strategy!r}: use one of {', '.join(DEVICE_STRATEGIES)}")
    prep = DevicePrepare(rt, params, seqstart_q, seqstart_k, workspace)
    try:
        return prep.replay(stream) if strategy == "device_graph" else prep.launch(stream)
    finally:
        prep.close()
