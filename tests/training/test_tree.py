"""Batches as trees (``streamrt.torch._tree``): what a Prefetcher flattens and rebuilds every step."""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (make test installs torch==2.13.0, the CPU build)")

from streamrt.torch._tree import flatten, unflatten

Pair = namedtuple("Pair", "a b")


def _batch(i: int) -> dict[str, Any]:
    return {"tokens": torch.full((4,), i), "cu_seqlens": np.arange(3, dtype=np.int32) + i, "n": i}


@pytest.mark.parametrize(
    "tree",
    [
        _batch(0),
        (_batch(0), _batch(1), _batch(2)),  # a Prefetcher group: a tuple of flat dicts
        [_batch(0), {"nested": [torch.zeros(2), (1, "x")], "t": torch.ones(1)}, None],  # a dict that is not flat
        Pair(torch.zeros(1), {"a": (np.zeros(2), 3.5)}),
        OrderedDict(b=torch.zeros(1), a=[1, 2]),
        torch.zeros(3),
        (),
    ],
    ids=["dict", "group", "nested", "namedtuple", "mapping", "tensor", "empty"],
)
def test_a_tree_comes_back_as_it_was_and_its_structure_is_a_key(tree: Any) -> None:
    values, structure = flatten(tree)
    again = unflatten(structure, values)
    assert _same(again, tree)
    values2, structure2 = flatten(again)
    assert structure2 == structure and hash(structure2) == hash(structure)  # a plan's key
    assert all(a is b for a, b in zip(values, values2)) and len(values) == len(values2)


def test_the_leaves_come_in_visiting_order() -> None:
    group = (_batch(0), {"tokens": torch.zeros(1), "more": {"x": 7}}, _batch(2))
    values, _ = flatten(group)
    assert [type(v).__name__ for v in values] == ["Tensor", "ndarray", "int", "Tensor", "int", "Tensor", "ndarray", "int"]
    assert values[4] == 7 and values[7] == 2


def test_groups_of_other_keys_or_leaf_kinds_have_other_structures() -> None:
    _, one = flatten((_batch(0), _batch(1)))
    _, keys = flatten((_batch(0), {"tokens": torch.zeros(1), "cu": np.zeros(1), "n": 1}))
    _, nested = flatten((_batch(0), {"tokens": torch.zeros(1), "cu_seqlens": [np.zeros(1)], "n": 1}))
    assert len({one, keys, nested}) == 3


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a is b
