"""Graphs: a pipeline captured once and replayed many times.

``Pipeline.capture(stream)`` records the pipeline into a backend graph
(``stream_begin_capture`` … ``stream_end_capture`` → ``graph_instantiate``) and
returns a :class:`Graph`. Each :meth:`Graph.launch` replays the executable
graph on a stream and returns a :class:`~streamrt.Run`. ``with stream.capture()``
(:mod:`._capture`) makes the same Graph from whatever a block enqueued on a
stream (no pipeline behind it: it cannot be rebound with :meth:`Graph.update`).

Lifetime. A Graph owns its executable graph, one host slot per Python host
node (see :mod:`streamrt._hostcall`: the captured host node wakes the slot's
worker, which runs ``fn(*args)`` with the *current* contents of its buffers,
on every replay), and references to every buffer, callable and argument of
its nodes. All of it lives until :meth:`Graph.close`; the executable graph is
destroyed and the slots stopped only once the last replay has completed, on
the runtime's releaser thread (never on a driver or completion thread).

Rebinding. :meth:`Graph.update` points the graph at other buffers of the same
sizes and kinds. The backend protocol has no executable-graph update or node
parameter setters, so it re-captures the rebound pipeline into a new
executable graph (on a pooled stream; nothing runs) and swaps it in; the old
one is retired like on close. Replays already launched finish on the old one.

Ordering. Replays run in launch order, and after the eager runs of the
pipeline the graph was captured from (and before its later ones): they share
one chain of runs, each waiting for the previous one's tail events when it is
still in flight, so they never touch the shared buffers concurrently.

Tracing. While the runtime's tracer is on, :meth:`Graph.launch` enqueues the
replay through it as one ``graph_launch`` op labelled with the pipeline's name
and the names of the pipeline nodes behind the graph's nodes (in capture order,
see :func:`~streamrt._pipeline._nodes.graph_node_names`); where the device
reports each replayed graph node (the simulator), the trace shows them under
those names. A capture made while tracing traces its enqueues like an eager
launch (they run only on replay, so they have no device times).

Thread rules: ``launch``, ``update`` and ``close`` may be called from any
thread; they are serialized per graph.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._backends.protocol import CaptureMode
from .._allocator import release_after_device
from .._buffer import Buffer
from .._errors import CaptureError, ClosedError
from ._deps import ForkPlan, hazards, plan_fork, topological_order
from ._nodes import (
    CopyNode,
    EnqueueContext,
    HostNode,
    MemsetNode,
    Node,
    enqueue_plan,
    graph_node_names,
    labelled,
)
from .._hostcall import HostRequest
from ._run import Run, RunChain, serialize_after
from .._stream import Stream, holding
from .._streampool import pool_for

if TYPE_CHECKING:
    from .._hostcall import HostSlot
    from .._runtime import Runtime

__all__ = ["Graph", "capture_pipeline"]


def _capturing(stream: Stream) -> CaptureError:
    return CaptureError(f"{stream.name} is capturing: a graph is replayed on a stream that is not capturing")


class _GraphState:
    """One executable graph with its host slots and keepalive; retired once unused and replaced or closed.

    ``node_names``: the pipeline node behind each graph node, by graph node index (for traces).
    """

    __slots__ = (
        "destroyed", "exec", "keep", "lock", "node_names", "pending", "pools", "retiring", "roots", "runtime", "slots", "streams",
    )

    def __init__(
        self,
        name: str,
        runtime: Runtime,
        exec_handle: int,
        slots: list[tuple[str, HostSlot]],
        nodes: list[Node],
        node_names: tuple[str, ...],
        *,
        keep: tuple[Any, ...] = (),
        buffers: tuple[Buffer, ...] = (),
        pools: tuple[Any, ...] = (),
    ) -> None:
        self.runtime = runtime
        self.exec = exec_handle
        runtime._graph_names[exec_handle] = (name, node_names)  # a traced replay is named by these
        self.slots = slots
        self.node_names = node_names
        self.keep: tuple[Any, ...] | None = (*keep, *(x for n in nodes for x in n.keepalive()))
        # the root buffers (views resolved to the buffer they view), each once
        used = (*buffers, *(b for n in nodes for b in n.buffers()))
        self.roots = tuple({id(r): r for r in (b.base for b in used)}.values())
        self.pools = pools  # capture pools (allocators): closed once the executable graph is gone
        self.streams: set[Stream] = set()  # where replays ran (the pools' blocks wait for them)
        self.pending = 0
        self.retiring = False
        self.lock = threading.Lock()
        self.destroyed = False

    def replay_done(self, _run: Run | None) -> None:
        """One replay passed its tail: on its completion lane, or on the thread of an await that polled it."""
        with self.lock:
            self.pending -= 1
            destroy = self.retiring and self.pending == 0 and not self.destroyed
            if destroy:
                self.destroyed = True
        if destroy:
            # The slots are stopped here, where the tail retired: the engine's close drains its
            # lanes (polled retirements included) before it stops the slots it still knows, so the
            # two never stop one slot concurrently. Where an await polled the tail this joins the
            # slots' worker threads on the loop's thread: brief, their runs have finished.
            self._close_slots()
            self.runtime.releaser.submit(self._destroy_exec)

    def retire(self) -> None:
        """Destroy once no replay is in flight: now, on the calling thread, or after the last
        replay completed (slots where its tail retired, the executable graph on the releaser thread)."""
        with self.lock:
            self.retiring = True
            destroy = self.pending == 0 and not self.destroyed
            if destroy:
                self.destroyed = True
        if destroy:
            try:
                self._destroy_exec()
            finally:
                self._close_slots()

    def _destroy_exec(self) -> None:
        self.runtime._graph_names.pop(self.exec, None)
        if not self.runtime.is_closed:
            self.runtime._base_backend.graph_exec_destroy(self.exec)
        self.keep = None
        pools, self.pools = self.pools, ()
        streams = [s for s in self.streams if not s.is_closed]
        for pool in pools:
            pool.close(streams)

    def _close_slots(self) -> None:
        for _, slot in self.slots:
            slot.close()


def _capture_exec(
    name: str, nodes: list[Node], order: list[int], plan: ForkPlan | None, stream: Stream, mode: CaptureMode
) -> tuple[int, list[tuple[str, HostSlot]], tuple[str, ...]]:
    """Capture ``nodes`` on ``stream`` and instantiate; returns the exec, the host slots (topological
    order) and the node names of the graph's nodes (see :func:`graph_node_names`).

    On any failure: ends the capture, destroys what was made, closes the
    slots, returns side streams to a usable state, and raises ``CaptureError``.
    """
    rt = stream._runtime
    backend = rt._backend  # traced while a trace is open
    h = stream._handle
    if not rt.capabilities.supports_graphs:
        raise CaptureError(f"the {rt.backend_name} backend on this device does not support graphs")
    if backend.stream_is_capturing(h):
        raise CaptureError(f"{stream.name} is already capturing; end that capture first")
    slots = host_slots(rt, nodes, order)
    pool = pool_for(rt) if plan is not None else None
    sides: list[Stream] = []
    if pool is not None and plan is not None:
        # Create what the capture needs before it starts: no stream or event creation while capturing.
        pool.reserve_events(1 + len(plan.signals) + len(plan.joins))
        sides = pool.acquire_streams(plan.slots - 1, stream.priority)
    capturing = named = False
    graph = 0
    held = contextlib.ExitStack()
    try:
        held.enter_context(holding([stream, *sides]))  # no other thread's work slips into the capture
        rt._captures.begun()  # before the capture begins: a device-wide wait in progress ends first
        held.callback(rt._captures.ended)  # the releaser's device-wide waits wait until then
        backend.stream_begin_capture(h, mode)
        capturing = True
        try:
            record_into(name, nodes, order, stream, slots, plan, sides)
        except BaseException:
            named = True  # its error names the pipeline and the node
            raise
        capturing = False
        graph = backend.stream_end_capture(h)
        exec_handle = backend.graph_instantiate(graph)
    except BaseException as exc:
        if capturing:
            try:
                leftover = backend.stream_end_capture(h)
            except BaseException:  # noqa: BLE001 - an invalidated capture raises here; it has ended anyway
                leftover = 0
            if leftover:
                backend.graph_destroy(leftover)
        if graph:
            backend.graph_destroy(graph)
        for slot in slots.values():
            slot.close()
        if not isinstance(exc, Exception) or isinstance(exc, ClosedError) or named:
            raise
        raise CaptureError(f"capturing pipeline {name!r} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        held.close()
        if pool is not None:
            usable = [s for s in sides if not backend.stream_is_capturing(s.handle)]
            for s in sides:
                if s not in usable:  # still capturing after a failure: never hand it out again
                    try:
                        s.close()
                    except Exception:  # noqa: BLE001 - a stream stuck in a failed capture; drop it
                        pass
            pool.release_streams(usable, stream.priority)
    backend.graph_destroy(graph)
    return exec_handle, [(n, slots[n]) for n in (nodes[i].name for i in order) if n in slots], graph_node_names(nodes, order, plan)


def host_slots(rt: Runtime, nodes: list[Node], order: list[int], *, foreign: bool = False) -> dict[str, HostSlot]:
    """One host slot per Python host node (by node name); none left open if one cannot be made."""
    engine = rt._engine
    slots: dict[str, HostSlot] = {}
    try:
        for i in order:
            node = nodes[i]
            if isinstance(node, HostNode) and not node.is_native:
                slots[node.name] = engine.host_slot(node.fn, node.args, foreign=foreign)
    except BaseException:
        for slot in slots.values():
            slot.close()
        raise
    return slots


def record_into(
    name: str,
    nodes: list[Node],
    order: list[int],
    stream: Stream,
    slots: dict[str, HostSlot],
    plan: ForkPlan | None = None,
    sides: list[Stream] | None = None,
) -> None:
    """Enqueue ``nodes`` on ``stream``, which is capturing (its lock held): Python host nodes through
    ``slots``; with ``plan``, branches on ``sides`` (pooled streams, their locks held), which join the
    capture by events and are joined back. Raises ``CaptureError`` naming the node that failed."""
    rt = stream._runtime
    pool = pool_for(rt) if plan is not None else None
    fork_ev = None
    ctx = EnqueueContext(capturing=True, slots=slots)
    try:
        if pool is not None:
            fork_ev = pool.acquire_event()
            with labelled(stream, name, None):
                rt._backend.event_record(fork_ev.handle, stream._handle)
        enqueue_plan(nodes, order, plan, [stream, *(sides or ())], pool, ctx, fork_from_caller=fork_ev, join=True)
    except BaseException as exc:
        if not isinstance(exc, Exception) or isinstance(exc, ClosedError):
            raise
        where = f" at node {ctx.current!r}" if ctx.current else ""
        detail = str(exc) if isinstance(exc, CaptureError) else f"{type(exc).__name__}: {exc}"
        raise CaptureError(f"capturing pipeline {name!r} failed{where}: {detail}") from exc
    finally:
        if pool is not None and fork_ev is not None:
            pool.release_event(fork_ev)


def capture_pipeline(
    name: str, nodes: list[Node], order: list[int], plan: ForkPlan | None, stream: Stream, mode: CaptureMode, chain: RunChain
) -> Graph:
    """Capture a validated pipeline (see ``Pipeline.capture``)."""
    preds_after = [{u for u, reasons in node._pipeline._preds[node.index].items() if "after" in reasons} for node in nodes]
    exec_handle, slots, node_names = _capture_exec(name, nodes, order, plan, stream, mode)
    state = _GraphState(name, stream._runtime, exec_handle, slots, nodes, node_names)
    return Graph(name, stream._runtime, nodes, preds_after, plan is not None, mode, state, chain)


class Graph:
    """A captured pipeline, or the work captured from a stream (``with stream.capture() as graph:``):
    replay it with :meth:`launch`. See the module docstring."""

    def __init__(
        self,
        name: str,
        runtime: Runtime,
        nodes: list[Node],
        preds_after: list[set[int]],
        fork: bool,
        mode: CaptureMode,
        state: _GraphState | None,
        chain: RunChain,
        *,
        from_stream: bool = False,
    ) -> None:
        self._from_stream = from_stream  # captured by Stream.capture: no pipeline to re-capture from
        self._capturing = state is None  # Stream.capture's graph until its with block ends
        self._name = name
        self._runtime = runtime
        self._nodes = nodes
        self._preds_after = preds_after
        self._fork = fork
        self._mode = mode
        self._state: _GraphState | None = state
        self._lock = threading.Lock()
        self._chain = chain  # shared with the pipeline it was captured from
        self._replays = 0
        self._updates = 0

    @property
    def name(self) -> str:
        return self._name

    @property
    def runtime(self) -> Runtime:
        return self._runtime

    @property
    def is_closed(self) -> bool:
        """Closed, or its capture failed (never while its ``with stream.capture()`` block runs)."""
        return self._state is None and not self._capturing

    def _captured(self, state: _GraphState | None) -> None:
        """Stream.capture: the with block ended; ``state`` is the executable graph (``None``: it failed)."""
        with self._lock:
            closed = not self._capturing  # closed inside its with block
            if not closed:
                self._state = state
                self._capturing = False
        if closed and state is not None:
            state.retire()

    @property
    def replays(self) -> int:
        """How many times :meth:`launch` replayed the graph."""
        return self._replays

    @property
    def updates(self) -> int:
        """How many times :meth:`update` swapped in a re-captured executable graph."""
        return self._updates

    @property
    def nodes(self) -> tuple[Node, ...]:
        """The captured nodes (with the buffers of the latest :meth:`update`); empty once closed."""
        return tuple(self._nodes)

    @property
    def host_slots(self) -> int:
        """Python host nodes of the graph (each owns a host slot)."""
        state = self._state
        return len(state.slots) if state is not None else 0

    def launch(self, stream: Stream) -> Run:
        """Replay the graph on ``stream``; returns its :class:`Run`. Non-blocking.

        Every replay reads the current contents of the device inputs and
        re-runs the host nodes. Replays of one graph run in launch order,
        whatever streams they are launched on.
        """
        if not isinstance(stream, Stream):
            raise TypeError(f"Graph.launch takes a streamrt Stream, not {type(stream).__name__}")
        rt = self._runtime
        if stream._runtime is not rt:
            raise ValueError("the stream belongs to another runtime than the graph")
        backend = rt._backend
        chain = self._chain
        with stream._lock, chain.lock, self._lock:  # the stream's lock first: see Stream.lock
            if stream._closed:
                stream._check_open()
            state = self._state
            if state is None:
                if self._capturing:
                    raise CaptureError(f"graph {self._name!r} is still being captured: launch it after its with block")
                raise ClosedError(f"graph {self._name!r} is closed")
            for b in state.roots:
                if b._released:
                    raise ValueError(f"graph {self._name!r} uses a released buffer ({b!r}); rebind it with update() first")
            prev = chain.last
            if prev is not None and not prev._done and prev._streams != (stream,):  # (nothing to wait for on this stream)
                ops = None  # the wait for a run on other streams must follow the capture check
                if backend.stream_is_capturing(stream._handle):
                    raise _capturing(stream)
                serialize_after(prev, (stream,))
            else:
                ops = getattr(backend, "native_ops", None)  # it checks for a capture itself
                if ops is None and backend.stream_is_capturing(stream._handle):
                    raise _capturing(stream)
            armed: tuple[tuple[str, HostRequest], ...] = ()
            if state.slots:  # armed before the launch: replays match runs FIFO
                pushed = []
                for name, slot in state.slots:
                    req = HostRequest(None, ())
                    slot._push(req)
                    pushed.append((name, req))
                armed = tuple(pushed)
            if ops is None:
                event = 0  # the Run records its tail
                try:
                    backend.graph_launch(state.exec, stream._handle)  # traced with its names while tracing
                except BaseException:
                    self._disarm(state, armed)
                    raise
                failed = None
            else:  # the check, the launch and the tail's record in one native call
                engine = rt._engine
                pool = engine._pool
                event = pool.pop() if pool else engine._events.take()
                lane = stream._lane
                lane._depth += 1  # a record-and-push section (see _Lane, "Order"), until the Run is pushed
                try:
                    failed = ops.replay(state.exec, stream._handle, event)
                except BaseException as exc:  # make_current failed before the first call: nothing was enqueued
                    failed = (0, exc)
                if failed is not None:
                    lane._depth -= 1
                    pool.append(event)
                    if failed[0] < 2:  # nothing was enqueued
                        self._disarm(state, armed)
                        raise failed[1] or _capturing(stream)
            with state.lock:
                state.pending += 1
            if stream not in state.streams:  # a root buffer's streams only grow while the graph holds it
                state.streams.add(stream)
                for b in state.roots:  # noted once per root buffer (see Buffer.note_stream)
                    used = b._streams
                    if used is None:
                        b._streams = {stream}
                    else:
                        used.add(stream)
            if failed is not None:  # the replay runs, its tail's record failed: nothing watches it
                release_after_device(rt, lambda: state.replay_done(None))
                raise failed[1]  # type: ignore[misc]
            try:  # a Run that raises finishes itself, replay_done included
                run = Run(self._name, "graph", (stream,), armed, state, rt._engine, (stream,), after=state.replay_done, recorded=event)
            finally:
                if event:
                    lane._depth -= 1
            chain.last = run
            self._replays += 1
            return run

    @staticmethod
    def _disarm(state: _GraphState, armed: tuple[tuple[str, HostRequest], ...]) -> None:
        for (_, req), (_, slot) in zip(armed, state.slots):
            slot.disarm(req)

    def update(self, rebind: Mapping[Any, Buffer]) -> None:
        """Point the graph at other buffers: ``{old_buffer: new_buffer, ...}``.

        Each old buffer must be used by the graph (itself, or as the base of
        views it uses: views are re-derived at the same offsets); the new one
        must have the same size and kind and the same runtime. Buffers inside
        host-node and enqueue-node arguments are rebound too (callables'
        closures are not). Re-captures and swaps the executable graph (see the
        module docstring). Raises ``ValueError``/``TypeError`` before changing
        anything, ``CaptureError`` if the re-capture fails (the graph then keeps
        its current binding).
        """
        if not isinstance(rebind, Mapping):
            raise TypeError("update takes a mapping {old_buffer: new_buffer}")
        if self._from_stream:
            raise ValueError(f"graph {self._name!r} was captured from a stream: capture it again to use other buffers")
        with self._lock:
            if self._state is None:
                raise ClosedError(f"graph {self._name!r} is closed")
            used: dict[int, Buffer] = {}
            for node in self._nodes:
                for b in node.buffers():
                    used[id(b)] = b
                    used[id(b.base)] = b.base
                for a in _flat(getattr(node, "args", ())):
                    if isinstance(a, Buffer):
                        used[id(a)] = a
                        used[id(a.base)] = a.base
            mapping: dict[int, Buffer] = {}
            for old, new in rebind.items():
                if not isinstance(old, Buffer) or not isinstance(new, Buffer):
                    raise TypeError("update maps streamrt Buffers to streamrt Buffers")
                if id(old) not in used:
                    raise ValueError(f"{old!r} is not used by graph {self._name!r}")
                if new.nbytes != old.nbytes or new.kind != old.kind:
                    raise ValueError(f"cannot rebind {old!r} to {new!r}: size and kind must match")
                if new.runtime is not self._runtime:
                    raise ValueError(f"{new!r} belongs to another runtime")
                if new.is_released:
                    raise ValueError(f"{new!r} was released")
                if old.readonly is False and new.readonly:
                    raise ValueError(f"{new!r} is read-only")
                mapping[id(old)] = new
            if not mapping:
                return
            nodes = [n._rebound(mapping) for n in self._nodes]
            for n in nodes:
                if isinstance(n, CopyNode) and n.nbytes and n.dst.ptr < n.src.ptr + n.nbytes and n.src.ptr < n.dst.ptr + n.nbytes:
                    raise ValueError(f"rebinding makes copy {n.name!r} overlap its source and destination")
                if isinstance(n, (CopyNode, MemsetNode)) and n.dst.readonly:
                    raise ValueError(f"rebinding makes node {n.name!r} write a read-only buffer")
            preds = [set(p) for p in self._preds_after]
            for v, node in enumerate(nodes):
                for u in range(v):
                    if hazards(nodes[u].accesses, node.accesses):
                        preds[v].add(u)
            try:
                order = topological_order(preds)
            except ValueError as exc:
                raise ValueError(f"rebinding graph {self._name!r} creates a dependency cycle") from exc
            plan = plan_fork(order, preds) if self._fork else None
            if plan is not None and plan.slots == 1:
                plan = None
            pool = pool_for(self._runtime)
            (capture_stream,) = pool.acquire_streams(1)
            try:
                exec_handle, slots, node_names = _capture_exec(self._name, nodes, order, plan, capture_stream, self._mode)
            finally:
                pool.release_streams([capture_stream])
            old_state = self._state
            self._state = _GraphState(self._name, self._runtime, exec_handle, slots, nodes, node_names)
            self._nodes = nodes
            self._updates += 1
        old_state.retire()

    def close(self) -> None:
        """Release everything the graph owns once its last replay has completed. Non-blocking; idempotent."""
        with self._lock:
            state, self._state = self._state, None
            self._capturing = False  # closed inside its with block: the capture's graph is dropped at its end
            self._nodes = []
            self._preds_after = []
        if state is not None:
            state.retire()

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Graph {self._name!r} nodes={len(self._nodes)} replays={self._replays}{' closed' if self._state is None else ''}>"


def _flat(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        out: list[Any] = []
        for v in value:
            out.extend(_flat(v))
        return out
    return [value]
