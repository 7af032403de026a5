"""Runtime compilation with NVRTC (``cuda.bindings.nvrtc``): CUDA C++ source to a CUBIN or PTX image.

Needs no GPU: :func:`nvrtc_compile` takes the target compute capability.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from ..._errors import KernelCompileError
from .. import unavailable
from .._cstring import c_string
from ._loading import _bindings_version

__all__ = ["nvrtc_compile"]


def _nvrtc() -> Any:
    """``cuda.bindings.nvrtc`` with its library loaded; ``BackendUnavailableError`` if it is not installed."""
    nvrtc = importlib.import_module("cuda.bindings.nvrtc")
    try:
        err, _major, _minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # the bindings raise when libnvrtc cannot be found
        version = _bindings_version() or "13"
        wheel = "nvidia-cuda-nvrtc-cu12" if version.startswith("12.") else "nvidia-cuda-nvrtc"
        raise unavailable(
            "cuda", f"NVRTC (libnvrtc) could not be loaded: {exc}", f"Install it with: pip install '{wheel}'"
        ) from exc
    if int(err) != 0:
        raise unavailable("cuda", f"nvrtcVersion failed ({err!r})", "Reinstall NVRTC: pip install 'nvidia-cuda-nvrtc'")
    return nvrtc


def _has_option(options: Sequence[str], *prefixes: str) -> bool:
    return any(opt.startswith(prefixes) for opt in options)


def nvrtc_compile(source: str, name: str, options: Sequence[str], capability: tuple[int, int]) -> bytes:
    """Compile ``source`` with NVRTC for compute capability ``capability``; return a loadable image.

    Adds ``-default-device``, ``--std=c++17``, ``-D__STREAMRT_CUDA__=1`` and the
    architecture unless ``options`` already set them. When NVRTC supports the
    device's ``sm_XY`` the result is a CUBIN; otherwise it is PTX for the newest
    virtual architecture NVRTC supports at or below the device's (the driver
    JIT-compiles it). Raises ``KernelCompileError`` with the full log on failure.
    Blocking; releases the GIL while NVRTC works.
    """
    nvrtc = _nvrtc()
    arch = capability[0] * 10 + capability[1]
    err, supported = nvrtc.nvrtcGetSupportedArchs()
    supported = sorted(int(a) for a in supported) if int(err) == 0 else [arch]
    flags: list[str] = []
    target = f"sm_{arch}"
    if not _has_option(options, "--gpu-architecture", "-arch", "--gpu-name"):
        if arch in supported:
            flags.append(f"--gpu-architecture=sm_{arch}")
        else:
            older = [a for a in supported if a <= arch]
            if not older:
                raise KernelCompileError(
                    f"nvrtc cannot compile {name!r}: device architecture sm_{arch} is older than every "
                    f"architecture this NVRTC supports",
                    f"supported architectures: {', '.join(f'sm_{a}' for a in supported)}",
                )
            target = f"compute_{older[-1]}"
            flags.append(f"--gpu-architecture={target}")
    if not _has_option(options, "-default-device", "--device-as-default-execution-space"):
        flags.append("-default-device")
    if not _has_option(options, "--std", "-std"):
        flags.append("--std=c++17")
    flags.append("-D__STREAMRT_CUDA__=1")
    all_options = [opt.encode() for opt in (*flags, *options)]

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    if int(err) != 0:
        raise KernelCompileError(f"nvrtcCreateProgram failed for {name!r}: {_nvrtc_error(nvrtc, err)}", "")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(all_options), all_options)
        log = _nvrtc_log(nvrtc, prog)
        if int(err) != 0:
            raise KernelCompileError(
                f"nvrtc failed to compile {name!r} for {target} ({_nvrtc_error(nvrtc, err)}); "
                f"options: {' '.join(o.decode() for o in all_options)}",
                log,
            )
        image = _nvrtc_output(nvrtc, prog, "CUBIN")
        if not image:
            image = _nvrtc_output(nvrtc, prog, "PTX")  # keeps the terminating NUL the loader wants
        if not image:
            raise KernelCompileError(f"nvrtc produced no CUBIN or PTX for {name!r}", log)
        return image
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvrtc_error(nvrtc: Any, err: Any) -> str:
    try:
        return c_string(nvrtc.nvrtcGetErrorString(err)[1])
    except Exception:
        return repr(err)


def _nvrtc_log(nvrtc: Any, prog: Any) -> str:
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if int(err) != 0 or size <= 1:
        return ""
    buf = b" " * size
    (err,) = nvrtc.nvrtcGetProgramLog(prog, buf)
    return c_string(buf) if int(err) == 0 else ""


def _nvrtc_output(nvrtc: Any, prog: Any, kind: str) -> bytes:
    err, size = getattr(nvrtc, f"nvrtcGet{kind}Size")(prog)
    if int(err) != 0 or not size:
        return b""
    buf = b" " * size
    (err,) = getattr(nvrtc, f"nvrtcGet{kind}")(prog, buf)
    return buf if int(err) == 0 else b""
