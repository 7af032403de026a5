"""Hooks by which higher layers serve methods of lower ones, so that no module imports upward.

``Runtime.scheduler``, ``Runtime.kernels``, ``Runtime.fetch``,
``Stream.launch_kernel``, ``Pipeline.kernel``, ``Buffer.__dlpack__`` and the
trace's reports live in layers above the classes that offer them. Each such
layer :func:`provide`\\ s its function when it is imported (``import streamrt``
imports them all), and the lower class calls :func:`hook` for it: a dict
lookup, no import.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["hook", "provide"]

_hooks: dict[str, Callable[..., Any]] = {}


def provide(name: str, fn: Callable[..., Any]) -> None:
    """Serve hook ``name`` with ``fn`` (called once, at import of the layer that owns ``fn``)."""
    _hooks[name] = fn


def hook(name: str) -> Callable[..., Any]:
    """The function that serves ``name``; ``RuntimeError`` if its layer was never imported."""
    try:
        return _hooks[name]
    except KeyError:
        raise RuntimeError(f"streamrt's {name!r} is not loaded: import streamrt (not only its private modules)") from None
