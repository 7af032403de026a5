"""Tracing as a backend wrapper: installed on a runtime while a trace is open, gone when it closes.

:func:`install` puts a :class:`TracingBackend` in place of the runtime's
backend (``Runtime._backend`` and each of its streams' ``_backend``); every
enqueue the core makes then goes through it and reaches the tracer
(:meth:`Tracer.op`, :meth:`Tracer.blocking`), labelled with the pipeline and
node names in effect (:func:`~streamrt._trace_labels.label`, which pipelines set
while tracing). :func:`uninstall` puts the backend back. With no trace open,
the enqueue paths call the backend directly: there is no traced twin of any
enqueue code and no tracer test at an enqueue site.

What is traced: memsets, copies (peer copies too), kernel launches (named by
their kernel), native host functions, Python host functions (the first of
their two host functions; the worker times the function's run), event
records and waits, graph launches (named by their pipeline and its nodes),
and blocking synchronizes. The completion engine's own events are not: it
keeps the raw backend, and so does the tracer for its timing events.

Thread rules: as the backend's. Install and uninstall from the thread that
starts and stops the trace.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from collections.abc import Callable

from ._backends.protocol import MemcpyKind
from ._native import HOLD_ADDRESS, SEM_POST_ADDRESS
from ._ranges import Ranges, for_runtime
from ._trace_labels import current_label, range_name

if TYPE_CHECKING:
    from ._runtime import Runtime
    from ._stream import Stream
    from ._tracer import Tracer

__all__ = ["RangesOnly", "TracingBackend", "install", "install_ranges", "uninstall"]

_COPY_KINDS = {kind: kind.name.lower() for kind in MemcpyKind}


class TracingBackend:
    """The runtime's backend, with each enqueue and blocking call handed to ``tracer``. Anything else passes through."""

    native_ops = None  # every call goes through the wrapper, so that the trace sees it

    def __init__(self, inner: Any, tracer: Tracer | RangesOnly, runtime: Runtime) -> None:
        self._inner = inner
        self._tracer = tracer
        self._runtime = runtime
        self._by_handle: dict[int, Stream] = {}
        self._open: dict[int, Any] = {}  # stream handle -> its Python host call between its two halves
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _stream(self, handle: int) -> Stream:
        """The runtime's Stream of ``handle`` (for its name); a stand-in for a handle streamrt does not know."""
        known = self._by_handle.get(handle)
        if known is not None and not known._released:
            return known
        for s in list(self._runtime._streams):
            if s._handle == handle and not s._released:
                self._by_handle[handle] = s
                return s
        return _Unknown(handle)  # type: ignore[return-value]

    # -- enqueues ------------------------------------------------------------------------------------
    def memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        inner = self._inner
        self._tracer.op(self._stream(stream), "memset", nbytes, lambda: inner.memset_async(ptr, value, nbytes, stream))

    def memcpy_async(self, dst: int, src: int, nbytes: int, kind: MemcpyKind, stream: int) -> None:
        inner = self._inner
        self._tracer.op(self._stream(stream), _COPY_KINDS[kind], nbytes, lambda: inner.memcpy_async(dst, src, nbytes, kind, stream))

    def memcpy_peer_async(self, dst: int, dst_device: int, src: int, src_device: int, nbytes: int, stream: int) -> None:
        inner = self._inner
        self._tracer.op(
            self._stream(stream),
            "device_to_device",
            nbytes,
            lambda: inner.memcpy_peer_async(dst, dst_device, src, src_device, nbytes, stream),
        )

    def launch_kernel(self, function: int, grid: Any, block: Any, shared_mem: int, stream: int, args: int) -> None:
        inner = self._inner
        name = self._runtime._kernel_names.get(function)
        self._tracer.op(
            self._stream(stream), "kernel", 0, lambda: inner.launch_kernel(function, grid, block, shared_mem, stream, args), name=name
        )

    def launch_host_func(self, stream: int, fn_ptr: int, user_data: int) -> None:
        inner = self._inner
        if fn_ptr == SEM_POST_ADDRESS:  # a Python host function: one op from this call to its hold
            worker = self._runtime._engine._workers.get(user_data)
            if worker is not None:
                p = self._tracer.host_call_begin(self._stream(stream), worker)
                inner.launch_host_func(stream, fn_ptr, user_data)  # raises: the op stays out of the trace
                self._open[stream] = p
                return
        elif fn_ptr == HOLD_ADDRESS and stream in self._open:  # its hold
            inner.launch_host_func(stream, fn_ptr, user_data)
            self._tracer.host_call_end(self._open.pop(stream))
            return
        self._tracer.op(self._stream(stream), "host_native", 0, lambda: inner.launch_host_func(stream, fn_ptr, user_data))

    def stream_wait_signal(self, stream: int, signal: int, value: int) -> None:
        self._inner.stream_wait_signal(stream, signal, value)
        if stream in self._open:  # the signal hold of a Python host function
            self._tracer.host_call_end(self._open.pop(stream))

    def event_record(self, event: int, stream: int) -> None:
        inner = self._inner
        self._tracer.op(self._stream(stream), "record", 0, lambda: inner.event_record(event, stream), event=event)

    def stream_wait_event(self, stream: int, event: int) -> None:
        inner = self._inner
        self._tracer.op(self._stream(stream), "wait_event", 0, lambda: inner.stream_wait_event(stream, event), event=event)

    def graph_launch(self, graph_exec: int, stream: int) -> None:
        inner = self._inner
        pipeline, node_names = self._runtime._graph_names.get(graph_exec, (None, None))
        self._tracer.op(
            self._stream(stream),
            "graph_launch",
            0,
            lambda: inner.graph_launch(graph_exec, stream),
            pipeline=pipeline,
            node_names=node_names,
        )

    # -- blocking ------------------------------------------------------------------------------------
    def stream_synchronize(self, stream: int) -> None:
        inner = self._inner
        self._tracer.blocking(self._stream(stream), "stream.synchronize", lambda: inner.stream_synchronize(stream))

    def device_synchronize(self) -> None:
        self._tracer.blocking(None, "runtime.synchronize", self._inner.device_synchronize)

    def event_synchronize(self, event: int) -> None:
        inner = self._inner
        self._tracer.blocking(None, "event.synchronize", lambda: inner.event_synchronize(event))


class RangesOnly:
    """What the wrapper hands ops to when no trace is open but ``STREAMRT_RANGES=1`` asks for
    profiler ranges: each op, Python host function run and blocking call becomes a range."""

    def __init__(self, ranges: Ranges) -> None:
        self._ranges = ranges

    def op(self, stream: Any, kind: str, nbytes: int, enqueue: Callable[[], Any], *, name: str | None = None,
           pipeline: str | None = None, node: str | None = None, **_: Any) -> Any:
        labels = current_label()
        with self._ranges.range(range_name(pipeline or labels[0], node or labels[1], name or kind)):
            return enqueue()

    def host_call_begin(self, stream: Any, worker: Any) -> Any:
        queue = worker._queue
        req = queue[-1] if queue else None
        if req is not None and req.trace is None:
            labels = current_label()
            fn = req.fn or getattr(worker, "fn", None)
            name = range_name(labels[0], f"host {labels[1] or getattr(fn, '__qualname__', 'function')}", "host function")
            req.trace = _RangedRun(self._ranges, name)
        return None

    def host_call_end(self, _p: Any) -> None:
        pass

    def blocking(self, stream: Any, what: str, call: Callable[[], None]) -> None:
        with self._ranges.range(what):
            call()


class _RangedRun:
    """A Python host function's run inside a profiler range (on its worker thread)."""

    __slots__ = ("_name", "_ranges")

    def __init__(self, ranges: Ranges, name: str) -> None:
        self._ranges = ranges
        self._name = name

    def __call__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, BaseException | None]:
        with self._ranges.range(self._name):
            try:
                return fn(*args), None
            except BaseException as exc:  # noqa: BLE001 - delivered to the awaiter by the worker
                return None, exc


class _Unknown:
    """A stream handle streamrt did not make or wrap (the tracer names it by its handle)."""

    __slots__ = ("handle", "name")

    def __init__(self, handle: int) -> None:
        self.handle = handle
        self.name = f"stream-0x{handle:x}"


def install(rt: Runtime, tracer: Tracer | RangesOnly) -> None:
    """Route ``rt``'s enqueues through ``tracer`` (see the module docstring); replaces a wrapper in place."""
    uninstall(rt)
    wrapped = TracingBackend(rt._backend, tracer, rt)
    rt._backend = wrapped
    for s in list(rt._streams):
        s._backend = wrapped


def install_ranges(rt: Runtime) -> None:
    """With ``STREAMRT_RANGES=1`` and a range library for ``rt``'s device: ranges with no trace open."""
    ranges = for_runtime(rt)
    if ranges is not None:
        install(rt, RangesOnly(ranges))


def uninstall(rt: Runtime) -> None:
    """Put ``rt``'s own backend back."""
    wrapped = rt._backend
    if isinstance(wrapped, TracingBackend):
        rt._backend = wrapped._inner
        for s in list(rt._streams):
            if s._backend is wrapped:
                s._backend = wrapped._inner
