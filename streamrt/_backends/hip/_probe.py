"""Whether the hip backend is usable here, and if not, what is missing and how to get it."""

from __future__ import annotations

from . import _loading as L
from ._codes import error_name, error_string

__all__ = ["INSTALL_HINT", "probe"]

INSTALL_HINT = "pip install 'streamrt[hip]'"


def _diagnose() -> tuple[str, str] | None:
    """``None`` when HIP is usable here, else ``(what is missing, how to get it)``."""
    if not L._hip_python_installed():
        return "hip-python is not installed", f"Install it with: {INSTALL_HINT}"
    try:
        L._load()
    except ImportError as exc:
        return f"hip-python could not be imported ({exc})", f"Reinstall it with: {INSTALL_HINT}"
    try:
        err, count = L._hip.hipGetDeviceCount()
    except RuntimeError as exc:  # hip-python could not dlopen libamdhip64.so
        return (
            f"libamdhip64.so could not be loaded ({exc})",
            "Install ROCm, or set ROCM_PATH to the ROCm installation whose lib/ holds libamdhip64.so",
        )
    if err:
        return (
            f"no usable HIP device ({error_name(err)}: {error_string(err)})",
            "Check the GPU driver and that this process may access the GPU",
        )
    if count == 0:
        return "no HIP device found", "Check the GPU driver and that this process may access the GPU"
    return None


def probe() -> str | None:
    """``None`` when the HIP backend is usable here, else a one-line reason with the fix."""
    problem = _diagnose()
    return None if problem is None else f"{problem[0]}. {problem[1]}"
