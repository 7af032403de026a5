"""Pipeline nodes and the enqueue of a planned pipeline onto streams (eager or while capturing).

A node is immutable once made: its buffers, sizes and callables are fixed and
validated when :class:`~streamrt.Pipeline` creates it; its edges live in the
pipeline. Each node knows how to put itself on a stream, either eagerly or
into a capture (:meth:`Node._enqueue`), through the backend's primitives.

:func:`enqueue_plan` runs a whole pipeline onto one stream (topological order)
or several (a :class:`~streamrt._pipeline._deps.ForkPlan`), ordering streams
with pooled events. It is shared by ``Pipeline.launch`` and ``Pipeline.capture``.

Tracing. Nodes have one enqueue. While a trace is open the runtime's backend
is the tracing wrapper (:mod:`streamrt._trace_backend`), so every op reaches
the tracer; :func:`enqueue_plan` names them by labelling each node's ops with
the pipeline's and the node's names (a launch plan is not used while tracing).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from .._backends.protocol import MemcpyKind
from .._buffer import DEVICE, HOST, Buffer
from ._deps import Access, ForkPlan
from .._stream import _user_data, native_function_address
from .._trace_labels import label

if TYPE_CHECKING:
    from .._event import Event
    from .._hostcall import HostRequest, HostSlot
    from .._stream import Stream
    from .._streampool import StreamPool

__all__ = [
    "CopyNode",
    "EnqueueNode",
    "HostNode",
    "MemsetNode",
    "Node",
    "RecordNode",
    "WaitNode",
    "enqueue_plan",
    "graph_node_names",
    "substitute",
]

COPY_KIND = {
    (HOST, HOST): MemcpyKind.HOST_TO_HOST,
    (HOST, DEVICE): MemcpyKind.HOST_TO_DEVICE,
    (DEVICE, HOST): MemcpyKind.DEVICE_TO_HOST,
    (DEVICE, DEVICE): MemcpyKind.DEVICE_TO_DEVICE,
}


class Node:
    """One step of a pipeline. Made by ``Pipeline`` methods, never directly.

    Attributes:
        name: unique within its pipeline.
        kind: ``"memset"``, ``"copy"``, ``"host"``, ``"enqueue"``, ``"kernel"``, ``"record"`` or ``"wait"``.
        reads, writes: the Buffers it declared (or that its operation implies).
    """

    kind = "node"
    __slots__ = ("_pipeline", "_index", "_name", "_reads", "_writes", "_accesses")

    def __init__(self, pipeline: Any, index: int, name: str, reads: tuple[tuple[Buffer, int], ...], writes: tuple[tuple[Buffer, int], ...]) -> None:
        self._pipeline = pipeline
        self._index = index
        self._name = name
        self._reads = reads  # (buffer, nbytes accessed from its start)
        self._writes = writes
        self._accesses = tuple(Access(b.ptr, b.ptr + n, False) for b, n in reads if n) + tuple(
            Access(b.ptr, b.ptr + n, True) for b, n in writes if n
        )

    @property
    def name(self) -> str:
        return self._name

    @property
    def index(self) -> int:
        """Position in the pipeline (creation order)."""
        return self._index

    @property
    def pipeline(self) -> Any:
        return self._pipeline

    @property
    def reads(self) -> tuple[Buffer, ...]:
        return tuple(b for b, _ in self._reads)

    @property
    def writes(self) -> tuple[Buffer, ...]:
        return tuple(b for b, _ in self._writes)

    @property
    def accesses(self) -> tuple[Access, ...]:
        """The address ranges it reads and writes (what dependency inference uses)."""
        return self._accesses

    def buffers(self) -> tuple[Buffer, ...]:
        return tuple(b for b, _ in self._reads) + tuple(b for b, _ in self._writes)

    def keepalive(self) -> tuple[Any, ...]:
        """What must stay alive while the node's work is in flight."""
        return self.buffers()

    def _enqueue(self, stream: Stream, ctx: EnqueueContext) -> None:
        """Put the node on ``stream`` (eagerly, or into the capture ``stream`` is part of). Untraced."""
        raise NotImplementedError

    def _plan_step(self, stream: Stream, keep: list[Any]) -> PlanStep | None:
        """The node's eager enqueue on ``stream`` as one bound call ``(fn, args)`` for a launch plan.

        ``fn is None`` marks a Python host node (``args`` is ``(fn, args)``,
        submitted to the stream's worker); ``None`` means no call (an empty
        memset or copy). Objects the call's arguments point into go to
        ``keep``. This default calls :meth:`_enqueue` (user code, kernels).
        """
        return (self._enqueue, (stream, _EAGER))

    def _graph_nodes(self) -> int | None:
        """How many graph nodes capturing the node adds (``None``: unknown, e.g. a user enqueue callable).

        A kernel launch is one graph node; event records and waits add none.
        Graphs use it to name their nodes in traces.
        """
        return 1 if self.kind == "kernel" else None

    def _pipeline_name(self) -> str | None:
        pipeline = self._pipeline
        return pipeline.name if pipeline is not None else None

    def _rebound(self, mapping: dict[int, Buffer]) -> Node:
        """A copy with buffers substituted (``mapping``: ``id(old buffer)`` -> new)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._name!r}>"


def _sub(buf: Buffer, mapping: dict[int, Buffer]) -> Buffer:
    new = mapping.get(id(buf))
    if new is not None:
        return new
    base = buf.base
    if base is not buf:
        new_base = mapping.get(id(base))
        if new_base is not None:
            return new_base.view(buf.offset, buf.nbytes)
    return buf


def substitute(value: Any, mapping: dict[int, Buffer]) -> Any:
    """``value`` with Buffers (also inside tuples and lists) replaced through ``mapping``."""
    if isinstance(value, Buffer):
        return _sub(value, mapping)
    if isinstance(value, tuple):
        return tuple(substitute(v, mapping) for v in value)
    if isinstance(value, list):
        return [substitute(v, mapping) for v in value]
    return value


class MemsetNode(Node):
    """Set ``nbytes`` bytes of ``dst`` to ``value``."""

    kind = "memset"
    __slots__ = ("dst", "value", "nbytes")

    def __init__(self, pipeline: Any, index: int, name: str, dst: Buffer, value: int, nbytes: int) -> None:
        super().__init__(pipeline, index, name, (), ((dst, nbytes),))
        self.dst = dst
        self.value = value
        self.nbytes = nbytes

    def _enqueue(self, stream: Stream, ctx: EnqueueContext) -> None:
        if self.nbytes:  # an empty memset is a no-op (and not a valid graph node)
            stream._backend.memset_async(self.dst._ptr, self.value, self.nbytes, stream._handle)
        self.dst.note_stream(stream)

    def _graph_nodes(self) -> int | None:
        return 1 if self.nbytes else 0

    def _plan_step(self, stream: Stream, keep: list[Any]) -> PlanStep | None:
        if not self.nbytes:
            return None
        return (stream._backend.memset_async, (self.dst._ptr, self.value, self.nbytes, stream._handle))

    def _rebound(self, mapping: dict[int, Buffer]) -> Node:
        return MemsetNode(self._pipeline, self._index, self._name, _sub(self.dst, mapping), self.value, self.nbytes)


class CopyNode(Node):
    """Copy ``nbytes`` from ``src`` to ``dst``; ``direction`` inferred from the buffers' kinds."""

    kind = "copy"
    __slots__ = ("dst", "src", "nbytes", "direction")

    def __init__(self, pipeline: Any, index: int, name: str, dst: Buffer, src: Buffer, nbytes: int, direction: MemcpyKind) -> None:
        super().__init__(pipeline, index, name, ((src, nbytes),), ((dst, nbytes),))
        self.dst = dst
        self.src = src
        self.nbytes = nbytes
        self.direction = direction

    def _enqueue(self, stream: Stream, ctx: EnqueueContext) -> None:
        if self.nbytes:  # an empty copy is a no-op (and not a valid graph node)
            stream._backend.memcpy_async(self.dst._ptr, self.src._ptr, self.nbytes, self.direction, stream._handle)
        self.dst.note_stream(stream)
        self.src.note_stream(stream)

    def _graph_nodes(self) -> int | None:
        return 1 if self.nbytes else 0

    def _plan_step(self, stream: Stream, keep: list[Any]) -> PlanStep | None:
        if not self.nbytes:
            return None
        return (stream._backend.memcpy_async, (self.dst._ptr, self.src._ptr, self.nbytes, self.direction, stream._handle))

    def _rebound(self, mapping: dict[int, Buffer]) -> Node:
        return CopyNode(self._pipeline, self._index, self._name, _sub(self.dst, mapping), _sub(self.src, mapping), self.nbytes, self.direction)


class HostNode(Node):
    """Run ``fn(*args)`` on the host in stream order.

    A Python callable runs on a runtime worker thread (eagerly through the
    completion engine's host calls; in a graph through a host slot that
    re-runs it on every replay). A native ``void(*)(void*)`` (ctypes, numba
    cfunc) runs on the driver thread with one user-data argument.
    """

    kind = "host"
    __slots__ = ("fn", "args", "native_address", "user_data")

    def __init__(
        self,
        pipeline: Any,
        index: int,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        reads: tuple[tuple[Buffer, int], ...],
        writes: tuple[tuple[Buffer, int], ...],
    ) -> None:
        super().__init__(pipeline, index, name, reads, writes)
        self.fn = fn
        self.args = args
        self.native_address = native_function_address(fn)
        self.user_data = _user_data(args) if self.native_address is not None else 0

    @property
    def is_native(self) -> bool:
        return self.native_address is not None

    def keepalive(self) -> tuple[Any, ...]:
        return (*self.buffers(), self.fn, self.args)

    def _enqueue(self, stream: Stream, ctx: EnqueueContext) -> None:
        if self.native_address is not None:  # the launch's keepalive holds the function
            stream._backend.launch_host_func(stream._handle, self.native_address, self.user_data)
        elif ctx.capturing:
            ctx.slots[self._name].capture(stream._handle, stream._backend)
        else:
            # launch() checked that no stream of the launch is capturing; the launch's Run reads the outcome
            request = stream._runtime._engine.host_request(stream._handle, self.fn, self.args, stream._backend)
            ctx.host.append((self._name, request))
        for b, _ in self._reads:
            b.note_stream(stream)
        for b, _ in self._writes:
            b.note_stream(stream)

    def _plan_step(self, stream: Stream, keep: list[Any]) -> PlanStep | None:
        if self.native_address is None:
            return (None, (self.fn, self.args))
        return (stream._backend.launch_host_func, (stream._handle, self.native_address, self.user_data))

    def _graph_nodes(self) -> int | None:
        # A native function is one host node; a Python one is captured through its host slot,
        # whose capture() enqueues two native functions (sem_post, sem_wait): two host nodes.
        return 1 if self.native_address is not None else 2

    def _rebound(self, mapping: dict[int, Buffer]) -> Node:
        return HostNode(
            self._pipeline,
            self._index,
            self._name,
            self.fn,
            substitute(self.args, mapping),
            tuple((_sub(b, mapping), n) for b, n in self._reads),
            tuple((_sub(b, mapping), n) for b, n in self._writes),
        )


class EnqueueNode(Node):
    """Device work enqueued by a callable: ``fn(stream, *args)`` (kernel launches, torch or cupy ops).

    ``fn`` must only enqueue work on the stream it is given, without
    synchronizing; inside a capture its work becomes graph nodes.
    """

    __slots__ = ("_kind", "args", "fn")

    def __init__(
        self,
        pipeline: Any,
        index: int,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        reads: tuple[tuple[Buffer, int], ...],
        writes: tuple[tuple[Buffer, int], ...],
        kind: str = "enqueue",
    ) -> None:
        super().__init__(pipeline, index, name, reads, writes)
        self.fn = fn
        self.args = args
        self._kind = kind

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self._kind

    def keepalive(self) -> tuple[Any, ...]:
        return (*self.buffers(), self.fn, self.args)

    def _enqueue(self, stream: Stream, ctx: EnqueueContext) -> None:
        self.fn(stream, *self.args)
        for b, _ in self._reads:
            b.note_stream(stream)
        for b, _ in self._writes:
            b.note_stream(stream)

    def _rebound(self, mapping: dict[int, Buffer]) -> Node:
        return EnqueueNode(
            self._pipeline,
            self._index,
            self._name,
            self.fn,
            substitute(self.args, mapping),
            tuple((_sub(b, mapping), n) for b, n in self._reads),
            tuple((_sub(b, mapping), n) for b, n in self._writes),
            self._kind,
        )


class _EventNode(Node):
    """A node that records or waits for ``event``: no buffers, no graph node of its own."""

    __slots__ = ("event",)
    _op = ""  # the traced op kind

    def __init__(self, pipeline: Any, index: int, name: str, event: Event) -> None:
        super().__init__(pipeline, index, name, (), ())
        self.event = event

    def keepalive(self) -> tuple[Any, ...]:
        return (self.event,)

    def _call(self, backend: Any, stream: int, event: int) -> None:
        raise NotImplementedError

    def _enqueue(self, stream: Stream, ctx: EnqueueContext) -> None:
        event = self.event
        event._check_open()
        self._call(stream._backend, stream._handle, event._handle)
        self._after(event, stream._handle)

    def _after(self, event: Event, stream: int) -> None:
        """Bookkeeping once the call is enqueued."""

    def _graph_nodes(self) -> int | None:
        return 0

    def _rebound(self, mapping: dict[int, Buffer]) -> Node:
        return self


class RecordNode(_EventNode):
    """Record ``event`` once the node's predecessors have completed (an edge to another pipeline)."""

    kind = "record"
    __slots__ = ()
    _op = "record"

    def _call(self, backend: Any, stream: int, event: int) -> None:
        backend.event_record(event, stream)

    def _plan_step(self, stream: Stream, keep: list[Any]) -> PlanStep | None:
        return (stream._backend.event_record, (self.event._handle, stream._handle))

    def _after(self, event: Event, stream: int) -> None:
        event._recorded_on = stream


class WaitNode(_EventNode):
    """Make the node's dependents wait for ``event`` (recorded by another pipeline or stream)."""

    kind = "wait"
    __slots__ = ()
    _op = "wait_event"

    def _call(self, backend: Any, stream: int, event: int) -> None:
        backend.stream_wait_event(stream, event)

    def _plan_step(self, stream: Stream, keep: list[Any]) -> PlanStep | None:
        return (stream._backend.stream_wait_event, (stream._handle, self.event._handle))


# -- enqueueing a whole pipeline ----------------------------------------------------------------------


#: One bound call of a launch plan: ``(fn, args)``; ``fn is None`` for a Python host node.
PlanStep = tuple[Callable[..., Any] | None, tuple[Any, ...]]


@dataclass
class EnqueueContext:
    """State of one enqueue pass: capture or eager, and what the host nodes produced."""

    capturing: bool
    slots: dict[str, HostSlot] = field(default_factory=dict)  # capture: Python host node -> slot
    host: list[tuple[str, HostRequest]] = field(default_factory=list)  # eager: node name -> its request
    current: str = ""  # the node being enqueued (for error messages)


#: The context of an eager enqueue in a launch plan (it collects nothing: the plan submits host nodes).
_EAGER = EnqueueContext(capturing=False)


def enqueue_plan(
    nodes: list[Node],
    order: list[int],
    plan: ForkPlan | None,
    streams: list[Stream],
    pool: StreamPool | None,
    ctx: EnqueueContext,
    *,
    fork_from_caller: Event | None,
    join: bool,
) -> None:
    """Enqueue ``nodes`` on ``streams`` (``streams[0]`` is the caller's).

    Without ``plan``: all of ``order`` on ``streams[0]``. With one: each step
    on its slot's stream; side streams first wait for ``fork_from_caller``
    (an event the caller recorded, or ``None`` for no entry wait); when
    ``join``, the caller's stream finally waits for every side tail that is
    not already ordered before it. Ordering events come from ``pool`` and go
    back to it before returning (waits bind at enqueue time). Raises whatever
    the backend or a node raised; ``ctx.current`` then names the node.

    While the runtime is traced, each node's ops (and the waits and the
    record around a step) are enqueued under :func:`~streamrt._trace_labels.label`
    with the pipeline's and the node's names, so the tracing backend labels
    them; the entry and join waits carry the pipeline's name only.
    """
    tag = _labels(streams[0], nodes)
    if plan is None:
        main = streams[0]
        for i in order:
            node = nodes[i]
            ctx.current = node._name
            with tag(node._name):
                node._enqueue(main, ctx)
        ctx.current = ""
        return
    assert pool is not None
    events: dict[int, Event] = {}
    try:
        if fork_from_caller is not None:
            with tag(None):
                for s in streams[1:]:
                    s._backend.stream_wait_event(s._handle, fork_from_caller._handle)
        for v, slot, waits in plan.steps:
            s = streams[slot]
            backend = s._backend
            node = nodes[v]
            with tag(node._name):
                for u in waits:
                    backend.stream_wait_event(s._handle, events[u]._handle)
                ctx.current = node._name
                node._enqueue(s, ctx)
                if v in plan.signals:
                    ev = pool.acquire_event()
                    events[v] = ev
                    backend.event_record(ev._handle, s._handle)
        ctx.current = ""
        if join:
            main = streams[0]
            for slot in plan.joins:
                tail = plan.tails[slot]
                tail_ev = events.get(tail)
                if tail_ev is None:
                    tail_ev = events[tail] = pool.acquire_event()
                    with tag(nodes[tail]._name):
                        main._backend.event_record(tail_ev._handle, streams[slot]._handle)
                with tag(None):
                    main._backend.stream_wait_event(main._handle, tail_ev._handle)
    finally:
        for ev in events.values():
            pool.release_event(ev)


_NO_LABEL = contextlib.nullcontext()


def labelled(stream: Stream, pipeline: str | None, node: str | None) -> contextlib.AbstractContextManager[None]:
    """The label of ops enqueued on ``stream`` while its backend is wrapped (a trace, or profiler ranges)."""
    return _NO_LABEL if stream._backend is stream._runtime._base_backend else label(pipeline, node)


def _labels(stream: Stream, nodes: list[Node]) -> Callable[[str | None], contextlib.AbstractContextManager[None]]:
    """``tag(node_name)``: the label of a node's ops while ``stream``'s runtime is traced, else nothing."""
    if stream._backend is stream._runtime._base_backend or not nodes:
        return lambda _node: _NO_LABEL
    pipeline = nodes[0]._pipeline_name()
    return lambda node: label(pipeline, node)


def graph_node_names(nodes: list[Node], order: list[int], plan: ForkPlan | None) -> tuple[str, ...]:
    """The pipeline node behind each node of a graph captured by :func:`enqueue_plan`, by graph node index.

    Graph nodes are numbered in capture order, which is the plan's enqueue
    order; ordering events add none. The names stop at the first node whose
    number of graph nodes is unknown (an enqueue node running user code):
    later graph nodes cannot be attributed. Used to label traced replays.
    """
    sequence = order if plan is None else [v for v, _slot, _waits in plan.steps]
    names: list[str] = []
    for i in sequence:
        node = nodes[i]
        count = node._graph_nodes()
        if count is None:
            break
        names.extend([node._name] * count)
    return tuple(names)
