"""``streamrt doctor``: which backends, GPUs and libraries are present, and how to get the missing ones.

:func:`diagnose` never raises for a missing or broken component: it probes each
backend with :func:`streamrt._backends.probe_backend` (cheap), and for a
backend that cannot be used it asks the backend to explain itself (its
``BackendUnavailableError`` names what is missing and how to install it). A
usable backend is opened briefly to list its devices. Optional Python
libraries are looked up by import metadata, without importing them (importing
torch takes seconds).

Blocking: opening a GPU backend initialises its driver (up to a second).
Thread rules: call from one thread; it opens and closes backends itself.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from .._backends import BACKEND_NAMES, load_backend, probe_backend, select_auto
from .._errors import BackendUnavailableError
from .._version import __version__

__all__ = ["BackendStatus", "DeviceInfo", "DoctorReport", "LibraryStatus", "diagnose", "native_module_problem"]

# How to get each backend when it is missing (shown under the backend's own explanation).
_BACKEND_HOW = {
    "cuda": "pip install 'streamrt[cuda]' (cuda-bindings >= 12.6) on a machine with an NVIDIA GPU and driver",
    "hip": "pip install 'streamrt[hip]' (hip-python matching your ROCm version) on a machine with ROCm and an AMD GPU",
    "sim": "the simulator needs only numpy; reinstall streamrt if it fails",
}

# Optional libraries: (distribution name, import name, what streamrt uses it for, how to get it).
_LIBRARIES: tuple[tuple[str, str, str, str], ...] = (
    ("cuda-bindings", "cuda.bindings", "the cuda backend", "pip install 'streamrt[cuda]'"),
    ("hip-python", "hip", "the hip backend", "pip install 'streamrt[hip]'"),
    ("torch", "torch", "wrapping torch streams and tensors, training-loop demos", "pip install 'streamrt[torch]'"),
    ("cupy", "cupy", "wrapping cupy streams and arrays", "pip install cupy-cuda12x (or the wheel for your CUDA/ROCm)"),
    ("numba", "numba", "native (cfunc) host functions that run without the GIL", "pip install numba"),
    ("matplotlib", "matplotlib", "timeline PNGs (streamrt demo / study)", "pip install 'streamrt[plot]'"),
    ("uvloop", "uvloop", "a faster asyncio event loop (optional)", "pip install uvloop"),
)

# The optional C extensions (built by pip install where a C compiler is found).
FASTPATH_MODULE = "allocators._fastpath_c"
PACK_MODULE = "streamrt.recipes.fmha_bwd._pack_c"
RELEASE_MODULE = "streamrt._graph_release_c"
LAUNCH_MODULE = "streamrt._backends._launch_c"

# Device files and tools that show whether GPU hardware and a driver are installed at all.
_HARDWARE_HINTS: tuple[tuple[str, str, str], ...] = (
    ("NVIDIA driver device file", "/dev/nvidiactl", "no NVIDIA kernel driver loaded (or no NVIDIA GPU passed to this container)"),
    ("AMD KFD device file", "/dev/kfd", "no AMD ROCm kernel driver loaded (or no AMD GPU passed to this container)"),
)
_TOOLS: tuple[tuple[str, str], ...] = (
    ("nvidia-smi", "installed with the NVIDIA driver"),
    ("rocm-smi", "installed with ROCm"),
)


@dataclass(frozen=True)
class DeviceInfo:
    """One device of a usable backend."""

    backend: str
    index: int
    name: str
    architecture: str
    total_memory: int
    multiprocessor_count: int
    is_simulated: bool


@dataclass(frozen=True)
class BackendStatus:
    """Whether a backend can be used here; when it cannot, ``why`` and ``how`` say so."""

    name: str
    usable: bool
    why: str = ""
    how: str = ""
    devices: tuple[DeviceInfo, ...] = ()


@dataclass(frozen=True)
class LibraryStatus:
    """An optional Python library: its version when present, else how to install it."""

    name: str
    present: bool
    version: str
    used_for: str
    how: str


@dataclass(frozen=True)
class DoctorReport:
    """What :func:`diagnose` found. ``str(report)`` is the human-readable text; :meth:`as_dict` is JSON-ready."""

    streamrt_version: str
    python: str
    platform: str
    numpy: str
    backends: tuple[BackendStatus, ...]
    libraries: tuple[LibraryStatus, ...]
    hardware: tuple[tuple[str, bool, str], ...]  # (what, present, meaning when absent)
    auto_backend: str
    notes: tuple[str, ...] = field(default=())

    @property
    def gpu_backends(self) -> tuple[str, ...]:
        """Names of the usable GPU (non-simulated) backends."""
        return tuple(b.name for b in self.backends if b.usable and not any(d.is_simulated for d in b.devices))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        lines = [
            f"streamrt {self.streamrt_version} doctor",
            f"python {self.python} on {self.platform}, numpy {self.numpy}",
            "",
            "backends",
        ]
        for b in self.backends:
            if b.usable:
                devs = ", ".join(f"{d.index}: {d.name} ({d.architecture}, {_gib(d.total_memory)})" for d in b.devices)
                lines.append(f"  {b.name:<6} ok       {len(b.devices)} device(s): {devs}")
            else:
                lines.append(f"  {b.name:<6} missing  why: {b.why}")
                lines.append(f"  {'':<6}          how: {b.how}")
        lines += ["", "GPU hardware and drivers"]
        for what, present, meaning in self.hardware:
            lines.append(f"  {what:<28} {'found' if present else 'not found'}{'' if present else ': ' + meaning}")
        lines += ["", "optional libraries"]
        hows = [b.how for b in self.backends if not b.usable]
        for lib in self.libraries:
            if lib.present:
                lines.append(f"  {lib.name:<14} {lib.version:<12} for {lib.used_for}")
            elif any(lib.how in how for how in hows):  # its install hint is printed under backends
                lines.append(f"  {lib.name:<14} {'missing':<12} for {lib.used_for} (see above)")
            else:
                lines.append(f"  {lib.name:<14} {'missing':<12} for {lib.used_for}; how: {lib.how}")
        lines += ["", f"open_runtime('auto') picks: {self.auto_backend}"]
        if not self.gpu_backends:
            lines.append("no GPU backend is usable here: everything runs on the simulator (open_runtime('sim')).")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def _gib(n: int) -> str:
    return f"{n / 2**30:.0f} GiB"


def _backend_status(name: str) -> BackendStatus:
    try:
        reason = probe_backend(name)
    except Exception as exc:  # a broken install must not stop the doctor
        reason = f"probe failed: {exc!r}"
    if reason is not None:
        why, how = _explain(name, reason)
        return BackendStatus(name, False, why=why, how=how)
    try:
        impl = load_backend(name)
    except BackendUnavailableError as exc:
        return BackendStatus(name, False, why=str(exc), how=_BACKEND_HOW[name])
    except Exception as exc:
        return BackendStatus(name, False, why=f"opening it failed: {exc!r}", how=_BACKEND_HOW[name])
    try:
        devices = []
        for i in range(impl.device_count()):
            caps = impl.capabilities(i)
            devices.append(
                DeviceInfo(name, i, caps.device_name, caps.architecture, caps.total_memory, caps.multiprocessor_count, caps.is_simulated)
            )
    except Exception as exc:
        return BackendStatus(name, False, why=f"listing its devices failed: {exc!r}", how=_BACKEND_HOW[name])
    finally:
        impl.close()
    return BackendStatus(name, True, devices=tuple(devices))


def _explain(name: str, reason: str) -> tuple[str, str]:
    """``(what is missing, how to get it)`` from the backend's own ``BackendUnavailableError``.

    Its message is ``backend 'x' is not available: <what>. <how>``; the probe's one-line
    ``reason`` (which may carry the how as well) stands in when the error does not say more.
    """
    try:
        impl = load_backend(name)
    except BackendUnavailableError as exc:
        text = str(exc)
        prefix = f"backend {name!r} is not available: "
        if text.startswith(prefix):
            text = text[len(prefix) :]
        # The how is one of the backend's fixed sentences; the what may quote an exception with ". " in it.
        what, sep, how = text.rpartition(". ")
        if sep and what.strip() and how.strip():
            return what.strip(), how.strip()
        return reason, _BACKEND_HOW[name]
    except Exception:
        return reason, _BACKEND_HOW[name]
    impl.close()  # became usable between the probe and now
    return reason, _BACKEND_HOW[name]


def _installed_version(dist: str, module: str) -> str:
    """The version of distribution ``dist``, else of the one that provides ``module`` under a longer name.

    Some libraries ship under a name per platform (CuPy: ``cupy-cuda12x``, ``cupy-rocm-6-0``): the
    import name's distributions that start with ``dist`` stand in. ``""`` when none is installed.
    """
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pass
    top = module.partition(".")[0]
    for candidate in sorted(importlib.metadata.packages_distributions().get(top, ())):
        if candidate.lower().replace("_", "-").startswith(dist + "-"):
            return f"{importlib.metadata.version(candidate)} ({candidate})"
    return ""


def _library_status(dist: str, module: str, used_for: str, how: str) -> LibraryStatus:
    version = _installed_version(dist, module)
    if not version:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if found:  # importable, but installed without package metadata (a source tree on the path)
            version = "unknown version"
    return LibraryStatus(dist, bool(version), version, used_for, how)


def native_module_problem(module: str) -> str | None:
    """Why the optional C extension ``module`` cannot be imported (``None`` when it can).

    Tells a module that was never built (no compiled file next to its source: ``pip
    install`` found no C compiler) from one that is there but fails to load. Imports
    the module when its file is there.
    """
    package, _, leaf = module.rpartition(".")
    try:
        spec = importlib.util.find_spec(module)
    except ImportError as exc:  # its package itself cannot be imported
        return f"{module} cannot be imported: {exc}"
    if spec is None:
        where = importlib.util.find_spec(package)
        folder = os.path.dirname(where.origin) if where is not None and where.origin else package
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
        return f"{module} was not built: no {leaf}{suffix} in {folder}"
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return f"{module} is built ({spec.origin}) but does not load: {exc}"
    return None


def diagnose(*, backends: tuple[str, ...] = BACKEND_NAMES) -> DoctorReport:
    """Probe ``backends``, the GPU device files and tools, and the optional libraries."""
    statuses = tuple(_backend_status(n) for n in backends)
    hardware: list[tuple[str, bool, str]] = [(what, os.path.exists(path), meaning) for what, path, meaning in _HARDWARE_HINTS]
    hardware += [(f"{tool} on PATH", shutil.which(tool) is not None, f"not on PATH ({where})") for tool, where in _TOOLS]
    libraries = tuple(_library_status(*spec) for spec in _LIBRARIES)
    try:
        auto = select_auto()
    except Exception as exc:
        auto = f"none ({exc!r})"
    notes: list[str] = []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        notes.append(f"CUDA_VISIBLE_DEVICES={visible!r} limits the CUDA devices this process sees")
    for var in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        if os.environ.get(var) is not None:
            notes.append(f"{var}={os.environ[var]!r} limits the HIP devices this process sees")
    from allocators import _fastpath

    rebuild = "reinstall streamrt with a C compiler present"
    slower = "allocate + release round trips take 2.5-3x longer (docs/performance.md, runs 59 and 62)"
    if not _fastpath.GIL_ENABLED:  # by design; importing the C module would turn the GIL back on
        notes.append(f"the caching allocators run their hot path in Python on this free-threaded interpreter (the C one needs the GIL): {slower}")
    elif not _fastpath.NATIVE:
        why = native_module_problem(FASTPATH_MODULE) or f"{FASTPATH_MODULE} did not load"
        notes.append(f"the caching allocators run their hot path in Python ({why}): {slower}; {rebuild}")
    from ..recipes.fmha_bwd.native import native_pack_unavailable_reason

    pack_reason = native_pack_unavailable_reason()
    if pack_reason is not None:
        # The recipe's own reason for a module that is not there reads as a circular import
        # (`from . import _pack_c` inside the package's initialisation): say what is really wrong.
        why = native_module_problem(PACK_MODULE) or pack_reason
        notes.append(f"the FMHA workspace recipe has no native pack ({why}): pack='native' is refused; {rebuild}")
    from .._graph_release import unavailable_reason as release_unavailable

    if release_unavailable() is not None:
        why = native_module_problem(RELEASE_MODULE) or f"{RELEASE_MODULE} did not load"
        notes.append(
            f"work cannot be recorded into captures other libraries begin ({why}): it is refused with CaptureError; "
            f"and a Python host function's hold is libc sem_wait, which a signal on the driver's thread ends early; {rebuild}"
        )
    from .._backends import _native_ops

    if not _native_ops.available():
        why = native_module_problem(LAUNCH_MODULE) or f"{LAUNCH_MODULE} did not load"
        notes.append(f"the GPU backends make a launch's driver calls one by one through the bindings ({why}): launches cost more host time; {rebuild}")
    try:
        numpy_version = importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError:
        numpy_version = "missing"
    return DoctorReport(
        streamrt_version=__version__,
        python=platform.python_version(),
        platform=f"{platform.system().lower()} {platform.machine()}",
        numpy=numpy_version,
        backends=statuses,
        libraries=libraries,
        hardware=tuple(hardware),
        auto_backend=auto,
        notes=tuple(notes),
    )


def run_doctor(*, as_json: bool = False, out: Any = None) -> int:
    """Print the doctor's report (text or JSON) to ``out`` (default stdout). Returns 0 (the simulator always works) or 1."""
    import json

    out = out or sys.stdout
    report = diagnose()
    if as_json:
        print(json.dumps(report.as_dict(), indent=2), file=out)
    else:
        print(report, file=out)
    return 0 if any(b.usable for b in report.backends) else 1
