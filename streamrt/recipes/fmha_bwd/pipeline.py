"""The workspace prepare as a streamrt pipeline, with the old synchronous path beside it.

The stream-async prepare is the seed PR's ``prepare_workspace_async``, with dq_acc zeroed as
Composable Kernel zeroes it::

    deterministic:      d2h_q -> d2h_k -> pack -> h2d_meta -> prezero
    non-deterministic:  d2h_q -> d2h_k -> pack -> h2d_meta   ∥   zero_dq_acc (memset of the bound)

    d2h_q, d2h_k: seqstart_q/k (device) -> pinned staging          (one chain; a side stream under "fork")
    pack:         host: the metadata image + the result record into pinned staging
    h2d_meta:     pinned metadata -> the workspace's metadata region
    prezero:      kernel (fmha_bwd_prezero.hip, CK's DqAccPrezeroKernel): reads offsets[batch]
                  from the uploaded metadata and zeroes exactly that many floats of dq_acc
    zero_dq_acc:  memset of the whole dq_acc bound (CK's launcher memset)

Nothing in it blocks the host; the workspace size comes from :class:`~.layout.WorkspaceParams`
alone. Staging is one pinned block from ``rt.host_allocator``: ``seqstart_q | seqstart_k |
metadata | result record``. In deterministic mode the host pack learns the used size only when
it runs, after every node was enqueued: the prezero kernel reads it on the device, so nothing
past the used prefix is written (the old pipeline zeroed the whole bound, up to 8x more).

Strategies (:func:`prepare_workspace` and :class:`WorkspacePrepare`):

* ``"stream"`` — the pipeline on the caller's stream (the seed's behaviour);
* ``"fork"`` — the round trip on a pooled side stream, joined by an event (non-deterministic:
  ``Pipeline.launch``'s ``"fork"``, the memset on the caller's stream; deterministic: the whole
  chain, memset-free, on the side stream);
* ``"graph"`` — the pipeline captured once, replayed per prepare (each replay
  re-reads seqstart on the device and re-runs the pack);
* ``"fork_graph"`` — that graph replayed on the pooled side stream of ``"fork"``, ordered and
  joined as ``"fork"`` orders its side stream (all of it there, the memset too): one driver
  call for the whole prepare, off the caller's stream;
* ``"sync"`` — the old path: two blocking D2H copies (each drains the stream), the pack on
  the calling thread, then memset (the used prefix, or the bound) and H2D enqueued;
* ``"device"`` / ``"device_graph"`` — no host round trip (:mod:`.device`), eager or captured.

Packs (``pack=``). ``"python"`` (the default) runs :func:`~.reference.pack_metadata` on a
runtime worker: a Python host node, which costs the stream two host functions and holds the
GIL while it packs. ``"native"`` runs the C pack of :mod:`.native` as a native host node on
the driver's thread: one host function, no GIL, no runtime thread (it needs the C module,
built by ``pip install``).

Result and errors. Every pack writes the result record (status, CK hazards, used bytes) beside
the metadata; :meth:`WorkspacePrepare.result` reads it. Seqlens that do not fit the params make
the pack write the idle image (the prezero then zeroes nothing). The Python pack also returns
the :class:`~.result.PrepareResult` (``run.host_result("pack")``) and raises
:class:`~.result.WorkspaceInputError` for invalid input, which surfaces on the Run (and is
raised directly by ``"sync"``); a native function cannot raise, so with ``pack="native"`` only
``"sync"`` raises.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._buffer import Buffer
from ..._completion import Completion
from ..._event import Event
from ..._kernel import library_for
from ..._pipeline import Pipeline
from ..._pipeline import Run, deferrable
from ..._streampool import pool_for
from . import _kernels
from ._plan import PreparePlan, prepare_buffers, seqstart_buffer
from .layout import WorkspaceParams
from .native import NativePack, native_pack_unavailable_reason
from .reference import pack_into
from .result import RESULT_BYTES, PrepareResult, WorkspaceInputError

if TYPE_CHECKING:
    from ..._pipeline._fork_plan import ForkLaunchPlan
    from ..._runtime import Runtime
    from ..._stream import Stream

__all__ = ["PACKS", "STRATEGIES", "WorkspacePrepare", "prepare_workspace", "prepare_workspace_sync"]

STRATEGIES = ("stream", "fork", "graph", "fork_graph", "sync", "device", "device_graph")  # the last two: .device
PACKS = ("python", "native")
_MAX_ASIDES = 4  # caller streams whose side stream a prepare keeps (see WorkspacePrepare._launch_aside)


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _pack(params: WorkspaceParams, seqstart_q: np.ndarray, seqstart_k: np.ndarray, out: np.ndarray, record: np.ndarray) -> PrepareResult:
    """The host node: seqstart staging -> metadata image and result record. Returns the result.

    Takes numpy views of the pinned staging made when the pipeline was built,
    so a one-shot prepare may release its staging right after the enqueue
    (the allocator keeps the memory until the stream has passed the prepare).
    Raises :class:`WorkspaceInputError` (after writing the idle image) for invalid seqlens.
    """
    result = pack_into(params, seqstart_q.astype(np.int64), seqstart_k.astype(np.int64), out)
    result.write_record(record)
    result.raise_for_status()
    return result


class WorkspacePrepare(PreparePlan):
    """A reusable prepare of one workspace: the pipeline, its pinned staging, optionally its graph.

    Args:
        rt: the runtime.
        params: workspace parameters.
        seqstart_q, seqstart_k: device buffers of ``batch + 1`` int32 each.
        workspace: a 16-byte aligned device buffer of at least ``workspace_size(params)`` bytes.
        pack: ``"python"`` or ``"native"`` (the module docstring); ``"native"``
            raises ``RuntimeError`` when the C pack was not built.

    Build once, launch per step: :meth:`launch` (``"stream"``/``"fork"``/``"fork_graph"``),
    :meth:`replay` (``"graph"``; captures on first use), :meth:`run_sync`
    (the baseline). Launching again while an earlier prepare is in flight is
    safe (launches of one prepare are serialized). In deterministic mode the
    prezero kernel is compiled (or loaded from the kernel cache) here.
    :meth:`close` releases the staging (reuse waits for the streams) and the graph.
    """

    def __init__(
        self, rt: Runtime, params: WorkspaceParams, seqstart_q: Any, seqstart_k: Any, workspace: Any, *, pack: str = "python"
    ) -> None:
        if pack not in PACKS:
            raise ValueError(f"unknown pack {pack!r}: use 'python' or 'native'")
        if pack == "native" and native_pack_unavailable_reason() is not None:
            raise RuntimeError(f"pack='native' is not available: {native_pack_unavailable_reason()}")
        q, k, ws = prepare_buffers(rt, params, seqstart_q, seqstart_k, workspace)
        self._prezero = library_for(rt).get("fmha_bwd_dq_acc_prezero") if params.deterministic else None
        self._rt = rt
        self._asides: dict[Stream, tuple[Stream, Event, int]] = {}  # caller's stream -> (side stream, entry event, priority)
        self._aside_lock = threading.Lock()
        region = params.metadata_region_bytes
        seq_bytes = q.nbytes
        seq_slot = _align(seq_bytes, 64)
        self._staging = rt.host_allocator.allocate(2 * seq_slot + region + RESULT_BYTES)
        stage_q = self._staging.view(0, seq_bytes)
        stage_k = self._staging.view(seq_slot, seq_bytes)
        meta = self._staging.view(2 * seq_slot, region)
        self._record = self._staging.view(2 * seq_slot + region, RESULT_BYTES)
        self._meta_host = meta
        self._stage = (stage_q, stage_k)
        self._arrays = (stage_q.numpy(np.int32), stage_k.numpy(np.int32), meta.numpy(np.uint8), self._record.numpy(np.uint8))
        self._dq_acc = ws.view(region, params.dq_acc_bound_bytes)
        self._meta_dev = ws.view(0, region)
        self._ws = ws
        self._seq = (q, k)
        self._native = NativePack(params, stage_q.ptr, stage_k.ptr, meta.ptr, self._record.ptr) if pack == "native" else None
        self._patch: tuple[ForkLaunchPlan | None, tuple[int | None, ...]] = (None, ())  # a deferred plan, its d2h steps
        self._given: tuple[Pipeline, Buffer] | None = None  # the pipeline over a copy of given seqstart (_launch_reading)
        self._given_lock = threading.Lock()
        super().__init__(params, self._build(params, q, k))

    def _build(self, params: WorkspaceParams, q: Buffer, k: Buffer, *, copies: bool = False) -> Pipeline:
        """The prepare's pipeline (5 nodes), reading seqstart from ``q`` and ``k`` (``copies``: the block given seqstart is copied to)."""
        stage_q, stage_k = self._stage
        meta = self._meta_host
        prezero = self._prezero
        p = Pipeline(f"fmha_bwd_prepare[batch={params.batch}{', seqstart given' if copies else ''}]")
        if prezero is None:
            p.memset(self._dq_acc, 0, name="zero_dq_acc")
        d2h_q = p.copy(dst=stage_q, src=q, name="d2h_q")
        # A declared edge keeps both small copies on one chain (one side stream under "fork").
        p.copy(dst=stage_k, src=k, after=[d2h_q], name="d2h_k")
        written = [meta, self._record]
        if self._native is not None:
            p.host(self._native.function, self._native.args, reads=[stage_q, stage_k], writes=written, name="pack")
        else:
            p.host(_pack, params, *self._arrays, reads=[stage_q, stage_k], writes=written, name="pack")
        p.copy(dst=self._meta_dev, src=meta, name="h2d_meta")
        if prezero is not None:
            ws = self._ws
            count_offset, dq_offset, max_count = _kernels.prezero_args(params)
            grid = _kernels.prezero_grid(params.dq_acc_bound_bytes, self._rt.capabilities.multiprocessor_count)
            # It reads offsets[batch], which h2d_meta writes: the edge is inferred.
            p.kernel(
                prezero,
                grid,
                (_kernels.PREZERO_THREADS, 1, 1),
                [ws, count_offset, dq_offset, max_count],
                reads=[ws.view(count_offset, 8)],
                writes=[self._dq_acc],
                name="prezero",
            )
        return p

    @property
    def pack(self) -> str:
        """``"python"`` or ``"native"``: which host pack the pipeline runs."""
        return "python" if self._native is None else "native"

    @property
    def staging(self) -> Buffer:
        """The pinned staging block (seqstart q | seqstart k | metadata | result record)."""
        return self._staging

    def launch(
        self,
        stream: Stream,
        strategy: str = "stream",
        *,
        seqstart_q: Any = None,
        seqstart_k: Any = None,
        wait_for: str | Event | None = "stream",
        join: bool = True,
        deferred: bool = False,
    ) -> Run:
        """Enqueue one prepare (``"stream"``, ``"fork"`` or ``"fork_graph"``; non-blocking).

        ``wait_for``, ``join`` and ``deferred`` are ``Pipeline.launch``'s. For ``"fork_graph"`` and the
        deterministic ``"fork"``, which put the whole prepare on a pooled side stream: ``wait_for``
        (``"stream"``, the default: after the work enqueued on ``stream`` so far; an Event; or
        ``None``: at once) and ``join`` (default ``True``: ``stream`` waits for the prepare).
        ``"fork_graph"`` captures the prepare on its first launch, as :meth:`replay` does.
        ``deferred=True`` with ``join=False`` has the runtime's submission thread make a ``"fork"``
        launch's calls (docs/pipelines.md, "Deferred launches"); the others make them here.

        ``seqstart_q``, ``seqstart_k``: device memory (a Buffer, a tensor) that this launch reads
        instead of the buffer the prepare was built with (which it neither reads nor writes), as the
        seed's prepare takes its seqstart pointers per call. It needs ``wait_for="stream"`` and
        ``"stream"`` or ``"fork"``; the Run keeps it alive. A deferred ``"fork"`` reads it where it is
        (from its second such launch on a stream); the others copy it first, on ``stream``, into a
        small device block of the prepare's. Raises ``ValueError`` before enqueuing anything for memory
        that is not device memory of the runtime, is short, or overlaps the workspace.
        """
        if self._closed:
            self._check_open()
        if strategy not in ("stream", "fork", "fork_graph"):
            raise ValueError(f"launch takes strategy 'stream', 'fork' or 'fork_graph', got {strategy!r} (use replay() or run_sync())")
        if seqstart_q is not None or seqstart_k is not None:
            return self._launch_reading(stream, strategy, seqstart_q, seqstart_k, join, deferred, wait_for)
        if deferred and strategy == "fork" and not join and (wait_for is None or wait_for == "stream"):
            plan = self._pipeline._plans.get((stream, wait_for, False, True))  # compiled by an earlier launch
            if plan is not None and plan.backend is stream._backend is stream._runtime._base_backend:
                return plan.launch()  # type: ignore[no-any-return]  # (Pipeline.launch's fast path, at once)
        return self._launch(self._pipeline, stream, strategy, wait_for, join, deferred)

    def _launch(self, p: Pipeline, stream: Stream, strategy: str, wait_for: Any, join: bool, deferred: bool) -> Run:
        """:meth:`launch` of ``p`` (this prepare's pipeline, or the one over given seqstart)."""
        if strategy == "fork_graph" or (strategy == "fork" and self._params.deterministic):
            return self._launch_aside(p, stream, graph=strategy == "fork_graph", wait_for=wait_for, join=join, deferred=deferred)
        return p.launch(stream, policy=strategy, wait_for=wait_for, join=join, deferred=deferred)

    def _launch_reading(
        self, stream: Stream, strategy: str, seqstart_q: Any, seqstart_k: Any, join: bool, deferred: bool, wait_for: Any
    ) -> Run:
        """:meth:`launch` with seqstart given: a second pipeline, ordered with the first, reads a device block
        into which the memory given is copied on ``stream``; its compiled deferred plan reads the memory
        given in place instead (its two copies' sources changed for the launch)."""
        if strategy == "fork_graph":
            raise ValueError("seqstart_q= and seqstart_k= take 'stream' or 'fork': a captured prepare reads the buffers it was built with")
        if not (isinstance(wait_for, str) and wait_for == "stream"):
            raise ValueError("seqstart_q= and seqstart_k= need wait_for='stream': the prepare reads them after the work on stream")
        own_q, own_k = self._seq
        n = own_q._nbytes
        q = k = None
        if seqstart_q is not None:
            q = seqstart_buffer(self._rt, seqstart_q, "seqstart_q", n, self._ws)
        if seqstart_k is seqstart_q:
            k = q
        elif seqstart_k is not None:
            k = seqstart_buffer(self._rt, seqstart_k, "seqstart_k", n, self._ws)
        if self._given is not None and deferred and not join and strategy == "fork" and stream._capture is None:
            plan = self._given[0]._plans.get((stream, "stream", False, True))  # compiled by an earlier launch
            if plan is not None and plan.backend is stream._backend is stream._runtime._base_backend:
                known, steps = self._patch
                if plan is not known:
                    steps = (plan.copy_step("d2h_q"), plan.copy_step("d2h_k"))
                    self._patch = (plan, steps)
                sq, sk = steps
                if sq is not None and sk is not None:  # both copies read the memory given, or the prepare's own
                    return plan.launch(((sq, own_q if q is None else q), (sk, own_k if k is None else k)))
        with self._given_lock:  # no other launch over the block between its copies and their launch
            p, given = self._given or self._given_pipeline()
            chain = p._chain
            with stream.lock, chain.lock:
                if stream._capture is None and not stream._backend.stream_is_capturing(stream._handle):
                    chain.wait_previous((stream,))  # every earlier prepare has read the block
                stream.copy(given.view(0, n), own_q if q is None else q, n)
                stream.copy(given.view(n, n), own_k if k is None else k, n)
            return self._launch(p, stream, strategy, "stream", join, deferred)  # (its locks taken in launch order)

    def _given_pipeline(self) -> tuple[Pipeline, Buffer]:
        """The pipeline that reads seqstart from a device block of its own (given seqstart is copied there),
        ordered with this prepare's runs: made on the first launch that needs it."""
        n = self._seq[0]._nbytes
        given = self._rt.device_allocator.allocate(2 * n)
        p = self._build(self._params, given.view(0, n), given.view(n, n), copies=True)
        p._chain = self._pipeline._chain  # one order for both pipelines: they write the same staging and workspace
        p._lock = p._chain.lock
        self._given = (p, given)
        return self._given

    def _launch_aside(
        self, p: Pipeline, stream: Stream, *, graph: bool = False, wait_for: str | Event | None = "stream", join: bool = True,
        deferred: bool = False,
    ) -> Run:
        """The prepare on a pooled side stream: ``"fork"`` of the deterministic prepare, or any
        ``"fork_graph"`` (``graph``: the captured prepare replayed there). The deterministic pipeline
        is one chain, which ``Pipeline.launch`` under ``"fork"`` would keep on the caller's stream (the
        first branch stays there). The side stream is ordered as ``"fork"`` orders a side branch:
        after ``stream`` (``wait_for="stream"``), after an event, or at once (``None``); ``join``
        makes ``stream`` wait for it. The side stream and the entry event are kept per caller's
        stream (the last few) until :meth:`close`, so the chain's launch plan stays compiled.
        ``deferred`` (with ``join=False``): the chain runs on a side stream of its deferred launch
        plan, its calls made by the runtime's submission thread; where that cannot be (a replay, an
        Event to wait for, the Python pack, a trace open), the calls are made here, as without it."""
        if not (wait_for is None or wait_for == "stream" or isinstance(wait_for, Event)):
            raise TypeError("wait_for must be 'stream', an Event or None")
        if deferred and join:
            raise ValueError("deferred=True needs join=False (nothing then waits on the caller's thread)")
        if deferred and not graph and deferrable(p, stream, wait_for):
            # the chain on a side stream of its deferred plan, its calls made by the submission thread
            return p.launch(stream, policy="fork", wait_for=wait_for, join=False, deferred=True)
        with self._aside_lock:  # no other launch gives this side stream and event back meanwhile
            aside = self._asides.get(stream)
            if aside is None:
                aside = self._new_aside(stream)
            side, entry, _ = aside
            if wait_for == "stream":
                stream.record(entry)  # a wait binds to the record it saw when enqueued: re-recording is safe
                side.wait(entry)
            elif isinstance(wait_for, Event):
                side.wait(wait_for)
            run = self.replay(side) if graph else p.launch(side)
            if join:
                run.join(stream)
            return run

    def _new_aside(self, stream: Stream) -> tuple[Stream, Event, int]:
        """A side stream and an entry event for launches from ``stream``, from the runtime's pool."""
        stream._check_open()
        if stream.runtime is not self._rt:
            raise ValueError("the stream belongs to another runtime than the prepare")
        asides = self._asides
        if len(asides) >= _MAX_ASIDES:
            self._give_back(asides.pop(next(iter(asides))))  # the oldest
        pool = pool_for(self._rt)
        (side,) = pool.acquire_streams(1, stream.priority)
        aside = asides[stream] = (side, pool.acquire_event(), stream.priority)
        return aside

    def _give_back(self, aside: tuple[Stream, Event, int]) -> None:
        side, entry, priority = aside
        pool = pool_for(self._rt)
        pool.release_event(entry)
        pool.release_streams([side], priority)

    def result(self, stream: Stream) -> PrepareResult:
        """Blocking: wait for ``stream`` (the prepare's), then decode the result record of the latest prepare."""
        self._check_open()
        stream.synchronize()
        return PrepareResult.from_record(self._arrays[3])

    def run_sync(self, stream: Stream) -> PrepareResult:
        """The old synchronous path; returns the prepare's result. Blocks the host twice.

        Two D2H copies, each followed by ``stream.synchronize()`` (draining the stream, as
        ``hipMemcpy`` does), the pack (this prepare's) on this thread, then the memset of
        what CK zeroes (the used prefix in deterministic mode, knowable now; else the bound)
        and the H2D enqueued on ``stream``. Raises :class:`WorkspaceInputError` for invalid
        seqlens (after uploading the idle image).
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
            q_arr, k_arr, out, record = self._arrays
            if self._native is not None:
                self._native()
            else:
                pack_into(self._params, q_arr.astype(np.int64), k_arr.astype(np.int64), out).write_record(record)
            result = PrepareResult.from_record(record)
            zero = result.dq_acc_used_bytes if self._params.deterministic else self._params.dq_acc_bound_bytes
            stream.memset(self._dq_acc, 0, zero)
            stream.copy(self._meta_dev, self._meta_host)
            # A later launch must not overwrite the staging before this H2D has read it.
            with stream.lock:
                chain.last = Run(self._pipeline.name, "sync", (stream,), (), None, self._rt._engine, (stream,))
        result.raise_for_status()
        return result

    def _release(self) -> None:
        """Release the staging (its reuse waits for the streams that used it); give the side streams back."""
        self._staging.release()
        self._patch = (None, ())
        if self._given is not None:
            self._given[1].release()
            self._given = None
        with self._aside_lock:
            if not self._rt.is_closed:
                for aside in self._asides.values():
                    self._give_back(aside)
            self._asides.clear()


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
    """One prepare of ``workspace`` on ``stream``; returns its Run (or, for ``"sync"``, a Completion resolved
    with the :class:`~.result.PrepareResult`).

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
) -> PrepareResult:
    """The old synchronous prepare (see :meth:`WorkspacePrepare.run_sync`); returns its :class:`~.result.PrepareResult`."""
    with WorkspacePrepare(rt, params, seqstart_q, seqstart_k, workspace) as prep:
        return prep.run_sync(stream)
