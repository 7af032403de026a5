"""Helpers for the allocator tests: stream gates and a recording, fault-injecting source."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from support.transfer import download

import allocators
import streamrt as srt


class Gate:
    """Holds a stream at the current point until :meth:`open` (a Python host function blocked on an Event).

    On a GPU the queue behind a blocked host function is bounded: enqueueing many
    ops behind a gate blocks the enqueuing thread. Tests keep the work behind a
    gate small, and the gate gives up after ``timeout`` seconds (the host
    function then raises) so a mistake fails the test instead of hanging it. A gate
    that gave up counts as open.
    """

    def __init__(self, stream: srt.Stream, timeout: float = 30.0) -> None:
        self.event = threading.Event()
        self.stream = stream
        self.completion = stream.launch_host_func(self._hold, timeout)

    def _hold(self, timeout: float) -> None:
        if not self.event.wait(timeout):
            self.event.set()  # the stream goes on: the gate is open from now on
            raise TimeoutError("gate was never opened")

    @property
    def is_open(self) -> bool:
        return self.event.is_set()

    def open(self) -> None:
        self.event.set()


class RecordingSource:
    """A :class:`allocators.Source` around another: counts calls, records free threads, injects failures.

    ``fail_calls``: 1-based numbers of ``allocate`` calls that raise ``OutOfMemoryError``.
    ``capacity``: bytes this source may have outstanding; beyond it ``allocate`` raises
    ``OutOfMemoryError`` (a device running out).
    """

    def __init__(self, inner: Any, *, fail_calls: set[int] | None = None, capacity: int | None = None) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.capture_safe = inner.capture_safe
        self.fail_calls = set(fail_calls or ())
        self.capacity = capacity
        self.lock = threading.Lock()
        self.allocate_calls = 0
        self.outstanding: dict[int, int] = {}
        self.freed: list[int] = []
        self.free_threads: list[int] = []
        self.closed = False

    def allocate(self, nbytes: int, stream: srt.Stream | None) -> int:
        with self.lock:
            self.allocate_calls += 1
            call = self.allocate_calls
            used = sum(self.outstanding.values())
        if call in self.fail_calls:
            raise srt.OutOfMemoryError(f"injected failure of allocate call {call}", requested=nbytes)
        if self.capacity is not None and used + nbytes > self.capacity:
            raise srt.OutOfMemoryError(f"test source capacity {self.capacity} exceeded", requested=nbytes)
        ptr = self.inner.allocate(nbytes, stream)
        with self.lock:
            self.outstanding[ptr] = nbytes
        return ptr

    def free(self, ptr: int) -> None:
        with self.lock:
            self.free_threads.append(threading.get_ident())
            self.freed.append(ptr)
            del self.outstanding[ptr]
        self.inner.free(ptr)

    def close(self) -> None:
        self.closed = True
        self.inner.close()


def recording(rt: srt.Runtime, kind: str, **options: Any) -> RecordingSource:
    return RecordingSource(allocators.RawSource(rt, kind), **options)


def conserved(stats: allocators.CachingAllocatorStatistics) -> bool:
    """``held == in_use + cached + in_flight + capture pools``."""
    return stats.held_bytes == stats.in_use_bytes + stats.cached_bytes + stats.in_flight_bytes + stats.capture_pool_bytes


def read_back(rt: srt.Runtime, stream: srt.Stream, buf: srt.Buffer) -> np.ndarray:
    """The bytes of ``buf`` (any kind), after everything enqueued on ``stream`` so far."""
    return download(rt, stream, buf)
