"""The ``"device"`` strategies: the workspace prepare on the device, no host round trip (the newest CK's form).

``kernels/fmha_bwd_prepare.hip`` reads ``seqstart_q/k`` on the device and writes the
metadata region (the bytes of :func:`~.reference.reference_metadata`) and the result
record; no D2H copy, no host function, no H2D copy, no pinned staging. dq_acc is
zeroed as CK zeroes it:

* deterministic: ``prepare kernel -> prezero kernel`` (``fmha_bwd_prezero.hip``, CK's
  ``DqAccPrezeroKernel``): the prezero reads ``offsets[batch]`` from the metadata the
  first kernel wrote and zeroes exactly that many floats; the rest of dq_acc is untouched;
* non-deterministic: ``memset(dq_acc bound) ∥ prepare kernel``, as the newest
  ``fmha_bwd_launcher::prepare_workspace_async`` does.

Compared with the host-pack pipeline (:mod:`.pipeline`) it costs the stream two
short device ops (~3-10 µs each) instead of a host function (~50 µs).

Strategies: ``"device"`` (:meth:`DevicePrepare.launch`, eager) and ``"device_graph"``
(:meth:`DevicePrepare.replay`, captured once and replayed; each replay re-reads
seqstart). :meth:`DevicePrepare.enqueue` launches the two ops bare on a stream, with no
:class:`~streamrt._pipeline._run.Run` bookkeeping (for hot loops that track completion themselves).

Errors. A kernel cannot raise: seqlens that do not fit the params make it write the
idle image (a backward kernel that trusts it does nothing, and the prezero zeroes
nothing) and the status into the result record, in device memory of its own: read it
with :meth:`DevicePrepare.result` (blocking) where it matters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..._kernel import launch_prepared, library_for, prepare_launch
from ..._pipeline import Pipeline
from . import _kernels
from ._plan import PreparePlan, prepare_buffers
from .layout import WorkspaceMetadata, WorkspaceParams, parse_metadata
from .result import RESULT_BYTES, PrepareResult

if TYPE_CHECKING:
    from ..._pipeline import Run
    from ..._runtime import Runtime
    from ..._stream import Stream

__all__ = ["DEVICE_STRATEGIES", "DevicePrepare", "prepare_workspace_device"]

DEVICE_STRATEGIES = ("device", "device_graph")


class DevicePrepare(PreparePlan):
    """A reusable device-side prepare of one workspace: its kernels, their arguments, a 2-node pipeline.

    Args:
        rt: the runtime.
        params: workspace parameters.
        seqstart_q, seqstart_k: device buffers of ``batch + 1`` int32 each.
        workspace: a 16-byte aligned device buffer of at least ``workspace_size(params)`` bytes.

    Compiles (or loads from the kernel cache) the kernels on first use in the runtime and
    allocates the 16-byte result record. Raises ``ValueError`` for host memory, short
    buffers, a misaligned workspace or seqstart inside it, before anything is enqueued.
    """

    def __init__(self, rt: Runtime, params: WorkspaceParams, seqstart_q: Any, seqstart_k: Any, workspace: Any) -> None:
        q, k, ws = prepare_buffers(rt, params, seqstart_q, seqstart_k, workspace)
        self._rt = rt
        region = params.metadata_region_bytes
        self._meta = ws.view(0, region)
        self._dq_acc = ws.view(region, params.dq_acc_bound_bytes)
        kernels = library_for(rt)
        prepare = kernels.get("fmha_bwd_prepare")
        self._result = rt.device_allocator.allocate(RESULT_BYTES)
        args = [q, k, self._meta, self._result, *_kernels.prepare_scalars(params)]
        block = (_kernels.PREPARE_THREADS, 1, 1)
        launches = [prepare_launch(prepare, (1, 1, 1), block, args, 0)]  # checks every argument
        p = Pipeline(f"fmha_bwd_prepare_device[batch={params.batch}]")
        if params.deterministic:
            prezero = kernels.get("fmha_bwd_dq_acc_prezero")
            count_offset, dq_offset, max_count = _kernels.prezero_args(params)
            zargs = [ws, count_offset, dq_offset, max_count]
            zgrid = _kernels.prezero_grid(params.dq_acc_bound_bytes, rt.capabilities.multiprocessor_count)
            zblock = (_kernels.PREZERO_THREADS, 1, 1)
            launches.append(prepare_launch(prezero, zgrid, zblock, zargs, 0))
            p.kernel(prepare, (1, 1, 1), block, args, name="prepare")
            # It reads offsets[batch], which the prepare writes: the edge is inferred.
            p.kernel(prezero, zgrid, zblock, zargs, reads=[ws.view(count_offset, 8)], writes=[self._dq_acc], name="prezero")
            self._zero_bound = False
        else:
            p.memset(self._dq_acc, 0, name="zero_dq_acc")
            p.kernel(prepare, (1, 1, 1), block, args, name="prepare")
            self._zero_bound = True
        self._launches = launches
        super().__init__(params, p)

    @property
    def grids(self) -> tuple[tuple[int, int, int], ...]:
        """The launch grids: the prepare kernel's (one block), then the prezero's (deterministic only)."""
        return tuple(launch[0] for launch in self._launches)

    def enqueue(self, stream: Stream) -> None:
        """Enqueue the prepare's device ops on ``stream`` (no Run, no tail event). Non-blocking."""
        self._check_open()
        if self._zero_bound:
            stream.memset(self._dq_acc, 0)
        for launch in self._launches:
            launch_prepared(stream, *launch)

    def launch(self, stream: Stream) -> Run:
        """One eager prepare on ``stream``: the ``"device"`` strategy. Returns its Run. Non-blocking."""
        self._check_open()
        return self._pipeline.launch(stream)

    def result(self, stream: Stream) -> PrepareResult:
        """Blocking: wait for ``stream`` and decode the result record of the latest prepare on it."""
        return PrepareResult.from_record(self._download(stream, self._result))

    def metadata(self, stream: Stream) -> WorkspaceMetadata:
        """Blocking: wait for ``stream``, download the metadata region and decode it."""
        return parse_metadata(self._params, self._download(stream, self._meta))

    def _download(self, stream: Stream, src: Any) -> np.ndarray:
        self._check_open()
        host = self._rt.host_allocator.allocate(src.nbytes)
        try:
            stream.copy(host, src)
            stream.synchronize()
            return np.array(host.numpy(np.uint8))
        finally:
            host.release()

    def _release(self) -> None:
        self._result.release()


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
