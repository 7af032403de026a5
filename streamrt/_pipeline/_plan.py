"""Launch plans: a pipeline compiled once for eager launches on one stream, then executed with few checks.

A :class:`LaunchPlan` is built the first time a pipeline version is launched
with the ``"stream"`` policy on a stream (one device, tracing off) and kept
until the pipeline changes. It holds:

* ``steps``: the nodes' backend calls bound to their handles and arguments,
  in topological order (``Node._plan_step``); a Python host node is a request
  submitted to the stream's worker;
* ``roots``: the root buffers of every node (views resolved), each once;
* ``keep``: the keepalive of a launch (buffers, callables, arguments, packed
  kernel arguments);
* ``events``: the events of record and wait nodes;
* ``program``: where the backend has native ops (``backend.native_ops``) and
  every step is a memset, copy, kernel launch, native host function, record or wait, the
  capture check and the steps compiled into one native call
  (:meth:`~streamrt._backends._native_ops.NativeOps.compile`), which the
  launch makes instead of the steps' Python calls.

:meth:`LaunchPlan.launch` re-checks only what can change between launches:
the stream closed, a root buffer released, an event closed, and a capture in
progress on the stream (its launch is then recorded into that capture instead:
:func:`~streamrt._pipeline._capture.launch_into_capture`).
It notes each root buffer's stream once, makes the stream wait for the
previous run of the pipeline when that ran elsewhere, runs the steps, and
ends with the Run, whose tail resolves it (see :mod:`._run`). A launch that
fails midway leaves what was enqueued to run (see ``Pipeline._fail_partial``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._hostcall import HostRequest
from ._capture import launch_into_capture
from ._nodes import Node, RecordNode, WaitNode
from ._run import Run, serialize_after

if TYPE_CHECKING:
    from .._buffer import Buffer
    from .._event import Event
    from .._stream import Stream
    from ._builder import Pipeline

__all__ = ["LaunchPlan", "recheck"]


def recheck(pipeline: Pipeline, roots: tuple[Buffer, ...], events: tuple[Event, ...]) -> None:
    """What can change between launches of a compiled plan: ``ValueError`` for a released root
    buffer, ``ClosedError`` for a closed event."""
    for b in roots:
        if b._released:
            raise ValueError(f"pipeline {pipeline._name!r} uses a released buffer ({b!r})")
    for ev in events:
        if ev._closed:
            ev._check_open()


class LaunchPlan:
    """``pipeline`` compiled for eager launches on ``stream``. See the module docstring."""

    __slots__ = (
        "backend", "channel", "events", "keep", "names", "pipeline", "program", "records", "roots", "run_program", "steps", "stream",
    )

    def __init__(self, pipeline: Pipeline, stream: Stream, nodes: list[Node], order: list[int], keep: tuple[Any, ...]) -> None:
        self.pipeline = pipeline
        self.stream = stream
        self.backend = stream._backend
        extra: list[Any] = []
        steps = []
        names = []
        for i in order:
            node = nodes[i]
            step = node._plan_step(stream, extra)
            if step is not None:
                steps.append(step)
                names.append(node._name)
        self.steps = tuple(steps)
        self.names = tuple(names)
        self.keep = (*keep, *extra)
        rt = stream._runtime  # buffers of other devices are noted on their peer streams (see streamrt._peer)
        self.roots = tuple({id(r): r for r in (b.base for node in nodes for b in node.buffers()) if r._runtime is rt}.values())
        self.events: tuple[Event, ...] = tuple(n.event for n in nodes if isinstance(n, (RecordNode, WaitNode)))
        self.records: tuple[Event, ...] = tuple(n.event for n in nodes if isinstance(n, RecordNode))
        # the stream's host-call worker, made now (not on every launch) when the pipeline has Python host nodes
        self.channel = stream._runtime._engine._channel(stream._handle) if any(fn is None for fn, _ in steps) else None
        # the capture check and every step in one native call, where the backend has one and every step is its own call
        ops = getattr(self.backend, "native_ops", None)
        self.program = ops.compile(stream._handle, self.steps) if ops is not None else None
        self.run_program = ops.run if ops is not None and self.program is not None else None

    def launch(self) -> Run:
        """Enqueue the pipeline on the plan's stream; its :class:`Run`. See the module docstring."""
        stream = self.stream
        pipeline = self.pipeline
        rt = stream._runtime
        backend = self.backend
        handle = stream._handle
        with stream._lock, pipeline._lock:
            if stream._closed:
                stream._check_open()
            recheck(pipeline, self.roots, self.events)
            chain = pipeline._chain
            prev = chain.last
            pending = prev is not None and not prev._done
            # the program checks for a capture first; a wait for a run on other streams must follow that check
            native = self.run_program is not None and not (pending and prev._streams != (stream,))  # type: ignore[union-attr]
            if stream._capture is not None or not native and backend.stream_is_capturing(handle):
                return launch_into_capture(pipeline, stream, *pipeline._validated())
            if rt._multi_device:  # kernel launches and the tail event need the stream's device current
                backend.ensure_device(rt._device)
            if pending and prev._streams != (stream,):  # type: ignore[union-attr]  # (nothing to wait for on this stream)
                serialize_after(prev, (stream,))  # type: ignore[arg-type]
            host: list[tuple[str, HostRequest]] = []
            if native:
                failed = self.run_program(self.program)  # type: ignore[misc]
                if failed is not None:
                    return self._native_failed(*failed)
            else:
                step = 0
                try:
                    for step, (fn, args) in enumerate(self.steps):
                        if fn is None:
                            req = HostRequest(args[0], args[1], committed=False)
                            self.channel.submit(req)  # type: ignore[union-attr]
                            host.append((self.names[step], req))
                        else:
                            fn(*args)
                except BaseException as exc:
                    pipeline._fail_partial_plan(stream, self.keep, host, self.names[step], exc)
                    raise
                if host:
                    rt._engine._host_calls += len(host)
            for ev in self.records:
                ev._recorded_on = handle
            for b in self.roots:  # each root buffer's stream noted once (see Buffer.note_stream)
                used = b._streams
                if used is None:
                    b._streams = {stream}
                elif stream not in used:
                    used.add(stream)
            run = Run(pipeline._name, "stream", (stream,), tuple(host), self.keep, rt._engine, (stream,))
            chain.last = run
            return run

    def _native_failed(self, index: int, error: BaseException | None) -> Run:
        """The program stopped at call ``index`` (0: the capture check, ``i``: step ``i - 1``)."""
        pipeline = self.pipeline
        if error is None:  # a capture another library began: nothing was enqueued, record into it
            return launch_into_capture(pipeline, self.stream, *pipeline._validated())
        if index:  # the steps before it were enqueued
            pipeline._fail_partial_plan(self.stream, self.keep, [], self.names[index - 1], error)
        raise error
