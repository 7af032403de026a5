"""Stream capture and graph calls of the hip backend."""

from __future__ import annotations

from ..._errors import CaptureError
from ..protocol import CaptureMode
from ._codes import _check, _error
from ._core import HipCore

__all__ = ["GraphCalls"]


class GraphCalls(HipCore):
    """stream_begin_capture / stream_end_capture / stream_is_capturing / graph_* calls."""

    # -- capture -----------------------------------------------------------------------------
    def stream_begin_capture(self, stream: int, mode: CaptureMode) -> None:
        err = self._hipStreamBeginCapture(self._stream(stream), self._capture_modes[mode])[0]
        _check(err, "hipStreamBeginCapture")

    def stream_end_capture(self, stream: int) -> int:
        """End capture; the graph handle. ``CaptureError`` when the capture was invalidated.

        On failure the stream has left capture mode and any partial graph is destroyed.
        """
        err, graph = self._hipStreamEndCapture(self._stream(stream))
        if err:
            if graph is not None:
                self._hipGraphDestroy(graph)
            raise _error(err, "hipStreamEndCapture")
        if graph is None:
            raise CaptureError("hipStreamEndCapture returned no graph: the stream was not capturing")
        return self._keep(self._graphs, graph)

    def stream_is_capturing(self, stream: int) -> bool:
        """``True`` while ``stream`` is capturing (also when its capture is already invalidated)."""
        err, status = self._hipStreamIsCapturing(self._stream(stream))
        _check(err, "hipStreamIsCapturing")
        return int(status) != 0

    # -- graphs ------------------------------------------------------------------------------
    def graph_instantiate(self, graph: int) -> int:
        graph_obj = self._graphs.get(graph)
        if graph_obj is None:
            graph_obj = self._remember(self._graphs, self._new_graph, graph)
        err, graph_exec, _error_node, _log = self._hipGraphInstantiate(graph_obj, 0)
        _check(err, "hipGraphInstantiate")
        return self._keep(self._graph_execs, graph_exec)

    def graph_launch(self, graph_exec: int, stream: int) -> None:
        ge = self._graph_execs.get(graph_exec)
        if ge is None:
            ge = self._remember(self._graph_execs, self._new_graph_exec, graph_exec)
        st = self._streams.get(stream)
        if st is None:
            st = self._remember(self._streams, self._new_stream, stream)
        err = self._hipGraphLaunch(ge, st)[0]
        if err:
            _check(err, "hipGraphLaunch")

    def graph_exec_destroy(self, graph_exec: int) -> None:
        ge = self._graph_execs.get(graph_exec)
        if ge is None:
            ge = self._new_graph_exec(graph_exec)
        _check(self._hipGraphExecDestroy(ge)[0], "hipGraphExecDestroy")
        self._graph_execs.pop(graph_exec, None)

    def graph_destroy(self, graph: int) -> None:
        g = self._graphs.get(graph)
        if g is None:
            g = self._new_graph(graph)
        _check(self._hipGraphDestroy(g)[0], "hipGraphDestroy")
        self._graphs.pop(graph, None)
