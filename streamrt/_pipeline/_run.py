"""Run: the awaitable outcome of one pipeline launch or graph replay, resolved by its tail.

A :class:`Run` is a :class:`~streamrt.Completion` that resolves once every
tail of the launch has completed. It then carries the launch's first error: a
device error seen at a tail, else the exception of the first failing host
node in topological order (all of them are in :attr:`Run.node_errors`).

One future per launch. A launch ends with one *tail event* recorded on its
caller's stream (after the side streams were joined into it), or one per
stream it used when it was not joined. The Run itself is what the stream's
completion lane watches for its tail (the lane retires it: there is no
separate Completion per tail or per host node): when the tail retires, the
launch's keepalive (buffers, host callables and their arguments) is dropped
on the lane thread, the outcome of each Python host node is read from its
request (the tail follows the node's hold, so it has run, or the stream failed
and the node is abandoned with the error), and the Run resolves. Extra tails
(``join=False``) are small items that count down to the Run.

The tail events also order later work after the run: :meth:`Run.join` and a
relaunch of the same pipeline make streams wait for them. They go back to the
completion engine's event pool when the Run resolves (a wait binds to the
record it saw when it was enqueued, so reuse is safe).

Thread rules: a Run may be waited on, awaited and joined from any thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .._allocator import release_after_device
from .._completion import Completion
from .._completion._future import PostBatch
from .._errors import CaptureError
from .._stream import Stream

if TYPE_CHECKING:
    from .._completion import CompletionEngine
    from .._completion._lane import _Lane
    from .._hostcall import HostRequest
    from .._submitter import Submitter

__all__ = ["Deferred", "Run", "RunChain", "recorded_run", "serialize_after"]

HostNodes = tuple[tuple[str, "HostRequest"], ...]


class Run(Completion):
    """One launch of a pipeline (or replay of a graph). Awaitable; see the module docstring.

    * ``run.wait()`` blocks (GIL released); ``await run`` never blocks the loop.
    * ``run.is_done``; ``run.exception()`` waits and returns the first error or ``None``;
      ``run.result()`` waits and raises it (returns ``None`` otherwise).
    * ``run.join(stream)`` makes later work on ``stream`` wait for the whole run
      (for fork launches with ``join=False``).
    * ``run.host_result(name)`` is the return value of a host node.

    Made by launches (the constructor records the tails), never directly.
    """

    __slots__ = (
        "_after",
        "_engine",
        "_error",
        "_host",
        "_host_values",
        "_lock",
        "_name",
        "_node_errors",
        "_policy",
        "_remaining",
        "_streams",
        "_submission",
        "_tails",
        "event",
        "gate",
        "keepalive",
        "pooled",
        "unordered",
    )

    def __init__(
        self,
        name: str,
        policy: str,
        streams: tuple[Stream, ...],
        host: HostNodes,
        keepalive: object,
        engine: CompletionEngine,
        tails: Iterable[Stream],
        *,
        after: Callable[[Run], None] | None = None,
        error: BaseException | None = None,
        recorded: int = 0,
        deferred: Deferred | None = None,
    ) -> None:
        """Record the tail events on ``tails`` (their enqueue locks held) and watch them.

        The first tail is this Run itself, on its stream's lane; more are
        :class:`_Tail` items. Raises the backend's error if a tail could not
        be recorded: the Run is then watched on the tails recorded before it
        (none: it finishes once the device is idle, ``after`` included).
        ``after(run)`` is called just before it resolves.
        ``error``: the Run's error from the start (with no tails: a Run that is done at once).
        ``recorded``: the one tail's event (from the engine's pool), already recorded by the
        caller inside its own record-and-push section on the tail stream's lane.
        ``deferred``: a deferred launch's submission; its tails' events (from the engine's pool)
        are recorded by the submission thread, and a call that failed there is the Run's error.
        """
        # Completion's state, set here directly: a launch pays for one call of its future.
        self._done = False
        self._resolved_ns = 0
        self._value = None
        self._exc = None
        self._callbacks = None
        self._waiters = None
        self._event = None
        self._log_unretrieved = False
        self._notifier = engine._notifier
        self._engine = engine
        self._name = name
        self._policy = policy
        self._streams = streams
        self._host = host
        self.keepalive = keepalive
        self.pooled = False  # the Run gives its tail events back itself, under its lock
        self.unordered = False
        self._tails: list[tuple[Stream, int]] = []  # (stream, tail event) while pending
        self._remaining = 0
        self._error: BaseException | None = error
        self._lock = threading.Lock()
        self._node_errors: dict[str, BaseException] = {}
        self._host_values: dict[str, Any] = {}
        self._after = after  # called just before it resolves, on the resolving thread (a graph's replay count)
        self.gate = 0
        self._submission = deferred
        for _, req in host:
            req.owner = self
        if deferred is not None:
            pushed = deferred.tails
            if len(pushed) == 1:  # one side stream, the common case: _watch_deferred inline, one Python call less
                self.gate = deferred.ticket
                self._tails = list(pushed)
                self._remaining = 1
                side, self.event = pushed[0]
                lane = side._lane
                self._lanes = (lane,)
                lane.push(self)  # type: ignore[arg-type]  # a Run is its own tail's lane item
            else:
                self._watch_deferred(deferred)
            return
        record = engine._record
        pool = engine._pool
        if type(tails) is tuple and len(tails) == 1:
            # One tail (every stream launch and replay): the Run is pushed last, so the lane may retire it at
            # once and the constructor needs no hold. On a failure nothing watches the launch: it finishes
            # once the device is idle.
            stream = tails[0]
            lane = stream._lane
            self._remaining = 1
            if not recorded:
                lane._depth += 1  # a record-and-push section (see _Lane, "Order")
            try:
                if recorded:
                    event = recorded
                else:
                    event = pool.pop() if pool else engine._events.take()
                    try:
                        record(event, stream._handle)
                    except BaseException:
                        pool.append(event)
                        raise
                self.event = event
                self.unordered = lane._depth > 1
                self._tails = [(stream, event)]
                self._lanes = (lane,)
                lane.push(self)  # type: ignore[arg-type]  # a Run is its own tail's lane item
            except BaseException:
                self._tails = []
                self._lanes = ()
                release_after_device(stream._runtime, lambda: self._tail_done(0, None, None))
                raise
            finally:
                if not recorded:
                    lane._depth -= 1
            return
        lanes: list[_Lane] = []
        self._remaining = 1  # held until every tail is watched: an early tail must not finish the Run
        try:
            for stream in tails:
                lane = stream._lane
                event = pool.pop() if pool else engine._events.take()
                lane._depth += 1  # a record-and-push section (see _Lane, "Order")
                try:
                    try:
                        record(event, stream._handle)
                    except BaseException:
                        pool.append(event)
                        raise
                    item: Any = self if not lanes else _Tail(self, event)
                    if item is self:
                        self.event = event
                    item.unordered = lane._depth > 1
                    with self._lock:
                        self._tails.append((stream, event))
                        self._remaining += 1
                    lanes.append(lane)
                    self._lanes = tuple(lanes)
                    lane.push(item)
                finally:
                    lane._depth -= 1
        except BaseException:
            if not lanes and streams:  # nothing watches what the launch enqueued: finish once the device is idle
                rt = streams[0]._runtime
                release_after_device(rt, lambda: self._tail_done(0, None, None))
                raise
            self._tail_done(0, None, None)  # release the hold: the tails watched so far finish the Run
            raise
        with self._lock:  # release the constructor's hold (as _tail_done(0, ...), inline)
            self._remaining -= 1
            last = self._remaining == 0
        if last:  # every tail retired already
            self._finish(None)

    def _watch_deferred(self, deferred: Deferred) -> None:
        """Push the tails of a deferred launch on several side streams, gated by its ticket (see ``_Lane``,
        "Order"); ``__init__`` pushes a single tail itself."""
        ticket = deferred.ticket
        self.gate = ticket
        tails = self._tails = list(deferred.tails)
        self._remaining = len(tails)
        stream, self.event = tails[0]
        lanes = [stream._lane]
        items: list[Any] = [self]
        for stream, event in tails[1:]:
            item = _Tail(self, event)
            item.gate = ticket
            lanes.append(stream._lane)
            items.append(item)
        self._lanes = tuple(lanes)
        for lane, item in zip(lanes, items):
            lane.push(item)

    def _submission_error(self) -> BaseException | None:
        """The error of the call that failed on the submission thread, if one did (asked once)."""
        deferred, self._submission = self._submission, None
        assert deferred is not None
        failed = deferred.submitter.failure(deferred.ticket, deferred.work)
        if failed is None:
            return None
        index, error = failed
        node = deferred.node_of(index)
        where = f"node {node!r} of " if node else ""
        if error is None or isinstance(error, CaptureError):  # a capture check: native (None) or the Python twin's
            return CaptureError(
                f"{where}pipeline {self._name!r}: its stream was capturing when the submission thread made the "
                "deferred launch's calls; nothing of it was enqueued"
            )
        error.add_note(f"made by the submission thread for {where}pipeline {self._name!r} (a deferred launch)")
        return error

    # -- public ---------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The pipeline's (or graph's) name."""
        return self._name

    @property
    def policy(self) -> str:
        """``"stream"``, ``"fork"``, ``"graph"``, ``"captured"`` (recorded into a graph capture:
        done at once with a ``CaptureError``) or ``"sync"`` (a recipe's blocking path)."""
        return self._policy

    @property
    def streams(self) -> tuple[Stream, ...]:
        """The streams the launch enqueued on, the caller's first."""
        return self._streams

    @property
    def node_errors(self) -> dict[str, BaseException]:
        """Exceptions of failed host nodes by node name (complete once the run is done)."""
        return dict(self._node_errors)

    def host_result(self, name: str) -> Any:
        """The return value of host node ``name``; waits for the run. ``KeyError`` if it failed or is unknown."""
        self.wait()
        if name in self._node_errors:
            raise KeyError(f"host node {name!r} raised {self._node_errors[name]!r}")
        if name not in self._host_values:
            raise KeyError(f"{name!r} is not a Python host node of this run")
        return self._host_values[name]

    def join(self, stream: Stream) -> None:
        """Make later work on ``stream`` wait for every tail of this run. Non-blocking; a no-op once done."""
        if not isinstance(stream, Stream):
            raise TypeError(f"join takes a Stream, not {type(stream).__name__}")
        if self._done:
            if stream._closed:
                stream._check_open()
            return
        with stream._lock:
            if stream._closed:
                stream._check_open()
            serialize_after(self, (stream,))

    # -- resolution (the lane) ------------------------------------------------------------
    def _retire(self, error: BaseException | None, posts: PostBatch | None) -> None:
        """The Run's own tail retired (on its lane's thread, or a polling task's)."""
        self._tail_done(self.event, error, posts)

    def _tail_done(self, event: int, error: BaseException | None, posts: PostBatch | None) -> None:
        """Tail ``event`` retired (``0``: the constructor's own hold on the Run)."""
        with self._lock:
            if event:
                tails = self._tails
                for i, (_s, ev) in enumerate(tails):
                    if ev == event:
                        break
                else:
                    return  # retired twice (a forced close gave it up first)
                self._tails = tails[:i] + tails[i + 1 :]  # a new list: readers iterate it without the lock
            self._remaining -= 1
            last = self._remaining == 0
            if error is not None and self._error is None:
                self._error = error
        if event and error is None:
            self._engine._recycle_event(event, True)
        if last:
            self._finish(posts)

    def _finish(self, posts: PostBatch | None) -> None:
        self.keepalive = None  # dropped on the retiring thread, before anyone sees the run done
        if self._submission is not None:
            failed = self._submission_error()
            if self._error is None:
                self._error = failed
        error = self._error
        for name, req in self._host:
            worker = req.worker
            value, exc = worker.settle(req, error) if worker is not None else req.outcome(error)
            if exc is not None:
                self._node_errors[name] = exc
                if error is None:
                    error = exc
            else:
                self._host_values[name] = value
        self._host = ()  # the requests name their workers, and a slot its callable
        if error is not None:
            self._log_unretrieved = True
        after, self._after = self._after, None
        if after is not None:  # before anyone sees the run done (a graph closed then finds it finished)
            after(self)
        self._resolve(None, error, posts)

    def __repr__(self) -> str:
        if not self._done:
            state = "running"
        elif self._exc is not None:
            state = f"failed {type(self._exc).__name__}"
        else:
            state = "done"
        return f"<Run {self._name!r} {self._policy} {state}>"


def recorded_run(name: str, engine: CompletionEngine, error: BaseException) -> Run:
    """The Run of a launch recorded into a graph capture: done at once, with ``error`` (a
    ``CaptureError`` saying where the work went), never logged as unretrieved."""
    run = Run(name, "captured", (), (), None, engine, (), error=error)
    run._log_unretrieved = False
    return run


class Deferred:
    """A deferred launch's submission: what a :class:`Run` needs to watch it and to name a failed call."""

    __slots__ = ("names", "skip", "submitter", "tails", "ticket", "work")

    def __init__(
        self, submitter: Submitter, ticket: int, work: Any, tails: tuple[tuple[Stream, int], ...], names: tuple[str, ...], skip: int
    ) -> None:
        self.submitter = submitter
        self.ticket = ticket
        self.work = work
        self.tails = tails  # (stream, event): recorded by the submission thread, last
        self.names = names  # per compiled step: its node ("" for ordering calls)
        self.skip = skip  # calls before the compiled steps (the capture check, waits for the previous run)

    def node_of(self, index: int) -> str:
        step = index - self.skip
        return self.names[step] if 0 <= step < len(self.names) else ""


class _Tail:
    """An extra tail of a Run (one per stream of a fork launch with ``join=False``): a lane item."""

    __slots__ = ("event", "gate", "keepalive", "pooled", "run", "unordered")

    def __init__(self, run: Run, event: int) -> None:
        self.run = run
        self.gate = 0
        self.event = event
        self.keepalive = None
        self.pooled = False
        self.unordered = False

    def _retire(self, error: BaseException | None, posts: PostBatch | None) -> None:
        self.run._tail_done(self.event, error, posts)


def serialize_after(run: Run, targets: Iterable[Stream]) -> None:
    """Make every stream in ``targets`` wait for ``run``'s tail events (a no-op once it is done).

    Blocks, GIL released, while ``run`` is a deferred launch whose calls the submission thread has not
    made yet (its tail events are recorded then)."""
    if run._done:
        return
    if run.gate and run._engine.submitted() < run.gate:
        run._engine.submitter().wait(run.gate)
    with run._lock:
        for target in targets:
            for src, ev in run._tails:
                if src is not target:
                    target._backend.stream_wait_event(target._handle, ev)


class RunChain:
    """Orders the runs of one pipeline and of the graphs captured from it.

    They all use the same buffers, so each launch first makes its streams
    wait for the previous run's tail events (if it is still in flight) and
    then becomes the previous run. Hold :attr:`lock` across the whole launch.
    """

    __slots__ = ("last", "lock")

    def __init__(self) -> None:
        self.lock = threading.RLock()  # re-entrant: an enqueue node may launch another pipeline
        self.last: Run | None = None

    def wait_previous(self, targets: Iterable[Stream]) -> None:
        """Make ``targets`` wait for the previous run, if it is still in flight. Call with :attr:`lock` held."""
        prev = self.last
        if prev is not None and not prev._done:
            serialize_after(prev, targets)
