"""torch work on streamrt timelines: spans for torch's kernels and for host waits.

streamrt traces the work it enqueues itself (``rt.trace()``); torch's kernels
are invisible to it. These helpers make a region of torch work (a forward and
backward pass, an optimizer step, a graph replay) one span on the stream it
runs on, and a host wait (``loss.item()``, ``.cpu()``) one blocking record,
so a training step reads on the same timeline as the copies, host functions
and events streamrt enqueued. With tracing off they call the function and
cost one attribute test.

On a GPU the span is bracketed by two timing events on the stream, so it
runs from the start of the region's first kernel to the end of its last
(gaps included). On the simulator torch runs on the CPU and enqueues nothing,
so a span records its host time only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ._interop import current_stream

if TYPE_CHECKING:
    from .._runtime import Runtime
    from .._stream import Stream

__all__ = ["trace_host_wait", "trace_torch"]

T = TypeVar("T")


def trace_torch(rt: Runtime, name: str, fn: Callable[..., T], *args: Any, stream: Stream | None = None) -> T:
    """Run ``fn(*args)`` -- torch work enqueued on ``stream`` (default: torch's current stream) --
    and, while ``rt`` is traced, record it as one span named ``name`` (kind ``"kernel"``)."""
    tracer = rt._tracer
    if tracer is None:
        return fn(*args)
    s = current_stream(rt) if stream is None else stream
    return tracer.op(s, "kernel", 0, lambda: fn(*args), name=name)  # type: ignore[no-any-return]


def trace_host_wait(rt: Runtime, what: str, fn: Callable[..., T], *args: Any, stream: Stream | None = None) -> T:
    """Run ``fn(*args)`` -- a call that blocks the host (``loss.item()``) -- and, while ``rt`` is
    traced, record how long it blocked, as a blocking record named ``what``."""
    tracer = rt._tracer
    if tracer is None:
        return fn(*args)
    out: list[T] = []
    tracer.blocking(stream, what, lambda: out.append(fn(*args)))
    return out[0]
