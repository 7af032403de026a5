"""Helpers for the completion-engine tests: gates, a fault-injecting backend, a harness.

A *gate* holds a stream at a point until the test opens it: it is the native
host function libc ``sem_wait`` on a test-owned semaphore, so it works the
same on every backend and runs no Python on the driver thread.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from typing import Any

from streamrt._completion import CompletionEngine
from streamrt._errors import BackendError
from streamrt._native import SEM_WAIT_ADDRESS, Semaphore

_libc = ctypes.CDLL(None)
#: libc ``usleep`` as a native host function: ``user_data`` is the delay in microseconds.
USLEEP_ADDRESS = int(ctypes.cast(_libc.usleep, ctypes.c_void_p).value or 0)


class Gate:
    """Holds ``stream`` (at the point of creation) until :meth:`open`."""

    def __init__(self, backend: Any, stream: int) -> None:
        self.sem = Semaphore(0)
        self.opened = False
        backend.launch_host_func(stream, SEM_WAIT_ADDRESS, self.sem.address)

    def open(self) -> None:
        if not self.opened:
            self.opened = True
            self.sem.post()

    def open_later(self, delay: float) -> threading.Timer:
        timer = threading.Timer(delay, self.open)
        timer.daemon = True
        timer.start()
        return timer


class FaultyBackend:
    """The sim backend with an injectable sticky device error.

    After :meth:`fail`, querying an event raises ``BackendError`` (as a failed
    CUDA/HIP context does). Waiting for an event raises it too, including a
    wait already blocked at that moment; with ``hang_waits=True`` a wait
    blocks instead (a driver that hangs on a failed context) until
    :meth:`release_waits`, and then raises. ``hung`` counts waits blocked
    that way right now.
    """

    def __init__(self, inner: Any, *, hang_waits: bool = False) -> None:
        self._inner = inner
        self.failed = threading.Event()
        self.hang_waits = hang_waits
        self._released = threading.Event()
        self._hung_lock = threading.Lock()
        self.hung = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def fail(self) -> None:
        self.failed.set()

    def release_waits(self) -> None:
        """Let hung waits return (they raise the error)."""
        self._released.set()

    def _error(self, call: str) -> BackendError:
        return BackendError(self._inner.name, 700, "cudaErrorIllegalAddress", "injected sticky error", call)

    def event_query(self, event: int) -> bool:
        if self.failed.is_set():
            raise self._error("event_query")
        return bool(self._inner.event_query(event))

    def event_synchronize(self, event: int) -> None:
        while not self._inner.event_query(event):
            if self.failed.wait(0.001):
                break
        if self.failed.is_set():
            if self.hang_waits:
                with self._hung_lock:
                    self.hung += 1
                try:
                    self._released.wait()
                finally:
                    with self._hung_lock:
                        self.hung -= 1
            raise self._error("event_synchronize")


class InjectedFailure:
    """A backend whose ``method`` raises an injected ``BackendError``, the other calls passed through.

    ``times`` calls fail (``None``: every one), counting only those for which
    ``when(*args)`` is true (default: all); each failure first sleeps
    ``delay`` seconds, time for the driver to run what was enqueued before it.
    """

    def __init__(
        self,
        inner: Any,
        method: str,
        *,
        times: int | None = 1,
        when: Callable[..., bool] | None = None,
        delay: float = 0.0,
    ) -> None:
        self._inner = inner
        self._method = method
        self._times = times
        self._when = when
        self._delay = delay
        self.failures = 0

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._inner, name)
        if name != self._method:
            return call

        def failing(*args: Any) -> Any:
            if (self._times is None or self.failures < self._times) and (self._when is None or self._when(*args)):
                self.failures += 1
                time.sleep(self._delay)
                raise BackendError(self._inner.name, 1, "cudaErrorInvalidValue", "injected", name)
            return call(*args)

        return failing


class Harness:
    """Streams and gates of one test; everything is opened, drained and freed at teardown."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.streams: list[int] = []
        self.gates: list[Gate] = []
        self.engines: list[CompletionEngine] = []

    def stream(self, priority: int = 0) -> int:
        s = self.backend.stream_create(priority)
        self.streams.append(s)
        return s

    def gate(self, stream: int) -> Gate:
        g = Gate(self.backend, stream)
        self.gates.append(g)
        return g

    def engine(self, backend: Any = None, **options: Any) -> CompletionEngine:
        e = CompletionEngine(backend or self.backend, 0, **options)
        self.engines.append(e)
        return e

    def teardown(self) -> None:
        for g in self.gates:
            g.open()
        for e in self.engines:
            e.close(timeout=10)
        for s in self.streams:
            self.backend.stream_synchronize(s)
            self.backend.stream_destroy(s)
        for g in self.gates:
            g.sem.destroy()


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.001)
    return predicate()
