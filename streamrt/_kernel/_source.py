"""Kernel sources: where the shipped ones are, and how an include of the portability header is resolved.

The sources ship as data of the ``streamrt.kernels`` namespace package (the
repository's top-level ``kernels/`` directory, mapped by pyproject.toml). In an
installed wheel they are found through :mod:`importlib.resources`; in a source
checkout or an editable install without the mapping, in ``<repo>/kernels``.

NVRTC and hiprtc get no include path: :func:`expand_includes` pastes every
``#include "file"`` of a shipped file (``streamrt_kernel.h``) into the text,
with ``#line`` directives so compiler messages name the right file and line.
The expanded text is what is compiled and what the kernel cache hashes.

Blocking: reads files. Thread-safe (the listing is cached after the first call).
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from pathlib import Path
from typing import Any

__all__ = ["SOURCE_SUFFIXES", "expand_includes", "read_shipped", "shipped_dir", "shipped_sources"]

SOURCE_SUFFIXES = (".hip", ".cpp", ".cu")
_HEADER_SUFFIXES = (".h", ".hpp")
_PACKAGE = "streamrt.kernels"
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*$', re.M)


@functools.cache
def shipped_dir() -> Any:
    """The directory (a ``Path`` or an importlib.resources ``Traversable``) of the shipped kernel sources.

    Raises ``FileNotFoundError`` when neither the installed package data nor the
    repository's ``kernels/`` holds ``streamrt_kernel.h``.
    """
    try:
        files = importlib.resources.files(_PACKAGE)
        if files.joinpath("streamrt_kernel.h").is_file():
            return files
    except (ModuleNotFoundError, TypeError, ValueError):
        pass
    repo = Path(__file__).resolve().parents[2] / "kernels"
    if (repo / "streamrt_kernel.h").is_file():
        return repo
    raise FileNotFoundError(
        "streamrt's kernel sources are missing: neither the package data 'streamrt.kernels' nor "
        f"{repo} holds streamrt_kernel.h (reinstall streamrt)"
    )


@functools.cache
def shipped_sources() -> tuple[str, ...]:
    """File names of the shipped kernel sources (``*.hip``, ``*.cpp``, ``*.cu``), sorted."""
    return tuple(sorted(p.name for p in shipped_dir().iterdir() if p.name.endswith(SOURCE_SUFFIXES)))


def _shipped_files() -> tuple[str, ...]:
    return tuple(p.name for p in shipped_dir().iterdir() if p.name.endswith(SOURCE_SUFFIXES + _HEADER_SUFFIXES))


def read_shipped(name: str) -> str:
    """The text of shipped file ``name`` (not expanded). ``FileNotFoundError`` names the files there are."""
    if not isinstance(name, str) or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"a shipped kernel source is named by its file name, got {name!r}")
    entry = shipped_dir().joinpath(name)
    if not entry.is_file():
        raise FileNotFoundError(f"no kernel source {name!r} ships with streamrt; there are: {', '.join(shipped_sources())}")
    return str(entry.read_text(encoding="utf-8"))


def expand_includes(text: str, name: str) -> str:
    """``text`` with each ``#include "F"`` of a shipped file ``F`` replaced by F's (expanded) text.

    Each file is pasted once (later includes of it become empty, like an include
    guard). Includes of other files are left for the compiler.
    """
    shipped = set(_shipped_files())
    done: set[str] = set()

    def expand(body: str, file: str) -> str:
        out: list[str] = []
        pos = 0
        for m in _INCLUDE.finditer(body):
            target = m.group(1)
            if target not in shipped:
                continue
            line_after = body.count("\n", 0, m.end()) + 2  # the line after the include
            out.append(body[pos : m.start()])
            if target not in done:
                done.add(target)
                inner = expand(read_shipped(target), target)
                out.append(f'#line 1 "{target}"\n{inner}\n')
            out.append(f'#line {line_after} "{file}"')
            pos = m.end()
        out.append(body[pos:])
        return "".join(out)

    return expand(text, name)
