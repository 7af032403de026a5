"""The releaser thread: where real frees run.

Frees never run on a driver callback thread (they deadlock against the main
thread's ``hipFree``) nor on completion lanes (``hipHostFree``/``cudaFreeHost``
synchronize the device and would delay every completion behind them).
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable

__all__ = ["Captures", "Releaser"]


class Releaser:
    """One daemon thread that runs submitted frees in submission order.

    ``submit`` is non-blocking and may be called from any thread. Errors raised
    by a free are kept (``errors``) and re-raised by :meth:`close`.
    """

    def __init__(self, name: str = "streamrt-releaser") -> None:
        self._queue: collections.deque[tuple[Callable[..., Any], tuple[Any, ...]]] = collections.deque()
        self._cond = threading.Condition()
        self._closing = False
        self._busy = 0
        self.errors: list[BaseException] = []
        self.thread_ident: int | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._cond:
            if self._closing:
                # After close the thread is gone: free inline (close() already drained).
                pass
            else:
                self._queue.append((fn, args))
                self._cond.notify()
                return
        fn(*args)

    def drain(self) -> None:
        """Block until everything submitted so far has run."""
        with self._cond:
            while self._queue or self._busy:
                self._cond.wait()

    def close(self) -> None:
        """Run what is queued, stop the thread. Idempotent."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
        self._thread.join()

    def _run(self) -> None:
        self.thread_ident = threading.get_ident()
        cond = self._cond
        while True:
            with cond:
                while not self._queue and not self._closing:
                    cond.wait()
                if not self._queue:
                    self.thread_ident = None  # an exited thread's ident is reused by later threads
                    cond.notify_all()
                    return
                fn, args = self._queue.popleft()
                self._busy = 1
            try:
                fn(*args)
            except BaseException as exc:  # keep going: one bad free must not leak the rest
                self.errors.append(exc)
            finally:
                del fn, args  # what a release held goes now, not when the next one arrives
                with cond:
                    self._busy = 0
                    cond.notify_all()


class Captures:
    """The graph captures streamrt has in progress on one runtime's device.

    A device-wide wait (``device_synchronize``) while a stream of the device
    is capturing invalidates that capture, so the two exclude each other:
    :meth:`device_wide` waits for streamrt's captures to end (:meth:`begun` /
    :meth:`ended` around each) and a capture begun during a device-wide wait
    waits for it to end. Each waits at most :attr:`PATIENCE_S` (a capture left
    open, a device-wide wait held up by work that needs the capturing thread),
    then goes ahead. Any thread.
    """

    #: How long a device-wide wait and a capture wait for each other before they go ahead.
    PATIENCE_S = 30.0

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._open = 0
        self._syncing = 0

    def begun(self) -> None:
        with self._cond:
            if self._syncing:
                self._cond.wait_for(lambda: not self._syncing, self.PATIENCE_S)
            self._open += 1

    def ended(self) -> None:
        with self._cond:
            self._open -= 1
            if not self._open:
                self._cond.notify_all()

    def device_wide(self, wait: Callable[[], None]) -> None:
        """Call ``wait`` (a device-wide wait) once no capture is in progress; captures begun meanwhile start after it."""
        with self._cond:
            self._cond.wait_for(lambda: not self._open, self.PATIENCE_S)
            self._syncing += 1
        try:
            wait()
        finally:
            with self._cond:
                self._syncing -= 1
                if not self._syncing:
                    self._cond.notify_all()
