"""streamrt.torch: overlap-friendly training loops with PyTorch.

torch is optional: importing this package does not import torch (the first
call that needs it does, and raises ``ImportError`` with the install hint
when it is missing). ``import streamrt`` never imports it.

* Interop: :func:`wrap_stream` / :func:`as_torch_stream` (streams both ways),
  :func:`current_stream`, :func:`tensor_buffer` (tensors as Buffers),
  :func:`device_empty` (device tensors of the runtime), :func:`order_after`,
  :func:`record_stream` (the caching allocator's stream semantics),
  :func:`torch_allocators` (streamrt allocators over torch's memory).
* :func:`fetch` -> :class:`FetchFuture`: a numpy copy of a tensor, D2H through
  pinned staging, resolved when it lands; never synchronizes a stream.
* :class:`MetricsLogger`: logs each step's loss a few steps late, never blocking.
* :class:`Prefetcher`: stages the next batches (tensors, dicts, tuples; varlen
  ``cu_seqlens`` batches) to the device on a side stream through pinned
  staging, handing them to the compute stream with events.

The guide is ``docs/training-loops.md``; on the simulator (CI) the same code
runs with CPU torch (see :mod:`streamrt.torch._context`).
"""

from __future__ import annotations

from ._fetch import FetchFuture, fetch
from ._interop import (
    as_torch_stream,
    current_stream,
    device_empty,
    order_after,
    record_stream,
    tensor_buffer,
    torch_allocators,
    wrap_stream,
)
from ._metrics import MetricsLogger, MetricsStatistics
from ._prefetch import Prefetcher, PrefetchStatistics
from ._tracing import trace_host_wait, trace_torch

__all__ = [
    "FetchFuture",
    "MetricsLogger",
    "MetricsStatistics",
    "PrefetchStatistics",
    "Prefetcher",
    "as_torch_stream",
    "current_stream",
    "device_empty",
    "fetch",
    "order_after",
    "record_stream",
    "tensor_buffer",
    "torch_allocators",
    "trace_host_wait",
    "trace_torch",
    "wrap_stream",
]
