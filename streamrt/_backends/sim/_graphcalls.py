"""Capture and graph calls of the sim backend.

See ``_graph`` for the capture model and the rules these calls enforce.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any

from ..._errors import CaptureError
from ..protocol import CaptureMode
from . import _codes as C
from ._codes import fail, make_error
from ._core import EXEC_BASE, GRAPH_BASE, SimCore
from ._graph import Capture, Graph, GraphExec, GraphMemory
from ._memory import Allocation, MemoryMap
from ._ops import Op

__all__ = ["GraphCalls"]


def _release_graph_memory(lock: threading.Lock, mem: MemoryMap, allocations: list[Allocation]) -> None:
    with lock:
        for alloc in allocations:
            mem.release(alloc)


class GraphCalls(SimCore):
    """stream_begin_capture / stream_end_capture / stream_is_capturing / graph_* calls."""

    if TYPE_CHECKING:  # the user-object mixin's (_user_objects.SimUserObjects)

        def _release_user_objects(self, objects: list[Any], after: list[Op]) -> None: ...

    # == graphs ===========================================================================================
    def stream_begin_capture(self, stream: int, mode: CaptureMode) -> None:
        call = "stream_begin_capture"
        tls = self._enter(call)
        try:
            m = CaptureMode(mode)
        except ValueError:
            fail(C.INVALID_VALUE, f"mode must be a CaptureMode (0..2), got {mode!r}", call)
        with self._lock:
            s = self._stream(stream, tls, call)
            if s.handle == 0:
                fail(C.CAPTURE_UNSUPPORTED, "the null stream cannot be captured (it cannot on CUDA/HIP either)", call)
            if s.capture is not None:
                fail(C.ILLEGAL_STATE, f"stream {s.handle:#x} is already capturing", call)
            self._capture_ids += 1
            cap = Capture(self._capture_ids, s, m, threading.get_ident(), s.device, self._new_handle(GRAPH_BASE))
            s.capture = cap
            s.cap_deps = []
            self._captures.append(cap)
            self._charge(tls)

    def stream_is_capturing(self, stream: int) -> bool:
        """``True`` from begin to end of capture (also once the capture is invalidated), for joined streams too."""
        call = "stream_is_capturing"
        tls = self._enter(call)
        with self._lock:
            return self._stream(stream, tls, call).capture is not None

    def _end(self, cap: Capture) -> None:
        cap.ended = True
        for st in cap.streams:
            st.capture = None
            st.cap_deps = []
        if cap in self._captures:
            self._captures.remove(cap)

    def _drop_capture_memory(self, memory: GraphMemory) -> None:
        memory.released = True
        self._release_user_objects(memory.user_objects, [])
        memory.user_objects = []
        for alloc in memory.allocations:
            self._mem.free_now(alloc)
        memory.allocations = []

    def stream_end_capture(self, stream: int) -> int:
        """End the capture begun on ``stream``; return a graph handle.

        Raises :class:`~streamrt.CaptureError` (chained to the sim error) when the
        capture was invalidated or a forked stream was not joined back; the
        streams are out of capture mode and usable either way.
        """
        call = "stream_end_capture"
        tls = self._enter(call)
        with self._lock:
            s = self._stream(stream, tls, call)
            cap = s.capture
            if cap is None:
                fail(C.ILLEGAL_STATE, f"stream {s.handle:#x} is not capturing", call)
            if cap.origin is not s:
                fail(C.CAPTURE_UNMATCHED, f"the capture began on stream {cap.origin.handle:#x}; end it there", call)
            if cap.mode != CaptureMode.RELAXED and cap.thread != threading.get_ident():
                fail(C.CAPTURE_WRONG_THREAD, f"the capture was begun in {cap.mode.name} mode by another thread", call)
            unjoined = cap.unjoined() if cap.invalid is None else []
            self._end(cap)
            self._charge(tls)
            if cap.invalid is not None or unjoined:
                self._drop_capture_memory(cap.memory)
                if cap.invalid is not None:
                    code, reason = cap.invalid
                    cause = make_error(C.CAPTURE_INVALIDATED, f"the capture was invalidated: {reason}", call)
                else:
                    names = ", ".join(f"{u.handle:#x}" for u in unjoined)
                    code = C.CAPTURE_UNJOINED
                    cause = make_error(
                        code,
                        f"stream(s) {names} forked from the capture were not joined back into stream {s.handle:#x} "
                        "(record an event on each and wait on it from the origin stream)",
                        call,
                    )
                raise CaptureError(str(cause)) from cause
            handle = cap.graph
            cap.memory.users = 1
            self._graphs[handle] = Graph(handle, cap.nodes, cap.memory, cap.device)
            return handle

    def graph_instantiate(self, graph: int) -> int:
        call = "graph_instantiate"
        tls = self._enter(call)
        with self._lock:
            g = self._lookup(self._graphs, graph, "graph", call)
            handle = self._new_handle(EXEC_BASE)
            self._execs[handle] = GraphExec(handle, g)
            g.memory.users += 1
            self._charge(tls)
            return handle

    def _unuse_memory(self, memory: GraphMemory) -> None:
        """One user of graph memory is gone; free it once none remain and launches finished. Lock held."""
        memory.users -= 1
        if memory.users > 0 or memory.released or not (memory.allocations or memory.user_objects):
            return
        memory.released = True
        allocs = list(memory.allocations)
        memory.allocations = []
        for alloc in allocs:
            self._mem.retire(alloc)
        waiting = [op for op in memory.launches if not op.done]
        memory.launches = []
        self._release_user_objects(memory.user_objects, waiting)
        memory.user_objects = []
        if not allocs:
            return
        if not waiting:
            for alloc in allocs:
                self._mem.release(alloc)
            return
        # a replay still runs: release when it has finished
        end = max(op.end_us for op in waiting)
        dev = self._devices[allocs[0].device]
        op = Op(
            self._next_seq(),
            "graph_free",
            dev.index,
            0,
            sum(a.size for a in allocs),
            end,
            end,
            end,
            "",
            functools.partial(_release_graph_memory, self._lock, self._mem),
            (allocs,),
            tuple(allocs),
            dev.executor,
        )
        for w in waiting:
            op.depend_on(w)
        dev.loose.append(op)
        self._sched.submit(op)

    def graph_exec_destroy(self, graph_exec: int) -> None:
        """Destroy an exec; a launch in flight still completes."""
        call = "graph_exec_destroy"
        tls = self._enter(call)
        with self._lock:
            ex = self._lookup(self._execs, graph_exec, "graph exec", call)
            del self._execs[ex.handle]
            ex.destroyed = True
            self._unuse_memory(ex.memory)
            self._charge(tls)

    def graph_destroy(self, graph: int) -> None:
        """Destroy a graph; its execs stay valid (they own copies of the nodes)."""
        call = "graph_destroy"
        tls = self._enter(call)
        with self._lock:
            g = self._lookup(self._graphs, graph, "graph", call)
            del self._graphs[g.handle]
            g.destroyed = True
            self._unuse_memory(g.memory)
            self._charge(tls)

    def graph_launch(self, graph_exec: int, stream: int) -> None:
        """Replay: nodes run in dependency order after prior work on ``stream``; later work waits for all of them."""
        call = "graph_launch"
        tls = self._enter(call)
        with self._lock:
            ex: GraphExec = self._lookup(self._execs, graph_exec, "graph exec", call)
            s = self._stream(stream, tls, call)
            if s.capture is not None:
                self._violation(
                    [s.capture], C.CAPTURE_UNSUPPORTED, "launching a graph inside a capture is not simulated", call
                )
            for node in ex.nodes:
                for a in node.refs or ():
                    if isinstance(a, Allocation) and a.freed and a.owner is not ex.memory:
                        if self._hz is not None:
                            self._hz.report(
                                [
                                    self._hz.freed_access(
                                        a, a.base, a.end, f"{node.kind} node {node.index} of graph exec {ex.handle:#x}"
                                    )
                                ],
                                call,
                            )
                        fail(
                            C.INVALID_VALUE,
                            f"node {node.index} ({node.kind}) of graph exec {ex.handle:#x} uses the {a.describe()}, "
                            "freed since the capture",
                            call,
                        )
            p = self._profile
            seq = self._seq + 1
            hzinfo = None
            if self._hz is not None:
                vc = self._hz.stream_clock(s)
                if ex.accesses:
                    epoch, _ = self._hz.device_access(
                        s.key,
                        vc,
                        ex.accesses,
                        f"graph_launch#{seq} (exec {ex.handle:#x}) on stream {s.handle:#x}",
                        call,
                    )
                else:
                    epoch = self._hz.next_epoch(s.key, vc)
                hzinfo = (s.key, dict(vc), epoch)
            dev = self._devices[s.device]
            issue = tls.host_us = tls.host_us + p.api_call_us
            base = max(issue + p.launch_latency_us, s.tail_us, s.work_ready_us, ex.last_end_us)
            nodes = ex.nodes
            ends = [0.0] * len(nodes)
            ops: list[Op] = []
            any_work = False
            for node in nodes:
                start = base
                for d in node.deps:
                    t = ends[d] + nodes[d].gap_after_us
                    if t > start:
                        start = t
                if node.engine is not None:
                    free_at = dev.engine_free[node.engine]
                    if free_at > start:
                        start = free_at
                end = start + node.duration_us
                if node.estimate is not None:
                    end += node.estimate.us
                if node.engine is not None:
                    dev.engine_free[node.engine] = end
                ends[node.index] = end
                any_work = any_work or node.work
                op = Op(
                    self._next_seq(),
                    node.kind,
                    s.device,
                    s.handle,
                    node.nbytes,
                    issue,
                    start,
                    end,
                    tls.name,
                    node.fn,
                    node.args,
                    node.refs,
                    dev.executor,
                    node.host,
                    node.name,
                    ex.handle,
                    node.index,
                )
                if node.host:
                    op.hz = hzinfo
                if node.deps:
                    for d in node.deps:
                        op.depend_on(ops[d])
                else:
                    op.depend_on(s.last_op)
                    op.depend_on(ex.last)
                ops.append(op)
            join_us = max([base, *ends])
            join = Op(
                self._next_seq(),
                "graph_launch",
                s.device,
                s.handle,
                0,
                issue,
                join_us,
                join_us,
                tls.name,
                None,
                (),
                None,
                dev.executor,
                False,
                "",
                ex.handle,
                -1,
            )
            if ops:
                for i in ex.sinks:
                    join.depend_on(ops[i])
            else:
                join.depend_on(s.last_op)
                join.depend_on(ex.last)
            for op in ops:
                self._sched.submit(op)
            self._sched.submit(join)
            s.last_op = join
            s.tail_us = join_us
            if join_us > dev.time_us:
                dev.time_us = join_us
            if self._charge_host_time:
                self._mark_real(tls)
            s.work_ready_us = join_us + (p.op_gap_us if any_work else 0.0)
            ex.last = join
            ex.last_end_us = join_us
            if ex.memory.allocations or ex.memory.user_objects:
                ex.memory.launches = [op for op in ex.memory.launches if not op.done]
                ex.memory.launches.append(join)
