"""Kernel specs: what the C signature cannot say about a kernel's arguments.

A :class:`KernelSpec` names, per pointer parameter, the minimum number of bytes
the kernel touches (a function of the other arguments), whether the kernel
reads, writes or both, whether NULL is allowed and the alignment; plus an
optional ``check`` for whatever else a launch must satisfy (block shape,
parameter ranges). The launcher checks all of it before anything is enqueued.

Specs are registered process-wide by kernel name (:func:`register_kernel_spec`)
or given to :meth:`KernelLibrary.from_source`. A kernel without a spec is still
launchable: its pointer arguments are then checked for kind, release and
alignment only, and are assumed read-write.

Thread rules: the registry is thread-safe; spec functions must be pure.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["KernelArgs", "KernelSpec", "get_kernel_spec", "register_kernel_spec", "registered_kernel_specs"]

_ACCESS = ("r", "w", "rw")


class KernelArgs(Mapping[str, Any]):
    """The converted arguments of one launch, by parameter name (``args.count`` or ``args["count"]``).

    Scalars are Python ints and floats; pointers are int addresses (0 for NULL).
    ``buffer(name)`` is the Buffer given for a pointer parameter, or ``None``. A parameter
    named like a Mapping method (``keys``, ``values``, ``items``, ``get``) is read as ``args["name"]``.
    """

    __slots__ = ("_values", "_buffers")

    def __init__(self, values: dict[str, Any], buffers: dict[str, Any]) -> None:
        self._values = values
        self._buffers = buffers

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"the kernel has no parameter {name!r}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def buffer(self, name: str) -> Any:
        """The Buffer passed for pointer parameter ``name`` (``None`` for a raw address or NULL)."""
        return self._buffers.get(name)

    def __repr__(self) -> str:
        return f"KernelArgs({self._values!r})"


SizeFn = Callable[[KernelArgs], int]
CheckFn = Callable[[KernelArgs, tuple[int, int, int], tuple[int, int, int], int], None]


@dataclass(frozen=True)
class KernelSpec:
    """Argument rules of one kernel. Frozen.

    Attributes:
        name: the kernel's ``extern "C"`` name.
        sizes: pointer parameter -> ``fn(args) -> bytes``: the least bytes the
            kernel may touch from that pointer. A Buffer smaller than that is a
            ``ValueError`` at launch.
        access: pointer parameter -> ``"r"``, ``"w"`` or ``"rw"``. Default: ``"r"``
            for ``const T*``, else ``"rw"``. Written parameters refuse read-only Buffers,
            and pipelines infer dependencies from these modes.
        nullable: pointer parameters that may be NULL (``None`` or 0).
        align: pointer parameter -> required byte alignment (default: the pointee size).
        check: ``check(args, grid, block, shared_mem)`` raising ``ValueError`` or
            ``TypeError`` for a launch the kernel cannot run.
    """

    name: str
    sizes: Mapping[str, SizeFn] = field(default_factory=dict)
    access: Mapping[str, str] = field(default_factory=dict)
    nullable: frozenset[str] = frozenset()
    align: Mapping[str, int] = field(default_factory=dict)
    check: CheckFn | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"a kernel spec needs the kernel's C name, got {self.name!r}")
        for param, mode in self.access.items():
            if mode not in _ACCESS:
                raise ValueError(f"spec {self.name!r}: access of {param!r} must be one of {_ACCESS}, got {mode!r}")
        for param, fn in self.sizes.items():
            if not callable(fn):
                raise TypeError(f"spec {self.name!r}: sizes[{param!r}] must be callable(args) -> bytes")
        for param, a in self.align.items():
            if isinstance(a, bool) or not isinstance(a, int) or a < 1 or a & (a - 1):
                raise ValueError(f"spec {self.name!r}: align[{param!r}] must be a power of two, got {a!r}")
        object.__setattr__(self, "nullable", frozenset(self.nullable))

    def min_bytes(self, param: str, args: KernelArgs) -> int:
        """Bytes the kernel needs behind pointer ``param`` for these arguments (0 if unspecified)."""
        fn = self.sizes.get(param)
        if fn is None:
            return 0
        n = fn(args)
        if isinstance(n, float) and math.isfinite(n) and n == int(n):
            n = int(n)
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"spec {self.name!r}: sizes[{param!r}] returned {n!r}, not an int")
        return max(n, 0)


_registry: dict[str, KernelSpec] = {}
_lock = threading.Lock()


def register_kernel_spec(spec: KernelSpec) -> KernelSpec:
    """Register (or replace) the spec of kernel ``spec.name``. Kernels made later use it."""
    if not isinstance(spec, KernelSpec):
        raise TypeError(f"register_kernel_spec takes a KernelSpec, not {type(spec).__name__}")
    with _lock:
        _registry[spec.name] = spec
    return spec


def get_kernel_spec(name: str) -> KernelSpec | None:
    with _lock:
        return _registry.get(name)


def registered_kernel_specs() -> dict[str, KernelSpec]:
    with _lock:
        return dict(_registry)
