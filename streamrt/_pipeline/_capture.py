"""Capturing a stream's work into a graph, and recording into a capture someone else began.

``with stream.capture() as graph:`` (:class:`StreamCapture`) begins a capture on
the stream, lets arbitrary streamrt work be enqueued on it (stream ops, Python
and native host functions, pipeline launches, kernel launches), and at the end
of the block ends and instantiates the capture into ``graph``, a
:class:`~streamrt._pipeline._graph.Graph` like ``Pipeline.capture``'s:
``graph.launch(stream)`` replays it and returns a Run whose awaiter gets the
host functions' errors; keepalives (buffers, callables, arguments, host slots,
the allocators' capture pools) live until ``graph.close()`` and the last
replay. While the block runs the stream carries a :class:`CaptureSession` that
collects them; allocations on the stream come from capture pools entered for
the block, so a staging buffer allocated and released in the block keeps its
memory for the graph (a buffer released by the end of the block is not
checked at launch; one released later is, as for ``Pipeline.capture``).

A failure inside the block (an exception, or a capture the backend
invalidated) ends the capture, destroys what was captured, closes the host
slots and pools, and leaves the stream usable; the graph is then closed. The
block's own exception propagates; a failed end of capture raises
``CaptureError``.

Foreign captures. A pipeline launch or a Python host function on a stream
that another library is capturing (found by ``stream_is_capturing``, with no
session on the stream) is recorded into that capture. Its host slots (foreign:
nobody arms their replays, errors are logged), callables, arguments, buffers
and the allocators' implicit capture pools of the stream are tied to the
foreign graph (:func:`streamrt._graph_release.tie`) *before* anything is
enqueued, and released on the releaser thread once that graph and its
executable graphs are destroyed. Without the C extension the tie refuses with
``CaptureError`` and nothing is enqueued.

What a recorded call returns. Recording runs nothing, so a pipeline launch
returns a Run (policy ``"captured"``), and a Python host function a
Completion, that is done at once and carries a ``CaptureError`` saying where
the work went: awaiting it, or calling ``result()``, raises that error at once
instead of waiting for a replay that it cannot see. It is never logged as
unretrieved. A pipeline launched into a capture records every node on the
launching stream, in topological order (``policy="fork"`` included): pooled side
streams stay part of a capture until it ends, which streamrt does not see for
a foreign one. It is not ordered after the pipeline's eager runs (a capturing
stream cannot wait for uncaptured work).

Thread rules: the with block belongs to the thread that entered it; work
other threads enqueue on the stream meanwhile is captured too (in the default
thread-local mode their unsafe calls are not refused).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._backends.protocol import CaptureMode
from .._buffer import Buffer
from .._completion import Completion
from .._errors import CaptureError
from .._extensions import provide
from .._graph_release import tie, unavailable_reason
from ._graph import Graph, _GraphState, host_slots, record_into
from ._nodes import RecordNode, WaitNode
from ._run import Run, RunChain, recorded_run

if TYPE_CHECKING:
    from .._hostcall import HostSlot
    from .._runtime import Runtime
    from .._stream import Stream
    from ._builder import Pipeline

__all__ = ["CaptureSession", "StreamCapture", "capture_host_func", "launch_into_capture"]


class CaptureSession:
    """What ``with stream.capture()`` has recorded so far: keepalives, buffers and host slots."""

    __slots__ = ("buffers", "graph", "keep", "slots")

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.keep: list[Any] = []
        self.buffers: list[Buffer] = []
        self.slots: list[tuple[str, HostSlot]] = []

    def used(self, *objects: Any) -> None:
        """A stream op of the block used ``objects`` (Buffers are checked at launch; all are kept)."""
        for obj in objects:
            if isinstance(obj, Buffer):
                self.buffers.append(obj)
            else:
                self.keep.append(obj)

    def slot_name(self, what: str) -> str:
        return f"{len(self.slots)}:{what}"


class StreamCapture:
    """The context manager of :meth:`Stream.capture`; ``__enter__`` returns the (not yet usable) Graph."""

    def __init__(self, stream: Stream, mode: CaptureMode | int, name: str | None) -> None:
        try:
            self._mode = CaptureMode(mode)
        except ValueError:
            raise ValueError(f"mode must be a CaptureMode (GLOBAL, THREAD_LOCAL or RELAXED), got {mode!r}") from None
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        self._stream = stream
        self._name = name or f"capture of {stream.name}"
        self._session: CaptureSession | None = None
        self._pools: list[Any] = []

    def __enter__(self) -> Graph:
        stream = self._stream
        rt = stream._runtime
        if self._session is not None:
            raise RuntimeError("this capture was entered already; call stream.capture() again")
        if not rt.capabilities.supports_graphs:
            raise CaptureError(f"the {rt.backend_name} backend on this device does not support graphs")
        backend = rt._backend
        with stream._lock:
            stream._check_open()
            if stream._capture is not None or backend.stream_is_capturing(stream._handle):
                raise CaptureError(f"{stream.name} is already capturing; end that capture first")
            self._pools = _enter_pools(rt, stream)
            rt._captures.begun()  # before the capture begins (a device-wide wait in progress ends first); __exit__ ends it
            try:
                backend.stream_begin_capture(stream._handle, self._mode)
            except BaseException:
                rt._captures.ended()
                _leave_pools(self._pools, close=True)
                raise
            graph = Graph(self._name, rt, [], [], False, self._mode, None, RunChain(), from_stream=True)
            self._session = stream._capture = CaptureSession(graph)
        return graph

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        stream = self._stream
        session = self._session
        assert session is not None, "__exit__ without __enter__"
        rt = stream._runtime
        backend = rt._backend
        failure: BaseException | None = None
        exec_handle = 0
        with stream._lock:
            stream._capture = None
            _leave_pools(self._pools, close=False)
            graph_handle = 0
            try:
                graph_handle = backend.stream_end_capture(stream._handle)
                if exc is None:
                    exec_handle = backend.graph_instantiate(graph_handle)
            except Exception as error:  # noqa: BLE001 - reported below, or behind the block's own error
                failure = error
            finally:
                rt._captures.ended()
                if graph_handle:
                    backend.graph_destroy(graph_handle)
        if exc is not None or failure is not None:
            for _, slot in session.slots:
                slot.close()
            _leave_pools(self._pools, close=True)
            session.graph._captured(None)
            if exc is None and failure is not None:
                raise CaptureError(f"capturing {self._name!r} failed: {failure}") from failure
            return
        # Buffers released in the block came from its capture pools (which keep their memory for the
        # graph) or were the caller's to keep: replays check the others for release.
        live = tuple(b for b in session.buffers if not b.base.is_released)
        state = _GraphState(
            self._name, rt, exec_handle, session.slots, [], (), keep=(*session.keep, *session.buffers), buffers=live, pools=tuple(self._pools)
        )
        session.graph._captured(state)


def _enter_pools(rt: Runtime, stream: Stream) -> list[Any]:
    """The allocators' capture pools for ``stream``, entered: allocations on it come from them until the block ends."""
    pools: list[Any] = []
    try:
        for allocator in (rt._host_allocator, rt._device_allocator):
            make = getattr(allocator, "capture_pool", None)
            if make is not None:
                pool = make(stream)
                pools.append(pool)
                pool.__enter__()
    except BaseException:
        _leave_pools(pools, close=True)
        raise
    return pools


def _leave_pools(pools: list[Any], *, close: bool) -> None:
    for pool in pools:
        pool.__exit__(None, None, None)
        if close:
            pool.close()


# -- recording into a capture (the stream's session, or a foreign capture) -------------------------------


def _recorded_error(stream: Stream, what: str) -> CaptureError:
    session = stream._capture
    if session is not None:
        return CaptureError(
            f"{what} was recorded into graph {session.graph.name!r} (stream.capture()); nothing ran: it runs on "
            "each replay, so await graph.launch(stream) instead"
        )
    return CaptureError(
        f"{what} was recorded into a graph another library is capturing on {stream.name}; nothing ran: it runs on "
        "each replay of that graph, which streamrt does not see, so wait for the replay there (torch.cuda.synchronize(), ...)"
    )


def _tie_foreign(stream: Stream, keep: tuple[Any, ...], slots: list[HostSlot]) -> None:
    """Tie ``keep``, ``slots`` and the stream's implicit capture pools to the foreign graph ``stream``
    captures into. Raises (nothing tied, nothing enqueued yet) when that is not possible."""
    rt = stream._runtime
    reason = unavailable_reason()
    if reason is not None:
        raise CaptureError(reason)
    graph = rt._base_backend.stream_capture_graph(stream._handle)
    if not graph:
        raise CaptureError(f"{stream.name} stopped capturing while streamrt recorded into its capture")
    pools: list[Any] = []
    held: list[Any] = [keep]

    def release() -> None:
        for slot in slots:
            slot.close()
        for pool in pools:
            pool.close()
        held.clear()  # the keepalive is dropped here, on the releaser thread

    tie(rt, graph, release)
    for allocator in (rt._host_allocator, rt._device_allocator):
        take = getattr(allocator, "take_capture_pool", None)
        pool = take(stream) if take is not None else None
        if pool is not None:
            pools.append(pool)


def launch_into_capture(p: Pipeline, stream: Stream, order: list[int], keep: tuple[Any, ...]) -> Run:
    """``Pipeline.launch`` on a capturing stream (its lock and the pipeline's held; validated): record
    the nodes into the stream's session or the foreign capture. See the module docstring."""
    rt = stream._runtime
    if p._devices or p._placement(rt) is not None:
        raise CaptureError(f"pipeline {p.name!r} uses buffers of several devices: it cannot be recorded into one graph")
    nodes = list(p._nodes)
    for node in nodes:
        if isinstance(node, (RecordNode, WaitNode)):
            raise CaptureError(
                f"node {node.name!r} ({node.kind}) cannot be recorded into a capture: event nodes order work between "
                "pipelines at launch time"
            )
    session = stream._capture
    slots = host_slots(rt, nodes, order, foreign=session is None)
    try:
        if session is None:
            _tie_foreign(stream, keep, list(slots.values()))
        else:
            session.keep.append(keep)
            session.buffers.extend(b for node in nodes for b in node.buffers())
            session.slots.extend((f"{p.name}.{name}", slot) for name, slot in slots.items())
    except BaseException:
        for slot in slots.values():
            slot.close()
        raise
    record_into(p.name, nodes, order, stream, slots)
    return recorded_run(p.name, rt._engine, _recorded_error(stream, f"the launch of pipeline {p.name!r}"))


def capture_host_func(stream: Stream, fn: Callable[..., Any], args: tuple[Any, ...]) -> Completion:
    """``Stream.launch_host_func`` of a Python callable on a capturing stream (its lock held): a host slot
    that runs ``fn(*args)`` on every replay, recorded into the session or the foreign capture."""
    rt = stream._runtime
    session = stream._capture
    slot = rt._engine.host_slot(fn, args, foreign=session is None)
    try:
        if session is None:
            _tie_foreign(stream, (), [slot])
        else:
            session.slots.append((session.slot_name(getattr(fn, "__name__", "host")), slot))
    except BaseException:
        slot.close()
        raise
    slot.capture(stream._handle, stream._backend)
    completion = rt._engine._new_completion()
    completion._resolve(None, _recorded_error(stream, f"host function {fn!r}"), None)
    return completion


provide("stream_capture", StreamCapture)  # Stream.capture
provide("capture_host_func", capture_host_func)  # Stream.launch_host_func while capturing
