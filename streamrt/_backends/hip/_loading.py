"""hip-python, imported once on first need: the modules every part of the hip backend reads, and its library's path.

The other modules read ``_loading._hip`` (and ``_hiprtc``, ``_types``,
``_helpers``) as attributes of this module at call time, never copy them at
import: importing the backend imports no hip-python, and a stand-in module put
here (as the offline tests do) is seen everywhere.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

__all__: list[str] = []

# The hip-python modules, loaded by _load().
_hip: Any = None
_hiprtc: Any = None
_types: Any = None
_helpers: Any = None


def _load() -> None:
    """Import hip-python (once). Raises ``ImportError`` when it is not installed."""
    global _hip, _hiprtc, _types, _helpers
    if _hip is not None:
        return
    import hip as _package  # noqa: F401  (the hip-python distribution; fails if absent)
    from rocm.bindings import _hip_helpers as helpers
    from rocm.bindings import hip as hip_module
    from rocm.bindings import hiprtc as hiprtc_module
    from rocm.bindings.util import types

    _types, _helpers, _hiprtc = types, helpers, hiprtc_module
    _hip = hip_module  # last: marks the load complete


def _hip_python_installed() -> bool:
    """Whether hip-python's packages (``hip`` and ``rocm.bindings``) can be imported; imports nothing."""
    return importlib.util.find_spec("hip") is not None and importlib.util.find_spec("rocm") is not None


def loaded_hip_library() -> str | None:
    """The path of the ``libamdhip64.so`` mapped into this process (hip-python's), or ``None``."""
    try:
        with open(f"/proc/{os.getpid()}/maps") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1] if line.count(" ") >= 5 else ""
                if os.path.basename(path).startswith("libamdhip64.so"):
                    return path
    except OSError:
        return None
    return None
