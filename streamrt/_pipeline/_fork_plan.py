"""Fork plans: the ``"fork"`` policy compiled once for a caller's stream, its side streams kept with it.

A :class:`ForkLaunchPlan` is built the first time a pipeline version is
launched with ``policy="fork"`` on a stream (``wait_for="stream"`` or
``None``, one device, tracing off, no Python host nodes, more than one
branch) and kept until the pipeline changes. It checks out its side streams
and its ordering events from the runtime's pool once, and gives them back
when the plan is dropped; the ordering events are re-recorded on every
launch (a wait binds to the record it saw when it was enqueued, so that is
safe). The launch is then a flat list of bound backend calls -- the entry
record and waits, each branch's nodes with the waits and records between
branches, the join -- which, where the backend has native ops, is one
native program (:meth:`~streamrt._backends._native_ops.NativeOps.compile`).

What a launch re-checks and how it fails are those of
:class:`~streamrt._pipeline._plan.LaunchPlan`; the Run's streams are the
caller's and the side streams, its tails the caller's (``join=True``) or
every stream's (``join=False``), as the general fork launch makes them.

A *deferred* plan (``deferred=True``, ``join=False``) puts every branch on a
side stream and hands each launch's calls -- the capture check, waits for
the previous run, the entry record and waits, the branches, a tail record per
side stream -- to the runtime's submission thread (:mod:`streamrt._submitter`)
as one program; the launch returns once it is queued. The Run's tails are
gated by the submission's ticket, and a call that fails on that thread is the
Run's error (the calls before it run; the tail records are still made).
A deferred launch may read other memory than a copy node's source, for that
launch only (``sources``: see :meth:`ForkLaunchPlan.copy_step`).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from .._backends._native_ops import Program
from .._errors import CaptureError
from .._streampool import StreamPool, pool_for
from ._capture import launch_into_capture
from ._deps import ForkPlan
from ._nodes import EnqueueContext, HostNode, Node, PlanStep, RecordNode, WaitNode
from ._plan import recheck
from ._run import Deferred, Run, serialize_after

if TYPE_CHECKING:
    from .._buffer import Buffer
    from .._event import Event
    from .._runtime import Runtime
    from .._stream import Stream
    from ._builder import Pipeline

__all__ = ["ForkLaunchPlan", "plannable"]


def plannable(nodes: list[Node], fork: ForkPlan, wait_for: object, deferred: bool = False) -> bool:
    """Whether a fork launch of ``nodes`` can be compiled: several branches (or deferred), no Python host node."""
    return (
        (fork.slots > 1 or deferred)
        and (wait_for is None or wait_for == "stream")
        and not any(isinstance(n, HostNode) and n.native_address is None for n in nodes)
    )


def _give_back(rt: Runtime, pool: StreamPool, sides: list[Stream], priority: int, events: list[Event]) -> None:
    for side in sides:  # a deferred plan's last calls are made before another user gets its streams
        rt._engine.settle(side._handle)
    pool.release_streams(sides, priority)
    for ev in events:
        pool.release_event(ev)


class ForkLaunchPlan:
    """``pipeline`` compiled for ``"fork"`` launches from ``stream``. See the module docstring."""

    __slots__ = (
        "__weakref__", "backend", "body", "check", "deferred", "event_words", "events", "keep", "names", "patched", "pipeline",
        "program", "records", "roots", "run_program", "run_streams", "side_handles", "sides", "source_words", "steps", "stream",
        "streams", "tails", "template", "users", "wait_for",
    )

    def __init__(
        self, pipeline: Pipeline, stream: Stream, nodes: list[Node], keep: tuple[Any, ...], fork: ForkPlan,
        wait_for: str | None, join: bool, deferred: bool = False,
    ) -> None:
        self.pipeline = pipeline
        self.stream = stream
        self.wait_for = wait_for
        self.deferred = deferred
        backend = self.backend = stream._backend
        pool = pool_for(stream._runtime)
        self.sides = pool.acquire_streams(fork.slots - (0 if deferred else 1), stream.priority)
        owned: list[Event] = []
        weakref.finalize(self, _give_back, stream._runtime, pool, self.sides, stream.priority, owned)
        streams = self.streams = (*self.sides,) if deferred else (stream, *self.sides)
        steps: list[PlanStep] = []
        names: list[str] = []  # per step: the node it belongs to ("" for the entry and the join)
        extra: list[Any] = []

        def ordering(fn: Any, args: tuple[Any, ...], name: str = "") -> None:
            steps.append((fn, args))
            names.append(name)

        def event() -> Event:
            ev = pool.acquire_event()
            owned.append(ev)
            return ev

        if wait_for == "stream":
            entry = event()
            ordering(backend.event_record, (entry._handle, stream._handle))
            for side in self.sides:
                ordering(backend.stream_wait_event, (side._handle, entry._handle))
        after: dict[int, Event] = {}  # node -> the event recorded after it
        used: dict[int, tuple[Buffer, dict[Stream, None]]] = {}  # root buffer id -> (root, streams using it)
        records: list[tuple[Event, int]] = []
        for v, slot, waits in fork.steps:
            s, node = streams[slot], nodes[v]
            for u in waits:
                ordering(backend.stream_wait_event, (s._handle, after[u]._handle), node._name)
            step = node._plan_step(s, extra)
            if step is not None:
                ordering(*step, node._name)
            if v in fork.signals:
                ev = after[v] = event()
                ordering(backend.event_record, (ev._handle, s._handle), node._name)
            if isinstance(node, RecordNode):
                records.append((node.event, s._handle))
            for b in node.buffers():
                root = b.base
                if root._runtime is stream._runtime:  # other devices' buffers are noted on their peer streams
                    used.setdefault(id(root), (root, {}))[1][s] = None
        if join:
            for slot in fork.joins:
                tail = fork.tails[slot]
                if tail not in after:
                    after[tail] = event()
                    ordering(backend.event_record, (after[tail]._handle, streams[slot]._handle), nodes[tail]._name)
                ordering(backend.stream_wait_event, (stream._handle, after[tail]._handle))
        self.steps = tuple(steps)
        self.names = tuple(names)
        self.keep = (*keep, *extra)
        self.roots = tuple(root for root, _ in used.values())
        self.users = tuple(tuple(users) for _, users in used.values())  # per root: the streams using it
        self.events: tuple[Event, ...] = tuple(n.event for n in nodes if isinstance(n, (RecordNode, WaitNode)))
        self.records = tuple(records)
        self.tails = (stream,) if join and not deferred else streams
        ops = getattr(backend, "native_ops", None)
        self.program = ops.compile(stream._handle, self.steps) if ops is not None else None
        self.run_program = ops.run if ops is not None and self.program is not None else None
        # While the previous run is pending its waits go between the capture check and the steps: the two halves
        self.check = Program().check_not_capturing(stream._handle) if self.program is not None else None
        self.body = self.program.after(1) if self.program is not None else None
        self.run_streams = (stream, *self.sides)  # a deferred Run's streams (one tuple: its plan's runs are told by it)
        self.side_handles = tuple(side._handle for side in self.sides)
        # A deferred launch with nothing to wait for: the program with its tail records, their events set per launch
        self.template = None
        self.patched: list[int] = []  # the template's copy steps whose source the last launch changed
        self.event_words: tuple[int, ...] = ()
        self.source_words: dict[int, int] = {}
        if deferred and self.program is not None:
            self._make_template()

    def _make_template(self) -> None:
        """The deferred program without waits, and where in its words a launch writes its tail records'
        events and its copy steps' sources (``template`` is ``None`` until then)."""
        self.template = template = self._deferred_work([], [0] * len(self.sides))
        first = len(template) - len(self.sides)
        self.event_words = tuple(Program.at(first + i, 0) for i in range(len(self.sides)))
        memcpy = self.backend.memcpy_async
        self.source_words = {i: Program.at(1 + i, 1) for i, (fn, _) in enumerate(self.steps) if fn == memcpy}

    def copy_step(self, node: str) -> int | None:
        """The index of the copy step of the node named ``node``, for ``launch(sources=...)``; ``None``
        where it has none (not a copy, an empty one, or not in this plan)."""
        memcpy = self.backend.memcpy_async
        for i, (name, (fn, _)) in enumerate(zip(self.names, self.steps)):
            if name == node and fn == memcpy:
                return i
        return None

    def launch(self, sources: tuple[tuple[int, Buffer], ...] = ()) -> Run:
        """Enqueue the pipeline with the ``"fork"`` policy from the plan's stream; its :class:`Run`.

        ``sources`` (a deferred plan only): ``(copy step, buffer)`` pairs; the step reads that buffer,
        of at least the copy's bytes and the same kind as its source (the caller checks), instead of
        its node's source in this launch, which keeps the buffer alive and notes its stream."""
        stream = self.stream
        pipeline = self.pipeline
        with stream._lock, pipeline._lock:
            if stream._closed:
                stream._check_open()
            held = 0
            try:
                for side in self.sides:  # held like the caller's: no close can come between the launch's parts
                    side._lock.acquire()
                    held += 1
                    if side._closed:
                        side._check_open()
                if self.deferred:
                    return self._launch_deferred(sources)
                if sources:
                    raise ValueError("only a deferred plan takes sources")
                return self._launch_locked()
            finally:
                for side in self.sides[:held]:
                    side._lock.release()

    def _launch_locked(self) -> Run:
        """:meth:`launch` of a plan made here, with the caller's, the pipeline's and the side streams' locks held."""
        stream = self.stream
        pipeline = self.pipeline
        rt = stream._runtime
        backend = self.backend
        handle = stream._handle
        recheck(pipeline, self.roots, self.events)
        chain = pipeline._chain
        prev = chain.last
        pending = prev is not None and not prev._done
        native = self.run_program is not None
        if stream._capture is not None or not native and backend.stream_is_capturing(handle):
            return launch_into_capture(pipeline, stream, *pipeline._validated())
        if rt._multi_device:
            backend.ensure_device(rt._device)
        if native:
            if pending:  # the check, the waits for the previous run, then the steps (call i of body is i + 1)
                failed = self.run_program(self.check)  # type: ignore[misc]
                if failed is None:
                    serialize_after(prev, (stream,) if self.wait_for == "stream" else self.streams)  # type: ignore[arg-type]
                    failed = self.run_program(self.body)  # type: ignore[misc]
                    if failed is not None:
                        failed = (failed[0] + 1, failed[1])
            else:
                failed = self.run_program(self.program)  # type: ignore[misc]
            if failed is not None:
                index, error = failed
                if error is None:  # a capture another library began: nothing was enqueued
                    return launch_into_capture(pipeline, stream, *pipeline._validated())
                if index:
                    self._fail_partial(self.names[index - 1], error)
                raise error
        else:
            if pending:
                serialize_after(prev, (stream,) if self.wait_for == "stream" else self.streams)  # type: ignore[arg-type]
            i = 0
            try:
                for i, (fn, args) in enumerate(self.steps):
                    fn(*args)  # type: ignore[misc]
            except BaseException as exc:
                self._fail_partial(self.names[i], exc)
                raise
        self._note_streams()
        run = Run(pipeline._name, "fork", self.streams, (), self.keep, rt._engine, self.tails)
        chain.last = run
        return run

    def _launch_deferred(self, sources: tuple[tuple[int, Buffer], ...] = ()) -> Run:
        """A deferred launch: its calls queued on the submission thread as one program (module docstring)."""
        stream = self.stream
        pipeline = self.pipeline
        recheck(pipeline, self.roots, self.events)
        keep = self.keep
        if sources:
            if stream._capture is not None:
                raise ValueError("a launch with other sources cannot be recorded into a capture")
            for _, b in sources:
                if b._released:
                    raise ValueError(f"pipeline {pipeline._name!r} was given a released buffer ({b!r})")
            keep = (*keep, sources)
        if stream._capture is not None:  # streamrt's own capture: recorded now, on this thread
            return launch_into_capture(pipeline, stream, *pipeline._validated())
        engine = stream._runtime._engine
        submitter = engine._submitter or engine.submitter()
        chain = pipeline._chain
        prev = chain.last
        waits: list[tuple[int, int]] = []  # (side stream, event): the previous run's tails, waited for there
        # (the previous run of this plan on one side stream is ordered by that stream alone)
        if prev is not None and not prev._done and (len(self.sides) > 1 or prev._streams is not self.run_streams):
            with prev._lock:
                waits = [(side._handle, ev) for side in self.sides for src, ev in prev._tails if src is not side]
        pool = engine._pool
        events = []  # a tail event per side stream, from the engine's pool
        for _ in self.sides:
            events.append(pool.pop() if pool else engine._events.take())
        work = self._deferred_work(waits, events, sources)
        ticket = submitter.submit(work, len(work) - len(events))
        engine.defer_on(self.side_handles, ticket)
        self._note_streams()
        for _, b in sources:  # (Buffer.note_stream, for every side stream)
            root = b._base if b._base is not None else b
            if root._streams is None:
                root._streams = set(self.sides)
            else:
                root._streams.update(self.sides)
        deferred = Deferred(submitter, ticket, work, tuple(zip(self.sides, events)), self.names, 1 + len(waits))
        run = Run(pipeline._name, "fork", self.run_streams, (), keep, engine, self.sides, deferred=deferred)
        chain.last = run
        return run

    def _deferred_work(self, waits: list[tuple[int, int]], events: list[int], sources: tuple[tuple[int, Buffer], ...] = ()) -> Any:
        """One launch's calls: the capture check, ``waits``, the compiled steps (their copies reading
        ``sources``), a tail record per side stream.

        Without waits it is :attr:`template`, changed in place (the submitter copies what it is given)."""
        template = self.template
        skip = 1 + len(waits)  # the calls before the compiled steps
        if template is not None and not waits:  # (its words written in place: no call per value)
            words = template.words
            for i, ev in zip(self.event_words, events):
                words[i] = ev
            if sources or self.patched:
                patched = []
                source = self.source_words
                for step, b in sources:
                    words[source[step]] = b._ptr
                    patched.append(step)
                for step in self.patched:
                    if step not in patched:  # back to the node's own source
                        words[source[step]] = self.steps[step][1][1]
                self.patched = patched
            return template
        if self.program is not None:
            program = Program().check_not_capturing(self.stream._handle)
            for handle, ev in waits:
                program.wait(handle, ev)
            program.extend(self.body)  # type: ignore[arg-type]
            for side, ev in zip(self.sides, events):
                program.record(ev, side._handle)
            for step, b in sources:
                program.set(skip + step, 1, b._ptr)
            return program
        backend = self.backend
        steps: list[Any] = [(_check_not_capturing, (backend, self.stream._handle))]
        for w in waits:
            steps.append((backend.stream_wait_event, w))
        steps += self.steps
        for step, b in sources:
            fn, (dst, _, *rest) = steps[skip + step]
            steps[skip + step] = (fn, (dst, b._ptr, *rest))
        for side, ev in zip(self.sides, events):
            steps.append((backend.event_record, (ev, side._handle)))
        return steps

    def _note_streams(self) -> None:
        for ev, on in self.records:
            ev._recorded_on = on
        for b, users in zip(self.roots, self.users):  # each root buffer's streams noted once (see Buffer.note_stream)
            noted = b._streams
            if noted is None:
                b._streams = set(users)
            else:
                noted.update(users)

    def _fail_partial(self, node: str, exc: BaseException) -> None:
        """What was enqueued before the failing call runs, on every stream (see ``Pipeline._fail_partial``)."""
        for s in self.streams:
            self.pipeline._fail_partial(s, self.keep, EnqueueContext(capturing=False, current=node), exc if s is self.stream else None)


def _check_not_capturing(backend: Any, stream: int) -> None:
    """The Python twin of a program's capture check (a deferred launch on a backend with no native ops)."""
    if backend.stream_is_capturing(stream):
        raise CaptureError("the stream is capturing")
