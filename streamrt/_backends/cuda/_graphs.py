"""Stream capture and graph calls of the CUDA backend (cudart)."""

from __future__ import annotations

from typing import Any

from ..protocol import CaptureMode
from ._codes import _check
from ._core import CudaCore

__all__ = ["GraphCalls"]


class GraphCalls(CudaCore):
    """stream_begin_capture / stream_end_capture / stream_is_capturing / graph_* calls."""

    def stream_begin_capture(self, stream: int, mode: CaptureMode) -> None:
        rt = self._rt
        (err,) = rt.cudaStreamBeginCapture(self._stream(stream), rt.cudaStreamCaptureMode(int(mode)))
        _check(err, "cudaStreamBeginCapture")

    def stream_end_capture(self, stream: int) -> int:
        err, graph = self._rt.cudaStreamEndCapture(self._stream(stream))
        _check(err, "cudaStreamEndCapture")
        handle = int(self._native_handle(graph))
        self._graphs[handle] = graph
        return handle

    def stream_is_capturing(self, stream: int) -> bool:
        """``True`` while ``stream`` is in capture mode, including a capture already invalidated."""
        rt = self._rt
        err, status = rt.cudaStreamIsCapturing(self._stream(stream))
        _check(err, "cudaStreamIsCapturing")
        return int(status) != int(rt.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone)

    def _graph(self, graph: int) -> Any:
        obj = self._graphs.get(graph)
        return self._rt.cudaGraph_t(graph) if obj is None else obj

    def graph_instantiate(self, graph: int) -> int:
        err, graph_exec = self._rt.cudaGraphInstantiate(self._graph(graph), 0)
        _check(err, "cudaGraphInstantiate")
        handle = int(self._native_handle(graph_exec))
        self._graph_execs[handle] = graph_exec
        return handle

    def graph_launch(self, graph_exec: int, stream: int) -> None:
        g = self._graph_execs.get(graph_exec)
        s = self._stream_get(stream)
        err = self._cudaGraphLaunch(
            self._cudaGraphExec_t(graph_exec) if g is None else g, self._stream(stream) if s is None else s
        )[0]
        if err:
            _check(err, "cudaGraphLaunch")

    def graph_exec_destroy(self, graph_exec: int) -> None:
        g = self._graph_execs.get(graph_exec)
        (err,) = self._rt.cudaGraphExecDestroy(self._cudaGraphExec_t(graph_exec) if g is None else g)
        _check(err, "cudaGraphExecDestroy")
        self._graph_execs.pop(graph_exec, None)

    def graph_destroy(self, graph: int) -> None:
        (err,) = self._rt.cudaGraphDestroy(self._graph(graph))
        _check(err, "cudaGraphDestroy")
        self._graphs.pop(graph, None)
