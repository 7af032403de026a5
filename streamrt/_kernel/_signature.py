"""Kernel signatures: the ``extern "C" __global__ void name(type a, ...)`` declarations of a source.

:func:`parse_kernels` reads every such declaration (comments ignored) into a
:class:`Signature`: a tuple of :class:`Param`, each either a pointer (any
``T*``; ``const T*`` is read-only) or one of the scalar types below. A
parameter of another type (a struct by value, ``bool``, ``char``, ``half``)
makes the signature unusable: :attr:`Signature.error` says why, and the loader
raises ``TypeError`` with it when that kernel is asked for.

Scalar type codes and the C spellings that map to them (LP64, as on every
NVIDIA and AMD GPU target)::

    i32  int, signed, int32_t, srt_i32           u32  unsigned, unsigned int, uint32_t, srt_u32
    i64  long, long long, int64_t, srt_i64       u64  unsigned long (long), uint64_t, size_t, srt_u64
    f32  float                                   f64  double

Pure functions; no device, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .._kernel_decl import DECL as _DECL
from .._kernel_decl import QUALIFIERS as _QUALIFIERS
from .._kernel_decl import blank_comments, split_params

__all__ = ["Param", "SCALAR_TYPES", "Signature", "parse_kernels"]

SCALAR_TYPES = ("i32", "u32", "i64", "u64", "f32", "f64")

_C_SCALARS = {
    "int": "i32",
    "signed": "i32",
    "signed int": "i32",
    "int32_t": "i32",
    "srt_i32": "i32",
    "unsigned": "u32",
    "unsigned int": "u32",
    "uint32_t": "u32",
    "srt_u32": "u32",
    "long": "i64",
    "long int": "i64",
    "long long": "i64",
    "long long int": "i64",
    "int64_t": "i64",
    "ptrdiff_t": "i64",
    "srt_i64": "i64",
    "unsigned long": "u64",
    "unsigned long int": "u64",
    "unsigned long long": "u64",
    "unsigned long long int": "u64",
    "uint64_t": "u64",
    "size_t": "u64",
    "srt_u64": "u64",
    "float": "f32",
    "double": "f64",
}

# Element sizes of pointee types (the default alignment a pointer argument is checked for).
_ELEMENT_SIZES = {
    **{name: 4 if code in ("i32", "u32", "f32") else 8 for name, code in _C_SCALARS.items()},
    "char": 1,
    "signed char": 1,
    "unsigned char": 1,
    "int8_t": 1,
    "uint8_t": 1,
    "srt_i8": 1,
    "srt_u8": 1,
    "short": 2,
    "unsigned short": 2,
    "int16_t": 2,
    "uint16_t": 2,
    "srt_u128": 16,
    "void": 1,
}

_IDENT = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class Param:
    """One kernel parameter.

    Attributes:
        name: the parameter name (``argN`` when the declaration has none).
        type: ``"ptr"`` or a scalar code of :data:`SCALAR_TYPES`.
        ctype: the declared C type text, e.g. ``"const srt_u32*"``.
        const: a pointer to const (the kernel only reads through it).
        element_size: bytes of the pointee type (1 when unknown); pointers only.
    """

    name: str
    type: str
    ctype: str
    const: bool = False
    element_size: int = 1

    @property
    def is_pointer(self) -> bool:
        return self.type == "ptr"


@dataclass(frozen=True)
class Signature:
    """A kernel declaration: its name, parameters and where it is.

    ``error`` is ``None`` when every parameter has a supported type, else the reason.
    """

    name: str
    params: tuple[Param, ...]
    line: int
    error: str | None = None

    def param(self, name: str) -> Param:
        """The parameter called ``name``; ``KeyError`` if there is none."""
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"kernel {self.name!r} has no parameter {name!r}")

    def __str__(self) -> str:
        return f"{self.name}({', '.join(f'{p.ctype} {p.name}' for p in self.params)})"


def _param(text: str, index: int) -> tuple[Param | None, str | None]:
    """Parse one parameter declaration; ``(param, None)`` or ``(None, reason)``."""
    is_ptr = "*" in text
    if "&" in text or "[" in text:
        return None, f"parameter {index} {text!r}: references and arrays are not kernel parameters streamrt can pass"
    if is_ptr:
        before, _, after = text.rpartition("*")
        base_tokens = _IDENT.findall(before.split("*", 1)[0])
        name_tokens = [t for t in _IDENT.findall(after) if t not in _QUALIFIERS]
        name = name_tokens[-1] if name_tokens else f"arg{index}"
        const = "const" in base_tokens
        base = " ".join(t for t in base_tokens if t not in _QUALIFIERS)
        ctype = ("const " if const else "") + base + "*" * text.count("*")
        size = _ELEMENT_SIZES.get(base, 1) if text.count("*") == 1 else 8
        return Param(name, "ptr", ctype, const, size), None
    tokens = [t for t in _IDENT.findall(text) if t not in _QUALIFIERS]
    if not tokens:
        return None, f"parameter {index} {text!r} has no type"
    type_tokens, name = (tokens[:-1], tokens[-1]) if len(tokens) >= 2 and " ".join(tokens) not in _C_SCALARS else (tokens, f"arg{index}")
    ctype = " ".join(type_tokens)
    code = _C_SCALARS.get(ctype)
    if code is None:
        return None, (
            f"parameter {index} '{text}' has type '{ctype}', which streamrt cannot pass; "
            "use a pointer or int/unsigned/long long/unsigned long long/float/double (or the srt_ typedefs)"
        )
    return Param(name, code, ctype), None


def parse_kernels(source: str) -> dict[str, Signature]:
    """Every ``extern "C" __global__`` kernel of ``source``, by name, in declaration order.

    A kernel declared twice keeps its first declaration.
    """
    clean = blank_comments(source)
    out: dict[str, Signature] = {}
    for m in _DECL.finditer(clean):
        if "__global__" not in _IDENT.findall(m.group(1)):
            continue
        name = m.group(2)
        if name in out:
            continue
        line = clean.count("\n", 0, m.start()) + 1
        texts = split_params(clean, m.end() - 1)
        if texts is None:
            out[name] = Signature(name, (), line, f"kernel {name!r}: unterminated parameter list")
            continue
        params: list[Param] = []
        error: str | None = None
        for i, text in enumerate(texts):
            p, why = _param(text, i)
            if p is None:
                error = error or f"kernel {name!r}: {why}"
                continue
            params.append(p)
        names = [p.name for p in params]
        if error is None and len(set(names)) != len(names):
            error = f"kernel {name!r}: duplicate parameter names {names}"
        out[name] = Signature(name, tuple(params), line, error)
    return out
