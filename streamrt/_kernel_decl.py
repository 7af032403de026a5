"""Shared lexing of ``extern "C" __global__ void NAME(...)`` kernel declarations.

Used by :mod:`streamrt._kernel._signature` (signatures for the runtime) and by
the simulator's twin checks (:mod:`streamrt._backends.sim._kernels`). Pure
functions on text; it imports nothing from streamrt, so any layer may use it.
"""

from __future__ import annotations

import re

__all__ = ["COMMENTS", "DECL", "QUALIFIERS", "blank_comments", "split_params"]

COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
# group 1: the specifiers before ``void`` (must include ``__global__``); group 2: the kernel name.
DECL = re.compile(r'extern\s+"C"\s+([^;{}]*?)\bvoid\s+([A-Za-z_]\w*)\s*\(')
QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct"}


def blank_comments(source: str) -> str:
    """``source`` with every comment replaced by spaces (newlines kept, so offsets and lines still match)."""
    return COMMENTS.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), source)


def split_params(text: str, open_paren: int) -> list[str] | None:
    """The top-level comma-separated parameter texts of the list opening at ``text[open_paren]``.

    ``(void)`` and ``()`` give ``[]``; ``None`` when the list is not closed.
    """
    depth = 0
    for i in range(open_paren, len(text)):
        c = text[i]
        if c in "(<[":
            depth += 1
        elif c in ")>]":
            depth -= 1
            if depth == 0:
                inner = text[open_paren + 1 : i]
                parts: list[str] = []
                cur: list[str] = []
                level = 0
                for ch in inner:
                    if ch in "(<[":
                        level += 1
                    elif ch in ")>]":
                        level -= 1
                    if ch == "," and level == 0:
                        parts.append("".join(cur).strip())
                        cur = []
                    else:
                        cur.append(ch)
                last = "".join(cur).strip()
                if last and last != "void":
                    parts.append(last)
                return parts
    return None
