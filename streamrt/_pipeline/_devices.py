"""Pipelines that span devices: each node on a stream of its device, edges between devices as events.

A pipeline may hold buffers of several runtimes of one backend object, one
runtime per device (see ``Pipeline``). Where a node runs:

* its buffers decide: a memset runs on its ``dst``'s device, a copy on its
  buffers' device, host and enqueue (kernel) nodes on the device of the
  buffers they declare, a record node on its event's device;
* a **peer-copy node** (a copy between device buffers of two devices) runs on
  the launch stream's device when one of its buffers is there, else on its
  source's device;
* nodes without buffers (wait nodes, host or enqueue nodes that declare none)
  run on the launch stream's device.

A node's buffers must all be on one device, except a peer copy's (checked when
the node is made).

``launch``: nodes of the launch stream's device go where the policy puts them
(the launch stream under ``"stream"``, its side streams under ``"fork"``). The
nodes of every other device go on a stream of that device, one per fork branch
under ``"fork"``, checked out of that runtime's stream pool. An edge between
two streams becomes an event of the first stream's device, recorded after the
first node and waited on before the second (only where the order is not
already implied). By default (``wait_for="stream"``) every other stream first
waits for the launch stream; at the end the launch stream waits for every
stream that is not already ordered before it, so other-device branches are
always joined and the Run's tail covers the whole pipeline.

Not supported (raise before anything is enqueued): capturing a pipeline that
spans devices into one graph (capture one pipeline per device), and
``join=False`` when nodes run on other devices.

Thread rules: as for ``Pipeline.launch``. Enqueueing makes each node's device
current on the calling thread while the node is enqueued (host nodes' events
and kernel launches need it) and the launch stream's device current afterwards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._buffer import Buffer
from .._errors import ClosedError
from .._peer import peer_copy
from ._deps import ForkPlan, reduce_edges
from ._nodes import CopyNode, _EAGER, EnqueueContext, Node, PlanStep, RecordNode, WaitNode, labelled
from ._run import Run
from .._streampool import pool_for

if TYPE_CHECKING:
    from .._event import Event
    from ._builder import Pipeline
    from .._runtime import Runtime
    from .._stream import Stream
    from .._streampool import StreamPool

__all__ = ["PeerCopyNode", "check_node_devices", "launch_across_devices", "placement", "plan_slots"]


class PeerCopyNode(CopyNode):
    """A copy between device buffers of two devices (``memcpy_peer_async``); see ``streamrt._peer``."""

    __slots__ = ()

    def _enqueue(self, stream: Stream, ctx: EnqueueContext) -> None:
        if self.nbytes:
            peer_copy(stream, self.dst, self.src, self.nbytes)
        else:
            for b in (self.dst, self.src):
                if b._runtime is stream._runtime:
                    b.note_stream(stream)

    def _plan_step(self, stream: Stream, keep: list[Any]) -> PlanStep | None:
        return (self._enqueue, (stream, _EAGER))  # a peer copy orders the other device's peer stream too

    def _rebound(self, mapping: dict[int, Buffer]) -> Node:
        from ._nodes import _sub

        return PeerCopyNode(
            self._pipeline, self._index, self._name, _sub(self.dst, mapping), _sub(self.src, mapping), self.nbytes, self.direction
        )


def _buffer_runtimes(node: Node) -> list[Any]:
    out: list[Any] = []
    for b in node.buffers():
        rt = b._runtime
        if rt is not None and all(rt is not r for r in out):
            out.append(rt)
    return out


def check_node_devices(node: Node) -> None:
    """Raise ``ValueError`` unless ``node``'s buffers are on one device (two for a peer copy)."""
    if isinstance(node, PeerCopyNode):
        return
    rts = _buffer_runtimes(node)
    if len(rts) > 1:
        devices = ", ".join(str(rt._device) for rt in rts)
        raise ValueError(
            f"node {node.name!r} uses buffers of several devices ({devices}): a node runs on one device; "
            "only a copy between device buffers may cross devices (a peer copy)"
        )


def _where(node: Node, launch: Runtime) -> Runtime:
    if isinstance(node, PeerCopyNode):
        if node.dst._runtime is launch or node.src._runtime is launch:
            return launch
        return node.src._runtime  # type: ignore[return-value]
    if isinstance(node, RecordNode):
        return node.event._runtime
    if isinstance(node, WaitNode):
        return launch
    rts = _buffer_runtimes(node)
    return rts[0] if rts else launch


def placement(nodes: list[Node], launch: Runtime) -> list[Runtime] | None:
    """The runtime each node runs on for a launch from a stream of ``launch``; ``None`` if all run there."""
    where = [_where(node, launch) for node in nodes]
    if all(rt is launch for rt in where):
        return None
    return where


def plan_slots(order: list[int], preds: list[set[int]], slot_of: list[int], slots: int) -> ForkPlan:
    """The plan for a fixed assignment of nodes to ``slots`` streams (slot 0: the launch stream).

    Each node waits for the events of its direct predecessors on other slots,
    unless an earlier wait on its slot already implies them; the launch stream
    finally waits for every slot whose last node it does not already follow.
    """
    reduced, masks = reduce_edges(order, preds)
    known = [0] * slots
    tails = [-1] * slots
    plan = ForkPlan(slots=slots)
    for v in order:
        c = slot_of[v]
        waits = []
        for u in sorted(reduced[v]):
            if slot_of[u] != c and not (known[c] >> u) & 1:
                waits.append(u)
                plan.signals.add(u)
                known[c] |= masks[u] | (1 << u)
        known[c] |= masks[v] | (1 << v)
        tails[c] = v
        plan.steps.append((v, c, tuple(waits)))
    plan.tails = tails
    plan.joins = [c for c in range(1, slots) if tails[c] >= 0 and not (known[0] >> tails[c]) & 1]
    return plan


def _wait(stream: Stream, event: Event, pipeline: str | None, node: str | None) -> None:
    with labelled(stream, pipeline, node):
        stream._backend.stream_wait_event(stream._handle, event._handle)


def _record(stream: Stream, event: Event, pipeline: str | None, node: str | None) -> None:
    with labelled(stream, pipeline, node):
        stream._backend.event_record(event._handle, stream._handle)


def _enqueue_across(
    nodes: list[Node],
    plan: ForkPlan,
    streams: list[Stream],
    pools: list[StreamPool],
    ctx: EnqueueContext,
    entry: Event | None,
    pipeline: str,
) -> None:
    """Enqueue ``plan`` on ``streams`` (``streams[0]``: the launch stream), events from each slot's pool.

    Each runtime that is being traced traces the ops on its own streams (labelled with the pipeline's
    and the node's names, as ``enqueue_plan`` does).
    """
    main = streams[0]
    events: dict[int, tuple[Event, StreamPool]] = {}
    try:
        if entry is not None:
            for s in streams[1:]:
                _wait(s, entry, pipeline, None)
        for v, slot, waits in plan.steps:
            s = streams[slot]
            s._backend.ensure_device(s._runtime._device)
            node = nodes[v]
            for u in waits:
                _wait(s, events[u][0], pipeline, node._name)
            ctx.current = node._name
            with labelled(s, pipeline, node._name):
                node._enqueue(s, ctx)
            if v in plan.signals:
                pool = pools[slot]
                ev = pool.acquire_event()  # an event of the recording stream's device
                events[v] = (ev, pool)
                _record(s, ev, pipeline, node._name)
        ctx.current = ""
        for slot in plan.joins:
            tail = plan.tails[slot]
            got = events.get(tail)
            if got is None:
                pool = pools[slot]
                got = events[tail] = (pool.acquire_event(), pool)
                _record(streams[slot], got[0], pipeline, nodes[tail]._name)
            _wait(main, got[0], pipeline, None)
    finally:
        for ev, pool in events.values():
            pool.release_event(ev)
        main._backend.ensure_device(main._runtime._device)


def launch_across_devices(
    p: Pipeline,
    stream: Stream,
    order: list[int],
    keep: tuple[Any, ...],
    where: list[Runtime],
    policy: str,
    wait_for: str | Event | None,
    join: bool,
) -> Run:
    """``Pipeline.launch`` for a pipeline with nodes on other devices than ``stream``'s (see the module docstring).

    Called with the pipeline's lock held, after validation.
    """
    if not join:
        raise ValueError(
            f"pipeline {p.name!r} runs nodes on other devices than the launch stream's; its other-device branches "
            "are always joined into the launch stream: launch it with join=True"
        )
    home = stream._runtime
    fork_slot: dict[int, int] = {}
    if policy == "fork":
        fork_slot = {v: slot for v, slot, _ in p._fork_plan().steps}
    keys: dict[tuple[int, int], int] = {(id(home), 0): 0}
    slot_rt: list[Runtime] = [home]
    slot_of = [0] * len(p._nodes)
    for v in order:
        rt = where[v]
        key = (id(rt), fork_slot.get(v, 0))
        slot = keys.get(key)
        if slot is None:
            slot = keys[key] = len(slot_rt)
            slot_rt.append(rt)
        slot_of[v] = slot
    plan = plan_slots(order, [set(ps) for ps in p._preds], slot_of, len(slot_rt))
    for rt in slot_rt:
        if rt.is_closed:
            raise ClosedError(f"pipeline {p.name!r} has nodes on {rt!r}, which is closed")
    pools = [pool_for(rt) for rt in slot_rt]
    sides: list[Stream] = []
    ctx = EnqueueContext(capturing=False)
    entry_ev: Event | None = None
    try:
        for rt, pool in zip(slot_rt[1:], pools[1:]):
            sides += pool.acquire_streams(1, stream.priority)
        streams = [stream, *sides]
        if wait_for == "stream":
            p._serialize_after_previous((stream,))
            entry_ev = pools[0].acquire_event()
            stream.record(entry_ev)
            entry: Event | None = entry_ev
        else:
            p._serialize_after_previous(streams)
            entry = wait_for if not isinstance(wait_for, str) else None
        try:
            _enqueue_across(p._nodes, plan, streams, pools, ctx, entry, p.name)
        except BaseException as exc:
            for s in streams:
                s._backend.ensure_device(s._runtime._device)
                p._fail_partial(s, keep, ctx, exc if s is stream else None)
            stream._backend.ensure_device(home._device)
            raise
        run = Run(p.name, policy, (stream, *sides), tuple(ctx.host), keep, stream._runtime._engine, (stream,))
    finally:
        if entry_ev is not None:
            pools[0].release_event(entry_ev)
        for s, pool in zip(sides, pools[1:]):
            pool.release_streams([s], stream.priority)
    p._chain.last = run
    return run
