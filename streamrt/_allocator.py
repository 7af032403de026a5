"""The allocator protocol, the allocator seam's release helper, and the raw (non-caching) allocator.

The allocator seam (``docs/allocators.md``) is how any allocator, streamrt's
own or the separate ``allocators`` package, talks to the core:

* construction: ``Buffer(ptr, nbytes, kind, runtime, deallocate=fn, stream=s)``,
  or, for a hot path that builds buffers without ``__init__``,
  ``Buffer.allocation_type`` and ``Buffer.ALLOCATION_FIELDS``;
* the stream-ordered release: ``buffer.release()`` calls
  ``deallocate(ptr, nbytes, streams)`` once, with the streams that used it;
  :func:`release_after_streams` runs a callback once they have all passed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, AbstractSet, Callable, Protocol, runtime_checkable

from ._buffer import DEVICE, HOST, Buffer, BufferKind, check_size
from ._errors import ClosedError

if TYPE_CHECKING:
    from ._runtime import Runtime
    from ._stream import Stream

__all__ = ["Allocator", "AllocatorStatistics", "RawAllocator", "release_after_device", "release_after_streams"]


@dataclass(frozen=True)
class AllocatorStatistics:
    """A snapshot of an allocator's state, in bytes and counts."""

    in_use_bytes: int = 0  # handed out and not yet released
    cached_bytes: int = 0  # held by the allocator, free for reuse
    in_flight_bytes: int = 0  # released, waiting for the streams that used them
    peak_in_use_bytes: int = 0
    held_bytes: int = 0  # obtained from the source and not given back
    requested_bytes: int = 0  # sum of the sizes asked for by blocks in use
    allocations: int = 0
    hits: int = 0
    misses: int = 0
    frees: int = 0


@runtime_checkable
class Allocator(Protocol):
    """What ``rt.host_allocator`` / ``rt.device_allocator`` provide.

    ``allocate`` returns a Buffer whose ``release()`` gives it back; the memory
    is reused only after every stream that used it has passed the release.
    """

    kind: BufferKind

    def allocate(self, nbytes: int, *, stream: Stream | None = None) -> Buffer: ...
    def statistics(self) -> AllocatorStatistics: ...
    def trim(self) -> None: ...
    def close(self) -> None: ...


def release_after_streams(runtime: Runtime, streams: AbstractSet[Stream], then: Callable[[], None]) -> None:
    """Call ``then`` once every stream in ``streams`` has passed its current tail (the allocator seam's helper).

    Non-blocking: the streams' tails are marked now; ``then`` runs on a
    completion lane (keep it short; hand real frees to ``runtime.releaser``),
    or at once on the calling thread when ``streams`` is empty. Closed streams
    cannot be recorded on, so a set containing one waits for the whole device
    on the releaser thread instead.
    """
    live = [s for s in streams if not s.is_closed]
    if len(live) != len(streams):
        release_after_device(runtime, then)
        return
    if not live:
        then()
        return
    remaining = [len(live)]
    lock = threading.Lock()

    def one_done(_completion: object) -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            then()

    engine = runtime._engine
    for s in live:
        engine.completion_for_stream(s.handle).add_done_callback(one_done)


def release_after_device(runtime: Runtime, then: Callable[[], None]) -> None:
    """Call ``then`` on the releaser thread once all work on the device has completed (the allocator seam's helper).

    Non-blocking: the releaser synchronizes the whole device, once no graph capture streamrt began on
    the runtime is in progress (a device-wide wait would invalidate it; captures begun meanwhile wait
    for it), then calls ``then`` (also when the wait failed, or the runtime has closed).
    """
    runtime.releaser.submit(_after_device_sync, runtime, then)


def _after_device_sync(runtime: Runtime, then: Callable[[], None]) -> None:
    """:func:`release_after_device`'s job, on the releaser thread: wait for the whole device (unless the
    runtime closed), then call ``then()``."""
    try:
        if not runtime.is_closed:
            backend = runtime.backend
            if runtime._multi_device:  # normally the releaser thread; inline once the releaser has closed
                backend.ensure_device(runtime.device)
            runtime._captures.device_wide(backend.device_synchronize)
    finally:
        then()


def _on_device(
    ensure_device: Callable[[int], None], device: int, malloc: Callable[[int], int], free: Callable[[int], None]
) -> tuple[Callable[[int], int], Callable[[int], None]]:
    """``malloc`` and ``free`` that first make ``device`` current on the calling thread."""

    def malloc_on_device(nbytes: int) -> int:
        ensure_device(device)
        return malloc(nbytes)

    def free_on_device(ptr: int) -> None:
        ensure_device(device)
        free(ptr)

    return malloc_on_device, free_on_device


class RawAllocator:
    """A non-caching allocator: every ``allocate`` calls the backend, every release frees.

    Use it to debug memory problems (like ``PYTORCH_NO_CUDA_MEMORY_CACHING``);
    the default allocators cache. Frees wait for the streams that used the
    buffer and run on the runtime's releaser thread.

    On a backend with several devices each ``malloc`` and ``free`` first makes
    the runtime's device current on the calling thread (it is not restored),
    so memory is obtained on the runtime's device whatever device the caller
    made current; with one device the backend's calls are used as they are.
    """

    def __init__(self, runtime: Runtime, kind: BufferKind) -> None:
        if kind not in (HOST, DEVICE):
            raise ValueError(f"kind must be 'host' or 'device', got {kind!r}")
        self.kind = kind
        self._runtime = runtime
        backend = runtime.backend
        malloc: Callable[[int], int] = backend.host_malloc if kind == HOST else backend.malloc
        free: Callable[[int], None] = backend.host_free if kind == HOST else backend.free
        if runtime._multi_device:
            malloc, free = _on_device(backend.ensure_device, runtime.device, malloc, free)
        self._malloc = malloc
        self._free = free
        self._lock = threading.Lock()
        self._in_use = 0
        self._in_flight = 0
        self._peak = 0
        self._allocations = 0
        self._frees = 0
        self._closed = False

    def allocate(self, nbytes: int, *, stream: Stream | None = None) -> Buffer:
        """Allocate ``nbytes`` bytes (at least 1 byte is obtained from the backend)."""
        if self._closed:
            raise ClosedError("allocator is closed")
        nbytes = check_size(nbytes, "nbytes")
        ptr = self._malloc(max(nbytes, 1))
        buf = Buffer(ptr, nbytes, self.kind, self._runtime, deallocate=self._deallocate, stream=stream)
        with self._lock:
            self._in_use += nbytes
            self._allocations += 1
            self._peak = max(self._peak, self._in_use)
        return buf

    def _deallocate(self, ptr: int, n: int, streams: AbstractSet[Stream]) -> None:
        """The buffers' stream-ordered release: freed on the releaser thread once ``streams`` have passed."""
        with self._lock:
            self._in_use -= n
            self._in_flight += n
        runtime = self._runtime
        release_after_streams(runtime, streams, lambda: runtime.releaser.submit(self._free_now, ptr, n))

    def _free_now(self, ptr: int, n: int) -> None:
        try:
            if not self._runtime.is_closed:
                self._free(ptr)
        finally:
            with self._lock:
                self._in_flight -= n
                self._frees += 1

    def statistics(self) -> AllocatorStatistics:
        with self._lock:
            return AllocatorStatistics(
                in_use_bytes=self._in_use,
                in_flight_bytes=self._in_flight,
                peak_in_use_bytes=self._peak,
                held_bytes=self._in_use + self._in_flight,
                requested_bytes=self._in_use,
                allocations=self._allocations,
                misses=self._allocations,
                frees=self._frees,
            )

    def trim(self) -> None:
        """Nothing is cached: a no-op."""

    def close(self) -> None:
        """Stop handing out memory. Buffers still in use stay valid until released. Idempotent."""
        self._closed = True
