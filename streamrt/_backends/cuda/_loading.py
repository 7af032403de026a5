"""Finding cuda-bindings and the CUDA driver: lazy imports, the probe, libcuda through ctypes.

Nothing here imports cuda-bindings at module import: :func:`probe` and the
backend's constructor do, on first need. The probe never raises.
"""

from __future__ import annotations

import ctypes
import importlib
import re
import sys
from dataclasses import dataclass
from typing import Any

from .. import unavailable
from .._cstring import c_string

__all__ = ["MIN_CUDA_BINDINGS", "probe"]

#: Oldest cuda-bindings accepted: from 12.9.1 (and 13.0.0) every binding call
#: releases the GIL around the C call, which the blocking calls here rely on.
MIN_CUDA_BINDINGS = (12, 9, 1)

_INSTALL_HINT = "pip install 'streamrt[cuda]'"


# -- lazy imports ---------------------------------------------------------------------


def _runtime() -> Any:
    return importlib.import_module("cuda.bindings.runtime")


def _driver() -> Any:
    return importlib.import_module("cuda.bindings.driver")


def _version_tuple(text: str) -> tuple[int, ...] | None:
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    return tuple(int(part) for part in match.groups(default="0"))


def _bindings_version() -> str | None:
    bindings = importlib.import_module("cuda.bindings")
    version = getattr(bindings, "__version__", None)
    if isinstance(version, str):
        return version
    try:
        from importlib.metadata import version as dist_version

        return dist_version("cuda-bindings")
    except Exception:
        return None


# -- availability -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Missing:
    """Why the backend cannot be used: ``what`` is missing, ``how`` to fix it.

    ``short_hint`` is appended to the one-line probe reason where it is brief
    enough to belong there (an install command).
    """

    what: str
    how: str
    short_hint: str = ""

    @property
    def line(self) -> str:
        return f"{self.what} ({self.short_hint})" if self.short_hint else self.what


def _diagnose() -> _Missing | None:
    """``None`` when cuda-bindings imports and reports at least one device."""
    try:
        rt = _runtime()
    except ImportError:
        return _Missing("cuda-bindings is not installed", f"Install it with: {_INSTALL_HINT}", _INSTALL_HINT)
    except Exception as exc:  # a broken install (missing shared library, ABI mismatch)
        return _Missing(
            f"cuda-bindings failed to import ({exc!r})", f"Reinstall it with: {_INSTALL_HINT}", _INSTALL_HINT
        )
    version = _bindings_version()
    parsed = _version_tuple(version) if version else None
    if parsed is not None and parsed < MIN_CUDA_BINDINGS:
        floor = ".".join(map(str, MIN_CUDA_BINDINGS))
        upgrade = f"pip install -U 'cuda-bindings>={floor}'"
        return _Missing(
            f"cuda-bindings {version} is too old (its calls release the GIL only from {floor} on)",
            f"Upgrade it with: {upgrade}",
            upgrade,
        )
    try:
        err, count = rt.cudaGetDeviceCount()
    except Exception as exc:  # the bindings raise when a shared library cannot be found
        return _Missing(f"no CUDA device: cudaGetDeviceCount raised {exc!r}", _driver_hint(None, version))
    code = int(err)
    if code != 0:
        name = c_string(rt.cudaGetErrorName(code)[1])
        return _Missing(f"no CUDA device: {name}", _driver_hint(name, version))
    if not count:
        return _Missing(
            "no CUDA device: cudaGetDeviceCount found 0 devices", _driver_hint("cudaErrorNoDevice", version)
        )
    return None


def _driver_hint(error_name: str | None, version: str | None) -> str:
    sim = "open_runtime('sim') works without a GPU"
    if error_name == "cudaErrorInsufficientDriver":
        major = (version or "13").split(".", 1)[0]
        return (
            f"The NVIDIA driver is missing or older than the CUDA {major} runtime built into "
            f"cuda-bindings {version or '?'}: install or update the NVIDIA driver, or install the "
            f"cuda-bindings major version that matches the driver; {sim}"
        )
    if error_name == "cudaErrorNoDevice":
        return f"No GPU is visible to this process: check nvidia-smi and CUDA_VISIBLE_DEVICES; {sim}"
    return f"Check the NVIDIA driver installation with nvidia-smi; {sim}"


def probe() -> str | None:
    """``None`` when cuda-bindings imports and a CUDA device is present, else a one-line reason.

    Cheap after the first call (the first ``cudaGetDeviceCount`` loads the driver).
    Never raises.
    """
    try:
        missing = _diagnose()
    except Exception as exc:
        return f"cuda probe failed: {exc!r}"
    return None if missing is None else missing.line


# -- the driver library, for the calls the bindings do not wrap safely ---------------------------


def _load_libcuda() -> ctypes.CDLL:
    names = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")
    last: OSError | None = None
    for lib_name in names:
        try:
            return ctypes.CDLL(lib_name)
        except OSError as exc:
            last = exc
    raise unavailable(
        "cuda",
        f"the CUDA driver library ({names[0]}) could not be loaded: {last}",
        "Install the NVIDIA driver (nvidia-smi must work)",
    )


def _proc_address(libcuda: ctypes.CDLL, name: str, version: int = 12000) -> int | None:
    """The address of driver entry point ``name`` as of CUDA ``version`` (``cuGetProcAddress_v2``), or ``None``."""
    get_proc = getattr(libcuda, "cuGetProcAddress_v2", None)
    if get_proc is None:
        return None
    get_proc.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p]
    get_proc.restype = ctypes.c_int
    address = ctypes.c_void_p()
    status = ctypes.c_int(0)
    if get_proc(name.encode(), ctypes.byref(address), version, 0, ctypes.byref(status)) != 0:
        return None
    return address.value or None


def _stream_wait_value64(libcuda: ctypes.CDLL) -> Any:
    """The driver's ``cuStreamWaitValue64`` (the version of CUDA 12: no module parameter needed), or ``None``."""
    prototype = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint)
    address = _proc_address(libcuda, "cuStreamWaitValue64")
    if address is None:
        symbol = getattr(libcuda, "cuStreamWaitValue64_v2", None)
        if symbol is None:
            return None
        address = ctypes.cast(symbol, ctypes.c_void_p).value
    return prototype(address) if address else None
