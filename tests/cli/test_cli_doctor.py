"""``streamrt doctor``: library versions under per-platform names, why a C extension is missing, one install hint each."""

from __future__ import annotations

import importlib.machinery
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import REPO, run_cli

from streamrt._cli import doctor

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _fake_distribution(root: Path, dist: str, version: str, package: str) -> None:
    """An installed distribution ``dist`` that provides the import package ``package``."""
    (root / package).mkdir()
    (root / package / "__init__.py").write_text("")
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(f"{package}\n")


def _library(name: str) -> doctor.LibraryStatus:
    return next(lib for lib in doctor.diagnose(backends=("sim",)).libraries if lib.name == name)


def test_cupy_shows_the_version_of_its_per_platform_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CuPy installs as cupy-cuda12x (or cupy-rocm-...): there is no distribution named cupy."""
    _fake_distribution(tmp_path, "cupy-cuda12x", "13.3.0", "cupy")
    monkeypatch.syspath_prepend(str(tmp_path))
    lib = _library("cupy")
    assert lib.present and lib.version == "13.3.0 (cupy-cuda12x)"
    assert "  cupy           13.3.0 (cupy-cuda12x) for wrapping cupy streams and arrays" in str(doctor.diagnose(backends=("sim",)))


def test_a_library_without_package_metadata_has_an_unknown_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if _library("numba").present:
        pytest.skip("numba is installed here")
    (tmp_path / "numba").mkdir()
    (tmp_path / "numba" / "__init__.py").write_text("")  # a source tree on the path, no dist-info
    monkeypatch.syspath_prepend(str(tmp_path))
    lib = _library("numba")
    assert lib.present and lib.version == "unknown version"


def test_why_a_native_module_cannot_be_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "fakepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / f"_broken{SUFFIX}").write_bytes(b"not an ELF file")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert doctor.native_module_problem("fakepkg._absent") == f"fakepkg._absent was not built: no _absent{SUFFIX} in {package}"
    broken = doctor.native_module_problem("fakepkg._broken")
    assert broken is not None and broken.startswith(f"fakepkg._broken is built ({package / ('_broken' + SUFFIX)}) but does not load: ")
    assert doctor.native_module_problem("json") is None


def test_missing_c_extensions_are_reported_as_not_built(tmp_path: Path) -> None:
    """A copy of the packages without the built modules: doctor names the missing files, not a circular import."""
    skip = shutil.ignore_patterns("__pycache__", f"_pack_c{SUFFIX}", f"_fastpath_c{SUFFIX}")
    for name in ("streamrt", "allocators"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=skip)
    # The copy comes first on the path; an editable install's finder must not lend it the originals' modules.
    boot = (
        "import runpy, sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, '__module__', '').startswith('__editable__')]\n"
        "sys.argv = ['streamrt', 'doctor']\n"
        "runpy.run_module('streamrt', run_name='__main__', alter_sys=True)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", boot],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "STREAMRT_PROGRESS": "0"},
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    folder = tmp_path / "streamrt" / "recipes" / "fmha_bwd"
    assert f"the FMHA workspace recipe has no native pack (streamrt.recipes.fmha_bwd._pack_c was not built: no _pack_c{SUFFIX} in {folder})" in proc.stdout
    assert "circular import" not in proc.stdout
    allocators = tmp_path / "allocators"
    assert f"the caching allocators run their hot path in Python (allocators._fastpath_c was not built: no _fastpath_c{SUFFIX} in {allocators})" in proc.stdout
    assert proc.stdout.count("reinstall streamrt with a C compiler present") == 2  # once per note


def test_each_install_hint_is_printed_once() -> None:
    """Without the GPU bindings: the why says what is missing, the how (once) how to install it."""
    proc = run_cli(["doctor"], block=["cuda", "cuda.bindings", "hip", "rocm"])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "  hip    missing  why: hip-python is not installed\n                  how: Install it with: pip install 'streamrt[hip]'\n" in out
    assert "  cuda   missing  why: cuda-bindings is not installed\n                  how: Install it with: pip install 'streamrt[cuda]'\n" in out
    for hint in ("pip install 'streamrt[cuda]'", "pip install 'streamrt[hip]'"):
        assert out.count(hint) == 1, out
    assert "  cuda-bindings  missing      for the cuda backend (see above)" in out


def test_a_how_with_a_full_stop_in_the_what_is_split_at_the_last_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    """The what may quote an exception that has ". " in it; the how is the backend's last sentence."""
    from streamrt._errors import BackendUnavailableError

    def load(name: str, **_kw: object) -> object:
        raise BackendUnavailableError(f"backend {name!r} is not available: cuda-bindings failed to import (OSError('a. b')). Reinstall it with: X")

    monkeypatch.setattr(doctor, "load_backend", load)
    assert doctor._explain("cuda", "probe line") == ("cuda-bindings failed to import (OSError('a. b'))", "Reinstall it with: X")
