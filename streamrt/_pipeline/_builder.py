"""Pipelines: explicit DAGs of memset, copy, host, kernel and event nodes, launched on streams or captured.

Build a pipeline with its node methods; each returns the :class:`Node`::

    p = Pipeline("prepare")
    z = p.memset(dq_acc, 0)
    d = p.copy(dst=staging, src=seqstart)                   # device -> pinned host
    k = p.host(pack, staging, meta, reads=[staging], writes=[meta])
    u = p.copy(dst=workspace_meta, src=meta)                # pinned host -> device
    run = p.launch(stream)                                  # or policy="fork"; or p.capture(stream)

Edges come from ``after=[...]`` (and :meth:`Pipeline.add_edge`) and from the
declared accesses: a node depends on every earlier node whose bytes it reads
after a write (RAW), writes after a read (WAR) or writes after a write (WAW);
see :mod:`streamrt._pipeline._deps`. Copies and memsets declare their own
access; host and enqueue nodes declare theirs with ``reads=``/``writes=``.

Validation. Node methods check their arguments when called (sizes, memory
kinds, read-only destinations, foreign nodes) and raise ``ValueError`` or
``TypeError`` naming the node. ``launch``/``capture`` check the whole
pipeline (not empty, no cycle, no released buffer, one runtime, an open stream
of it) before anything is enqueued.

Launch policies (``"stream"``, ``"fork"``) and how a launch is enqueued: see
:mod:`streamrt._pipeline._launch`.

Relaunching while an earlier Run of the same pipeline is in flight is safe:
the new launch first waits for the earlier run's tail events (nothing is
added when both run on the same stream, which orders them already). Graphs
captured from the pipeline share this ordering: eager runs and replays of
one pipeline never overlap, whatever streams they are launched on.

Several devices: a pipeline may use buffers of runtimes of one backend object
on several devices (one runtime per device). Each node then runs on a stream
of its buffers' device, a copy between device buffers of two devices is a
peer copy, and edges between devices become events; see
:mod:`streamrt._pipeline._devices`.

Thread rules: build a pipeline from one thread. ``launch`` and ``capture``
may be called from any thread; concurrent launches of one pipeline are
serialized.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .._backends.protocol import CaptureMode
from .._buffer import DEVICE, PAGEABLE, Buffer, check_size, wrap_foreign
from .._errors import CaptureError
from .._extensions import hook
from .._event import Event
from ._deps import CycleError, ForkPlan, hazards, plan_fork, topological_order
from ._devices import PeerCopyNode, check_node_devices, placement
from ._nodes import (
    COPY_KIND,
    CopyNode,
    EnqueueContext,
    EnqueueNode,
    HostNode,
    MemsetNode,
    Node,
    RecordNode,
    WaitNode,
)
from ._graph import capture_pipeline
from ._launch import POLICIES, launch_pipeline
from ._run import Run, RunChain
from .._stream import Stream

if TYPE_CHECKING:
    from .._hostcall import HostRequest
    from ._graph import Graph
    from .._runtime import Runtime

__all__ = ["Edge", "Pipeline"]


class Edge(tuple):  # type: ignore[type-arg]
    """``(before, after, reasons)``: ``after`` waits for ``before``; reasons ⊆ {after, RAW, WAR, WAW}."""

    __slots__ = ()

    def __new__(cls, before: Node, after: Node, reasons: frozenset[str]) -> Edge:
        return tuple.__new__(cls, (before, after, reasons))

    @property
    def before(self) -> Node:
        return self[0]

    @property
    def after(self) -> Node:
        return self[1]

    @property
    def reasons(self) -> frozenset[str]:
        return self[2]


class Pipeline:
    """A DAG of stream work. See the module docstring.

    Args:
        name: shown in errors, runs and traces.
        runtime: needed only to use foreign memory (numpy arrays, torch
            tensors) before any streamrt Buffer has told the pipeline its runtime.
    """

    def __init__(self, name: str, *, runtime: Runtime | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError("a pipeline needs a non-empty str name")
        self._name = name
        self._runtime = runtime
        self._devices: dict[int, Runtime] = {}  # runtimes of other devices than self._runtime's, by device
        self._nodes: list[Node] = []
        self._names: set[str] = set()
        self._preds: list[dict[int, set[str]]] = []  # per node: predecessor index -> reasons
        self._version = 0
        self._cache: dict[str, Any] = {}
        self._chain = RunChain()  # orders this pipeline's runs and its graphs' replays
        self._plans: dict[Any, Any] = {}  # compiled for this version: LaunchPlan by stream, ForkLaunchPlan by (stream, wait_for, join, deferred)
        self._lock = self._chain.lock

    # -- introspection ----------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def runtime(self) -> Runtime | None:
        """The runtime of the pipeline's buffers (``None`` until one is known); with several devices,
        the runtime of the first buffer's device."""
        return self._runtime

    @property
    def runtimes(self) -> tuple[Runtime, ...]:
        """Every runtime whose buffers the pipeline uses (one per device), :attr:`runtime` first."""
        if self._runtime is None:
            return ()
        return (self._runtime, *(self._devices[d] for d in sorted(self._devices)))

    @property
    def nodes(self) -> tuple[Node, ...]:
        """Nodes in creation order."""
        return tuple(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    @property
    def edges(self) -> list[Edge]:
        """Every direct edge with its reasons, ordered by (after, before) creation index."""
        out = []
        for v, preds in enumerate(self._preds):
            for u in sorted(preds):
                out.append(Edge(self._nodes[u], self._nodes[v], frozenset(preds[u])))
        return out

    def predecessors(self, node: Node) -> dict[Node, frozenset[str]]:
        """The nodes ``node`` waits for directly, with the reasons."""
        self._own(node, "node")
        return {self._nodes[u]: frozenset(r) for u, r in self._preds[node._index].items()}

    def topological_order(self) -> list[Node]:
        """The order the ``"stream"`` policy enqueues in. Raises ``ValueError`` on a cycle."""
        return [self._nodes[i] for i in self._order()]

    def validate(self) -> None:
        """Check the whole pipeline as launch does (minus the stream). Raises ``ValueError``."""
        if not self._nodes:
            raise ValueError(f"pipeline {self._name!r} is empty: add nodes before launching or capturing it")
        self._order()
        for node in self._nodes:
            for b in node.buffers():
                if b.is_released:
                    raise ValueError(f"node {node.name!r} of pipeline {self._name!r} uses a released buffer ({b!r})")

    # -- building ------------------------------------------------------------------------------
    def memset(self, dst: Any, value: int, nbytes: int | None = None, *, after: Iterable[Node] = (), name: str | None = None) -> Node:
        """Set ``nbytes`` bytes (default: all) of ``dst`` (device or pinned host) to the byte ``value``."""
        name = self._new_name(name, "memset")
        d = self._buffer(dst, f"memset {name!r} dst")
        if d.readonly:
            raise ValueError(f"memset {name!r}: dst is read-only")
        if d.kind == PAGEABLE:
            raise ValueError(f"memset {name!r}: dst is pageable host memory; use device or pinned memory (rt.host_allocator)")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255:
            raise ValueError(f"memset {name!r}: value must be an int byte in [0, 255], got {value!r}")
        n = d.nbytes if nbytes is None else check_size(nbytes, "nbytes")
        if n > d.nbytes:
            raise ValueError(f"memset {name!r}: {n} bytes exceed dst's {d.nbytes} bytes")
        deps = self._after(after, name)
        return self._add(MemsetNode(self, len(self._nodes), name, d, value, n), deps)

    def copy(self, dst: Any, src: Any, nbytes: int | None = None, *, after: Iterable[Node] = (), name: str | None = None) -> Node:
        """Copy ``nbytes`` (default ``src.nbytes``) from ``src`` to ``dst``; the direction is inferred.

        Both sides must be device or pinned host memory (pageable memory
        cannot be copied asynchronously on any backend); the ranges must not overlap.
        Device buffers of two devices make a peer copy (``memcpy_peer_async``).
        """
        name = self._new_name(name, "copy")
        d = self._buffer(dst, f"copy {name!r} dst")
        s = self._buffer(src, f"copy {name!r} src")
        if d.readonly:
            raise ValueError(f"copy {name!r}: dst is read-only")
        n = s.nbytes if nbytes is None else check_size(nbytes, "nbytes")
        if n > s.nbytes or n > d.nbytes:
            raise ValueError(f"copy {name!r}: {n} bytes exceed src ({s.nbytes} bytes) or dst ({d.nbytes} bytes)")
        direction = COPY_KIND.get((s.kind, d.kind))
        if direction is None:
            raise ValueError(
                f"copy {name!r}: async copies need device or pinned host memory on both sides; got src {s.kind}, "
                f"dst {d.kind}: stage pageable data through rt.host_allocator.allocate(n)"
            )
        if n and d.ptr < s.ptr + n and s.ptr < d.ptr + n:
            raise ValueError(f"copy {name!r}: src and dst overlap")
        deps = self._after(after, name)
        if d.runtime is not s.runtime and d.runtime is not None and s.runtime is not None:
            if direction != COPY_KIND[(DEVICE, DEVICE)]:
                raise ValueError(
                    f"copy {name!r}: src ({s.kind}) and dst ({d.kind}) are on devices {s.device} and {d.device}; "
                    "a copy between devices needs device buffers on both sides (a peer copy)"
                )
            return self._add(PeerCopyNode(self, len(self._nodes), name, d, s, n, direction), deps)
        return self._add(CopyNode(self, len(self._nodes), name, d, s, n, direction), deps)

    def host(
        self,
        fn: Callable[..., Any],
        *args: Any,
        reads: Iterable[Any] = (),
        writes: Iterable[Any] = (),
        after: Iterable[Node] = (),
        name: str | None = None,
    ) -> Node:
        """Run ``fn(*args)`` on the host once its predecessors have completed; later dependents wait for it.

        ``reads``/``writes`` declare the host memory it touches (pinned or
        pageable; never device memory, which a host function cannot access).
        A Python ``fn`` runs on a runtime worker thread; its exception
        surfaces on the Run and the stream goes on. A native ``fn`` (ctypes
        ``CFUNCTYPE(None, c_void_p)``, numba cfunc) runs on the driver thread
        with one user-data argument. ``fn`` must not call HIP/CUDA.
        """
        name = self._new_name(name, "host")
        if not callable(fn):
            raise TypeError(f"host node {name!r} needs a callable, got {type(fn).__name__}")
        r = self._host_access(reads, name, "reads")
        w = self._host_access(writes, name, "writes")
        deps = self._after(after, name)
        try:
            node = HostNode(self, len(self._nodes), name, fn, tuple(args), r, w)
        except TypeError as exc:
            raise TypeError(f"host node {name!r}: {exc}") from None
        return self._add(node, deps)

    def enqueue(
        self,
        fn: Callable[..., Any],
        *args: Any,
        reads: Iterable[Any] = (),
        writes: Iterable[Any] = (),
        after: Iterable[Node] = (),
        name: str | None = None,
    ) -> Node:
        """Device work put on the stream by ``fn(stream, *args)``: a kernel launch, a torch or cupy op.

        ``fn`` gets the :class:`Stream` the node runs on (a side stream under
        ``"fork"``, the capturing stream in a capture) and must only enqueue
        work on it, never synchronize. ``reads``/``writes`` declare the memory
        the work touches (any kind). Buffers among ``args`` (also inside
        tuples and lists) are rebound by :meth:`Graph.update`.
        """
        return self._enqueue_node(fn, args, reads, writes, after, name, "enqueue")

    def kernel(
        self,
        kernel: Any,
        grid: Any,
        block: Any,
        args: Sequence[Any],
        *,
        shared_mem: int = 0,
        reads: Iterable[Any] | None = None,
        writes: Iterable[Any] | None = None,
        after: Iterable[Node] = (),
        name: str | None = None,
    ) -> Node:
        """A kernel launch node. Arguments are checked now, as ``Stream.launch_kernel`` checks them;
        with ``reads`` and ``writes`` both ``None`` they come from the kernel's spec (each Buffer
        argument, per its access mode). Kernel nodes take part in dependency inference, both
        launch policies and capture."""
        return hook("kernel_node")(  # type: ignore[no-any-return]
            self, kernel, grid, block, args, shared_mem=shared_mem, reads=reads, writes=writes, after=after, name=name
        )

    def record(self, event: Event, *, after: Iterable[Node] = (), name: str | None = None) -> Node:
        """Record ``event`` once the nodes in ``after`` have completed (under ``"stream"``: once
        everything enqueued before it has). Another pipeline or stream waits for it."""
        name = self._new_name(name, "record")
        self._event(event, name, record=True)
        deps = self._after(after, name)
        return self._add(RecordNode(self, len(self._nodes), name, event), deps)

    def wait(self, event: Event, *, after: Iterable[Node] = (), name: str | None = None) -> Node:
        """A node that completes when ``event`` has: give it as ``after=`` to the nodes that must wait."""
        name = self._new_name(name, "wait")
        self._event(event, name)
        deps = self._after(after, name)
        return self._add(WaitNode(self, len(self._nodes), name, event), deps)

    def add_edge(self, before: Node, after: Node) -> None:
        """Make ``after`` wait for ``before`` (both nodes of this pipeline). A cycle is reported at launch."""
        self._own(before, "before")
        self._own(after, "after")
        if before is after:
            raise ValueError(f"node {before.name!r} cannot wait for itself")
        self._preds[after._index].setdefault(before._index, set()).add("after")
        self._changed()

    # -- launching -----------------------------------------------------------------------------
    def launch(
        self,
        stream: Stream,
        *,
        policy: str = "stream",
        wait_for: str | Event | None = "stream",
        join: bool = True,
        deferred: bool = False,
    ) -> Run:
        """Enqueue the pipeline on ``stream`` and return its :class:`Run`. Non-blocking.

        ``policy``: ``"stream"`` or ``"fork"``. ``wait_for``, ``join`` and ``deferred`` (with
        ``join=False``: the runtime's submission thread makes the backend calls) apply to
        ``"fork"`` (see :mod:`streamrt._pipeline._launch`).
        Everything is validated before anything is enqueued. If the backend
        fails midway, the error is raised; what was enqueued still completes
        and stays alive.
        On a stream that is capturing (``with stream.capture()``, or a capture
        another library began) the nodes are recorded into that capture and
        the Run returned is done at once with a ``CaptureError`` (nothing ran;
        see docs/pipelines.md, "Capture").
        """
        compiled = self._plans.get(stream if policy == "stream" else (stream, wait_for, join, deferred) if policy == "fork" else None)
        if compiled is not None and compiled.backend is stream._backend is stream._runtime._base_backend:
            return compiled.launch()
        return launch_pipeline(self, stream, policy, wait_for, join, deferred)

    def capture(self, stream: Stream, *, policy: str = "stream", mode: CaptureMode = CaptureMode.THREAD_LOCAL) -> Graph:
        """Record the pipeline into a graph on ``stream`` (HIP/CUDA graph; the simulator's own).

        Nothing runs: replay it with :meth:`Graph.launch`. Python host nodes
        become host slots that re-run ``fn(*args)`` on every replay with the
        current contents of their buffers; the Graph keeps callables,
        arguments and buffers alive until :meth:`Graph.close`. ``policy="fork"``
        captures independent branches as parallel graph branches. Event
        record/wait nodes cannot be captured (``CaptureError``). A capture that
        fails (an unsupported or synchronizing call in an enqueue node, an
        invalidated capture) raises ``CaptureError``; the stream is usable
        afterwards and nothing is left behind.
        """
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}: use 'stream' or 'fork'")
        stream = self._check_stream(stream)
        with stream._lock, self._lock:
            if stream._closed:
                stream._check_open()
            order, _keep = self._validated()
            if self._devices or self._placement(stream._runtime) is not None:
                raise CaptureError(
                    f"pipeline {self._name!r} uses buffers of several devices: a pipeline spanning devices cannot be "
                    "captured into one graph; capture one pipeline per device, or launch it"
                )
            for node in self._nodes:
                if isinstance(node, (RecordNode, WaitNode)):
                    raise CaptureError(
                        f"node {node.name!r} ({node.kind}) cannot be captured: event nodes order work between "
                        "pipelines at launch time; launch the pipeline eagerly, or order graphs on the stream"
                    )
            plan = self._fork_plan() if policy == "fork" else None
            if plan is not None and plan.slots == 1:
                plan = None
            return capture_pipeline(self._name, list(self._nodes), order, plan, stream, mode, self._chain)

    # -- internals: launch ---------------------------------------------------------------------------
    def _serialize_after_previous(self, targets: Sequence[Stream]) -> None:
        """Make ``targets`` wait for the previous run of this pipeline (or of a graph of it) if in flight."""
        self._chain.wait_previous(targets)

    def _fail_partial(self, stream: Stream, keep: tuple[Any, ...], ctx: EnqueueContext, exc: BaseException | None) -> None:
        """A launch failed midway: what was enqueued runs; a Run nobody gets keeps it alive until it completed,
        collects the outcomes of host nodes already enqueued (their errors are logged), and orders the next
        launch after it. Names the node in ``exc``."""
        try:
            self._chain.last = Run(self._name, "failed", (stream,), tuple(ctx.host), keep, stream._runtime._engine, (stream,))
        except BaseException:  # noqa: BLE001, S110 - the original error matters more
            pass
        if exc is not None and ctx.current and hasattr(exc, "add_note"):
            exc.add_note(f"while enqueueing node {ctx.current!r} of pipeline {self._name!r}")

    def _fail_partial_plan(
        self, stream: Stream, keep: tuple[Any, ...], host: list[tuple[str, HostRequest]], node: str, exc: BaseException
    ) -> None:
        """:meth:`_fail_partial` for a launch plan that failed at ``node``."""
        ctx = EnqueueContext(capturing=False, host=host, current=node)
        self._fail_partial(stream, keep, ctx, exc)

    def _check_stream(self, stream: Any) -> Stream:
        if not isinstance(stream, Stream):
            raise TypeError(f"launch/capture take a streamrt Stream, not {type(stream).__name__} (wrap it with rt.wrap_stream)")
        stream._check_open()
        rt = stream._runtime
        if self._runtime is not None and rt is not self._runtime and self._devices.get(rt._device) is not rt:
            raise ValueError(f"pipeline {self._name!r} uses buffers of another runtime than the stream's")
        for node in self._nodes:
            if (
                isinstance(node, (RecordNode, WaitNode))
                and node.event._runtime is not rt
                and node.event._runtime._base_backend is not rt._base_backend
            ):
                raise ValueError(f"node {node.name!r}: its event belongs to another runtime than the stream's")
        return stream

    def _placement(self, launch: Runtime) -> list[Runtime] | None:
        """Where each node runs for a launch from ``launch`` (``None``: all on its device). Cached per version."""
        key = f"where:{id(launch)}"
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = (placement(self._nodes, launch), launch)
        return cached[0]

    def _validated(self) -> tuple[list[int], tuple[Any, ...]]:
        """Order and keepalive, after the launch-time checks. Cached per version (buffers re-checked)."""
        cached = self._cache.get("validated")
        if cached is None:
            self.validate()
            keep = tuple(x for node in self._nodes for x in node.keepalive())
            buffers = tuple({id(b): b for node in self._nodes for b in node.buffers()}.values())
            cached = self._cache["validated"] = (self._order(), keep, buffers)
        order, keep, buffers = cached
        for b in buffers:
            root = b._base if b._base is not None else b
            if root._released:
                raise ValueError(f"pipeline {self._name!r} uses a released buffer ({b!r})")
        return order, keep

    def _order(self) -> list[int]:
        order = self._cache.get("order")
        if order is None:
            preds = [set(p) for p in self._preds]
            try:
                order = topological_order(preds)
            except CycleError as exc:
                names = " -> ".join(repr(self._nodes[i].name) for i in exc.cycle)
                raise CycleError(f"pipeline {self._name!r} has a cycle: {names}", exc.cycle) from None
            self._cache["order"] = order
        return order

    def _fork_plan(self) -> ForkPlan:
        plan = self._cache.get("fork")
        if plan is None:
            plan = self._cache["fork"] = plan_fork(self._order(), [set(p) for p in self._preds])
        return plan

    # -- internals: building ----------------------------------------------------------------------------
    def _changed(self) -> None:
        self._version += 1
        self._cache.clear()
        self._plans = {}

    def _add(self, node: Node, deps: dict[int, set[str]]) -> Node:
        check_node_devices(node)
        for u, earlier in enumerate(self._nodes):
            kinds = hazards(earlier._accesses, node._accesses)
            if kinds:
                deps.setdefault(u, set()).update(kinds)
        self._nodes.append(node)
        self._names.add(node._name)
        self._preds.append(deps)
        self._changed()
        return node

    def _new_name(self, name: str | None, kind: str) -> str:
        if name is None:
            name = f"{kind}{len(self._nodes)}"
            while name in self._names:
                name += "_"
            return name
        if not isinstance(name, str) or not name:
            raise TypeError("a node name must be a non-empty str")
        if name in self._names:
            raise ValueError(f"pipeline {self._name!r} already has a node named {name!r}")
        return name

    def _own(self, node: Any, what: str) -> None:
        if not isinstance(node, Node):
            raise TypeError(f"{what} must be a pipeline Node, not {type(node).__name__}")
        if node._pipeline is not self or node._index >= len(self._nodes) or self._nodes[node._index] is not node:
            other = node._pipeline.name if node._pipeline is not None else "?"
            raise ValueError(f"node {node.name!r} belongs to pipeline {other!r}, not to {self._name!r}")

    def _after(self, after: Iterable[Node], name: str) -> dict[int, set[str]]:
        if isinstance(after, Node):
            after = (after,)
        deps: dict[int, set[str]] = {}
        for node in after:
            try:
                self._own(node, "after")
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"node {name!r}: {exc}") from None
            deps.setdefault(node._index, set()).add("after")
        return deps

    def _event(self, event: Any, name: str, record: bool = False) -> None:
        """Check an event node's event: of this pipeline's backend; a recorded one also joins its device."""
        if not isinstance(event, Event):
            raise TypeError(f"node {name!r} needs an Event, not {type(event).__name__}")
        event._check_open()
        if self._runtime is not None and event._runtime is not self._runtime:
            if event._runtime._base_backend is not self._runtime._base_backend:
                raise ValueError(f"node {name!r}: the event belongs to another runtime with a different backend instance")
            if record:
                self._join_runtime(event._runtime, f"node {name!r}: the event")

    def _buffer(self, obj: Any, what: str) -> Buffer:
        if isinstance(obj, Buffer):
            buf = obj
        else:
            if obj is None:
                raise TypeError(f"{what} must be a Buffer or an object exposing memory, not None")
            if self._runtime is None:
                raise TypeError(
                    f"{what}: {type(obj).__name__} is not a streamrt Buffer; wrap it with rt.as_buffer(obj) "
                    "or create the pipeline with Pipeline(name, runtime=rt)"
                )
            buf = wrap_foreign(obj, self._runtime)
        if buf.is_released:
            raise ValueError(f"{what} was released")
        rt = buf.runtime
        if rt is not None:
            if self._runtime is None:
                self._runtime = rt
            elif rt is not self._runtime:
                self._join_runtime(rt, what)
        return buf

    def _join_runtime(self, rt: Runtime, what: str) -> None:
        """Accept ``rt`` as the runtime of another device of the same backend object, or raise ``ValueError``."""
        home = self._runtime
        assert home is not None
        known = self._devices.get(rt._device)
        if known is rt:
            return
        if rt._base_backend is not home._base_backend or rt._device == home._device or known is not None:
            raise ValueError(f"{what} belongs to another runtime than the pipeline's other buffers")
        self._devices[rt._device] = rt

    def _host_access(self, objs: Iterable[Any], name: str, what: str) -> tuple[tuple[Buffer, int], ...]:
        if isinstance(objs, (Buffer, str, bytes)) or not isinstance(objs, Iterable):
            raise TypeError(f"host node {name!r}: {what} must be a list of buffers")
        out = []
        for obj in objs:
            b = self._buffer(obj, f"host node {name!r} {what}")
            if b.kind == DEVICE:
                raise ValueError(
                    f"host node {name!r} declares device memory in {what} ({b!r}); a host function cannot "
                    "touch device memory: copy it to pinned host memory with a copy node first"
                )
            out.append((b, b.nbytes))
        return tuple(out)

    def _access(self, objs: Iterable[Any], name: str, what: str) -> tuple[tuple[Buffer, int], ...]:
        if isinstance(objs, (Buffer, str, bytes)) or not isinstance(objs, Iterable):
            raise TypeError(f"node {name!r}: {what} must be a list of buffers")
        return tuple((b, b.nbytes) for b in (self._buffer(o, f"node {name!r} {what}") for o in objs))

    def _enqueue_node(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        reads: Iterable[Any],
        writes: Iterable[Any],
        after: Iterable[Node],
        name: str | None,
        kind: str,
    ) -> Node:
        name = self._new_name(name, kind)
        if not callable(fn):
            raise TypeError(f"{kind} node {name!r} needs a callable, got {type(fn).__name__}")
        r = self._access(reads, name, "reads")
        w = self._access(writes, name, "writes")
        deps = self._after(after, name)
        return self._add(EnqueueNode(self, len(self._nodes), name, fn, tuple(args), r, w, kind), deps)

    def __repr__(self) -> str:
        return f"<Pipeline {self._name!r} nodes={len(self._nodes)}>"


