"""Stream capture and graphs on the simulated device, modelled on CUDA's.

While a stream captures, work enqueued on it becomes :class:`Node` records of
a :class:`Capture` instead of running. Each capturing stream keeps its
*capture dependencies* (the nodes the next node depends on). An event recorded
on a capturing stream remembers those dependencies; another stream waiting on
that event joins the capture (a fork), and the origin stream waiting on an
event recorded on the forked stream joins it back. ``stream_end_capture``
checks that every forked stream was joined back (each stream's last nodes are
ancestors of the origin's) and returns a :class:`Graph`.

A capture is *invalidated* by an unsupported or synchronizing call (the call
raises a ``simErrorStreamCapture*`` error); later captured calls raise
``simErrorStreamCaptureInvalidated`` and ``stream_end_capture`` raises
:class:`~streamrt.CaptureError`. Either way, ending the capture returns every
participating stream to normal, usable operation.

User objects retained by a graph (``_user_objects``) are shared by the graph
and its execs like graph memory: released once all of them are destroyed and
their launches have finished. A capture's graph has its handle from the
start, so ``stream_capture_graph`` can name it while the capture runs.

Memory from ``malloc_async`` during capture belongs to the graph: it keeps the
same address on every replay and is freed when the graph and all its
executable instances are destroyed (a ``free_async`` of it inside the capture
is recorded as a node and does not release it). Freeing, during capture,
memory that was allocated outside it is unsupported.

A :class:`GraphExec` is an immutable copy of the graph's nodes in topological
order (capture order is one). Replays run the nodes in dependency order on the
device's threads, moving real bytes and re-running host functions each time.
Captured arguments (pointers, sizes, kernel arguments, host-function user data)
are fixed at capture. Launching a graph inside a capture (child graphs) is not
simulated: it raises ``simErrorStreamCaptureUnsupported``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..protocol import CaptureMode
from ._hazards import AccessSpec

__all__ = ["Node", "Capture", "Graph", "GraphExec", "GraphMemory", "ancestors"]


class Node:
    """One captured operation. Immutable after capture.

    Attributes:
        index: position in the graph (dependencies always have smaller indices).
        kind: an op kind (``memset``, ``copy_d2h``, ``kernel``, ``host_func``, ``malloc_async``, ...).
        deps: indices of the nodes it depends on.
        stream: the stream handle it was captured on.
        nbytes, name: as in the op log.
        duration_us: virtual duration of one run.
        work: it occupies time as work (device or host function), not a zero-length marker.
        gap_after_us: gap a dependent device node leaves after it (0 after host functions).
        engine: copy engine it queues on (``"h2d"``, ``"d2h"``) or ``None``.
        fn, args, host: the payload; ``host`` runs it on the callback thread.
        refs: objects kept alive as long as the node (allocations, twin objects).
        accesses: memory accesses for hazard checking.
        estimate: for the host function that waits for a Python host node, the runtime's
            live estimate of the function's run time (its ``us``, read at every replay).
    """

    __slots__ = (
        "index",
        "kind",
        "deps",
        "stream",
        "nbytes",
        "name",
        "duration_us",
        "work",
        "gap_after_us",
        "engine",
        "fn",
        "args",
        "host",
        "refs",
        "accesses",
        "estimate",
    )

    def __init__(
        self,
        index: int,
        kind: str,
        deps: tuple[int, ...],
        stream: int,
        *,
        nbytes: int = 0,
        name: str = "",
        duration_us: float = 0.0,
        work: bool = True,
        gap_after_us: float = 0.0,
        engine: str | None = None,
        fn: Callable[..., Any] | None = None,
        args: tuple[Any, ...] = (),
        host: bool = False,
        refs: Any = None,
        accesses: tuple[AccessSpec, ...] = (),
        estimate: Any = None,
    ) -> None:
        self.index = index
        self.kind = kind
        self.deps = deps
        self.stream = stream
        self.nbytes = nbytes
        self.name = name
        self.duration_us = duration_us
        self.work = work
        self.gap_after_us = gap_after_us
        self.engine = engine
        self.fn = fn
        self.args = args
        self.host = host
        self.estimate = estimate
        self.refs = refs
        self.accesses = accesses


class GraphMemory:
    """Allocations made during a capture, and the user objects the graph retains; freed (released)
    when the graph and all its execs are gone and their launches have finished."""

    __slots__ = ("allocations", "user_objects", "users", "released", "launches")

    def __init__(self) -> None:
        self.allocations: list[Any] = []
        self.user_objects: list[Any] = []  # one reference each (see _user_objects)
        self.users = 0  # the graph and its execs
        self.released = False
        self.launches: list[Any] = []  # end markers of launches that may still be running


class Capture:
    """One capture sequence, begun on ``origin`` by thread ``thread`` in ``mode``."""

    __slots__ = ("id", "graph", "origin", "mode", "thread", "nodes", "streams", "invalid", "memory", "ended", "device")

    def __init__(self, cid: int, origin: Any, mode: CaptureMode, thread: int, device: int, graph: int = 0) -> None:
        self.id = cid
        self.graph = graph  # the handle the graph under construction has (and keeps once captured)
        self.origin = origin
        self.mode = mode
        self.thread = thread
        self.device = device
        self.nodes: list[Node] = []
        self.streams: list[Any] = [origin]  # every stream taking part, origin first
        self.invalid: tuple[int, str] | None = None  # (code, reason) of the first invalidation
        self.memory = GraphMemory()
        self.ended = False

    def invalidate(self, code: int, reason: str) -> None:
        if self.invalid is None:
            self.invalid = (code, reason)

    def unjoined(self) -> list[Any]:
        """Streams whose captured work is not an ancestor of the origin's current dependencies."""
        reach = ancestors(self.nodes, self.origin.cap_deps)
        return [s for s in self.streams[1:] if any(d not in reach for d in s.cap_deps)]


def ancestors(nodes: list[Node], roots: list[int]) -> set[int]:
    """``roots`` and every node they depend on, transitively."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        stack.extend(nodes[i].deps)
    return seen


class Graph:
    """A captured graph (``stream_end_capture``)."""

    __slots__ = ("handle", "nodes", "memory", "device", "destroyed")

    def __init__(self, handle: int, nodes: list[Node], memory: GraphMemory, device: int) -> None:
        self.handle = handle
        self.nodes = nodes
        self.memory = memory
        self.device = device
        self.destroyed = False


class GraphExec:
    """An instantiated graph. ``last`` is the marker op of its latest launch (launches are ordered)."""

    __slots__ = ("handle", "nodes", "memory", "device", "sinks", "accesses", "last", "last_end_us", "destroyed")

    def __init__(self, handle: int, graph: Graph) -> None:
        self.handle = handle
        self.nodes = tuple(graph.nodes)
        self.memory = graph.memory
        self.device = graph.device
        has_dependents = {d for n in self.nodes for d in n.deps}
        self.sinks = tuple(n.index for n in self.nodes if n.index not in has_dependents)
        self.accesses = tuple(a for n in self.nodes for a in n.accesses)
        self.last: Any = None
        self.last_end_us = 0.0
        self.destroyed = False
