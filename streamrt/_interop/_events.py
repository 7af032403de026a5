"""Ordering a streamrt stream after other libraries' work: foreign events, foreign streams, collectives.

``Stream.wait(obj)`` hands every object that is not a streamrt Event to
:func:`wait_foreign`. Accepted, each ordered on the device with no host
synchronization on the calling thread:

* a torch ``torch.cuda.Event`` (``.cuda_event``; one never recorded is done,
  as in torch), a CuPy ``cupy.cuda.Event`` (``.ptr``), a cuda.core ``Event``
  (``.handle``): the stream waits on the event's driver handle;
* a ``torch.distributed`` ``Work`` from ``async_op=True``: on a GPU runtime
  torch makes the stream wait (``Work.block_current_stream()`` with the stream
  as torch's current stream: for NCCL a device-side wait on the collective's
  end, for CPU collectives such as Gloo a device-side wait on a flag the host
  sets); on the simulator, where torch's collectives run on the host, a host
  function on the stream waits for the Work on a runtime worker thread, so
  the stream, not the caller, waits.

Thread rules: any thread; each wait holds the stream's enqueue lock while it enqueues.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from .._extensions import hook

if TYPE_CHECKING:
    from .._stream import Stream

__all__ = ["order_after_foreign_stream", "wait_event_handle", "wait_foreign"]


def wait_event_handle(stream: Stream, event: int) -> None:
    """Later work on ``stream`` waits for the raw backend event ``event`` (traced as a ``wait_event``)."""
    with stream.lock:
        stream._check_open()
        stream._backend.stream_wait_event(stream.handle, event)  # the tracing wrapper while a trace is open


def order_after_foreign_stream(stream: Stream, producer: int) -> None:
    """Later work on ``stream`` waits for the work enqueued so far on the raw stream handle ``producer``.

    An event of the runtime's pool is recorded on ``producer``, waited on by
    ``stream`` and given back at once (the wait holds). Nothing when
    ``producer`` is ``stream`` itself. Non-blocking.
    """
    if producer == stream.handle:
        return
    stream._check_open()
    runtime = stream.runtime
    pool = runtime.event_pool
    event = pool.take()  # made on the runtime's device, as the producer's stream is
    try:
        runtime.backend.event_record(event, producer)  # a foreign stream: not traced
        wait_event_handle(stream, event)
    finally:
        pool.give(event)


def _foreign_event_handle(obj: Any) -> int | None:
    """The driver handle of a torch, cuda.core or CuPy event; ``None`` for anything else."""
    if hasattr(obj, "cuda_event"):  # torch.cuda.Event: 0 until it is first recorded
        return int(obj.cuda_event)
    if type(obj).__module__.startswith("cuda.core") and hasattr(obj, "handle"):  # cuda.core Event
        return int(obj.handle)
    if hasattr(obj, "ptr") and callable(getattr(obj, "record", None)) and not hasattr(obj, "wait_event"):  # CuPy Event
        return int(obj.ptr)
    return None


def _is_distributed_work(obj: Any) -> bool:
    dist = sys.modules.get("torch.distributed")  # never imports torch
    work = getattr(dist, "Work", None) if dist is not None else None
    return isinstance(work, type) and isinstance(obj, work)


def wait_for_work(work: Any) -> None:
    """Run on a runtime worker thread, in stream order: block there until ``work`` has completed."""
    work.wait()


def _wait_work(stream: Stream, work: Any) -> None:
    if stream.runtime.capabilities.is_simulated:
        stream.launch_host_func(wait_for_work, work)
        return
    block = getattr(work, "block_current_stream", None)
    if not callable(block):
        raise TypeError(
            "this torch's distributed Work has no block_current_stream(): order a stream after a collective "
            "with a newer torch, or record a torch.cuda.Event after it and pass that event"
        )
    import torch  # loaded already: the caller holds one of its Work objects

    torch_stream = hook("as_torch_stream")(stream)

    def enqueue() -> None:
        with torch.cuda.stream(torch_stream):
            block()

    with stream.lock:
        stream._check_open()
        tracer = stream.runtime._tracer
        if tracer is None:
            enqueue()
        else:
            tracer.op(stream, "wait_event", 0, enqueue, name="torch.distributed Work")


def wait_foreign(stream: Stream, obj: Any) -> None:
    """``stream.wait(obj)`` for ``obj`` that is not a streamrt Event (see the module docstring). Non-blocking.

    Raises ``TypeError`` for anything else, with what to pass instead.
    """
    stream._check_open()
    handle = _foreign_event_handle(obj)
    if handle is not None:
        if handle:
            wait_event_handle(stream, handle)
        return
    if _is_distributed_work(obj):
        _wait_work(stream, obj)
        return
    if hasattr(obj, "__cuda_stream__") or hasattr(obj, "cuda_stream") or hasattr(obj, "wait_event"):
        raise TypeError(
            f"wait takes an event; {type(obj).__name__} is a stream: use stream.wait_stream(...) "
            "(with rt.wrap_stream(obj) for another library's stream)"
        )
    raise TypeError(
        f"wait takes an Event (streamrt, torch.cuda, CuPy or cuda.core) or a torch.distributed Work, "
        f"not {type(obj).__name__}"
    )
