"""What every prepare strategy object shares: its buffers' checks, its pipeline, its captured graph, closing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._buffer import DEVICE, Buffer
from .layout import WorkspaceParams

if TYPE_CHECKING:
    from typing_extensions import Self

    from ..._pipeline import Graph
    from ..._pipeline import Pipeline
    from ..._pipeline import Run
    from ..._runtime import Runtime
    from ..._stream import Stream

__all__ = ["PreparePlan", "prepare_buffers", "seqstart_buffer"]


def prepare_buffers(rt: Runtime, params: Any, seqstart_q: Any, seqstart_k: Any, workspace: Any) -> tuple[Buffer, Buffer, Buffer]:
    """``(seqstart_q, seqstart_k, workspace)`` as Buffers of exactly the bytes a prepare touches.

    Raises ``TypeError`` for params that are not :class:`WorkspaceParams`, ``ValueError`` for
    host memory, short buffers, a workspace that is not 16-byte aligned (CK's requirement) or
    seqstart inside the workspace (the prepare would overwrite it).
    """
    if not isinstance(params, WorkspaceParams):
        raise TypeError(f"params must be WorkspaceParams, not {type(params).__name__}")
    ws = rt.as_buffer(workspace)
    if ws.kind != DEVICE:
        raise ValueError(f"workspace must be device memory, got {ws.kind}")
    if ws.nbytes < params.workspace_bytes:
        raise ValueError(f"workspace has {ws.nbytes} bytes; workspace_size(params) is {params.workspace_bytes}")
    if ws.ptr % 16:
        raise ValueError(f"the workspace must be 16-byte aligned, got address {ws.ptr:#x}")
    ws = ws.view(0, params.workspace_bytes)
    seq_bytes = 4 * (params.batch + 1)
    q = seqstart_buffer(rt, seqstart_q, "seqstart_q", seq_bytes, ws)
    k = seqstart_buffer(rt, seqstart_k, "seqstart_k", seq_bytes, ws)
    return q.view(0, seq_bytes), k.view(0, seq_bytes), ws


def seqstart_buffer(rt: Runtime, value: Any, what: str, seq_bytes: int, workspace: Buffer) -> Buffer:
    """``value`` (a Buffer, or memory ``rt.as_buffer`` takes) as a Buffer, checked as seqstart that a prepare
    of ``workspace`` reads: ``ValueError`` for memory of another runtime, host memory, fewer than
    ``seq_bytes`` or an overlap with the workspace."""
    buf = value if isinstance(value, Buffer) else rt.as_buffer(value)
    if buf._runtime is not workspace._runtime:
        raise ValueError(f"{what} belongs to another runtime than the workspace")
    if buf._kind != DEVICE:
        raise ValueError(f"{what} must be device memory, got {buf._kind}")
    if buf._nbytes < seq_bytes:
        raise ValueError(f"{what} has {buf._nbytes} bytes; batch + 1 int32 need {seq_bytes}")
    if buf._ptr < workspace._ptr + workspace._nbytes and workspace._ptr < buf._ptr + seq_bytes:
        raise ValueError(f"{what} overlaps the workspace the prepare writes")
    return buf


class PreparePlan:
    """A built prepare: a :class:`Pipeline` launched eagerly, or captured once and replayed.

    Subclasses build the pipeline and call ``super().__init__``; ``_release``
    frees what they own beyond the graph. Close with :meth:`close` or ``with``.
    """

    def __init__(self, params: WorkspaceParams, pipeline: Pipeline) -> None:
        self._params = params
        self._pipeline = pipeline
        self._graph: Graph | None = None
        self._closed = False

    @property
    def params(self) -> WorkspaceParams:
        return self._params

    @property
    def pipeline(self) -> Pipeline:
        return self._pipeline

    @property
    def graph(self) -> Graph | None:
        """The captured graph, once :meth:`capture` or :meth:`replay` made it."""
        return self._graph

    def capture(self, stream: Stream, *, policy: str = "stream") -> Graph:
        """Capture the pipeline into this prepare's graph (replacing an earlier one)."""
        self._check_open()
        graph = self._pipeline.capture(stream, policy=policy)
        if self._graph is not None:
            self._graph.close()
        self._graph = graph
        return graph

    def replay(self, stream: Stream) -> Run:
        """Replay the captured prepare on ``stream`` (capturing on ``stream`` first if needed). Non-blocking."""
        self._check_open()
        graph = self._graph if self._graph is not None else self.capture(stream)
        return graph.launch(stream)

    def close(self) -> None:
        """Close the graph and release what the prepare owns. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._graph is not None:
            self._graph.close()
            self._graph = None
        self._release()

    def _release(self) -> None:
        """Free what a subclass owns beyond the graph (called once, by :meth:`close`)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"this {type(self).__name__} was closed")
