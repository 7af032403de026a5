"""The submission thread: backend calls made off the caller's thread, in submission order.

A deferred launch (``Pipeline.launch(..., deferred=True)``) hands its
backend calls to its runtime's :class:`Submitter` and returns at once; one
thread of the runtime makes them, program after program, in the order they
were submitted. Each submission gets a *ticket* (1, 2, ...); :meth:`done`
is the last ticket whose calls were made, :meth:`wait` blocks until a
ticket's were. A call that fails skips the rest of its program but for the
program's last ``len - always`` calls (its tail records), which are still
made; :meth:`failure` then says which call failed and why, once.

Two implementations of one contract, chosen once per runtime:

* :class:`NativeSubmitter`, where the backend has native ops: the C
  extension's ``Submitter`` (``_backends/_submit_c.h``), whose thread makes
  the calls without ever taking the GIL; a program is a
  :class:`~streamrt._backends._native_ops.Program`.
* :class:`PySubmitter` elsewhere (the simulator, a traced backend): a Python
  thread calling ``(fn, args)`` steps.

Thread rules: submit from any thread; ``wait``, ``done`` and ``failure``
from any thread; :meth:`close` once, from no submission thread.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ._backends._native_ops import NativeOps, Program

__all__ = ["NativeSubmitter", "PySubmitter", "Steps", "Submitter", "make_submitter"]

Steps = Sequence[tuple[Callable[..., Any], tuple[Any, ...]]]


class Submitter(Protocol):
    """See the module docstring."""

    def submit(self, work: Any, always: int) -> int:
        """Queue ``work`` (a Program, or steps); its ticket. Calls ``[always, len)`` are made even after a failure."""
        ...

    def done(self) -> int:
        """The last ticket whose calls were made (or skipped after a failure). Never blocks."""
        ...

    def wait(self, ticket: int) -> None:
        """Block (GIL released) until ``done() >= ticket``. ``RuntimeError`` if the thread stopped first."""
        ...

    def failure(self, ticket: int, work: Any) -> tuple[int, BaseException | None] | None:
        """``(index, error)`` of ``ticket``'s failed call (``error`` ``None``: its stream was capturing), once;
        ``None`` if none failed. Call after :meth:`wait` or once ``done()`` reached the ticket."""
        ...

    def close(self, timeout: float | None = None) -> None:
        """Make the calls of every program submitted so far, then stop the thread; later submits raise.
        Waits up to ``timeout`` seconds for the thread (``None``: as long as it takes)."""
        ...


class NativeSubmitter:
    """The C extension's submitter over a backend's native ops. See the module docstring."""

    __slots__ = ("_c", "_ops", "_thread", "done", "wait")

    def __init__(self, ops: NativeOps, name: str) -> None:
        self._ops = ops
        self._c = ops.new_submitter()
        self.done: Callable[[], int] = self._c.done
        self.wait: Callable[[int], None] = self._c.wait
        self._thread = threading.Thread(target=self._c.serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Program, always: int) -> int:
        return self._c.submit(work.words, always)  # type: ignore[no-any-return]

    def failure(self, ticket: int, work: Program) -> tuple[int, BaseException | None] | None:
        failed = self._c.failure(ticket)
        return None if failed is None else self._ops.failure_in(work, *failed)

    def close(self, timeout: float | None = None) -> None:
        self._c.stop()
        self._thread.join(timeout)


class PySubmitter:
    """The Python twin: a thread calling each program's ``(fn, args)`` steps. See the module docstring."""

    __slots__ = ("_cond", "_done", "_failures", "_queue", "_stopping", "_submitted", "_thread")

    def __init__(self, name: str, on_start: Callable[[], None] | None = None) -> None:
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[int, Steps, int]] = collections.deque()
        self._submitted = 0
        self._done = 0
        self._stopping = False
        self._failures: dict[int, tuple[int, BaseException]] = {}
        self._thread = threading.Thread(target=self._serve, args=(on_start,), name=name, daemon=True)
        self._thread.start()

    def submit(self, work: Steps, always: int) -> int:
        with self._cond:
            if self._stopping:
                raise RuntimeError("the submitter was stopped")
            self._submitted += 1
            self._queue.append((self._submitted, work, always))
            self._cond.notify_all()
            return self._submitted

    def done(self) -> int:
        return self._done

    def wait(self, ticket: int) -> None:
        if self._done >= ticket:
            return
        with self._cond:
            self._cond.wait_for(lambda: self._done >= ticket or not self._thread.is_alive() or ticket > self._submitted)
            if self._done < ticket:
                raise RuntimeError("the submitter stopped before that program ran (or it was never submitted)")

    def failure(self, ticket: int, work: Steps) -> tuple[int, BaseException | None] | None:
        with self._cond:
            return self._failures.pop(ticket, None)

    def close(self, timeout: float | None = None) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _serve(self, on_start: Callable[[], None] | None) -> None:
        if on_start is not None:
            on_start()
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._stopping)
                if not self._queue:
                    self._cond.notify_all()  # waiters of tickets never submitted see the thread gone
                    return
                ticket, steps, always = self._queue.popleft()
            failed: tuple[int, BaseException] | None = None
            for i, (fn, args) in enumerate(steps):
                if failed is not None and i < always:
                    continue
                try:
                    fn(*args)
                except BaseException as exc:  # noqa: BLE001 - reported through failure()
                    if failed is None:
                        failed = (i, exc)
            with self._cond:
                if failed is not None:
                    self._failures[ticket] = failed
                self._done = ticket
                self._cond.notify_all()


def make_submitter(backend: Any, device: int, name: str = "streamrt-submit") -> NativeSubmitter | PySubmitter:
    """The native submitter where ``backend`` has native ops, else the Python twin (the device made current first)."""
    ops = getattr(backend, "native_ops", None)
    if ops is not None:
        return NativeSubmitter(ops, name)
    return PySubmitter(name, on_start=lambda: backend.ensure_device(device))
