"""Events: markers recorded into a stream, waited on by streams, threads and coroutines."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generator

from ._completion import refuse_blocking_wait
from ._errors import ClosedError

if TYPE_CHECKING:
    from ._completion import Completion
    from ._runtime import Runtime

__all__ = ["Event"]


class Event:
    """A backend event. Create with ``rt.create_event(timing=...)`` or ``stream.record()``.

    Events are created blocking-sync: :meth:`synchronize` sleeps instead of
    spinning. An event that was never recorded counts as done.

    ``await event`` waits on a runtime thread and never blocks the event loop;
    cancelling the awaiting task cancels only the wait.
    """

    __slots__ = ("_runtime", "_handle", "_timing", "_recorded_on", "_closed", "__weakref__")

    def __init__(self, runtime: Runtime, handle: int, timing: bool) -> None:
        self._runtime = runtime
        self._handle = handle
        self._timing = timing
        self._recorded_on = 0  # stream handle of the last record; keys the completion lane
        self._closed = False

    @property
    def handle(self) -> int:
        """The raw backend event handle."""
        return self._handle

    @property
    def device(self) -> int:
        """The device the event belongs to (its runtime's): it is recorded on streams of that device."""
        return self._runtime._device

    @property
    def runtime(self) -> Runtime:
        return self._runtime

    @property
    def timing(self) -> bool:
        """Whether the event records a timestamp usable with :meth:`elapsed_ms`."""
        return self._timing

    @property
    def is_done(self) -> bool:
        """``True`` when the work before the last record has completed. Non-blocking."""
        self._check_open()
        return self._runtime.backend.event_query(self._handle)

    def synchronize(self) -> None:
        """Block the calling thread until the event has completed (the GIL is released).

        Raises ``RuntimeError`` on a runtime thread (a Python host function, a done callback).
        """
        refuse_blocking_wait("event.synchronize()")
        self._check_open()
        self._runtime._backend.event_synchronize(self._handle)

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds from this event to ``end`` (virtual time on the simulator).

        Both events must be timing events that have completed, recorded on one
        device (devices have no common clock).
        """
        self._check_open()
        if not isinstance(end, Event):
            raise TypeError(f"elapsed_ms takes an Event, not {type(end).__name__}")
        end._check_open()
        if end._runtime is not self._runtime and (
            end._runtime._base_backend is not self._runtime._base_backend or end._runtime._device != self._runtime._device
        ):
            raise ValueError(
                f"elapsed_ms needs two events of one device and backend instance; got {self._runtime!r} and {end._runtime!r}"
            )
        if not (self._timing and end._timing):
            raise ValueError("elapsed_ms needs two timing events: rt.create_event(timing=True)")
        return self._runtime.backend.event_elapsed_ms(self._handle, end._handle)

    def completion(self) -> Completion:
        """A :class:`Completion` resolved when this event has completed."""
        self._check_open()
        return self._runtime._engine.event_completion(self._handle, self._recorded_on)

    def __await__(self) -> Generator[Any, None, None]:
        return self.completion().__await__()

    def close(self) -> None:
        """Destroy the backend event. Idempotent. Work already waiting on it is unaffected."""
        rt = self._runtime
        with rt._lock:  # one close, also when the runtime's close closes it from another thread
            if self._closed:
                return
            self._closed = True
            rt._events.discard(self)
        if not rt.is_closed:
            rt.backend.event_destroy(self._handle)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("event is closed")
        if self._runtime._closed:
            raise ClosedError("runtime is closed")

    def __repr__(self) -> str:
        return (
            f"<Event 0x{self._handle:x} device={self._runtime._device}{' timing' if self._timing else ''}"
            f"{' closed' if self._closed else ''}>"
        )
