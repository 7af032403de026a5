"""Debug mode of the caching allocators (``debug=True``): poison released blocks, check reuse.

What it does, per released block:

* **Poison.** The whole block is filled with :data:`POISON` (``0xDB``) once
  every stream that used it has passed its release: by a memset on a private
  stream of the allocator that first waits for those streams' release events
  (device blocks, and pinned blocks that streams used), or by a host fill at
  once (pinned blocks no stream used). Stale readers then see ``0xDB`` bytes
  instead of plausible data. A block released while a stream that used it is
  capturing, or after that stream was closed, is not poisoned (no point in
  stream order to do it from).
  A device block that goes back to its stream's own list (only the stream it
  was allocated for used it) is poisoned by a memset on that stream itself,
  in stream order, unless the stream is capturing.
* **Reuse check.** Every block handed out is checked not to be handed out
  already (an allocator bug), and on the simulator (``capabilities.is_simulated``)
  the simulator's hazard checker is asked whether the host may write it now
  (``backend.check_host_access(ptr, nbytes, write=True)``), as it is before the
  host fill of a pinned block: work still using the block that the allocator
  was not told about (raw pointers passed to the backend) is reported as a
  ``host_access`` hazard (recorded in ``backend.hazards()``, or raised with
  ``open_runtime("sim", check_hazards="raise")``). Not for a block from a
  stream's own list: its stream may still be running the poison memset.
* **Late device access.** On the simulator, device work that touches a block
  after its release without the allocator knowing (a raw pointer kept past
  ``release()``) races with the poison memset on the private stream, and the
  hazard checker reports it as a ``race`` naming both ops.

Costs one memset and one or two events per release; meant for debugging runs.
"""

from __future__ import annotations

import ctypes
import threading
from typing import TYPE_CHECKING, Any, Callable

import streamrt as srt

from ._fence import Fence

if TYPE_CHECKING:
    from collections.abc import Set

    from ._caching import CachingAllocator

__all__ = ["POISON", "DebugChecks"]

POISON = 0xDB


class DebugChecks:
    """The debug-mode hooks of one allocator; see the module docstring."""

    def __init__(self, allocator: CachingAllocator) -> None:
        self._alloc = allocator
        self._runtime = allocator.runtime
        self._backend = allocator.runtime.backend
        self._lock = threading.Lock()
        self._stream: int | None = None
        self._out: set[int] = set()
        check: Callable[[int, int, bool], Any] | None = None
        if self._runtime.capabilities.is_simulated:
            check = getattr(self._backend, "check_host_access", None)
        self._check_host_access = check

    def _private_stream(self) -> int:
        with self._lock:
            if self._stream is None:
                self._backend.ensure_device(self._runtime.device)
                self._stream = self._backend.stream_create(0)
            return self._stream

    def handed_out(self, ptr: int, nbytes: int, *, check_host: bool = True) -> None:
        """Called for every block handed out (``nbytes``: the block size; ``check_host``: ask the
        hazard checker, not for a block from a stream's own list)."""
        with self._lock:
            if ptr in self._out:
                raise RuntimeError(f"allocator bug: block {ptr:#x} handed out while already in use")
            self._out.add(ptr)
        check = self._check_host_access
        if check is not None and check_host:
            check(ptr, nbytes, True)

    def released(self, ptr: int) -> None:
        """A block came back without being poisoned (capture pools keep theirs for the graph)."""
        with self._lock:
            self._out.discard(ptr)

    def poison(self, ptr: int, nbytes: int, streams: Set[srt.Stream], own: srt.Stream | None = None) -> Fence:
        """Record the release fence of a block and poison the block behind it; returns the fence.

        ``own``: the block goes back to that stream's own list: poisoned on it, in stream order,
        and the fence is empty.
        """
        with self._lock:
            self._out.discard(ptr)
        alloc = self._alloc
        runtime, events, backend = self._runtime, alloc._events, self._backend
        if own is not None:
            handle = own.handle
            if not (alloc._check_capture and backend.stream_is_capturing(handle)):
                backend.memset_async(ptr, POISON, nbytes, handle)
            return Fence()
        fence = Fence.record(runtime, events, streams, check_capture=alloc._check_capture)
        if fence.is_capture_deferred or fence.waits_for_device:
            return fence  # no point in stream order to poison from
        if fence.is_empty and alloc.kind == "host":
            check = self._check_host_access
            if check is not None:
                check(ptr, nbytes, True)  # the fill below is a host write: is anything still using the block?
            ctypes.memset(ptr, POISON, nbytes)
            return fence
        stream = self._private_stream()
        for event in fence.events:
            backend.stream_wait_event(stream, event)
        backend.memset_async(ptr, POISON, nbytes, stream)
        done = events.take()
        backend.event_record(done, stream)
        fence.add_event(done)
        return fence

    def close(self) -> None:
        """Destroy the private stream (after its work). Idempotent."""
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None and not self._runtime.is_closed:
            self._backend.stream_synchronize(stream)
            self._backend.stream_destroy(stream)
