"""Kernel objects and their arguments: checking, conversion and packing into a ``void*[]``.

:meth:`Kernel.bind` checks one launch's arguments against the kernel's
:class:`~._signature.Signature` and :class:`~._spec.KernelSpec` and returns a
:class:`BoundArgs`; nothing is enqueued. The rules:

* count: a sequence of exactly one value per parameter, or a mapping of every
  parameter name -> ``TypeError``;
* pointers take a streamrt Buffer, an object exposing device or pinned memory
  (``__cuda_array_interface__``, DLPack, the buffer protocol), an ``int``
  address (unchecked: an escape hatch), or ``None`` for NULL where the spec
  allows it. Anything else -> ``TypeError``. A Buffer of another runtime, a
  released one, pageable host memory (a kernel cannot reach it), a read-only
  Buffer for a written parameter, a misaligned address or a Buffer smaller than
  the spec's minimum -> ``ValueError``;
* integer parameters take ``int`` / numpy integers (not ``bool``), range-checked
  for their C type (``ValueError``); floating parameters take real numbers.
  A value of the wrong kind -> ``TypeError``.

:meth:`BoundArgs.pack` builds the ``void*[]`` of argument addresses that
``cuLaunchKernel`` / ``hipModuleLaunchKernel`` (and the simulator) read; the
:class:`PackedArgs` owns the ctypes storage, so keep it referenced until the
launch call has returned (the drivers copy the values at launch).

Thread rules: a Kernel is immutable and may be launched from any thread.
"""

from __future__ import annotations

import ctypes
import math
import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._buffer import PAGEABLE, Buffer, wrap_foreign
from ._signature import Param, Signature
from ._spec import KernelArgs, KernelSpec

if TYPE_CHECKING:
    from .._runtime import Runtime
    from ._library import KernelModule

__all__ = ["BoundArgs", "Kernel", "PackedArgs", "launch_dims"]

_CTYPES: dict[str, Any] = {
    "ptr": ctypes.c_uint64,
    "i32": ctypes.c_int32,
    "u32": ctypes.c_uint32,
    "i64": ctypes.c_int64,
    "u64": ctypes.c_uint64,
    "f32": ctypes.c_float,
    "f64": ctypes.c_double,
}
_INT_RANGES = {
    "i32": (-(2**31), 2**31 - 1),
    "u32": (0, 2**32 - 1),
    "i64": (-(2**63), 2**63 - 1),
    "u64": (0, 2**64 - 1),
}
_F32_MAX = 3.4028234663852886e38
_GRID_LIMITS = (2**31 - 1, 65535, 65535)
_BLOCK_LIMITS = (1024, 1024, 64)
_MAX_THREADS = 1024


def launch_dims(value: Any, what: str) -> tuple[int, int, int]:
    """``grid``/``block`` as three ints >= 1: an int or a sequence of 1-3 ints. ``TypeError``/``ValueError``."""
    limits = _GRID_LIMITS if what == "grid" else _BLOCK_LIMITS
    if type(value) is int:  # the common cases, without the general checks' cost
        if 1 <= value <= limits[0]:
            return value, 1, 1
    elif type(value) is tuple and len(value) == 3 and type(value[0]) is int and type(value[1]) is int and type(value[2]) is int:
        x, y, z = value
        if 1 <= x <= limits[0] and 1 <= y <= limits[1] and 1 <= z <= limits[2] and (what == "grid" or x * y * z <= _MAX_THREADS):
            return value
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be an int or a tuple of up to three ints, not bool")
    if isinstance(value, (int, np.integer)):
        dims = [int(value)]
    elif isinstance(value, (tuple, list)):
        try:
            dims = [operator.index(v) for v in value]
        except TypeError:
            raise TypeError(f"{what} must hold ints, got {value!r}") from None
        if any(isinstance(v, (bool, np.bool_)) for v in value):
            raise TypeError(f"{what} must hold ints, not bools: {value!r}")
        if not 1 <= len(dims) <= 3:
            raise ValueError(f"{what} must have 1 to 3 dimensions, got {value!r}")
    else:
        raise TypeError(f"{what} must be an int or a tuple of up to three ints, not {type(value).__name__}")
    dims += [1] * (3 - len(dims))
    if any(d < 1 for d in dims):
        raise ValueError(f"every {what} dimension must be >= 1, got {tuple(dims)}")
    if any(d > lim for d, lim in zip(dims, limits, strict=False)):
        raise ValueError(f"{what} {tuple(dims)} exceeds the limits {limits}")
    if what == "block" and dims[0] * dims[1] * dims[2] > _MAX_THREADS:
        raise ValueError(f"block {tuple(dims)} has {dims[0] * dims[1] * dims[2]} threads; the most is {_MAX_THREADS}")
    return dims[0], dims[1], dims[2]


def check_shared_mem(value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"shared_mem must be an int byte count, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"shared_mem must be >= 0, got {value}")
    return int(value)


class PackedArgs:
    """The ``void*[]`` of one launch and the ctypes values it points to. ``address`` is what the backend takes."""

    __slots__ = ("_values", "_array", "address")

    def __init__(self, types: Sequence[str], values: Sequence[Any]) -> None:
        self._values = [_CTYPES[t](v) for t, v in zip(types, values, strict=False)]
        n = len(self._values)
        self._array: ctypes.Array[ctypes.c_void_p] | None = None
        self.address = 0
        if n:
            self._array = (ctypes.c_void_p * n)(*[ctypes.addressof(v) for v in self._values])
            self.address = ctypes.addressof(self._array)


class BoundArgs:
    """One launch's checked arguments. Attributes: ``kernel``, ``values`` (pointers as int
    addresses), ``args`` (:class:`KernelArgs`), ``buffers`` ((param, Buffer, mode, nbytes) for
    each Buffer argument; ``nbytes`` is the spec's minimum, or the Buffer's size without one)."""

    __slots__ = ("kernel", "values", "args", "buffers", "_packed")

    def __init__(
        self, kernel: Kernel, values: tuple[Any, ...], args: KernelArgs, buffers: tuple[tuple[Param, Buffer, str, int], ...]
    ) -> None:
        self.kernel = kernel
        self.values = values
        self.args = args
        self.buffers = buffers
        self._packed: PackedArgs | None = None

    def pack(self) -> PackedArgs:
        """The packed ``void*[]`` (made once; the values never change)."""
        if self._packed is None:
            self._packed = PackedArgs([p.type for p in self.kernel.signature.params], self.values)
        return self._packed

    def reads(self) -> list[tuple[Buffer, int]]:
        """Buffers the kernel reads (``"r"`` or ``"rw"``), with the bytes it may touch."""
        return [(b, n) for _p, b, mode, n in self.buffers if "r" in mode]

    def writes(self) -> list[tuple[Buffer, int]]:
        """Buffers the kernel writes (``"w"`` or ``"rw"``), with the bytes it may touch."""
        return [(b, n) for _p, b, mode, n in self.buffers if "w" in mode]


class Kernel:
    """One kernel of a loaded module: its name, :class:`Signature`, :class:`KernelSpec` and function handle.

    Made by :meth:`KernelModule.kernel` / ``rt.kernels.get(name)``; launch it with
    ``stream.launch_kernel(kernel, grid, block, args)`` or a ``Pipeline.kernel`` node.
    """

    __slots__ = ("_signature", "_spec", "_module", "_function", "_modes", "_plan")

    def __init__(self, module: KernelModule, signature: Signature, spec: KernelSpec | None, function: int) -> None:
        if signature.error is not None:
            raise TypeError(signature.error)
        self._signature = signature
        self._spec = spec
        self._module = module
        self._function = function
        module.runtime._kernel_names[function] = signature.name  # a traced launch is named by it
        modes: dict[str, str] = {}
        for p in signature.params:
            if p.is_pointer:
                modes[p.name] = (spec.access.get(p.name) if spec is not None else None) or ("r" if p.const else "rw")
        if spec is not None:
            names = {p.name for p in signature.params}
            unknown = (set(spec.sizes) | set(spec.access) | set(spec.nullable) | set(spec.align)) - names
            if unknown:
                raise ValueError(
                    f"the spec of kernel {signature.name!r} names unknown parameter(s) {sorted(unknown)}; the kernel is {signature}"
                )
            pointer_names = {p.name for p in signature.params if p.is_pointer}
            scalar_rules = (set(spec.sizes) | set(spec.access) | set(spec.nullable) | set(spec.align)) - pointer_names
            if scalar_rules:
                raise ValueError(f"the spec of kernel {signature.name!r} gives pointer rules to scalar parameter(s) {sorted(scalar_rules)}")
        self._modes = modes
        # Per parameter: (Param, is pointer, integer range or None), for bind's loop.
        self._plan = tuple((p, p.is_pointer, _INT_RANGES.get(p.type)) for p in signature.params)

    # -- identity ------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._signature.name

    @property
    def signature(self) -> Signature:
        return self._signature

    @property
    def params(self) -> tuple[Param, ...]:
        return self._signature.params

    @property
    def spec(self) -> KernelSpec | None:
        return self._spec

    @property
    def module(self) -> KernelModule:
        return self._module

    @property
    def runtime(self) -> Runtime:
        return self._module.runtime

    @property
    def function(self) -> int:
        """The backend's function handle (``CUfunction`` / ``hipFunction_t`` as int): an escape hatch."""
        return self._function

    def access(self, param: str) -> str:
        """``"r"``, ``"w"`` or ``"rw"`` for pointer parameter ``param``."""
        try:
            return self._modes[param]
        except KeyError:
            raise KeyError(f"{param!r} is not a pointer parameter of {self._signature}") from None

    # -- arguments -------------------------------------------------------------------------------
    def bind(self, args: Sequence[Any] | Mapping[str, Any]) -> BoundArgs:
        """Check and convert one launch's arguments (see the module docstring). Enqueues nothing."""
        plan = self._plan
        given = args if (type(args) is list or type(args) is tuple) and len(args) == len(plan) else self._arrange(args)
        values: list[Any] = []
        named: dict[str, Any] = {}
        buffers: dict[str, Buffer] = {}
        for (p, is_pointer, int_range), value in zip(plan, given, strict=False):
            if is_pointer:
                ptr, buf = self._pointer(p, value)
                values.append(ptr)
                named[p.name] = ptr
                if buf is not None:
                    buffers[p.name] = buf
            elif int_range is not None and type(value) is int and int_range[0] <= value <= int_range[1]:
                values.append(value)  # the common case of _scalar
                named[p.name] = value
            else:
                v = self._scalar(p, value)
                values.append(v)
                named[p.name] = v
        kargs = KernelArgs(named, buffers)
        spec = self._spec
        bound: list[tuple[Param, Buffer, str, int]] = []
        for p, is_pointer, _r in plan:
            if not is_pointer:
                continue
            need = spec.min_bytes(p.name, kargs) if spec is not None else 0
            ptr = named[p.name]
            buf = buffers.get(p.name)
            if ptr == 0:
                if spec is not None and p.name not in spec.nullable:
                    raise ValueError(f"{self.name}: {p.name} is NULL, but the kernel needs {need} bytes there")
                continue
            align = spec.align.get(p.name, p.element_size) if spec is not None else p.element_size
            if ptr % align:
                raise ValueError(f"{self.name}: {p.name} at 0x{ptr:x} is not {align}-byte aligned")
            if buf is not None:
                if buf.nbytes < need:
                    raise ValueError(
                        f"{self.name}: {p.name} has {buf.nbytes} bytes, but the kernel touches {need} bytes there " f"with these arguments"
                    )
                bound.append((p, buf, self._modes[p.name], need if spec is not None and p.name in spec.sizes else buf.nbytes))
        return BoundArgs(self, tuple(values), kargs, tuple(bound))

    def _arrange(self, args: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
        params = self._signature.params
        if isinstance(args, Mapping):
            names = [p.name for p in params]
            missing = [n for n in names if n not in args]
            extra = [k for k in args if k not in names]
            if missing or extra:
                raise TypeError(
                    f"{self.name}: arguments by name must name every parameter of {self._signature}; " f"missing {missing}, unknown {extra}"
                )
            return [args[n] for n in names]
        if isinstance(args, (str, bytes)) or not isinstance(args, Sequence):
            raise TypeError(
                f"{self.name}: args must be a list or tuple of {len(params)} values (or a dict by name), not {type(args).__name__}"
            )
        if len(args) != len(params):
            raise TypeError(f"{self.name} takes {len(params)} argument(s) ({self._signature}), got {len(args)}")
        return list(args)

    def _pointer(self, p: Param, value: Any) -> tuple[int, Buffer | None]:
        if value is None:
            return 0, None
        if isinstance(value, Buffer):  # the common case, checked in full below
            buf = value
            if buf._runtime is self._module._library._runtime and not buf.is_released and buf._kind != PAGEABLE:
                if not (buf._readonly and "w" in self._modes[p.name]):
                    return buf._ptr, buf
        if isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{self.name}: {p.name} is a pointer ({p.ctype}); got a bool")
        if isinstance(value, (int, np.integer)):
            ptr = int(value)
            if not 0 <= ptr < 2**64:
                raise ValueError(f"{self.name}: {p.name} address {ptr} is out of range")
            return ptr, None
        if isinstance(value, (float, str, complex, np.floating)):
            raise TypeError(f"{self.name}: {p.name} is a pointer ({p.ctype}); got {type(value).__name__}")
        rt = self.runtime
        if isinstance(value, Buffer):
            buf = value
        else:
            try:
                buf = wrap_foreign(value, rt)
            except TypeError as exc:
                raise TypeError(f"{self.name}: {p.name} is a pointer ({p.ctype}): {exc}") from None
        if buf.runtime is not None and buf.runtime is not rt:
            raise ValueError(f"{self.name}: {p.name} belongs to another runtime or device")
        if buf.is_released:
            raise ValueError(f"{self.name}: {p.name} was released")
        if buf.kind == PAGEABLE:
            raise ValueError(
                f"{self.name}: {p.name} is pageable host memory, which a kernel cannot access; "
                "use device memory or pinned memory from rt.host_allocator"
            )
        if buf.readonly and "w" in self._modes[p.name]:
            raise ValueError(f"{self.name}: {p.name} is read-only, but the kernel writes it")
        return buf.ptr, buf

    def _scalar(self, p: Param, value: Any) -> Any:
        if isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{self.name}: {p.name} is {p.ctype}; got a bool (pass 0 or 1)")
        if p.type in _INT_RANGES:
            if not isinstance(value, (int, np.integer)):
                raise TypeError(f"{self.name}: {p.name} is {p.ctype}; got {type(value).__name__}")
            v = int(value)
            lo, hi = _INT_RANGES[p.type]
            if not lo <= v <= hi:
                raise ValueError(f"{self.name}: {p.name} = {v} does not fit {p.ctype} [{lo}, {hi}]")
            return v
        if not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(f"{self.name}: {p.name} is {p.ctype}; got {type(value).__name__}")
        f = float(value)
        if p.type == "f32" and math.isfinite(f) and abs(f) > _F32_MAX:
            raise ValueError(f"{self.name}: {p.name} = {f} does not fit float")
        return f

    def __repr__(self) -> str:
        return f"<Kernel {self._signature} of {self._module.name!r}>"
