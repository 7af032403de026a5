"""Kernels on the simulated device: numpy *twins* of ``extern "C"`` HIP/CUDA kernels.

The simulator cannot compile C++. Instead, each kernel name is bound to a
Python function, its twin, registered with :func:`register_twin`:

.. code-block:: python

    def fill_twin(ctx, grid, block, out, n, value):
        ctx.view(out, n, np.int32)[:] = value

    register_twin("fill_i32", ("ptr:w", "i64", "i32"), fill_twin, cost_us=lambda grid, block, out, n, v: 1 + n / 1e6)

``compile_source`` scans the source for ``extern "C" __global__ ... void NAME(``
declarations, checks each against a registered twin (argument count,
pointer-ness and, where the C type is a plain scalar, its type), and returns an
image naming them; it raises :class:`~streamrt.KernelCompileError` with a log
when a declared kernel has no twin or does not match. ``launch_kernel`` decodes
the ``void*[]`` argument array with the twin's signature at enqueue (as the
drivers copy arguments at launch) and the executor later calls
``fn(ctx, grid, block, *args)`` in stream order, where ``ctx`` is a
:class:`TwinContext`.

Signature types: ``"ptr"`` (read-write pointer), ``"ptr:r"`` (read-only),
``"ptr:w"`` (write-only), ``"ptr:rw"``; ``"i32"``, ``"i64"``, ``"u32"``,
``"u64"``, ``"f32"``, ``"f64"``. Pointer modes only matter to hazard checking.

``cost_us`` is ``None`` (the profile's ``kernel_default_us``), a number of
virtual µs, or a callable ``(grid, block, *args) -> µs`` evaluated at enqueue;
it must depend on its arguments only (not on device memory contents), so
virtual times stay deterministic.

The registry is process-wide and thread-safe. Registering an existing name
replaces the twin; modules loaded earlier keep the twin they resolved.
"""

from __future__ import annotations

import ctypes
import json
import math
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from ..._errors import KernelCompileError
from ..._kernel_decl import DECL as _DECL
from ..._kernel_decl import QUALIFIERS as _QUALIFIERS
from ..._kernel_decl import blank_comments, split_params

__all__ = [
    "Twin",
    "TwinContext",
    "SimMemoryFault",
    "register_twin",
    "unregister_twin",
    "registered_twins",
    "COMPILER_VERSION",
    "SIGNATURE_TYPES",
]

COMPILER_VERSION = "sim-twins-1"
_IMAGE_MAGIC = b"SIMTWIN1\n"

_SCALARS: dict[str, type[ctypes._SimpleCData]] = {  # type: ignore[type-arg]
    "i32": ctypes.c_int32,
    "i64": ctypes.c_int64,
    "u32": ctypes.c_uint32,
    "u64": ctypes.c_uint64,
    "f32": ctypes.c_float,
    "f64": ctypes.c_double,
}
_POINTERS = {"ptr": "rw", "ptr:rw": "rw", "ptr:r": "r", "ptr:w": "w"}
SIGNATURE_TYPES = tuple(_POINTERS) + tuple(_SCALARS)

CostModel = Union[None, float, int, Callable[..., float]]  # noqa: UP007 - evaluated at runtime


@dataclass(frozen=True)
class Twin:
    """A registered kernel twin.

    Attributes:
        name: the ``extern "C"`` kernel name.
        signature: argument types, see the module docstring.
        fn: ``fn(ctx, grid, block, *args)``; runs on the simulator's executor thread.
        cost_us: the cost model, see the module docstring.
    """

    name: str
    signature: tuple[str, ...]
    fn: Callable[..., Any]
    cost_us: CostModel = None

    def cost(
        self, grid: tuple[int, int, int], block: tuple[int, int, int], args: Sequence[Any], default: float
    ) -> float:
        """Virtual duration of one launch, µs. Raises ``ValueError`` for a bad cost model result."""
        model = self.cost_us
        if model is None:
            return default
        value = model(grid, block, *args) if callable(model) else model
        value = float(value)
        if not math.isfinite(value) or value < 0:
            raise ValueError(
                f"the cost model of twin {self.name!r} returned {value!r}; it must be a finite number >= 0"
            )
        return value

    def pointer_modes(self) -> list[tuple[int, str]]:
        """``(argument index, "r" | "w" | "rw")`` for each pointer argument."""
        return [(i, _POINTERS[t]) for i, t in enumerate(self.signature) if t in _POINTERS]


_registry: dict[str, Twin] = {}
_registry_lock = threading.Lock()
_NAME = re.compile(r"^[A-Za-z_]\w*$")


def register_twin(name: str, signature: Sequence[str], fn: Callable[..., Any], cost_us: CostModel = None) -> Twin:
    """Register (or replace) the twin of kernel ``name``. Returns the :class:`Twin`.

    Raises ``ValueError``/``TypeError`` for a bad name, signature type, callable or cost model.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"a twin name must be a C identifier, got {name!r}")
    if isinstance(signature, str):
        raise TypeError("signature must be a sequence of type names such as ('ptr', 'i64'), not a str")
    sig = tuple(signature)
    bad = [t for t in sig if t not in _POINTERS and t not in _SCALARS]
    if bad:
        raise ValueError(f"unknown signature type(s) {bad} for twin {name!r}; use {list(SIGNATURE_TYPES)}")
    if not callable(fn):
        raise TypeError(f"the twin of {name!r} must be callable, got {type(fn).__name__}")
    constant = cost_us is not None and not callable(cost_us)
    if constant and (
        isinstance(cost_us, bool) or not isinstance(cost_us, (int, float)) or not math.isfinite(cost_us) or cost_us < 0
    ):
        raise ValueError(f"cost_us must be None, a number >= 0 or a callable, got {cost_us!r}")
    twin = Twin(name, sig, fn, cost_us)
    with _registry_lock:
        _registry[name] = twin
    return twin


def unregister_twin(name: str) -> bool:
    """Remove the twin of ``name``; ``True`` if there was one."""
    with _registry_lock:
        return _registry.pop(name, None) is not None


def registered_twins() -> dict[str, Twin]:
    """A snapshot of the registry."""
    with _registry_lock:
        return dict(_registry)


def get_twin(name: str) -> Twin | None:
    with _registry_lock:
        return _registry.get(name)


class SimMemoryFault(Exception):
    """A twin asked for memory that is not simulated device or pinned memory (reported as an illegal address)."""


class TwinContext:
    """What a twin gets besides its arguments: numpy views of simulated memory and the launch shape.

    Attributes:
        name: kernel name. grid, block: launch dimensions. shared_mem: dynamic shared memory bytes.
        stream: the stream handle. device: the device index.
    """

    __slots__ = ("_resolve", "name", "grid", "block", "shared_mem", "stream", "device")

    def __init__(
        self,
        resolve: Callable[[int, int], Any],
        name: str,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        stream: int,
        device: int,
    ) -> None:
        self._resolve = resolve
        self.name = name
        self.grid = grid
        self.block = block
        self.shared_mem = shared_mem
        self.stream = stream
        self.device = device

    def view(self, ptr: int, count: int, dtype: Any = np.uint8) -> np.ndarray:
        """A writable numpy array of ``count`` ``dtype`` elements at device (or pinned) address ``ptr``.

        Raises :class:`SimMemoryFault` when the range is not inside one live
        simulated allocation (the launch then fails with an illegal-address error).
        """
        dt = np.dtype(dtype)
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise ValueError(f"count must be an int >= 0, got {count!r}")
        nbytes = int(count) * dt.itemsize
        if nbytes == 0:
            return np.empty(0, dtype=dt)
        alloc = self._resolve(int(ptr), nbytes)
        return np.frombuffer(alloc.mm, dtype=dt, count=int(count), offset=int(ptr) - alloc.base)


# -- compilation ------------------------------------------------------------------------------
_C_SCALARS = {
    "int": "i32",
    "signed": "i32",
    "signed int": "i32",
    "int32_t": "i32",
    "unsigned": "u32",
    "unsigned int": "u32",
    "uint32_t": "u32",
    "long": "i64",
    "long int": "i64",
    "long long": "i64",
    "long long int": "i64",
    "int64_t": "i64",
    "ptrdiff_t": "i64",
    "unsigned long": "u64",
    "unsigned long long": "u64",
    "unsigned long long int": "u64",
    "uint64_t": "u64",
    "size_t": "u64",
    "float": "f32",
    "double": "f64",
}


def _scalar_of(param: str) -> str | None:
    tokens = [t for t in re.findall(r"[A-Za-z_]\w*", param) if t not in _QUALIFIERS]
    if len(tokens) >= 2:
        tokens = tokens[:-1]  # drop the parameter name
    return _C_SCALARS.get(" ".join(tokens))


def declared_kernels(source: str) -> list[tuple[str, list[str] | None, int]]:
    """``(name, parameter texts or None, line)`` for each ``extern "C"`` ``__global__`` kernel in ``source``."""
    clean = blank_comments(source)
    out = []
    for m in _DECL.finditer(clean):
        if "__global__" not in m.group(1).split():
            continue
        line = clean.count("\n", 0, m.start()) + 1
        out.append((m.group(2), split_params(clean, m.end() - 1), line))
    return out


def compile_twins(source: str, name: str, options: Sequence[str]) -> bytes:
    """Check ``source``'s kernels against the registry and return a loadable image; see the module docstring."""
    if not isinstance(source, str):
        raise TypeError(f"source must be a str, not {type(source).__name__}")
    opts = [str(o) for o in options]
    declared = declared_kernels(source)
    log: list[str] = []
    if not declared:
        log.append(f'{name}: error: no extern "C" __global__ kernel declared; the simulator runs only named kernels')
    kernels: list[str] = []
    for kname, params, line in declared:
        twin = get_twin(kname)
        where = f"{name}({line})"
        if twin is None:
            log.append(
                f"{where}: error: kernel '{kname}' has no simulator twin; register one with "
                f"streamrt._backends.sim.register_twin({kname!r}, signature, fn)"
            )
            continue
        if params is None:
            log.append(f"{where}: error: unterminated parameter list of kernel '{kname}'")
            continue
        if len(params) != len(twin.signature):
            log.append(
                f"{where}: error: kernel '{kname}' declares {len(params)} parameter(s) but its twin's "
                f"signature {twin.signature} has {len(twin.signature)}"
            )
            continue
        for i, (param, typ) in enumerate(zip(params, twin.signature)):
            is_ptr = "*" in param
            if is_ptr != (typ in _POINTERS):
                log.append(f"{where}: error: kernel '{kname}' parameter {i} '{param}' does not match twin type '{typ}'")
            elif not is_ptr:
                scalar = _scalar_of(param)
                if scalar is not None and scalar != typ:
                    log.append(
                        f"{where}: error: kernel '{kname}' parameter {i} '{param}' is {scalar} but the twin says '{typ}'"
                    )
        if kname not in kernels:
            kernels.append(kname)
    if log:
        raise KernelCompileError(f"sim could not compile program {name!r}", "\n".join(log))
    body = {"compiler": COMPILER_VERSION, "program": name, "kernels": kernels, "options": opts}
    return _IMAGE_MAGIC + json.dumps(body, sort_keys=True).encode("utf-8")


def parse_image(image: bytes) -> tuple[str, list[str]]:
    """``(program name, kernel names)`` of an image; ``ValueError`` if it is not a sim image."""
    data = bytes(image)
    if not data.startswith(_IMAGE_MAGIC):
        raise ValueError("not a simulator kernel image (missing the SIMTWIN1 header)")
    try:
        body = json.loads(data[len(_IMAGE_MAGIC) :].decode("utf-8"))
        return str(body["program"]), [str(k) for k in body["kernels"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"corrupt simulator kernel image: {exc}") from exc


def decode_args(arg_ptrs: int, signature: Sequence[str]) -> tuple[Any, ...]:
    """Read the arguments behind the ``void*[]`` at ``arg_ptrs`` (``ValueError`` on a NULL entry)."""
    n = len(signature)
    if n == 0:
        return ()
    if not arg_ptrs:
        raise ValueError(f"arg_ptrs is NULL but the kernel takes {n} argument(s)")
    slots = (ctypes.c_void_p * n).from_address(arg_ptrs)
    out: list[Any] = []
    for i, typ in enumerate(signature):
        addr = slots[i]
        if not addr:
            raise ValueError(f"argument {i} address is NULL")
        ctype = ctypes.c_uint64 if typ in _POINTERS else _SCALARS[typ]
        out.append(ctype.from_address(addr).value)
    return tuple(out)
