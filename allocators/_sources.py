"""Sources: where a caching allocator gets its blocks from, and gives them back to.

A source is the uncached layer under a caching allocator. It is asked for
whole blocks (already rounded to a size class) on a miss, and asked to free
them on :meth:`trim`, on eviction, when flushing for an out-of-memory retry and
at :meth:`close`. The caching allocator guarantees two things to every source:

* ``free`` runs on the runtime's releaser thread (``runtime.releaser``), never
  on a driver callback thread or a completion lane, and only once all work
  that used the block on any stream has completed;
* ``allocate`` is never called while a stream the allocator knows to be
  capturing would be affected, unless the source says it is
  :attr:`Source.capture_safe`.

Any object with the attributes and methods of :class:`Source` is a source
(``typing.Protocol``): plug one in with
``CachingPinnedAllocator(rt, source=my_source)`` or, for the runtime's own
allocators, ``open_runtime(..., host_allocator=caching_allocator_factory(source=MySource))``.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, runtime_checkable

import streamrt as srt

__all__ = ["RawSource", "Source", "StreamOrderedSource", "TorchSource"]

_KINDS = ("host", "device")


@runtime_checkable
class Source(Protocol):
    """Blocks of memory for a caching allocator.

    Attributes:
        kind: ``"host"`` (page-locked host memory) or ``"device"``.
        capture_safe: ``allocate`` makes no call that is illegal or synchronizing
            while a stream is capturing a graph, so a capture pool may call it
            during capture. ``False`` for the drivers' ``malloc``/``host_malloc``.
    """

    kind: str
    capture_safe: bool

    def allocate(self, nbytes: int, stream: srt.Stream | None) -> int:
        """Return the address of ``nbytes`` new bytes; raise ``srt.OutOfMemoryError`` when out of memory.

        ``stream`` is the stream the first user named (``allocate(n, stream=s)``), or ``None``.
        Called on the allocating thread, without the allocator's lock held.
        """
        ...

    def free(self, ptr: int) -> None:
        """Give a block back. Runs on the releaser thread, after all work that used it completed."""
        ...

    def close(self) -> None:
        """Release what the source itself owns (not blocks: those were freed one by one). Idempotent."""
        ...


def _check_kind(kind: str) -> str:
    if kind not in _KINDS:
        raise ValueError(f"kind must be 'host' or 'device', got {kind!r}")
    return kind


class RawSource:
    """The runtime's own allocation calls: ``host_malloc``/``host_free`` or ``malloc``/``free``.

    Works on every backend (hip, cuda, sim). Makes the runtime's device
    current on the calling thread before each call. Not capture-safe: the
    drivers' ``malloc`` may synchronize and is refused during a global-mode
    capture.
    """

    capture_safe = False

    def __init__(self, runtime: srt.Runtime, kind: str) -> None:
        self.kind = _check_kind(kind)
        self._runtime = runtime
        backend = runtime.backend
        self._backend = backend
        self._malloc = backend.host_malloc if kind == "host" else backend.malloc
        self._free = backend.host_free if kind == "host" else backend.free

    def allocate(self, nbytes: int, stream: srt.Stream | None) -> int:
        self._backend.ensure_device(self._runtime.device)
        return self._malloc(nbytes)

    def free(self, ptr: int) -> None:
        self._backend.ensure_device(self._runtime.device)
        self._free(ptr)

    def close(self) -> None:
        """Nothing to release."""

    def __repr__(self) -> str:
        return f"<RawSource {self.kind} on {self._runtime!r}>"


class StreamOrderedSource:
    """Device memory from the driver's stream-ordered pool (``hipMallocAsync`` / ``cudaMallocAsync``).

    Needs ``runtime.capabilities.supports_stream_ordered_alloc``. A block asked
    for with ``allocate(n, stream=s)`` is allocated in stream order on ``s``:
    use it on ``s`` (or on streams that wait for ``s``). Without a stream it is
    allocated on a private stream that is synchronized before the address is
    returned (a short wait on an otherwise idle stream, on the miss path only).
    Frees go to the pool on the private stream, from the releaser thread.
    """

    capture_safe = False
    kind = "device"

    def __init__(self, runtime: srt.Runtime, kind: str = "device") -> None:
        if _check_kind(kind) != "device":
            raise ValueError("StreamOrderedSource serves device memory only (kind='device')")
        if not runtime.capabilities.supports_stream_ordered_alloc:
            raise ValueError(f"the {runtime.backend_name} backend on this device has no stream-ordered allocation; use RawSource")
        self._runtime = runtime
        self._backend = runtime.backend
        self._lock = threading.Lock()
        self._stream: int | None = None
        self._closed = False

    def _private_stream(self) -> int:
        with self._lock:
            if self._closed:
                raise srt.ClosedError("StreamOrderedSource is closed")
            if self._stream is None:
                self._backend.ensure_device(self._runtime.device)
                self._stream = self._backend.stream_create(0)
            return self._stream

    def allocate(self, nbytes: int, stream: srt.Stream | None) -> int:
        backend = self._backend
        backend.ensure_device(self._runtime.device)
        if stream is not None:
            return backend.malloc_async(nbytes, stream.handle)
        private = self._private_stream()
        ptr = backend.malloc_async(nbytes, private)
        backend.stream_synchronize(private)
        return ptr

    def free(self, ptr: int) -> None:
        backend = self._backend
        backend.ensure_device(self._runtime.device)
        backend.free_async(ptr, self._private_stream())

    def close(self) -> None:
        """Wait for the private stream's frees and destroy it. Idempotent."""
        with self._lock:
            stream, self._stream = self._stream, None
            self._closed = True
        if stream is not None and not self._runtime.is_closed:
            self._backend.stream_synchronize(stream)
            self._backend.stream_destroy(stream)

    def __repr__(self) -> str:
        return f"<StreamOrderedSource device on {self._runtime!r}>"


class TorchSource:
    """Blocks from torch's allocators, for sharing one memory budget with torch.

    * ``kind="host"``: ``torch.empty(n, dtype=torch.uint8, pin_memory=True)``
      (torch's pinned caching host allocator) on GPU runtimes; plain CPU tensors
      on the simulator, where torch has no device to pin for.
    * ``kind="device"``: ``torch.cuda.caching_allocator_alloc`` /
      ``caching_allocator_delete`` (torch's CUDA/ROCm caching allocator) on GPU
      runtimes; refused on the simulator.

    The tensors are kept alive by the source until :meth:`free` drops them on the
    releaser thread (torch then caches them itself). Raises ``ImportError``
    when torch is not installed.
    """

    capture_safe = False

    def __init__(self, runtime: srt.Runtime, kind: str) -> None:
        import torch  # noqa: PLC0415 - optional dependency, imported on use

        self.kind = _check_kind(kind)
        self._torch = torch
        self._runtime = runtime
        self._lock = threading.Lock()
        self._tensors: dict[int, Any] = {}
        gpu = not runtime.capabilities.is_simulated
        if gpu and not torch.cuda.is_available():
            raise ValueError("TorchSource on a GPU runtime needs torch built with CUDA or ROCm and a visible GPU")
        if kind == "device" and not gpu:
            raise ValueError("TorchSource(kind='device') needs a GPU runtime: the simulator's device memory is not torch's")
        self._pin = gpu

    @property
    def pinned(self) -> bool:
        """Whether host blocks are page-locked (GPU runtimes) or plain CPU tensors (simulator)."""
        return self._pin

    def allocate(self, nbytes: int, stream: srt.Stream | None) -> int:
        torch = self._torch
        if self.kind == "device":
            handle = stream.handle if stream is not None else None
            try:
                return int(torch.cuda.caching_allocator_alloc(nbytes, device=self._runtime.device, stream=handle))
            except torch.cuda.OutOfMemoryError as exc:
                raise srt.OutOfMemoryError(f"torch could not allocate {nbytes} device bytes: {exc}", requested=nbytes) from exc
        try:
            tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self._pin)
        except RuntimeError as exc:  # torch reports pinned-allocation failures as RuntimeError
            raise srt.OutOfMemoryError(f"torch could not allocate {nbytes} host bytes: {exc}", requested=nbytes) from exc
        ptr = int(tensor.data_ptr())
        with self._lock:
            self._tensors[ptr] = tensor
        return ptr

    def free(self, ptr: int) -> None:
        if self.kind == "device":
            self._torch.cuda.caching_allocator_delete(ptr)
            return
        with self._lock:
            tensor = self._tensors.pop(ptr)
        del tensor

    def close(self) -> None:
        """Drop any tensors still held (normally none). Idempotent."""
        with self._lock:
            self._tensors.clear()

    def __repr__(self) -> str:
        return f"<TorchSource {self.kind}{' pinned' if self._pin and self.kind == 'host' else ''} on {self._runtime!r}>"
