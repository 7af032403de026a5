"""Run: the awaitable outcome of one pipeline launch or graph replay.

A :class:`Run` is a :class:`~streamrt.Completion` that resolves once every
tail of the launch has completed and every host node of the launch has
finished. It then carries the launch's first error: a device error seen at a
tail, else the exception of the first failing host node in topological order
(all of them are in :attr:`Run.node_errors`).

Tails. A launch ends with one *tail event* recorded on its caller's stream
(after the side streams were joined into it), or one per stream it used when
it was not joined. The completion engine watches each tail event on its lane
thread; the launch's keepalive (buffers, host callables and their arguments)
is referenced until the tail completed and dropped on the lane thread before
the Run resolves. The Run itself holds no buffers.

The tail events also order later work after the run: :meth:`Run.join` and a
relaunch of the same pipeline make streams wait for them. They go back to the
runtime's event pool when the Run resolves (a wait binds to the record it saw
when it was enqueued, so reuse is safe).

Thread rules: a Run may be waited on, awaited and joined from any thread.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ._completion import Completion
from ._stream import Stream

if TYPE_CHECKING:
    from ._event import Event
    from ._streampool import StreamPool

__all__ = ["Run", "RunChain", "Tail", "record_tail", "serialize_after"]

Tail = tuple[Stream, "Event", Completion]


def record_tail(stream: Stream, pool: StreamPool, keepalive: object) -> Tail:
    """Record a pooled event at the current end of ``stream``; its Completion resolves when it completes.

    ``keepalive`` is referenced until then and dropped on the lane thread
    before the Completion resolves. Raises the backend's error (nothing is
    then watched). Must not be called while ``stream`` is capturing.
    """
    ev = pool.acquire_event()
    engine = stream._runtime._engine
    completion = Completion()
    completion._notifier = engine._notifier
    holder = [keepalive]

    def tail_done(error: BaseException | None) -> None:
        holder.clear()  # drop the keepalive before anyone sees the run done
        if error is None:
            completion._set_result(None)
        else:
            completion._set_exception(error)

    try:
        engine.record_and_watch(ev._handle, stream._handle, tail_done)
    except BaseException:
        pool.release_event(ev)
        raise
    completion._lanes = engine.lanes_of(stream._handle)
    return stream, ev, completion


class Run(Completion):
    """One launch of a pipeline (or replay of a graph). Awaitable; see the module docstring.

    * ``run.wait()`` blocks (GIL released); ``await run`` never blocks the loop.
    * ``run.is_done``; ``run.exception()`` waits and returns the first error or ``None``;
      ``run.result()`` waits and raises it (returns ``None`` otherwise).
    * ``run.join(stream)`` makes later work on ``stream`` wait for the whole run
      (for fork launches with ``join=False``).
    * ``run.host_result(name)`` is the return value of a host node.
    """

    __slots__ = (
        "_host",
        "_host_values",
        "_lock",
        "_name",
        "_node_errors",
        "_policy",
        "_pool",
        "_remaining",
        "_streams",
        "_tails",
    )

    def __init__(
        self,
        name: str,
        policy: str,
        streams: tuple[Stream, ...],
        host: list[tuple[str, Completion]],
        tails: list[Tail],
        pool: StreamPool | None,
    ) -> None:
        super().__init__()
        if tails:
            self._notifier = tails[0][2]._notifier
            # an await polls every lane that resolves a part of the run (side streams' host calls too)
            parts = [c for _, c in host] + [c for _, _, c in tails]
            self._lanes = tuple(dict.fromkeys(lane for c in parts for lane in c._lanes))
        self._name = name
        self._policy = policy
        self._streams = streams
        self._host = host
        self._tails: list[Tail] | None = tails
        self._pool = pool
        self._remaining = len(host) + len(tails)
        self._lock = threading.Lock()
        self._node_errors: dict[str, BaseException] = {}
        self._host_values: dict[str, Any] = {}
        if self._remaining == 0:
            self._finish()
            return
        for _, c in host:
            c.add_done_callback(self._one_done)
        for _, _, c in tails:
            c.add_done_callback(self._one_done)

    # -- public ---------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The pipeline's (or graph's) name."""
        return self._name

    @property
    def policy(self) -> str:
        """``"stream"``, ``"fork"``, ``"graph"`` (or ``"sync"`` for a recipe's blocking path)."""
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
        stream._check_open()
        serialize_after(self, (stream,))

    # -- resolution ------------------------------------------------------------------------
    def _one_done(self, _c: Completion) -> None:
        with self._lock:
            self._remaining -= 1
            last = self._remaining == 0
        if last:
            self._finish()

    def _finish(self) -> None:
        error: BaseException | None = None
        with self._lock:
            tails, self._tails = self._tails, None
        for _, ev, c in tails or ():
            exc = c.exception(0)
            if exc is not None and error is None:
                error = exc
            if self._pool is not None:
                self._pool.release_event(ev)
        for name, c in self._host:
            exc = c.exception(0)
            if exc is not None:
                self._node_errors[name] = exc
                if error is None:
                    error = exc
            else:
                self._host_values[name] = c._value
        self._host = []
        if error is not None:
            self._log_unretrieved = True
        self._resolve(None, error, None)

    def __repr__(self) -> str:
        if not self._done:
            state = "running"
        elif self._exc is not None:
            state = f"failed {type(self._exc).__name__}"
        else:
            state = "done"
        return f"<Run {self._name!r} {self._policy} {state}>"


def serialize_after(run: Run, targets: Iterable[Stream]) -> None:
    """Make every stream in ``targets`` wait for ``run``'s tail events (a no-op once it is done)."""
    if run._done:
        return
    with run._lock:
        tails = run._tails
        if tails is None:
            return
        for target in targets:
            for src, ev, _ in tails:
                if src is not target:
                    target._backend.stream_wait_event(target._handle, ev._handle)


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
