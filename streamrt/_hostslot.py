"""Captured Python host nodes: :class:`HostSlot`, one per node of a graph, re-run on every replay.

A captured host node must re-run the Python function on every replay, so it
cannot use the per-stream FIFO of eager calls (a replay does not go through
:meth:`~streamrt._completion.CompletionEngine.host_call`). A slot is the node's
own two semaphores, function, arguments and worker (:class:`~streamrt._hostcall._Worker`),
owned by the Graph and alive as long as it. Slots always hold their stream
with ``sem_wait(done)``: a captured signal wait would need a fixed value.
The rules of :mod:`streamrt._hostcall` for the function apply.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._hostcall import HostRequest, _Worker

if TYPE_CHECKING:
    from ._completion import CompletionEngine

__all__ = ["HostSlot"]

_log = logging.getLogger("streamrt")
_slot_ids = itertools.count(1)


class HostSlot(_Worker):
    """One captured Python host node of a graph; re-runs ``fn(*args)`` on every replay.

    Lifecycle (what a Graph does with it):

    1. ``slot = engine.host_slot(fn, args)`` while building the capture;
    2. ``slot.capture(stream)`` while ``stream`` is capturing: enqueues the
       two native host functions (``sem_post(ready)``, ``sem_wait(done)``),
       which become host nodes of the graph;
    3. per replay: ``req = slot.arm()`` *before* ``graph_launch`` (replays
       of one graph exec run in launch order, so armed requests match
       replays FIFO); the replay's Run reads ``fn``'s outcome from ``req``
       when its tail retires, and abandons it if the stream failed first, so
       no awaiter hangs;
    4. ``slot.close()`` after the graph exec is destroyed and its last replay
       completed.

    ``fn`` and ``args`` are read at each run, so a replay sees the current
    contents of the buffers it was given. A replay that nobody armed (a raw
    ``graph_launch``) still runs ``fn``; its exception is logged.
    The rules of :mod:`streamrt._hostcall` for ``fn`` apply.

    ``foreign``: the slot was captured into a graph another library owns
    (see :mod:`streamrt._graph_release`). Nobody arms its replays; it lives
    until that graph is destroyed, which may be after its engine closed (the
    engine does not stop it), and it keeps the switch interval lowered for
    as long (every replay runs Python while the stream waits).
    """

    def __init__(self, engine: CompletionEngine, fn: Callable[..., Any], args: tuple[Any, ...], *, foreign: bool = False) -> None:
        super().__init__(engine, f"streamrt-slot-{next(_slot_ids)}")
        if not callable(fn):
            raise TypeError(f"host slot function must be callable, got {type(fn).__name__}")
        self._fn = fn
        self._args = tuple(args)
        self.closed = False
        self.foreign = foreign
        if foreign:
            engine._python_call_started()

    @property
    def fn(self) -> Callable[..., Any]:
        """The Python function run on every replay."""
        return self._fn

    @property
    def args(self) -> tuple[Any, ...]:
        """Its positional arguments (kept alive as long as the slot)."""
        return self._args

    def capture(self, stream: int, backend: Any = None) -> None:
        """Enqueue the slot's two native host functions on ``stream`` (normally capturing), through
        ``backend`` (the stream's; default: the engine's)."""
        self._check_open()
        self._start()
        self._enqueue_native(stream, self._fn, self._engine._backend if backend is None else backend)

    def arm(self) -> HostRequest:
        """Expect one more run; returns its request, whose outcome the replay's Run reads. Call before each launch."""
        self._check_open()
        req = HostRequest(None, ())
        self._push(req)
        return req

    def disarm(self, req: HostRequest) -> bool:
        """Withdraw the armed run ``req`` (its launch failed, nothing was enqueued), so later
        replays stay matched FIFO. ``False`` if it is not armed (already ran or withdrawn)."""
        with self._cond:
            armed = not req.finished and req in self._queue
            if armed:
                self._queue.remove(req)
        if armed:
            self._finish(req)
        return armed

    def close(self) -> None:
        """Stop the worker and free the semaphores (leaked if a failed run may still name them).

        Blocks until armed runs have finished. Idempotent. Call after the
        graph exec that names this slot is destroyed.
        """
        if self.closed:
            return
        self.closed = True
        self.wait_idle(None)
        self.stop(forced=False, join_timeout=None)
        self._engine._forget_slot(self)
        if self.foreign:
            self._engine._python_call_finished()

    def _check_open(self) -> None:
        if self.closed:
            from ._errors import ClosedError

            raise ClosedError("this host slot was closed with its graph")

    def _call_of(self, req: HostRequest) -> tuple[Callable[..., Any] | None, tuple[Any, ...]]:
        return self._fn, self._args

    def _serve_unarmed(self) -> bool:
        try:
            self._fn(*self._args)
        except BaseException:  # noqa: BLE001 - nobody armed this replay to receive it
            _log.exception("exception in captured host function %r (replay nobody armed)", self._fn)
        return True
