"""What every prepare strategy object shares: its pipeline, its captured graph, closing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .layout import WorkspaceParams

if TYPE_CHECKING:
    from typing_extensions import Self

    from ..._graph import Graph
    from ..._pipeline import Pipeline
    from ..._run import Run
    from ..._stream import Stream

__all__ = ["PreparePlan"]


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
