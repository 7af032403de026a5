"""Kernel sources: what ships, how declarations are read, include expansion, NVRTC compiles, packaging."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from kernel_helpers import (  # (importing it registers the shipped kernels' twins and specs)
    KERNELS,
    REPO,
)

from streamrt._backends.sim import registered_twins
from streamrt._errors import KernelCompileError
from streamrt._kernel import (
    expand_includes,
    get_kernel_spec,
    parse_kernels,
    read_shipped,
    shipped_sources,
)

SHIPPED = {
    "fmha_bwd_prepare.hip": ["fmha_bwd_prepare"],
    "fmha_bwd_prezero.hip": ["fmha_bwd_dq_acc_prezero"],
    "sleep.hip": ["spin_sleep"],
    "verify.hip": ["fill_u32", "checksum_u32"],
}


def test_the_shipped_sources_declare_the_issue_kernels() -> None:
    assert set(SHIPPED) <= set(shipped_sources())
    for src, kernels in SHIPPED.items():
        assert list(parse_kernels(read_shipped(src))) == kernels


def test_signatures_are_read_from_the_declaration() -> None:
    sig = parse_kernels(read_shipped("verify.hip"))["checksum_u32"]
    assert [(p.name, p.type, p.const, p.element_size) for p in sig.params] == [
        ("data", "ptr", True, 4),
        ("count", "u64", False, 1),
        ("result", "ptr", False, 8),
    ]
    prep = parse_kernels(read_shipped("fmha_bwd_prepare.hip"))["fmha_bwd_prepare"]
    assert [p.name for p in prep.params][:4] == ["seqstart_q", "seqstart_k", "workspace", "result"]
    assert all(p.type == "i32" for p in prep.params[4:])
    assert len(prep.params) == 14 and prep.error is None


def test_parsing_skips_comments_and_reports_unsupported_parameter_types() -> None:
    src = """
    // extern "C" __global__ void commented_out(int x) {}
    /* extern "C" __global__ void also_commented(int x) {} */
    extern "C" __global__ void a(const float* __restrict__ x, unsigned long long n, double, int k) {}
    extern "C" __global__ void b(bool flag) {}
    extern "C" __device__ void not_a_kernel(int x) {}
    extern "C" __global__ void c() {}
    """
    found = parse_kernels(src)
    assert list(found) == ["a", "b", "c"]
    a = found["a"]
    assert [(p.name, p.type) for p in a.params] == [("x", "ptr"), ("n", "u64"), ("arg2", "f64"), ("k", "i32")]
    assert a.params[0].const and a.error is None
    assert found["b"].error is not None and "bool" in found["b"].error
    assert found["c"].params == ()


def test_include_expansion_pastes_the_header_once_with_line_directives() -> None:
    text = '#include "streamrt_kernel.h"\n#include "streamrt_kernel.h"\n#include <other.h>\nint x;\n'
    out = expand_includes(text, "mine.hip")
    assert out.count("#ifndef STREAMRT_KERNEL_H") == 1
    assert '#line 1 "streamrt_kernel.h"' in out
    assert '#line 2 "mine.hip"' in out and '#line 3 "mine.hip"' in out
    assert "#include <other.h>" in out  # not a shipped file: left to the compiler
    assert out.endswith("int x;\n")


def test_kernels_dir_is_never_a_regular_package() -> None:
    """``kernels`` belongs to a PyPI project: the directory has no ``__init__.py`` (the wheel maps it to
    ``streamrt.kernels``, see the pyproject tests below)."""
    assert not (KERNELS / "__init__.py").exists()
    assert not any(p.suffix == ".py" for p in KERNELS.iterdir())


def test_every_twin_signature_matches_the_c_declaration_and_spec() -> None:
    """The simulator runs exactly what the GPU runs: same parameter count, pointer-ness, scalar types, access."""
    twins = registered_twins()
    for src, kernels in SHIPPED.items():
        sigs = parse_kernels(read_shipped(src))
        for name in kernels:
            spec = get_kernel_spec(name)
            assert spec is not None
            expected = tuple(
                ("ptr:" + (spec.access.get(p.name) or ("r" if p.const else "rw"))) if p.is_pointer else p.type for p in sigs[name].params
            )
            assert twins[name].signature == expected, name


# -- packaging ----------------------------------------------------------------------------------------------


def _pyproject() -> dict:
    if sys.version_info < (3, 11):
        pytest.skip("tomllib needs Python 3.11")
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_pyproject_ships_kernels_as_data_of_streamrt() -> None:
    tool = _pyproject()["tool"]["setuptools"]
    assert tool["package-dir"]["streamrt.kernels"] == "kernels"
    assert "streamrt.kernels" in tool["packages"]
    assert "kernels" not in tool["packages"]
    patterns = tool["package-data"]["streamrt.kernels"]
    for f in KERNELS.iterdir():
        assert any(Path(f.name).match(p) for p in patterns), f.name


def test_pyproject_lists_every_python_package_of_the_tree() -> None:
    """The package list is explicit (setuptools cannot mix discovery with the kernels mapping): keep it complete."""
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(REPO).parts) for top in ("streamrt", "allocators") for p in (REPO / top).rglob("__init__.py")}
    assert on_disk - listed == set(), "add these packages to [tool.setuptools] packages in pyproject.toml"
    assert listed - on_disk == {"streamrt.kernels"}


# -- NVRTC ---------------------------------------------------------------------------------------------------


def _nvrtc_or_skip() -> None:
    if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.bindings") is None:
        pytest.skip("cuda-bindings is not installed (NVRTC)")
    from streamrt._backends.cuda._compile import _nvrtc
    from streamrt._errors import BackendUnavailableError

    try:
        _nvrtc()
    except BackendUnavailableError as exc:
        pytest.skip(str(exc))


DIALECTS = {
    "cuda": [],
    "hip_on_cuda": ["-D__STREAMRT_HIP__=1", "-D__STREAMRT_HIP_ON_CUDA__=1"],  # what hiprtc-on-NVRTC adds
}


@pytest.mark.parametrize("dialect", list(DIALECTS))
@pytest.mark.parametrize("source", sorted(SHIPPED))
def test_every_shipped_kernel_compiles_with_nvrtc_for_sm90(source: str, dialect: str) -> None:
    _nvrtc_or_skip()
    from streamrt._backends.cuda import nvrtc_compile

    image = nvrtc_compile(expand_includes(read_shipped(source), source), source, DIALECTS[dialect], (9, 0))
    assert image[:4] == b"\x7fELF"  # a CUBIN
    for kernel in SHIPPED[source]:
        assert kernel.encode() in image


def test_an_nvrtc_error_carries_the_log_with_file_and_line() -> None:
    _nvrtc_or_skip()
    from streamrt._backends.cuda import nvrtc_compile

    src = '#include "streamrt_kernel.h"\n\nextern "C" __global__ void broken(srt_u32* p) {\n    p[0] = ;\n}\n'
    with pytest.raises(KernelCompileError) as info:
        nvrtc_compile(expand_includes(src, "broken.hip"), "broken.hip", [], (9, 0))
    assert re.search(r"broken\.hip\(4\): error", info.value.log), info.value.log
