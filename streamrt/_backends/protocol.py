"""The backend protocol: plain primitives over int handles and byte counts.

Every backend module (``hip``, ``cuda``, ``sim``) implements :class:`Backend`.
Nothing outside ``streamrt/_backends`` knows which backend it talks to; what
differs between backends is described by :class:`Capabilities`.

Rules every implementation keeps:

* Every call checks its return code and raises :class:`~streamrt.BackendError`
  (or :class:`~streamrt.OutOfMemoryError` for allocation failures) through one
  ``_check`` function of the module. A call that fails leaves nothing
  half-created.
* Handles are plain ``int`` (the raw ``hipStream_t`` / ``cudaStream_t`` value,
  pointer values for memory). The null stream is ``0``.
* Methods are thread-safe to the extent the underlying runtime is; blocking
  calls (``*_synchronize``) release the GIL.
* ``set_device`` is per calling thread, as in HIP/CUDA; the runtime layer calls
  ``ensure_device`` before work on threads it owns.
* One backend object can serve every device of the process (runtimes of one
  process share it, see ``streamrt._runtime``). Streams, events and memory
  belong to the device that was current when they were created. Memsets,
  copies and host functions may be enqueued on a stream of any device; an event
  is recorded only on a stream of its own device, and kernel launches and event
  or stream creation need the stream's device current (the runtime layer
  ensures both). ``stream_wait_event`` works across devices;
  ``memcpy_peer_async`` copies between devices.
* A backend also has ``native_ops``: ``None``, or a
  :class:`~streamrt._backends._native_ops.NativeOps` that makes several of its
  own enqueue calls in one native call (launch plans and graph replays use it;
  the methods stay the reference behaviour, and a wrapper that must see every
  call, such as the tracing one, sets it to ``None``). Where it is there,
  ``event_record``, ``event_query`` and ``event_synchronize`` are its native
  calls too.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

__all__ = [
    "Backend",
    "Capabilities",
    "CaptureMode",
    "MemcpyKind",
    "PointerKind",
]


class MemcpyKind(enum.IntEnum):
    """Copy directions; the values are HIP's and CUDA's (they agree)."""

    HOST_TO_HOST = 0
    HOST_TO_DEVICE = 1
    DEVICE_TO_HOST = 2
    DEVICE_TO_DEVICE = 3
    DEFAULT = 4


class CaptureMode(enum.IntEnum):
    """Stream-capture modes; the values are HIP's and CUDA's (they agree)."""

    GLOBAL = 0
    THREAD_LOCAL = 1
    RELAXED = 2


class PointerKind(str, enum.Enum):
    """What a raw address points to, as far as the backend knows."""

    DEVICE = "device"  # device memory (cudaMalloc / hipMalloc, or a pool)
    HOST = "host"  # page-locked host memory (host_malloc or registered)
    MANAGED = "managed"  # unified / managed memory
    PAGEABLE = "pageable"  # ordinary host memory the backend does not know


@dataclass(frozen=True)
class Capabilities:
    """What one backend on one device can do. Frozen; read it, never branch on names.

    Attributes:
        backend: ``"hip"``, ``"cuda"`` or ``"sim"``.
        device_name: human-readable device name.
        architecture: ``"sm_90"``, ``"gfx942"`` or ``"sim"``; keys kernel caches.
        is_simulated: the device is the simulator (virtual clock, host RAM).
        supports_graphs: stream capture and graph replay work.
        supports_stream_ordered_alloc: ``malloc_async`` / ``free_async`` work.
        supports_pageable_async_copy: an async copy may name pageable host memory
            (it then runs synchronously with respect to the host on GPUs).
        supports_stream_signals: ``signal_alloc``, ``signal_free`` and
            ``stream_wait_signal`` work: a stream can wait, on the device and
            without any host thread, for a 64-bit word the host stores.
        priority_range: ``(least, greatest)`` stream priorities; on HIP and CUDA
            numerically lower is higher priority, so ``greatest <= least``.
        virtual_clock: event times come from a deterministic virtual clock.
        total_memory: device memory in bytes.
        multiprocessor_count: compute units / SMs (used by the seed workload).
        max_shared_memory_per_block: bytes of shared memory a kernel launch
            may use per block (static plus dynamic) without opting in per
            kernel; a launch asking for more is refused before it is enqueued.
        dlpack_device_type: the DLPack device type of device memory (``2``
            kDLCUDA, ``10`` kDLROCM; ``1`` kDLCPU where device memory is host
            RAM, the simulator); pinned memory is the matching host type.
        profiler_ranges: the range API this device's profilers read (``"nvtx"``,
            ``"roctx"``), or ``None`` (see ``streamrt._ranges``).
    """

    backend: str
    device_name: str
    architecture: str
    is_simulated: bool
    supports_graphs: bool
    supports_stream_ordered_alloc: bool
    supports_pageable_async_copy: bool
    priority_range: tuple[int, int]
    virtual_clock: bool
    total_memory: int
    multiprocessor_count: int
    supports_stream_signals: bool = False
    max_shared_memory_per_block: int = 48 * 1024
    dlpack_device_type: int = 1
    profiler_ranges: str | None = None


@runtime_checkable
class Backend(Protocol):
    """The primitives a backend provides. See the module docstring for the rules."""

    name: str

    # -- devices ---------------------------------------------------------------
    def device_count(self) -> int: ...
    def set_device(self, device: int) -> None: ...
    def ensure_device(self, device: int) -> None:
        """Make ``device`` current on the calling thread if it is not already."""
        ...

    def capabilities(self, device: int) -> Capabilities: ...
    def device_synchronize(self) -> None:
        """Wait for all work on the calling thread's current device."""
        ...

    def mem_get_info(self) -> tuple[int, int]:
        """``(free, total)`` bytes of the current device."""
        ...

    # -- several devices -------------------------------------------------------
    def can_access_peer(self, device: int, peer: int) -> bool:
        """Whether ``device`` can map ``peer``'s memory directly (``cudaDeviceCanAccessPeer``).

        ``False`` for ``device == peer`` (a device is not its own peer). Cheap; no side effects.
        """
        ...

    def enable_peer_access(self, peer: int) -> None:
        """Let the calling thread's current device access ``peer``'s memory (one direction).

        Process-wide and permanent until the process ends. Idempotent: access that
        is already enabled is not an error. Raises when the pair cannot access each
        other (check :meth:`can_access_peer` first).
        """
        ...

    def memcpy_peer_async(self, dst: int, dst_device: int, src: int, src_device: int, nbytes: int, stream: int) -> None:
        """Copy ``nbytes`` of device memory from ``src`` on ``src_device`` to ``dst`` on ``dst_device``.

        Stream-ordered on ``stream`` (a stream of any device of this backend; by
        convention the source's or the destination's). Legal without peer access:
        the driver then stages the copy through host memory, more slowly.
        """
        ...

    # -- streams ---------------------------------------------------------------
    def stream_create(self, priority: int = 0) -> int:
        """Create a non-blocking stream (it does not synchronize with the null stream)."""
        ...

    def stream_destroy(self, stream: int) -> None: ...
    def stream_synchronize(self, stream: int) -> None: ...
    def stream_query(self, stream: int) -> bool:
        """``True`` when all work enqueued on ``stream`` has completed."""
        ...

    def stream_wait_event(self, stream: int, event: int) -> None: ...

    # -- events ----------------------------------------------------------------
    def event_create(self, *, timing: bool, blocking_sync: bool = True) -> int:
        """Create an event. ``blocking_sync`` makes ``event_synchronize`` sleep, not spin."""
        ...

    def event_destroy(self, event: int) -> None: ...
    def event_record(self, event: int, stream: int) -> None: ...
    def event_query(self, event: int) -> bool: ...
    def event_synchronize(self, event: int) -> None: ...
    def event_elapsed_ms(self, start: int, end: int) -> float: ...

    # -- memory ----------------------------------------------------------------
    def malloc(self, nbytes: int) -> int: ...
    def free(self, ptr: int) -> None: ...
    def host_malloc(self, nbytes: int) -> int:
        """Page-locked host memory, portable across devices."""
        ...

    def host_free(self, ptr: int) -> None: ...
    def malloc_async(self, nbytes: int, stream: int) -> int:
        """Stream-ordered allocation (only when ``supports_stream_ordered_alloc``)."""
        ...

    def free_async(self, ptr: int, stream: int) -> None: ...
    def pointer_kind(self, ptr: int) -> PointerKind: ...
    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None: ...
    def memcpy_async(self, dst: int, src: int, nbytes: int, kind: MemcpyKind, stream: int) -> None: ...

    # -- host functions ----------------------------------------------------------
    def launch_host_func(self, stream: int, fn_ptr: int, user_data: int) -> None:
        """Enqueue the native function ``void fn(void*)`` at ``fn_ptr`` with ``user_data``.

        It runs on a driver (or simulator callback) thread once prior work on
        ``stream`` completes; later work waits for it to return.
        """
        ...

    # -- signals (only when ``supports_stream_signals``) ------------------------------
    def signal_alloc(self) -> int:
        """A *signal*: 8 zeroed, 8-aligned bytes of host memory the device can wait on.

        The host updates it with plain 64-bit stores (no backend call). On ROCm
        this is ``hipMallocSignalMemory`` memory, as ``hipStreamWaitValue64``
        requires; on CUDA, mapped pinned memory.
        """
        ...

    def signal_free(self, signal: int) -> None:
        """Free a signal. No stream may still wait on it.

        Any address that :meth:`signal_alloc` did not return (or that was
        freed already) is refused with ``BackendError`` and nothing is freed;
        :meth:`stream_wait_signal` refuses it the same way.
        """
        ...

    def stream_wait_signal(self, stream: int, signal: int, value: int) -> None:
        """Later work on ``stream`` waits until the unsigned 64-bit word at ``signal`` is ``>= value``.

        The wait happens on the device (``cuStreamWaitValue64`` /
        ``hipStreamWaitValue64`` with ``GEQ``); no host thread is held. Other
        streams are not held back. Not to be captured: streamrt never does, and
        the simulator refuses it.
        """
        ...

    # -- graphs ------------------------------------------------------------------
    def stream_begin_capture(self, stream: int, mode: CaptureMode) -> None: ...
    def stream_end_capture(self, stream: int) -> int:
        """End capture and return the graph handle. Raises ``CaptureError`` if invalidated."""
        ...

    def stream_is_capturing(self, stream: int) -> bool: ...
    def graph_instantiate(self, graph: int) -> int: ...
    def graph_launch(self, graph_exec: int, stream: int) -> None: ...
    def graph_exec_destroy(self, graph_exec: int) -> None: ...
    def graph_destroy(self, graph: int) -> None: ...

    # -- captures others began, and user objects -----------------------------------------
    def stream_capture_graph(self, stream: int) -> int:
        """The graph ``stream`` is capturing into (``cuStreamGetCaptureInfo`` /
        ``hipStreamGetCaptureInfo_v2``); ``0`` when it is not capturing.

        Works for a capture begun by anyone, on ``stream`` or on a stream it
        joined by an event wait. The handle is valid until that capture ends.
        Raises ``CaptureError`` when the capture has been invalidated.
        """
        ...

    def user_object_create(self, destructor: int, user_data: int) -> int:
        """A user object holding one reference: the native ``void fn(void*)`` at ``destructor`` is
        called with ``user_data`` on a driver thread once its last reference is gone.

        ``cuUserObjectCreate(..., CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)`` /
        ``hipUserObjectCreate``. The destructor must not call the backend.
        """
        ...

    def graph_retain_user_object(self, graph: int, user_object: int) -> None:
        """Move the caller's one reference to ``user_object`` into ``graph`` (``cudaGraphUserObjectMove``).

        The graph and every executable graph instantiated from it then hold it;
        it is released once all of them are destroyed and their launches have
        finished. On failure the caller still owns its reference.
        """
        ...

    def user_object_release(self, user_object: int) -> None:
        """Drop one reference the caller owns (the destructor runs when it was the last)."""
        ...

    # -- kernels -------------------------------------------------------------------
    def compiler_version(self) -> str:
        """Version string of the runtime compiler (nvrtc / hiprtc / the simulator's twins)."""
        ...

    def compile_source(self, source: str, name: str, options: Sequence[str]) -> bytes:
        """Compile HIP C++ ``source`` for the current device; return a loadable image.

        ``name`` is the program name shown in logs. Raises ``KernelCompileError``
        carrying the compiler log. Kernels are declared ``extern "C"``.
        """
        ...

    def module_load_data(self, image: bytes) -> int: ...
    def module_get_function(self, module: int, name: str) -> int: ...
    def module_unload(self, module: int) -> None: ...
    def launch_kernel(
        self,
        function: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        stream: int,
        arg_ptrs: int,
    ) -> None:
        """Launch; ``arg_ptrs`` is the address of a ``void*[]`` of argument addresses."""
        ...

    # -- errors and lifetime -----------------------------------------------------------
    def error_name(self, code: int) -> str: ...
    def error_string(self, code: int) -> str: ...
    def close(self) -> None:
        """Release what the backend object owns (simulator threads). Idempotent."""
        ...


def priority_clamp(priority: int, priority_range: Sequence[int]) -> int:
    """Clamp a user priority into ``(least, greatest)`` where greatest may be numerically lower."""
    least, greatest = priority_range
    lo, hi = min(least, greatest), max(least, greatest)
    return max(lo, min(hi, priority))
