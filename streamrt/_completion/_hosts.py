"""The host-call side of the completion engine: Python and native host functions, graph host
slots, the stream workers (channels) and their signals, and the switch-interval guard.

:class:`_HostCalls` is a mixin of :class:`~streamrt._completion.CompletionEngine`
(its methods use the engine's lock, lanes and event pool); how one call runs
is described in :mod:`streamrt._hostcall`. Thread rules: as for the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._errors import CaptureError
from .._hostcall import HostChannel, HostRequest, HostSlot
from .._switch_interval import switch_interval_guard
from ._future import Completion
from ._lane import _Entry

if TYPE_CHECKING:
    import threading

    from .._backends.protocol import Backend
    from .._host_work import HostWorkEstimates
    from ._future import _LoopNotifier
    from ._lane import _Lane

__all__: list[str] = []


class _HostCalls:
    """Host functions of a :class:`~streamrt._completion.CompletionEngine` (a mixin; see the module docstring)."""

    if TYPE_CHECKING:  # made by CompletionEngine.__init__; the engine's methods used here
        _backend: Backend
        _lock: threading.Lock
        _notifier: _LoopNotifier
        _pool: list[int]
        _channels: dict[int, HostChannel]
        _uses_signals: bool
        _signals: list[int] | None
        _slots: set[HostSlot]
        _host_calls: int
        _python_in_flight: int
        _holds_guard: bool
        _switch_interval: float | None
        _expect_host_work: Callable[[Any], None] | None
        _host_work: HostWorkEstimates | None

        def _lane(self, key: int) -> _Lane: ...
        def _check_open(self) -> None: ...
        def _acquire_event(self) -> int: ...
        def completion_for_stream(self, stream: int, *, keepalive: object = None) -> Completion: ...

    def _new_completion(self) -> Completion:
        completion = Completion()
        completion._notifier = self._notifier
        return completion

    def host_call(
        self, stream: int, fn: Callable[..., Any], args: tuple[Any, ...] = (), *, capture_checked: bool = False, backend: Any = None
    ) -> Completion:
        """Run the Python ``fn(*args)`` in stream order on a runtime worker thread.

        Enqueues two native host functions on ``stream``: ``sem_post(ready)``
        wakes the stream's worker, ``sem_wait(done)`` holds the stream
        (GIL-free on the driver thread) until the worker has run ``fn``. The
        returned Completion resolves with ``fn``'s return value or exception
        (the stream goes on either way), on the stream's lane, in stream order
        with the stream's other Completions; if the stream fails before
        reaching the call, ``fn`` never runs and the Completion gets the
        error. ``fn`` must not call HIP/CUDA, and a long ``fn`` blocks its
        stream. Raises ``CaptureError`` if ``stream`` is capturing (use
        :meth:`host_slot` for graphs). ``capture_checked``: the caller has just
        checked that ``stream`` is not capturing (a pipeline launch), so the
        check is not repeated. ``backend``: the stream's, for the two host
        functions (a tracing wrapper while a trace is open); the guard event
        is the engine's own.
        """
        if not callable(fn):
            raise TypeError(f"host function must be callable, got {type(fn).__name__}")
        own = self._backend  # the guard event is the engine's
        lane = self._lane(stream)
        with lane.lock:
            lane._depth += 1  # a record-and-push section (see _Lane, "Order")
            try:
                self._check_open()
                if not capture_checked and own.stream_is_capturing(stream):
                    raise CaptureError(
                        "host_call cannot be captured: a captured host node must re-run on every replay; "
                        "use CompletionEngine.host_slot (pipelines do this in Pipeline.capture)"
                    )
                channel = self._channel(stream)
                completion = self._new_completion()
                req = channel.submit(HostRequest(fn, tuple(args), completion, committed=False), backend)
                self._host_calls += 1
                # The guard event after the call: its lane resolves the Completion in stream
                # order, and fails the call instead if the stream dies before reaching it.
                event = self._acquire_event()
                try:
                    own.event_record(event, stream)
                except BaseException as exc:
                    self._pool.append(event)
                    channel.abandon(req, exc)  # no guard, no watchdog: fn will not run
                    raise
                completion._lanes = (lane,)
                lane.push(_Entry(event, None, None, None, True, req, channel, unordered=lane._depth > 1))
            finally:
                lane._depth -= 1
        # Only now: an error raised to the caller above is not also logged as never retrieved.
        completion._log_unretrieved = True
        return completion

    def host_request(self, stream: int, fn: Callable[..., Any], args: tuple[Any, ...], backend: Any = None) -> HostRequest:
        """A pipeline's Python host node: ``fn(*args)`` in stream order on the stream's worker, with no
        Completion of its own and no guard event.

        The launch's Run reads the outcome once its tail event retires (the
        tail follows the call's hold, so by then the call has run, or the
        stream failed and the Run abandons it: :meth:`~streamrt._hostcall._Worker.settle`).
        Call with the stream's enqueue lock held, and only when it is not capturing.
        """
        lane = self._lane(stream)
        with lane.lock:
            self._check_open()
            req = self._channel(stream).submit(HostRequest(fn, args, committed=False), backend)
            self._host_calls += 1
        return req

    def host_call_native(self, stream: int, fn_ptr: int, user_data: int, *, keepalive: object = None) -> None:
        """Enqueue the native ``void fn(void*)`` at ``fn_ptr``; it runs directly on the driver thread.

        Pass the ctypes/numba object owning ``fn_ptr`` (and whatever
        ``user_data`` points into) as ``keepalive``: it is held until the
        function has run and dropped on a lane thread after.
        """
        if not fn_ptr:
            raise ValueError("fn_ptr is NULL")
        with self._lane(stream).lock:
            self._check_open()
            self._backend.launch_host_func(stream, fn_ptr, user_data)
            if keepalive is not None:
                self.completion_for_stream(stream, keepalive=keepalive)

    def host_slot(self, fn: Callable[..., Any], args: tuple[Any, ...] = (), *, foreign: bool = False) -> HostSlot:
        """A captured Python host node for a graph; see :class:`~streamrt._hostcall.HostSlot`.

        The slot is owned by the Graph and lives as long as it; each replay
        runs ``fn(*args)`` on the slot's worker thread. ``foreign``: for a
        graph another library owns; the engine never stops it (its graph's
        release closes it).
        """
        self._check_open()
        slot = HostSlot(self, fn, tuple(args), foreign=foreign)  # type: ignore[arg-type]  # self is the CompletionEngine
        if foreign:
            return slot
        with self._lock:
            self._check_open()
            self._slots.add(slot)
        return slot

    def _forget_slot(self, slot: HostSlot) -> None:
        with self._lock:
            self._slots.discard(slot)

    def _channel(self, stream: int) -> HostChannel:
        channel = self._channels.get(stream)
        if channel is not None:
            return channel
        with self._lock:
            self._check_open()
            channel = self._channels.get(stream)
            if channel is None:
                channel = self._channels[stream] = HostChannel(self, stream, self._take_signal_locked())  # type: ignore[arg-type]
        return channel

    @property
    def stream_signals(self) -> bool:
        """``True`` when Python host calls hold their stream with a signal wait (one host function each)."""
        return self._uses_signals

    def _take_signal_locked(self) -> int | None:
        """A signal for a new channel (an idle one, else a new one); ``None`` without signals. Lock held."""
        if self._signals is None:
            return None
        if self._signals:
            return self._signals.pop()
        return self._backend.signal_alloc()

    def _return_signal(self, signal: int, *, reusable: bool) -> None:
        """A stopped channel's signal: kept for the next channel, else leaked.

        Leaked when a failed stream may still reach a wait on it, and when the
        engine has already freed its pool (a lane that outlived a forced
        close): a real free never runs on a lane thread.
        """
        with self._lock:
            if reusable and self._signals is not None:
                self._signals.append(signal)

    def _announce_host_work(self, fn: Callable[..., Any]) -> None:
        """Before what holds the stream for a Python host call: tell a simulator how long ``fn`` runs."""
        if self._host_work is not None and self._expect_host_work is not None:
            self._expect_host_work(self._host_work.for_function(fn))

    def _python_call_started(self) -> None:
        with self._lock:
            self._python_in_flight += 1
            if self._python_in_flight == 1 and self._switch_interval is not None and not self._holds_guard:
                self._holds_guard = True
                switch_interval_guard.acquire(self._switch_interval)

    def _python_call_finished(self) -> None:
        with self._lock:
            self._python_in_flight -= 1
            if self._python_in_flight == 0 and self._holds_guard:
                self._holds_guard = False
                switch_interval_guard.release()
