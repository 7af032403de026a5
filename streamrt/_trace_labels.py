"""Labels: the ``(pipeline, node)`` names of the ops enqueued in a block, read by traces and profiler ranges.

:func:`label` sets them (pipelines around each node they enqueue; users
around any code), :func:`current_label` reads them, and :func:`range_name`
makes the profiler-range name of an op from them. They follow the calling
context (a ``contextvars`` variable: per thread and per asyncio task).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

__all__ = ["current_label", "label", "range_name"]

_label: contextvars.ContextVar[tuple[str | None, str | None]] = contextvars.ContextVar(
    "streamrt_trace_label", default=(None, None)
)


@contextlib.contextmanager
def label(pipeline: str | None, node: str | None = None) -> Iterator[None]:
    """Name the ops enqueued inside the block: ``pipeline`` and ``node`` appear in traces and reports.

    Pipelines set it around each node they enqueue; users may set it around
    any code (the innermost ``label`` wins; ``None`` keeps the enclosing value).
    It follows the calling context (a ``contextvars`` variable: per thread and
    per asyncio task). Costs ~0.3 µs; callers on a hot path may skip it when
    ``runtime._tracer is None``.
    """
    outer_pipeline, outer_node = _label.get()
    token = _label.set((outer_pipeline if pipeline is None else pipeline, outer_node if node is None else node))
    try:
        yield
    finally:
        _label.reset(token)


def range_name(pipeline: str | None, node: str | None, what: str) -> str:
    """The profiler-range name of an op: ``"pipeline: node"`` when labelled, else ``node`` or ``what``."""
    if pipeline is not None and node is not None:
        return f"{pipeline}: {node}"
    return node or pipeline or what


def current_label() -> tuple[str | None, str | None]:
    """The ``(pipeline, node)`` labels in effect in the calling context."""
    return _label.get()
