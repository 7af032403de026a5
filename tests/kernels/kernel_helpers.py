"""Helpers of the kernel tests: seqstart arrays, the numpy twins run on host arrays,
and the host emulation of the kernel sources (tests/kernels/emulation)."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import streamrt._kernel._builtin  # noqa: F401 - registers the shipped kernels' twins
import streamrt.recipes.fmha_bwd  # noqa: F401 - registers the recipe's kernels' twins
from streamrt._backends.sim import registered_twins

REPO = Path(__file__).resolve().parents[2]
KERNELS = REPO / "kernels"
EMULATION = Path(__file__).resolve().parent / "emulation"


def seqstart(lengths: Sequence[int] | np.ndarray, first: int = 0) -> np.ndarray:
    return np.concatenate([[first], first + np.cumsum(np.asarray(lengths, dtype=np.int64))]).astype(np.int32)


class HostTwinContext:
    """The ``ctx`` a twin gets, over host numpy arrays instead of simulated memory.

    ``view(ptr, count, dtype)`` must fall inside one of the registered arrays
    (addresses are the arrays' real host addresses), else ``AssertionError``.
    """

    def __init__(self, *arrays: np.ndarray) -> None:
        self._arrays = arrays

    def view(self, ptr: int, count: int, dtype: Any = np.uint8) -> np.ndarray:
        dt = np.dtype(dtype)
        n = int(count) * dt.itemsize
        if n == 0:
            return np.empty(0, dtype=dt)
        for a in self._arrays:
            base = a.ctypes.data
            if base <= ptr and ptr + n <= base + a.nbytes:
                raw = a.view(np.uint8).reshape(-1)[ptr - base : ptr - base + n]
                return raw.view(dt)
        raise AssertionError(f"twin asked for [{ptr:#x}, +{n}) outside the arrays it was given")


def run_twin(name: str, grid: Any, block: Any, arrays: Sequence[np.ndarray], args: Sequence[Any]) -> None:
    """Run the registered simulator twin of ``name`` on host ``arrays`` (pointer args are their addresses)."""
    twin = registered_twins()[name]
    twin.fn(HostTwinContext(*arrays), grid, block, *args)


# -- host emulation of the kernel sources -----------------------------------------------------------------


def _emulation_sources() -> list[Path]:
    return sorted(KERNELS.glob("*.h")) + sorted(KERNELS.glob("*.hip")) + sorted(EMULATION.glob("*"))


@functools.cache
def emulation_library() -> ctypes.CDLL | str:
    """The shipped kernels compiled for the host (a ctypes library), or why that is impossible here.

    Built once per source hash into a temporary directory (g++ -std=c++20; needs <ucontext.h>).
    """
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        return "no C++ compiler (g++ or clang++) for the host emulation"
    digest = hashlib.sha256()
    for p in _emulation_sources():
        digest.update(p.name.encode() + b"\0" + p.read_bytes())
    out = Path(tempfile.gettempdir()) / f"streamrt-kernel-emulation-{digest.hexdigest()[:16]}.so"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        cmd = [
            cxx,
            "-std=c++20",
            "-O1",
            "-shared",
            "-fPIC",
            "-I",
            str(KERNELS),
            "-I",
            str(EMULATION),
            str(EMULATION / "emu_kernels.cpp"),
            "-o",
            str(tmp),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            if "No such file" in proc.stderr or "unrecognized command-line option" in proc.stderr:
                return f"{cxx} cannot build the host emulation here: {proc.stderr[-300:]}"
            raise AssertionError(f"the host emulation does not compile:\n{proc.stderr}")
        os.replace(tmp, out)
    lib = ctypes.CDLL(str(out))
    ptr, i32, u32 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_uint
    lib.emu_fmha_bwd_prepare.argtypes = [u32, u32, ptr, ptr, ptr, ptr] + [i32] * 10
    i64 = ctypes.c_int64
    lib.emu_fmha_bwd_dq_acc_prezero.argtypes = [u32, u32, ptr, i64, i64, i64]
    lib.emu_fill_u32.argtypes = [u32, u32, ptr, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32]
    lib.emu_checksum_u32.argtypes = [u32, u32, ptr, ctypes.c_uint64, ptr]
    lib.emu_spin_sleep.argtypes = [ptr, ctypes.c_double, ctypes.c_double, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64]
    lib.emu_spin_sleep.restype = ctypes.c_double
    return lib


def aligned_bytes(n: int, fill: int, align: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """``(owner, view)``: a uint8 view of ``n`` bytes set to ``fill`` whose address is ``align``-aligned."""
    owner = np.full(n + align, fill, dtype=np.uint8)
    off = (-owner.ctypes.data) % align
    return owner, owner[off : off + n]
