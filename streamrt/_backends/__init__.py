"""Backend selection. Backends are imported lazily, by name.

Each backend module exposes ``create(**options) -> Backend``, raising
:class:`~streamrt.BackendUnavailableError` with what is missing and how to get
it, and ``probe() -> str | None`` returning ``None`` when usable or the reason
it is not (cheap; used by ``open_runtime("auto")`` and ``streamrt doctor``).
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from .._errors import BackendUnavailableError
from .protocol import Backend

__all__ = ["BACKEND_NAMES", "AUTO_ORDER", "load_backend", "probe_backend", "select_auto"]

_log = logging.getLogger("streamrt")

BACKEND_NAMES = ("hip", "cuda", "sim")
# "auto" prefers the vendor-native backend: CUDA on NVIDIA, HIP on AMD. On a
# machine with both libraries CUDA wins, since HIP there is a forwarding layer.
AUTO_ORDER = ("cuda", "hip")


def _module(name: str) -> Any:
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {name!r}; choose one of 'auto', " + ", ".join(repr(n) for n in BACKEND_NAMES))
    return importlib.import_module(f".{name}", __name__)


def probe_backend(name: str) -> str | None:
    """``None`` when backend ``name`` is usable here, else a one-line reason."""
    return _module(name).probe()


def load_backend(name: str, **options: Any) -> Backend:
    """Create backend ``name``; raises ``BackendUnavailableError`` if it cannot be used."""
    return _module(name).create(**options)


def select_auto() -> str:
    """The best available backend name; logs at debug level why each GPU backend was skipped."""
    for name in AUTO_ORDER:
        try:
            reason = probe_backend(name)
        except Exception as exc:  # a broken install must not stop "auto" from falling back
            reason = f"probe failed: {exc!r}"
        if reason is None:
            _log.debug("open_runtime('auto'): using %s", name)
            return name
        _log.debug("open_runtime('auto'): %s not used: %s", name, reason)
    _log.debug("open_runtime('auto'): no GPU backend usable, using the simulator")
    return "sim"


def unavailable(name: str, missing: str, how: str) -> BackendUnavailableError:
    """The error for a backend whose library or device is missing."""
    return BackendUnavailableError(f"backend {name!r} is not available: {missing}. {how}")
