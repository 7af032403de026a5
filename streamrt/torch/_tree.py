"""Batches as trees: tensors and arrays inside dicts, lists, tuples and named tuples.

:func:`map_leaves` rebuilds a batch with a function applied to every leaf
(a torch tensor or a numpy array), visiting leaves in a fixed order: dict
items in insertion order, sequences front to back. Everything else
(ints, strings, ``None``) is kept as is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ._lazy import is_tensor

__all__ = ["is_leaf", "map_leaves"]


def is_leaf(obj: Any) -> bool:
    """A torch tensor or a numpy array."""
    return isinstance(obj, np.ndarray) or is_tensor(obj)


def map_leaves(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """``obj`` rebuilt with ``fn(leaf)`` for every leaf (see the module docstring)."""
    if is_leaf(obj):
        return fn(obj)
    if isinstance(obj, Mapping):
        items = [(k, map_leaves(v, fn)) for k, v in obj.items()]
        if type(obj) is dict:
            return dict(items)
        try:
            return type(obj)(items)  # type: ignore[call-arg]
        except TypeError:  # a mapping type that cannot be built from pairs (defaultdict): a plain dict
            return dict(items)
    if isinstance(obj, tuple):
        values = [map_leaves(v, fn) for v in obj]
        if hasattr(obj, "_fields"):  # a named tuple
            return type(obj)(*values)
        return tuple(values) if type(obj) is tuple else type(obj)(values)
    if isinstance(obj, list):
        return [map_leaves(v, fn) for v in obj]
    return obj
