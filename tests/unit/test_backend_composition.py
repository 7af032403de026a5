"""Each backend class is composed of call groups that together implement the whole protocol.

Imports the classes only (cuda-bindings and hip-python are imported lazily), so
this runs everywhere.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from streamrt._backends.cuda import CudaBackend
from streamrt._backends.cuda._core import CudaCore
from streamrt._backends.hip import HipBackend
from streamrt._backends.hip._core import HipCore
from streamrt._backends.protocol import Backend
from streamrt._backends.sim import SimBackend
from streamrt._backends.sim._core import SimCore

CLASSES = [(CudaBackend, CudaCore, "cuda"), (HipBackend, HipCore, "hip"), (SimBackend, SimCore, "sim")]


def _protocol_methods() -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(Backend).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }


def _shape(sig: inspect.Signature) -> list[tuple[str, Any, bool]]:
    return [(p.name, p.kind, p.default is inspect.Parameter.empty) for p in sig.parameters.values()]


@pytest.mark.parametrize(("cls", "core", "name"), CLASSES, ids=[name for *_, name in CLASSES])
def test_backend_has_every_protocol_method_with_matching_parameters(cls: type, core: type, name: str) -> None:
    methods = _protocol_methods()
    assert len(methods) > 30  # the protocol is the big one, not an empty class
    mismatched = {}
    for method, expected in methods.items():
        actual = getattr(cls, method, None)
        assert callable(actual), f"{cls.__name__} lacks {method}"
        got = inspect.signature(actual)
        if _shape(got) != _shape(expected):
            mismatched[method] = (str(got), str(expected))
    assert not mismatched, mismatched
    assert cls.name == name


@pytest.mark.parametrize(("cls", "core", "name"), CLASSES, ids=[name for *_, name in CLASSES])
def test_call_groups_define_disjoint_methods_on_one_core(cls: type, core: type, name: str) -> None:
    """No group overrides another's method, so the order of the bases does not matter."""
    groups = [base for base in cls.__mro__ if base not in (cls, core, object)]
    assert len(groups) >= 5, groups
    assert all(issubclass(group, core) for group in groups)
    owner: dict[str, str] = {}
    for klass in (cls, *groups):
        for method in vars(klass):
            if method.startswith("__") or method == "name":
                continue
            assert method not in owner, f"{method} is defined by both {owner[method]} and {klass.__name__}"
            owner[method] = klass.__name__
