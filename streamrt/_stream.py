"""Streams: ordered queues of device work, with memory operations, host functions and events."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Callable

from ._backends.protocol import CaptureMode, MemcpyKind
from ._buffer import DEVICE, HOST, PAGEABLE, Buffer, check_size, wrap_foreign
from ._completion import refuse_blocking_wait
from ._errors import CaptureError, ClosedError
from ._event import Event
from ._extensions import hook
from ._interop import stream_protocol, wait_foreign
from ._peer import check_peer_buffer, peer_copy

if TYPE_CHECKING:
    from ._completion import Completion
    from ._pipeline import Graph
    from ._runtime import Runtime

__all__ = ["Stream", "holding", "native_function_address"]

_COPY_KIND = {
    (HOST, HOST): MemcpyKind.HOST_TO_HOST,
    (HOST, DEVICE): MemcpyKind.HOST_TO_DEVICE,
    (DEVICE, HOST): MemcpyKind.DEVICE_TO_HOST,
    (DEVICE, DEVICE): MemcpyKind.DEVICE_TO_DEVICE,
}


def native_function_address(fn: Any) -> int | None:
    """The address of a native ``void(*)(void*)`` given as a ctypes function pointer or a numba cfunc.

    ``None`` when ``fn`` is not a native function (a plain Python callable).
    """
    if isinstance(fn, ctypes._CFuncPtr):  # type: ignore[attr-defined]
        return ctypes.cast(fn, ctypes.c_void_p).value
    address = getattr(fn, "address", None)
    if isinstance(address, int) and hasattr(fn, "ctypes"):  # numba @cfunc
        return address
    return None


def _user_data(args: tuple[Any, ...]) -> int:
    if not args:
        return 0
    if len(args) != 1:
        raise TypeError("a native host function takes one user-data argument (an int address, a ctypes object or a Buffer)")
    (arg,) = args
    if arg is None:
        return 0
    if isinstance(arg, Buffer):
        return arg.ptr
    if isinstance(arg, int) and not isinstance(arg, bool):
        return arg
    if isinstance(arg, ctypes._Pointer):  # type: ignore[attr-defined]
        return ctypes.cast(arg, ctypes.c_void_p).value or 0
    if isinstance(arg, (ctypes._SimpleCData, ctypes.Structure, ctypes.Array)):  # type: ignore[attr-defined]
        return ctypes.addressof(arg)
    raise TypeError(f"cannot pass {type(arg).__name__} as user data to a native host function")


@contextlib.contextmanager
def holding(streams: Iterable[Stream]) -> Iterator[None]:
    """Hold the enqueue locks of ``streams`` (in the order given), each checked open: ``ClosedError`` if not.

    For work that spans several streams (a fork launch's side streams): no
    close of one of them can come between its parts.
    """
    with contextlib.ExitStack() as stack:
        for s in streams:
            stack.enter_context(s._lock)
            if s._closed:
                s._check_open()
        yield


class _ForeignBuffer(ValueError):
    """A buffer of another runtime where only the stream's runtime's are accepted (``copy`` retries it as a peer copy)."""


class Stream:
    """An ordered queue of work on one device (:attr:`device`, its runtime's).

    Every method that enqueues returns as soon as the work is queued; the work
    runs asynchronously in the order it was enqueued. Methods validate all
    arguments before anything is enqueued: a call that raises enqueued nothing.

    Several devices: buffers must belong to the stream's runtime, except in
    :meth:`copy`, which also takes a device buffer of another device of the
    same backend object (a peer copy, see :mod:`streamrt._peer`). :meth:`wait`
    takes events of any runtime of the same backend object (a cross-device wait).

    Thread rules: a stream may be used from several threads. Each enqueue holds
    the stream's enqueue lock (:attr:`lock`) while it calls the backend, so
    calls from different threads are enqueued one after the other, in the
    order they take the lock, and :meth:`close` (or the runtime's) waits for
    an enqueue in progress: a call either enqueues its work or raises
    ``ClosedError``.
    """

    __slots__ = (
        "_runtime", "_backend", "_handle", "_priority", "_owned", "_closed", "_released", "_name", "_foreign",
        "_lane", "_lock", "_capture", "__weakref__",
    )

    def __init__(self, runtime: Runtime, handle: int, *, priority: int = 0, owned: bool, name: str | None = None, foreign: Any = None) -> None:
        self._runtime = runtime
        self._backend = runtime._backend  # the tracing wrapper while a trace is open
        self._handle = handle
        self._priority = priority
        self._owned = owned
        self._closed = False  # no more work accepted (set under the lock)
        self._released = False  # forgotten by the engine, destroyed if owned
        self._lane = runtime._engine.lane(handle)
        self._lock = self._lane.lock
        self._name = name or f"stream-0x{handle:x}"
        self._foreign = foreign  # keeps a wrapped torch/cupy stream object alive
        self._capture: Any = None  # the CaptureSession of a `with stream.capture()` block in progress

    # -- properties ---------------------------------------------------------------
    @property
    def handle(self) -> int:
        """The raw backend stream handle (``hipStream_t`` / ``cudaStream_t`` as int): an escape hatch."""
        return self._handle

    @property
    def runtime(self) -> Runtime:
        return self._runtime

    @property
    def device(self) -> int:
        return self._runtime.device

    @property
    def priority(self) -> int:
        return self._priority

    @property
    def name(self) -> str:
        return self._name

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def lock(self) -> Any:
        """The stream's enqueue lock (re-entrant): held by every enqueue, taken by :meth:`close`.

        Hold it to enqueue a sequence of operations that no other thread's work
        on this stream may interleave with.
        """
        return self._lock

    @property
    def is_idle(self) -> bool:
        """``True`` when all work enqueued so far has completed. Non-blocking."""
        with self._lock:
            self._check_open()
            if self._capture is not None:
                self._refuse_in_capture("is_idle")
            return self._backend.stream_query(self._handle)

    # -- memory operations ----------------------------------------------------------
    def memset(self, dst: Any, value: int, nbytes: int | None = None) -> None:
        """Set ``nbytes`` bytes of ``dst`` (default: all of it) to the byte ``value``."""
        if self._closed:
            self._check_open()
        buf = self._buffer(dst, "dst")
        if buf._readonly:
            raise ValueError("dst is read-only")
        if buf._kind == PAGEABLE:
            raise ValueError("stream.memset needs device or pinned host memory; pageable host memory can be set with numpy")
        if type(value) is not int or not 0 <= value <= 255:  # bool and floats are refused too
            raise ValueError(f"memset value must be an int byte in [0, 255], got {value!r}")
        n = buf._nbytes if nbytes is None else check_size(nbytes, "nbytes")
        if n > buf._nbytes:
            raise ValueError(f"memset of {n} bytes exceeds dst's {buf._nbytes} bytes")
        with self._lock:
            if self._closed:
                self._check_open()
            self._backend.memset_async(buf._ptr, value, n, self._handle)
            if self._capture is not None:
                self._capture.used(buf)
        buf.note_stream(self)

    def copy(self, dst: Any, src: Any, nbytes: int | None = None) -> None:
        """Copy ``nbytes`` bytes (default ``src.nbytes``) from ``src`` to ``dst``; the direction is inferred.

        Both sides must be device or pinned host memory: a pageable host buffer
        raises ``ValueError`` (allocate staging from ``rt.host_allocator``).

        Between devices: when ``dst`` and ``src`` are device buffers of two
        different devices (runtimes of one backend object), the copy is a peer
        copy (``memcpy_peer_async``), stream-ordered on this stream; peer access
        is enabled once per pair of devices where the hardware allows, and the
        copy is staged by the driver otherwise. Order it after the other
        device's work on those buffers with events (``stream.wait``).
        """
        if self._closed:
            self._check_open()
        try:
            d = self._buffer(dst, "dst")
            s = self._buffer(src, "src")
        except _ForeignBuffer:
            self._copy_between_devices(dst, src, nbytes)
            return
        if d._readonly:
            raise ValueError("dst is read-only")
        n = s._nbytes if nbytes is None else check_size(nbytes, "nbytes")
        if n > s._nbytes or n > d._nbytes:
            raise ValueError(f"copy of {n} bytes exceeds src ({s._nbytes} bytes) or dst ({d._nbytes} bytes)")
        kind = _COPY_KIND.get((s._kind, d._kind))
        if kind is None:
            raise ValueError(
                "async copies need device or pinned host memory on both sides; "
                f"got src {s._kind}, dst {d._kind}: stage pageable data through rt.host_allocator.allocate(n)"
            )
        if n and d._ptr < s._ptr + n and s._ptr < d._ptr + n:
            raise ValueError("copy: src and dst overlap (copy through a separate buffer)")
        self._copy_raw(d._ptr, s._ptr, n, kind, d, s)
        d.note_stream(self)
        s.note_stream(self)

    def _copy_between_devices(self, dst: Any, src: Any, nbytes: int | None) -> None:
        """``copy`` when a buffer belongs to another runtime: validated as a peer copy, then enqueued."""
        d = self._buffer(dst, "dst", peer=True)
        s = self._buffer(src, "src", peer=True)
        if d._readonly:
            raise ValueError("dst is read-only")
        n = s._nbytes if nbytes is None else check_size(nbytes, "nbytes")
        if n > s._nbytes or n > d._nbytes:
            raise ValueError(f"copy of {n} bytes exceeds src ({s._nbytes} bytes) or dst ({d._nbytes} bytes)")
        if d._kind != DEVICE or s._kind != DEVICE:
            raise ValueError(
                "a copy with a buffer of another device is a peer copy: both sides must be device buffers "
                f"(got src {s._kind}, dst {d._kind}); stage host data through a buffer of that device's runtime"
            )
        if d._runtime._device == s._runtime._device:  # type: ignore[union-attr]
            raise ValueError(
                f"both buffers are on device {d._runtime._device}: enqueue a copy between them on a stream "  # type: ignore[union-attr]
                "of that device's runtime"
            )
        peer_copy(self, d, s, n)

    # -- host functions -------------------------------------------------------------------
    def launch_host_func(self, fn: Callable[..., Any], *args: Any) -> Completion | None:
        """Run ``fn(*args)`` on the host once prior work on this stream has completed.

        Later work on the stream waits until ``fn`` returns. A Python callable
        runs on a runtime worker thread, never on the driver's callback thread;
        a native function (a ctypes ``CFUNCTYPE(None, c_void_p)`` or numba
        ``cfunc``) runs directly on the driver thread with one user-data
        argument (an int address, a ctypes object or a Buffer).

        Returns, for a Python callable, a :class:`Completion` that resolves with
        ``fn``'s result or its exception (the stream continues either way); for
        a native function ``None``: it has no result, and the runtime keeps the
        function object alive until it closes, so no per-call bookkeeping is
        needed.

        ``fn`` must not call HIP/CUDA and should be short: it blocks its stream.
        """
        if self._closed:
            self._check_open()
        runtime = self._runtime
        known = runtime._native_functions.get(id(fn))
        if known is not None and known[0] is fn:
            address: int | None = known[1]
        else:
            if not callable(fn):
                raise TypeError(f"launch_host_func needs a callable, got {type(fn).__name__}")
            address = native_function_address(fn)
            if address is not None:
                # Kept alive (and its address remembered) until the runtime closes.
                runtime._native_functions[id(fn)] = (fn, address)
        user_data = _user_data(args) if address is not None and args else 0
        with self._lock:
            if self._closed:
                self._check_open()
            if address is None:
                if self._capture is not None or self._backend.stream_is_capturing(self._handle):
                    return hook("capture_host_func")(self, fn, args)  # type: ignore[no-any-return]
                return runtime._engine.host_call(self._handle, fn, args, capture_checked=True, backend=self._backend)
            self._backend.launch_host_func(self._handle, address, user_data)
            if self._capture is not None:
                self._capture.used(fn, *args)
        return None

    # -- kernels --------------------------------------------------------------------------------
    def launch_kernel(self, kernel: Any, grid: Any, block: Any, args: Any = (), shared_mem: int = 0) -> None:
        """Enqueue ``kernel`` with ``grid``/``block`` (an int or a tuple of up to 3), ``args`` (a list,
        or a dict by parameter name) and ``shared_mem`` bytes of dynamic shared memory.

        Everything is checked first (wrong count or kind: ``TypeError``; out of range, buffer too
        small, misaligned: ``ValueError``); nothing is enqueued when a check fails. Buffer arguments
        are tracked like those of copies. See docs/kernels.md.
        """
        hook("launch_kernel")(self, kernel, grid, block, args, shared_mem)

    # -- events and ordering -----------------------------------------------------------------
    def record(self, event: Event | None = None) -> Event:
        """Record ``event`` (default: a new non-timing event) at the current end of the stream."""
        if self._closed:
            self._check_open()
        if event is None:
            event = self._runtime.create_event()
        elif not isinstance(event, Event):
            raise TypeError(f"record takes an Event, not {type(event).__name__}")
        else:
            if event._runtime is not self._runtime:
                raise ValueError(
                    "event belongs to another runtime: record events of the stream's runtime (rt.create_event()); "
                    "stream.wait accepts events of other runtimes"
                )
            event._check_open()
        return self._record_raw(event)

    def wait(self, event: Any) -> None:
        """Make later work on this stream wait until ``event`` has completed. Non-blocking.

        ``event`` may belong to another runtime of the same backend object, on
        this device or another (a cross-device wait: the device-side wait needs
        no host thread). An event of a different backend instance raises
        ``ValueError``. Other libraries' events (torch, CuPy, cuda.core) and a
        ``torch.distributed`` ``Work`` are accepted too (see docs/interop.md).
        """
        if self._closed:
            self._check_open()
        if not isinstance(event, Event):  # foreign events and collectives
            return wait_foreign(self, event)
        if event._runtime is not self._runtime and event._runtime._base_backend is not self._runtime._base_backend:
            raise ValueError(
                f"event belongs to another runtime ({event._runtime!r}) with a different backend instance than the "
                f"stream's ({self._runtime!r}): streams wait only on events of their own backend instance"
            )
        event._check_open()
        self._wait_raw(event)

    # -- enqueues on arguments already checked (Stream's methods above, the per-step helpers) -------
    # Each holds the enqueue lock, raises ClosedError on a closed stream, goes to the stream's
    # backend (the tracing wrapper while a trace is open) and tells a `with stream.capture()` block
    # what to keep. Noting buffers' streams is the caller's job.

    def _copy_raw(self, dst: int, src: int, nbytes: int, kind: MemcpyKind, *keep: Any) -> None:
        """Copy ``nbytes`` bytes between addresses; ``keep``: what a capture in progress must hold."""
        with self._lock:
            if self._closed:
                self._check_open()
            self._backend.memcpy_async(dst, src, nbytes, kind, self._handle)
            if self._capture is not None:
                self._capture.used(*keep)

    def _record_raw(self, event: Event) -> Event:
        """Record ``event`` (open, of this runtime) at the current end of the stream."""
        with self._lock:
            if self._closed:
                self._check_open()
            self._backend.event_record(event._handle, self._handle)
            event._recorded_on = self._handle
            if self._capture is not None:
                self._capture.used(event)
        return event

    def _copy_record_raw(self, dst: int, src: int, nbytes: int, kind: MemcpyKind, event: Event) -> bool:
        """Unless the stream is capturing (``False``: nothing enqueued), copy ``nbytes`` bytes (none: no copy),
        then record ``event`` (open, of this runtime): one native call where the backend has native ops,
        else one call each. Raises the backend's error; the copy may then be in flight."""
        with self._lock:
            if self._closed:
                self._check_open()
            backend = self._backend
            ops = getattr(backend, "native_ops", None)
            if ops is not None and nbytes:
                failed = ops.copy_record(dst, src, nbytes, kind, self._handle, event._handle)
                if failed is not None:
                    if failed[1] is None:
                        return False
                    raise failed[1]
            else:
                if backend.stream_is_capturing(self._handle):
                    return False
                if nbytes:
                    backend.memcpy_async(dst, src, nbytes, kind, self._handle)
                backend.event_record(event._handle, self._handle)
            event._recorded_on = self._handle
        return True

    def _wait_raw(self, event: Event) -> None:
        """Make later work wait for ``event`` (open, of this backend instance)."""
        with self._lock:
            if self._closed:
                self._check_open()
            self._backend.stream_wait_event(self._handle, event._handle)
            if self._capture is not None:
                self._capture.used(event)

    def __cuda_stream__(self) -> tuple[int, int]:
        """``(0, handle)``: the CUDA stream protocol, so cuda.core, numba-cuda and torch take this stream.

        On HIP the handle is the ``hipStream_t``. Raises ``TypeError`` on the
        simulator (its streams are not driver streams), ``ClosedError`` once closed.
        """
        return stream_protocol(self)

    def wait_stream(self, other: Stream) -> None:
        """Make later work on this stream wait for all work enqueued so far on ``other``.

        ``other`` may be a stream of another device of the same backend object.
        """
        if not isinstance(other, Stream):
            raise TypeError(f"wait_stream takes a Stream, not {type(other).__name__}")
        ev = other.record()
        try:
            self.wait(ev)
        finally:
            ev.close()

    def synchronize(self) -> None:
        """Block the calling thread until all work enqueued so far has completed (the GIL is released).

        Work a deferred launch queued for this stream counts as enqueued (see :meth:`settle`).
        Raises ``RuntimeError`` on a runtime thread (in a Python host function or
        a done callback), where it would wait for work queued behind that thread.
        """
        refuse_blocking_wait("stream.synchronize()")
        self.settle()
        with self._lock:
            self._check_open()
            if self._capture is not None:
                self._refuse_in_capture("synchronize")
            self._backend.stream_synchronize(self._handle)

    def settle(self) -> None:
        """Block (GIL released) until the calls deferred launches queued for this stream were made.

        Returns at once when none is pending. Needed only before enqueueing on the stream
        through its :attr:`handle` with backend calls of one's own (an allocator's fence):
        streamrt's own calls on the stream settle it first.
        """
        engine = self._runtime._engine
        if engine._deferred_on:
            engine.settle(self._handle)

    def wait_idle(self) -> Completion:
        """An awaitable :class:`Completion` that resolves when the work enqueued so far has completed.

        ``await stream.wait_idle()`` never blocks the event loop.
        """
        with self._lock:
            self._check_open()
            if self._capture is not None:
                self._refuse_in_capture("wait_idle")
            return self._runtime._engine.completion_for_stream(self._handle)

    # -- graph capture -----------------------------------------------------------------------------
    def capture(self, *, mode: CaptureMode | int = CaptureMode.THREAD_LOCAL, name: str | None = None) -> AbstractContextManager[Graph]:
        """``with stream.capture() as graph:`` records the streamrt work enqueued on this stream in the
        block (stream ops, host functions, pipeline and kernel launches) into ``graph``; nothing runs.

        After the block, ``graph.launch(stream)`` replays it and returns a Run
        (host functions re-run on every replay; their errors reach the Run);
        the graph keeps what its work uses alive until ``graph.close()`` and
        its last replay. Calls recorded in the block return a Run or
        Completion that is done at once with a ``CaptureError`` (nothing ran).
        Allocations on this stream in the block come from the allocators'
        capture pools and live as long as the graph. ``mode``: the backend's
        capture mode (thread-local by default). An exception in the block, or
        a capture the backend invalidated, ends the capture, frees what was
        captured and leaves the stream usable (a failed end raises
        ``CaptureError``); ``graph`` is then closed. ``synchronize``,
        ``wait_idle`` and ``is_idle`` raise ``CaptureError`` in the block.
        Raises ``CaptureError`` at once if the stream is already capturing.
        See docs/pipelines.md.
        """
        return hook("stream_capture")(self, mode, name)  # type: ignore[no-any-return]

    def _refuse_in_capture(self, what: str) -> None:
        raise CaptureError(f"stream.{what}() inside {self._name}.capture(): the work is being captured, not run")

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop accepting work. An owned stream is destroyed once its queued work completes
        (destroying a stream with work in flight is legal in HIP/CUDA: the work still runs).
        A wrapped foreign stream is left alone. Waits for an enqueue in progress on another
        thread; later ones raise ``ClosedError``. Idempotent."""
        self._refuse_work()
        self._release()

    def _refuse_work(self) -> None:
        """Accept no more work (after any enqueue in progress)."""
        with self._lock:
            self._closed = True

    def _release(self) -> None:
        """Forget the stream and destroy it if owned (once; after :meth:`_refuse_work`)."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self._runtime._forget_stream(self)
        if self._owned and not self._runtime.is_closed:
            self._backend.stream_destroy(self._handle)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"{self._name} is closed")
        if self._runtime._closed:
            raise ClosedError("runtime is closed")

    def _buffer(self, obj: Any, what: str, peer: bool = False) -> Buffer:
        """``obj`` as a usable Buffer of this stream's runtime (``peer``: or a device buffer of another device)."""
        if isinstance(obj, Buffer):
            if obj._runtime is not self._runtime:
                self._reject_or_peer(obj, what, peer)
            if obj._released or (obj._base is not None and obj._base._released):
                raise ValueError(f"{what} used after release()")
            return obj
        if obj is None:
            raise TypeError(f"{what} must be a Buffer or an object exposing memory, not None")
        buf = wrap_foreign(obj, self._runtime, stream=self)  # ordered after the object's producer, on this stream
        if buf._runtime is not self._runtime:
            self._reject_or_peer(buf, what, peer)
        buf.check_usable()
        return buf

    def _reject_or_peer(self, buf: Buffer, what: str, peer: bool) -> None:
        if not peer:
            raise _ForeignBuffer(
                f"{what} belongs to another runtime or device ({buf._runtime!r}, the stream's is {self._runtime!r}); "
                "a buffer of another device is accepted only by stream.copy, as a peer copy"
            )
        check_peer_buffer(self, buf, what)

    def __repr__(self) -> str:
        return (
            f"<Stream {self._name} device={self._runtime._device} priority={self._priority}"
            f"{' closed' if self._closed else ''}>"
        )
