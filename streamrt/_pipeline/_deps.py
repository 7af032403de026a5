"""Dependency inference and scheduling plans for pipelines: pure functions over node indices.

Nothing here touches a device. A pipeline hands in, per node, the byte ranges
it reads and writes and its explicit predecessors; this module returns the
inferred edges, a topological order, and the plan of the ``"fork"`` policy.

Hazards are judged on address ranges ``[ptr, ptr + nbytes)``: two accesses
conflict when their ranges overlap and at least one is a write. Addresses are
unique across device and host memory (unified addressing on HIP and CUDA; the
simulator keeps device memory in host RAM), so views, slices and several
wrappers of the same foreign memory are judged by the bytes they cover.

Edge kinds, for an earlier node ``a`` and a later node ``b``:

* ``RAW`` — ``b`` reads bytes ``a`` writes (read after write);
* ``WAR`` — ``b`` writes bytes ``a`` reads (write after read);
* ``WAW`` — both write the same bytes (write after write);
* ``after`` — declared with ``after=[a]`` or ``Pipeline.add_edge(a, b)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Access", "CycleError", "ForkPlan", "hazards", "plan_fork", "reduce_edges", "topological_order"]


@dataclass(frozen=True)
class Access:
    """One declared access: the half-open address range ``[lo, hi)``; ``write`` or read."""

    lo: int
    hi: int
    write: bool

    def overlaps(self, other: Access) -> bool:
        return self.lo < other.hi and other.lo < self.hi


class CycleError(ValueError):
    """The pipeline's edges form a cycle. ``cycle`` lists node indices, first == last."""

    def __init__(self, message: str, cycle: list[int]) -> None:
        self.cycle = cycle
        super().__init__(message)


def hazards(earlier: tuple[Access, ...], later: tuple[Access, ...]) -> set[str]:
    """The hazard kinds (``RAW``, ``WAR``, ``WAW``) between an earlier and a later node's accesses."""
    kinds: set[str] = set()
    for a in earlier:
        for b in later:
            if (a.write or b.write) and a.lo < b.hi and b.lo < a.hi:
                if a.write and b.write:
                    kinds.add("WAW")
                elif a.write:
                    kinds.add("RAW")
                else:
                    kinds.add("WAR")
    return kinds


def topological_order(preds: list[set[int]]) -> list[int]:
    """Kahn's order preferring the lowest index; raises :class:`CycleError` naming one cycle."""
    n = len(preds)
    succs: list[list[int]] = [[] for _ in range(n)]
    indegree = [0] * n
    for v, ps in enumerate(preds):
        indegree[v] = len(ps)
        for u in ps:
            succs[u].append(v)
    import heapq

    ready = [v for v in range(n) if indegree[v] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        u = heapq.heappop(ready)
        order.append(u)
        for v in succs[u]:
            indegree[v] -= 1
            if indegree[v] == 0:
                heapq.heappush(ready, v)
    if len(order) == n:
        return order
    raise CycleError("cycle", _find_cycle(preds, {v for v in range(n) if indegree[v] > 0}))


def _find_cycle(preds: list[set[int]], remaining: set[int]) -> list[int]:
    """A cycle among ``remaining`` (every node there has a predecessor there), in edge order."""
    start = min(remaining)
    path: list[int] = []
    position: dict[int, int] = {}
    v = start
    while v not in position:
        position[v] = len(path)
        path.append(v)
        v = min(u for u in preds[v] if u in remaining)
    cycle = path[position[v] :] + [v]
    cycle.reverse()  # we walked predecessor links; report before -> after
    return cycle


def ancestor_masks(order: list[int], preds: list[set[int]]) -> list[int]:
    """Per node, a bitmask of all its ancestors (not itself)."""
    masks = [0] * len(preds)
    for v in order:
        m = 0
        for u in preds[v]:
            m |= masks[u] | (1 << u)
        masks[v] = m
    return masks


def reduce_edges(order: list[int], preds: list[set[int]]) -> tuple[list[set[int]], list[int]]:
    """The transitive reduction of the DAG, and each node's ancestor mask.

    An edge ``u -> v`` is dropped when ``u`` is an ancestor of another
    predecessor of ``v``: the order is implied.
    """
    masks = ancestor_masks(order, preds)
    reduced: list[set[int]] = []
    for v, ps in enumerate(preds):
        implied = 0
        for u in ps:
            implied |= masks[u]
        reduced.append({u for u in ps if not (implied >> u) & 1})
    return reduced, masks


@dataclass
class ForkPlan:
    """Where each node runs under the ``"fork"`` policy, and which events order the lanes.

    Slot 0 is the caller's stream; slots ``1..slots-1`` are pooled side streams.

    Attributes:
        slots: number of streams used.
        steps: in enqueue order, ``(node, slot, waits)``: before enqueuing
            ``node`` on ``slot``, wait for the events recorded after each node in ``waits``.
        signals: nodes after which an event is recorded (someone waits for them).
        tails: the last node of every slot.
        joins: side slots whose tail the caller's stream waits for at the end
            (those not already ordered before the caller's stream's tail).
    """

    slots: int
    steps: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)
    signals: set[int] = field(default_factory=set)
    tails: list[int] = field(default_factory=list)
    joins: list[int] = field(default_factory=list)


def plan_fork(order: list[int], preds: list[set[int]]) -> ForkPlan:
    """Assign nodes to streams so independent branches run concurrently.

    Greedy chain decomposition in topological order: a node continues the
    stream whose last node is one of its ancestors (preferring a direct
    predecessor, then the lowest slot); otherwise it opens a new side stream
    (the first root takes the caller's stream). Waits are added only for
    predecessors not already known complete on that stream.
    """
    reduced, masks = reduce_edges(order, preds)
    tail_of_slot: list[int] = []  # last node per slot
    known: list[int] = []  # per slot: bitmask of nodes known complete before its next node
    slot_of: dict[int, int] = {}
    plan = ForkPlan(slots=0)
    for v in order:
        anc = masks[v]
        choice = -1
        for s, t in enumerate(tail_of_slot):
            if t in reduced[v]:
                choice = s
                break
        if choice < 0:
            for s, t in enumerate(tail_of_slot):
                if (anc >> t) & 1:
                    choice = s
                    break
        if choice < 0:
            choice = len(tail_of_slot)
            tail_of_slot.append(-1)
            known.append(0)
        waits = []
        for u in sorted(reduced[v]):
            if slot_of[u] != choice and not (known[choice] >> u) & 1:
                waits.append(u)
                plan.signals.add(u)
                known[choice] |= masks[u] | (1 << u)
        known[choice] |= anc | (1 << v)
        tail_of_slot[choice] = v
        slot_of[v] = choice
        plan.steps.append((v, choice, tuple(waits)))
    plan.slots = len(tail_of_slot)
    plan.tails = tail_of_slot
    main_known = known[0] if known else 0
    for s in range(1, plan.slots):
        t = tail_of_slot[s]
        if not (main_known >> t) & 1:
            plan.joins.append(s)
    return plan
