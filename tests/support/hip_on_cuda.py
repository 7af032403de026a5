"""Build the HIP-on-CUDA forwarding libraries and point hip-python at them.

The lent GPUs are NVIDIA. ``tests/hip_on_cuda`` holds a ``libamdhip64.so``
(HIP runtime entry points on the CUDA runtime) and a ``libhiprtc.so`` (hipRTC
on NVRTC). hip-python resolves its libraries lazily, on the first call into
them, from ``$ROCM_PATH/lib``; so setting ``ROCM_PATH`` in this process before
that first call is enough (``LD_LIBRARY_PATH`` is set too, for subprocesses).

* :func:`ensure_built` runs ``build.sh`` once per source hash (cached, locked).
* :func:`environment` is the set of variables that selects the built libraries.
* :func:`prepare_if_needed` does both when this is an NVIDIA machine with
  hip-python and without ROCm; the test set-up calls it before probing ``hip``.

Environment knobs: ``STREAMRT_HIP_ON_CUDA_DIR`` (build directory, default
``<repo>/build/hip_on_cuda``), ``CUDA_HOME`` / ``CC`` (see ``build.sh``),
``HIP_ON_CUDA_CUDART`` / ``HIPRTC_ON_NVRTC_LIBRARY`` (the libcudart / libnvrtc
the forwarding libraries open at run time).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

__all__ = [
    "SOURCE_DIR",
    "BuildError",
    "PrerequisiteMissing",
    "default_outdir",
    "ensure_built",
    "environment",
    "find_cuda_library",
    "prepare_if_needed",
]

SOURCE_DIR = Path(__file__).resolve().parents[1] / "hip_on_cuda"
_SOURCES = ("build.sh", "cuda_abi.h", "hip_on_cuda.c", "hiprtc_on_nvrtc.c")
_STAMP = ".hip_on_cuda-source-hash"
_LIBRARIES = ("libamdhip64.so", "libhiprtc.so")


class BuildError(RuntimeError):
    """``build.sh`` failed to compile or link; the message carries its output."""


class PrerequisiteMissing(BuildError):
    """``build.sh`` found no C compiler (exit status 3)."""


def default_outdir() -> Path:
    """``$STREAMRT_HIP_ON_CUDA_DIR``, else ``<repo>/build/hip_on_cuda`` (git-ignored)."""
    configured = os.environ.get("STREAMRT_HIP_ON_CUDA_DIR")
    if configured:
        return Path(configured)
    return SOURCE_DIR.parents[1] / "build" / "hip_on_cuda"


def _source_hash() -> str:
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update(name.encode())
        digest.update((SOURCE_DIR / name).read_bytes())
    return digest.hexdigest()


def _is_built(outdir: Path, source_hash: str) -> bool:
    stamp = outdir / _STAMP
    return (
        stamp.is_file()
        and stamp.read_text().strip() == source_hash
        and all((outdir / "lib" / name).is_file() for name in _LIBRARIES)
    )


def ensure_built(outdir: str | os.PathLike[str] | None = None) -> Path:
    """Build the libraries into ``outdir`` unless a build of the same sources is there.

    Returns ``outdir`` (absolute): the directory to use as ``ROCM_PATH``; the
    libraries are in its ``lib/``. Blocks while another process builds into the
    same directory. Raises :class:`PrerequisiteMissing` when there is no C
    compiler, :class:`BuildError` when the build fails. Building needs no CUDA:
    the libraries open libcudart and libnvrtc at run time.
    """
    out = Path(outdir) if outdir is not None else default_outdir()
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    source_hash = _source_hash()
    if _is_built(out, source_hash):
        return out
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _is_built(out, source_hash):
            return out
        (out / _STAMP).unlink(missing_ok=True)
        env = dict(os.environ, PYTHON=sys.executable)
        result = subprocess.run(
            ["bash", str(SOURCE_DIR / "build.sh"), str(out)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        output = (result.stdout + result.stderr).strip()
        if result.returncode == 3:
            raise PrerequisiteMissing(output)
        if result.returncode != 0:
            raise BuildError(f"build.sh exited with {result.returncode}:\n{output}")
        (out / _STAMP).write_text(source_hash + "\n")
    return out


def find_cuda_library(stem: str) -> str | None:
    """A ``lib<stem>.so*`` of this Python's nvidia-* packages, ``$CUDA_HOME`` or /usr/local/cuda, if any."""
    roots: list[Path] = []
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            roots += sorted(p for p in Path(base).iterdir() if p.is_dir())
    for env_name in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env_name):
            roots.append(Path(os.environ[env_name]))
    roots.append(Path("/usr/local/cuda"))
    for root in roots:
        for sub in ("lib", "lib64"):
            found = sorted((root / sub).glob(f"lib{stem}.so*"))
            libraries = [f for f in found if f.name == f"lib{stem}.so" or f.name[len(f"lib{stem}.so") :][:1] == "."]
            if libraries:
                return str(libraries[0])
    return None


def environment(outdir: str | os.PathLike[str]) -> dict[str, str]:
    """The variables that make hip-python load the forwarding libraries in ``outdir``.

    ``ROCM_PATH`` (what hip-python resolves ``lib/libamdhip64.so`` and
    ``lib/libhiprtc.so`` from) and ``LD_LIBRARY_PATH`` with ``outdir/lib``
    first (for anything that loads them by bare name). ``HIP_ON_CUDA_CUDART``
    and ``HIPRTC_ON_NVRTC_LIBRARY`` name the libcudart / libnvrtc found here
    (pip packages first), unless they are configured already.
    """
    root = Path(outdir).resolve()
    lib = str(root / "lib")
    previous = os.environ.get("LD_LIBRARY_PATH", "")
    env = {
        "ROCM_PATH": str(root),
        "LD_LIBRARY_PATH": lib + (os.pathsep + previous if previous else ""),
    }
    for variable, stem in (("HIP_ON_CUDA_CUDART", "cudart"), ("HIPRTC_ON_NVRTC_LIBRARY", "nvrtc")):
        if not os.environ.get(variable):
            found = find_cuda_library(stem)
            if found is not None:
                env[variable] = found
    return env


def _is_forwarding_build(root: Path) -> bool:
    return (root / _STAMP).is_file()


def _real_rocm_present() -> bool:
    """A ROCm HIP runtime that is not one of our builds: ROCM_PATH/ROCM_HOME, /opt/rocm or rocm_sdk."""
    for env_name in ("ROCM_PATH", "ROCM_HOME"):
        value = os.environ.get(env_name)
        if value and (Path(value) / "lib" / "libamdhip64.so").exists() and not _is_forwarding_build(Path(value)):
            return True
    if Path("/opt/rocm/lib/libamdhip64.so").exists():
        return True
    return importlib.util.find_spec("rocm_sdk") is not None


def _nvidia_gpu_present() -> bool:
    if Path("/dev/nvidiactl").exists() or any(Path("/dev").glob("nvidia[0-9]*")):
        return True
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


def prepare_if_needed(outdir: str | os.PathLike[str] | None = None) -> str | None:
    """On an NVIDIA machine with hip-python and no ROCm, build and select HIP-on-CUDA.

    Returns ``None`` when the hip backend should be probed as usual (prepared
    here, real ROCm present, or nothing to prepare: hip-python missing or no
    NVIDIA GPU), or a reason to skip the hip tests (the build failed).
    Must run before hip-python's first call into libamdhip64 in this process:
    hip-python caches the library path it resolved first.
    """
    if importlib.util.find_spec("hip") is None:
        return None
    current = os.environ.get("ROCM_PATH")
    if current and _is_forwarding_build(Path(current)):
        return None
    if _real_rocm_present() or not _nvidia_gpu_present():
        return None
    try:
        root = ensure_built(outdir)
    except BuildError as exc:
        return f"hip backend unavailable: the HIP-on-CUDA forwarding library could not be built: {exc}"
    os.environ.update(environment(root))
    return None
