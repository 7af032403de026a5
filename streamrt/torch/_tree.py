"""Batches as trees: tensors and arrays inside dicts, lists, tuples and named tuples.

:func:`flatten` splits a batch into the values at its ends -- leaves (torch
tensors and numpy arrays) and everything else (ints, strings, ``None``), in a
fixed order: dict items in insertion order, sequences front to back -- and a
hashable *structure*; :func:`unflatten` puts them back together. Batches of one
structure can share what was worked out for the first of them (a Prefetcher's
plan). Mappings other than dicts are rebuilt from ``(key, value)`` pairs (a
plain dict when their type cannot be), named tuples from their fields, list
subclasses as plain lists.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ._lazy import is_tensor

__all__ = ["flatten", "is_leaf", "unflatten"]

# Structure nodes: _END (a value at an end), or (kind, type, keys or None, children, flat);
# ``flat``: every child is an end. Built and read with loops, not comprehensions (each of which is
# a function call before Python 3.12): batches are flattened and rebuilt once per step.
_END = None
_DICT, _MAPPING, _TUPLE, _NAMED, _LIST = range(5)
_CONTAINERS = (Mapping, tuple, list)
# Types that are never containers (no isinstance, whose Mapping check is slow); tensor types join on sight.
_ENDS = {np.ndarray, int, float, bool, str, bytes, type(None)}


def is_leaf(obj: Any) -> bool:
    """A torch tensor or a numpy array."""
    return isinstance(obj, np.ndarray) or is_tensor(obj)


def _is_end(obj: Any) -> bool:
    """``obj`` is not a container (a type outside :data:`_ENDS`)."""
    if isinstance(obj, _CONTAINERS):
        return False
    if is_tensor(obj):
        _ENDS.add(type(obj))
    return True


def flatten(obj: Any) -> tuple[list[Any], Any]:
    """``(values, structure)``: the values at the ends of ``obj`` in visiting order, and its shape as a hashable key."""
    values: list[Any] = []
    if type(obj) is not dict and (type(obj) in _ENDS or _is_end(obj)):
        values.append(obj)
        return values, _END
    if type(obj) is dict:  # a flat dict (a batch's usual shape): its structure without the walk
        values.extend(obj.values())
        for value in values:
            if type(value) not in _ENDS and not _is_end(value):
                values.clear()
                break
        else:
            return values, (_DICT, dict, tuple(obj), (_END,) * len(values), True)
    return values, _flatten(obj, values)


def _flatten(obj: Any, out: list[Any]) -> Any:
    """The structure of container ``obj``; its ends are appended to ``out``."""
    cls = type(obj)
    keys: tuple[Any, ...] | None = None
    if cls is dict or isinstance(obj, Mapping):
        kind = _DICT if cls is dict else _MAPPING
        keys = tuple(obj)
        items: Any = obj.values()
    else:
        kind = _TUPLE if cls is tuple else _LIST if cls is list else _NAMED if hasattr(obj, "_fields") else _TUPLE if isinstance(obj, tuple) else _LIST
        items = obj
    children: list[Any] = []
    flat = True
    for value in items:
        if type(value) in _ENDS or _is_end(value):
            out.append(value)
            children.append(_END)
            continue
        flat = False
        if type(value) is dict:  # a flat dict (a group's batch) without the call
            n = len(out)
            out.extend(value.values())
            for v in value.values():
                if type(v) not in _ENDS and not _is_end(v):
                    del out[n:]
                    break
            else:
                children.append((_DICT, dict, tuple(value), (_END,) * (len(out) - n), True))
                continue
        children.append(_flatten(value, out))
    return (kind, cls, keys, tuple(children), flat)


def unflatten(structure: Any, values: list[Any]) -> Any:
    """The batch of ``structure`` (from :func:`flatten`) with ``values`` at its ends, in order."""
    if structure is _END:
        return values[0]
    if structure[0] == _DICT and structure[4]:  # a flat dict
        return dict(zip(structure[2], values))
    return _build(structure, values, 0)[0]


def _build(node: Any, values: list[Any], at: int) -> tuple[Any, int]:
    """The container of ``node`` from ``values[at:]``, and the index after its last end."""
    kind, cls, keys, children, flat = node
    if flat:
        end = at + len(children)
        items = values[at:end]
        at = end
    else:
        items = []
        for child in children:
            if child is _END:
                items.append(values[at])
                at += 1
            elif child[0] == _DICT and child[4]:  # a flat dict (a group's batch) without the call
                end = at + len(child[3])
                items.append(dict(zip(child[2], values[at:end])))
                at = end
            else:
                item, at = _build(child, values, at)
                items.append(item)
    if kind == _DICT:
        return dict(zip(keys, items)), at
    if kind == _MAPPING:
        pairs = list(zip(keys, items))
        try:
            return cls(pairs), at
        except TypeError:  # a mapping type that cannot be built from pairs (defaultdict): a plain dict
            return dict(pairs), at
    if kind == _NAMED:
        return cls(*items), at
    if kind == _LIST:
        return items, at  # list subclasses come back as plain lists
    return (tuple(items) if cls is tuple else cls(items)), at
