"""The Runtime: one backend on one device, and the factory of streams, events and buffers.

Several devices in one process: open one runtime per device
(``open_runtime(backend, device=i)``). Runtimes of one process share one
backend object where the backend says so (GPU backends always; the simulator
when it has several devices, ``devices=N``): see ``streamrt._backends._shared``.
Streams of such runtimes wait on each other's events and copy between each
other's device buffers (peer copies, see ``streamrt._peer``).
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable

from ._allocator import Allocator, RawAllocator
from ._backends import select_auto
from ._backends._shared import BackendLease, acquire_backend
from ._backends.protocol import Backend, Capabilities, priority_clamp
from ._buffer import DEVICE, HOST, Buffer, wrap_foreign
from ._completion import DEFAULT_AWAIT_POLL_US, CompletionEngine, refuse_blocking_wait
from ._errors import ClosedError
from ._event import Event
from ._event_pool import EventPool
from ._extensions import hook
from ._interop import foreign_stream_handle
from ._releaser import Captures, Releaser
from ._stream import Stream
from ._switch_interval import DEFAULT_SWITCH_INTERVAL
from ._trace import Trace, TraceRegion, attach_on_open, finish_on_close, stop_trace, trace_region

if TYPE_CHECKING:
    from ._kernel import KernelLibrary
    from .torch import FetchFuture
    from ._scheduler import Scheduler

__all__ = ["Runtime", "open_runtime"]

AllocatorFactory = Callable[["Runtime", str], Allocator]


def open_runtime(
    backend: str = "auto",
    device: int = 0,
    *,
    host_allocator: str | AllocatorFactory | Allocator = "caching",
    device_allocator: str | AllocatorFactory | Allocator = "caching",
    python_host_switch_interval: float | None = DEFAULT_SWITCH_INTERVAL,
    stream_signals: bool = False,
    await_poll_us: float = DEFAULT_AWAIT_POLL_US,
    trace: bool | None = None,
    **backend_options: Any,
) -> Runtime:
    """Open a runtime on ``backend`` (``"auto"``, ``"hip"``, ``"cuda"`` or ``"sim"``) and ``device``.

    ``"auto"`` picks a GPU backend when its library and a GPU are present, else
    the simulator, and logs why at debug level (logger ``"streamrt"``).
    Allocators: ``"caching"`` (default, from the ``allocators`` package),
    ``"raw"`` (no caching), an allocator object, or a factory
    ``(runtime, kind) -> Allocator``. Extra keyword options go to the backend
    (for the simulator: ``profile=``, ``devices=``, ``check_hazards=``).
    ``trace=True`` traces every op from the start (see ``rt.trace()`` for a region).
    ``stream_signals=True`` holds a stream for a Python host function with a
    device-side signal wait instead of a second host function, where the
    backend supports it; read ``docs/asyncio.md`` ("How a Python host function
    holds its stream") first: it can deadlock with GIL-holding synchronizing calls.
    ``await_poll_us`` (default 50): for this long after an ``await`` of pending
    work begins, the event loop's thread polls the work's events itself
    between its other callbacks, which saves the completion thread's and the
    loop's cross-thread wake-ups; 0 turns it off (``docs/asyncio.md``, "Polling
    awaits").

    One runtime per device: ``open_runtime("cuda", device=1)`` next to a runtime
    on device 0 shares its backend object, so streams of the two wait on each
    other's events and copy between their buffers. The simulator is one
    simulated machine per ``(profile, devices, options)`` when ``devices >= 2``:
    ``open_runtime("sim", device=1, devices=2)`` and
    ``open_runtime("sim", device=0, devices=2)`` share it (a one-device
    simulator stays private to its runtime). The backend closes with its last runtime.

    Use it as a context manager, or call :meth:`Runtime.close`.
    """
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str, not {type(backend).__name__}")
    if isinstance(device, bool) or not isinstance(device, int) or device < 0:
        raise ValueError(f"device must be a non-negative int, got {device!r}")
    name = select_auto() if backend == "auto" else backend
    lease = acquire_backend(name, **backend_options)
    impl = lease.backend
    try:
        count = impl.device_count()
        if device >= count:
            raise ValueError(f"device {device} does not exist: the {name} backend has {count} device(s)")
        impl.set_device(device)
        rt = Runtime(
            impl,
            device,
            host_allocator=host_allocator,
            device_allocator=device_allocator,
            python_host_switch_interval=python_host_switch_interval,
            stream_signals=stream_signals,
            await_poll_us=await_poll_us,
            lease=lease,
        )
    except BaseException:
        lease.release()
        raise
    try:
        attach_on_open(rt, trace)  # trace=True, or a `streamrt study` session is running
    except BaseException:
        rt.close()
        raise
    return rt


class Runtime:
    """One backend on one device. Create with :func:`open_runtime`.

    Owns the completion engine (runtime threads that retire completions), the
    releaser thread (real frees) and the allocators. Thread-safe: streams and
    buffers may be created and used from any thread.

    On a backend with several devices, calls that create device objects
    (streams, events, the completion engine's events) first make the
    runtime's device current on the calling thread, as HIP/CUDA require; code
    that relies on the thread's current device afterwards should set it itself.
    """

    def __init__(
        self,
        backend: Backend,
        device: int,
        *,
        host_allocator: str | AllocatorFactory | Allocator = "caching",
        device_allocator: str | AllocatorFactory | Allocator = "caching",
        python_host_switch_interval: float | None = DEFAULT_SWITCH_INTERVAL,
        stream_signals: bool = False,
        await_poll_us: float = DEFAULT_AWAIT_POLL_US,
        lease: BackendLease | None = None,
    ) -> None:
        self._backend = backend  # the tracing wrapper while a trace is open (see _trace_backend.py)
        self._base_backend = backend  # the backend itself, always
        self._device = device
        self._lease = lease  # None: this runtime owns the backend and closes it
        # several devices visible: make this device current before creating device objects
        self._multi_device = backend.device_count() > 1
        self._peer: Stream | None = None  # the peer stream (streamrt._peer), made on first use
        self._closed = False
        self._closing = False
        self._lock = threading.Lock()
        self._streams: weakref.WeakSet[Stream] = weakref.WeakSet()
        self._events: weakref.WeakSet[Event] = weakref.WeakSet()
        # native host functions by id(): (function, address), kept alive until close
        self._native_functions: dict[int, tuple[object, int]] = {}
        self._tracer: Any = None  # a tracer while tracing is on (its backend wrapper is installed: _trace_backend.py)
        self._kernel_names: dict[int, str] = {}  # kernel function handle -> name (traces name launches)
        self._graph_names: dict[int, tuple[str, tuple[str, ...]]] = {}  # graph exec -> pipeline, node names (traces)
        self._last_trace: Trace | None = None
        self._torch_context: Any = None  # streamrt.torch's per-runtime state, made on first use
        self._schedulers: weakref.WeakSet[Scheduler] = weakref.WeakSet()
        self._capabilities = backend.capabilities(device)
        self.releaser = Releaser()
        self._captures = Captures()  # streamrt's captures in progress (device-wide waits wait for them)
        if self._multi_device:  # frees and device-wide syncs on the releaser thread act on this device
            self.releaser.submit(backend.ensure_device, device)
        # one pool for every bookkeeping event; with several devices it makes them on this one
        self._event_pool = EventPool(backend, device, multi_device=self._multi_device)
        try:
            self._engine = CompletionEngine(
                backend,
                device,
                events=self._event_pool,
                python_host_switch_interval=python_host_switch_interval,
                stream_signals=stream_signals,
                await_poll_us=await_poll_us,
            )
        except BaseException:  # a bad option: nothing else was started
            self.releaser.close()
            self._event_pool.close()
            raise
        try:
            self._host_allocator = self._make_allocator(host_allocator, HOST)
            try:
                self._device_allocator = self._make_allocator(device_allocator, DEVICE)
            except BaseException:
                if self._host_allocator is not host_allocator:  # made here, not the caller's
                    self._host_allocator.close()
                raise
        except BaseException:
            self._engine.close()
            self.releaser.close()
            self._event_pool.close()
            raise

    # -- identity -----------------------------------------------------------------------
    @property
    def backend_name(self) -> str:
        """``"hip"``, ``"cuda"`` or ``"sim"``."""
        return self._backend.name

    @property
    def backend(self) -> Backend:
        """The backend object (plain primitives over int handles): an escape hatch. Work enqueued
        through it directly is not traced."""
        return self._base_backend

    @property
    def device(self) -> int:
        """The device this runtime's streams, events and device buffers belong to."""
        return self._device

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    @property
    def event_pool(self) -> EventPool:
        """The runtime's idle bookkeeping events (non-timing, blocking-sync raw handles), shared by
        the completion engine, forks and joins, and the allocators' fences: ``take()`` one, record
        it, and ``give()`` it back once every wait on and query of that record is done or enqueued.
        Any thread; never blocks. Closed with the runtime."""
        return self._event_pool

    @property
    def is_closed(self) -> bool:
        return self._closed

    # -- factories ------------------------------------------------------------------------
    def create_stream(self, priority: int = 0, *, name: str | None = None) -> Stream:
        """A new non-blocking stream. ``priority`` follows HIP/CUDA: lower numbers run first;
        it is clamped into the device's range (``capabilities.priority_range``)."""
        self._check_open()
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an int, got {type(priority).__name__}")
        priority = priority_clamp(priority, self._capabilities.priority_range)
        with self._lock:  # not while close() runs: every stream it will close is registered first
            self._check_accepting()
            self._backend.ensure_device(self._device)
            handle = self._backend.stream_create(priority)
            try:
                stream = Stream(self, handle, priority=priority, owned=True, name=name)
            except BaseException:
                self._backend.stream_destroy(handle)
                raise
            self._streams.add(stream)
        return stream

    def wrap_stream(self, obj: Any, *, name: str | None = None) -> Stream:
        """Wrap a foreign stream: an object with ``__cuda_stream__`` (cuda.core, torch 2.10+),
        a torch stream (``.cuda_stream``), a CuPy stream (``.ptr``), or a raw int handle.
        The stream is not destroyed by streamrt."""
        self._check_open()
        if isinstance(obj, Stream):
            if obj._runtime is not self:
                raise ValueError("stream belongs to another runtime")
            return obj
        handle = foreign_stream_handle(obj, self)
        with self._lock:
            self._check_accepting()
            stream = Stream(self, handle, owned=False, name=name, foreign=obj if obj is not handle else None)
            self._streams.add(stream)
        return stream

    def create_event(self, *, timing: bool = False) -> Event:
        """A new (blocking-sync) event; ``timing=True`` allows :meth:`Event.elapsed_ms`."""
        with self._lock:
            self._check_accepting()
            if self._multi_device:
                self._backend.ensure_device(self._device)
            handle = self._backend.event_create(timing=bool(timing), blocking_sync=True)
            event = Event(self, handle, bool(timing))
            self._events.add(event)
        return event

    def as_buffer(self, obj: Any, nbytes: int | None = None, *, stream: Stream | None = None) -> Buffer:
        """Wrap foreign memory (buffer protocol, ``__cuda_array_interface__``, DLPack) as a Buffer.

        ``nbytes`` limits it to its first ``nbytes`` bytes. The Buffer keeps ``obj`` alive.
        ``stream``: the stream that will use it, ordered now (on the device) after the
        producer's stream the object names (docs/interop.md); without it nothing is ordered.
        """
        self._check_open()
        if stream is not None and (not isinstance(stream, Stream) or stream._runtime is not self):
            raise TypeError("as_buffer's stream= takes a Stream of this runtime")
        buf = wrap_foreign(obj, self, nbytes, stream=stream)
        if buf.runtime is not self:
            raise ValueError("buffer belongs to another runtime or device")
        return buf

    def scheduler(self, streams: int = 4, *, max_in_flight: int | None = 64, max_pinned_bytes: int | None = None) -> Scheduler:
        """An asyncio stream scheduler over ``streams`` streams per priority, with bounded in-flight
        work (by count and pinned bytes) that makes callers wait. See docs/asyncio.md."""
        self._check_open()
        sched = hook("scheduler")(self, streams=streams, max_in_flight=max_in_flight, max_pinned_bytes=max_pinned_bytes)
        with self._lock:
            self._schedulers.add(sched)
        return sched

    @property
    def kernels(self) -> KernelLibrary:
        """Runtime-compiled kernels of this runtime: ``rt.kernels.get("fill_u32")`` (docs/kernels.md)."""
        return hook("kernels")(self)  # type: ignore[no-any-return]

    def fetch(self, tensor: Any, stream: Stream | None = None, *, dtype: Any = None) -> FetchFuture:
        """A host copy (numpy) of ``tensor`` (a torch tensor, or a Buffer with ``stream=``/``dtype=``) as an
        awaitable future; never blocks and never synchronizes the stream. See ``streamrt.torch.fetch``."""
        return hook("fetch")(self, tensor, stream, dtype=dtype)  # type: ignore[no-any-return]

    # -- tracing -----------------------------------------------------------------------------------
    def trace(self, *, name: str = "trace") -> TraceRegion:
        """Trace one region: ``with rt.trace() as t: ...``; then ``t.report()``, ``t.save_chrome(path)``.
        Leaving the region synchronizes the device (device times are read then)."""
        return trace_region(self, name=name)

    def stop_trace(self) -> Trace:
        """Stop tracing started by ``open_runtime(trace=True)`` and return the trace."""
        return stop_trace(self)

    @property
    def last_trace(self) -> Trace | None:
        """The most recent finished trace (for ``trace=True`` runtimes, set by ``close``)."""
        return self._last_trace

    # -- allocators ------------------------------------------------------------------------------
    @property
    def host_allocator(self) -> Allocator:
        """Pinned host memory: ``rt.host_allocator.allocate(n)``."""
        return self._host_allocator

    @property
    def device_allocator(self) -> Allocator:
        """Device memory: ``rt.device_allocator.allocate(n, stream=s)``."""
        return self._device_allocator

    def _make_allocator(self, spec: str | AllocatorFactory | Allocator, kind: str) -> Allocator:
        if spec == "raw":
            return RawAllocator(self, kind)
        if spec == "caching":
            try:
                from allocators import default_allocator  # lazily: allocators depends on streamrt
            except ImportError:
                return RawAllocator(self, kind)
            return default_allocator(self, kind)
        if isinstance(spec, str):
            raise ValueError(f"unknown allocator {spec!r}: use 'caching', 'raw', an allocator or a factory")
        if isinstance(spec, Allocator):
            if spec.kind != kind:
                raise ValueError(f"a {spec.kind} allocator cannot serve {kind} memory")
            return spec
        if callable(spec):
            allocator = spec(self, kind)
            if not isinstance(allocator, Allocator):
                raise TypeError("the allocator factory must return an object implementing streamrt.Allocator")
            return allocator
        raise TypeError(f"cannot use {type(spec).__name__} as an allocator")

    # -- whole-device operations -------------------------------------------------------------------
    def synchronize(self) -> None:
        """Block until all work on the device has completed (the GIL is released).

        Raises ``RuntimeError`` on a runtime thread (a Python host function, a done callback).
        """
        refuse_blocking_wait("rt.synchronize()")
        self._check_open()
        if self._multi_device:
            self._backend.ensure_device(self._device)
        self._backend.device_synchronize()

    def close(self) -> None:
        """Drain and shut down, deterministically: waits for all in-flight work and
        completions, closes the allocators, destroys owned streams and events, stops
        the runtime's threads, and closes the backend (a shared backend: once its
        last runtime closes). Idempotent.

        Raises ``RuntimeError`` at once, changing nothing, when called from one
        of the runtime's own threads (a Python host function, a done callback,
        a completion lane, the releaser): it would wait for itself."""
        if self._engine.owns_thread() or threading.get_ident() == self.releaser.thread_ident:
            raise RuntimeError(
                "rt.close() cannot close the runtime from its own thread (a host function, a done "
                "callback or another runtime thread): it would wait for itself; close it from "
                "another thread, e.g. after awaiting the work"
            )
        with self._lock:
            if self._closed or self._closing:
                return  # closed, or another thread is closing it
            self._closing = True
            streams = list(self._streams)
            events = list(self._events)
            schedulers = list(self._schedulers)
        for sched in schedulers:
            sched.close()
        for s in streams:  # after any enqueue in progress on another thread; later ones raise ClosedError
            s._refuse_work()
        if self._tracer is not None:
            finish_on_close(self)
        try:
            if self._multi_device:
                self._backend.ensure_device(self._device)
            self._backend.device_synchronize()
        finally:
            self._engine.close()
            for allocator in (self._host_allocator, self._device_allocator):
                allocator.close()
            self.releaser.close()
            self._event_pool.close()
            for s in streams:
                s._release()
            for e in events:
                e.close()
            hook("close_kernels")(self)  # unload kernel modules while the backend is still open
            self._closed = True
            if self._lease is not None:
                self._lease.release()
            else:
                self._backend.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- bookkeeping ---------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("runtime is closed")

    def _check_accepting(self) -> None:
        """Under ``_lock``: no new streams or events once ``close`` has begun."""
        if self._closed or self._closing:
            raise ClosedError("runtime is closed")

    def _forget_stream(self, stream: Stream) -> None:
        with self._lock:
            self._streams.discard(stream)
        self._engine.forget_stream(stream.handle)

    def _peer_stream(self) -> Stream:
        """This runtime's peer stream: it waits for copies that other devices' streams make with this
        runtime's buffers, and those buffers are marked with it (see ``streamrt._peer``)."""
        stream = self._peer
        if stream is None:
            made = self.create_stream(name=f"peer-copies-{self._device}")
            with self._lock:
                stream = self._peer
                if stream is None:
                    stream = self._peer = made
            if stream is not made:
                made.close()
        return stream

    def __repr__(self) -> str:
        return f"<Runtime {self.backend_name}:{self._device}{' closed' if self._closed else ''}>"
