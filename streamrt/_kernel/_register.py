"""Registering a kernel that ships with a package above the kernel layer: its spec and its simulator twin.

A package that owns a kernel source (the FMHA recipe owns ``fmha_bwd_prepare.hip``) registers its
kernels when it is imported, with :func:`register_kernel`. A shipped source names that package in a
line ``// streamrt-register: <module>``; :meth:`KernelLibrary.load` imports the module before it
compiles the source (:func:`import_registrars`), so ``rt.kernels.get(name)`` finds the spec and, on
the simulator, the twin, whoever imported what first. The kernel layer names no package above it.

Thread rules: as for the spec and twin registries (thread-safe).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from typing import Any

from ._spec import KernelSpec, register_kernel_spec

__all__ = ["import_registrars", "register_kernel"]

_REGISTRAR = re.compile(r"^[ \t]*//[ \t]*streamrt-register:[ \t]*([A-Za-z_][\w.]*)[ \t]*$", re.M)


def register_kernel(spec: KernelSpec, *, twin: Callable[..., Any], signature: Sequence[str], cost_us: Any = None) -> KernelSpec:
    """Register ``spec`` and the simulator twin of kernel ``spec.name`` (see ``register_twin``). Returns ``spec``."""
    from .._backends.sim import register_twin  # the simulator's twin registry

    register_kernel_spec(spec)
    register_twin(spec.name, signature, twin, cost_us)
    return spec


def import_registrars(source: str) -> None:
    """Import every module a ``// streamrt-register: <module>`` line of ``source`` names."""
    for name in _REGISTRAR.findall(source):
        importlib.import_module(name)
