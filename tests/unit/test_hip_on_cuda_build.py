"""The HIP-on-CUDA forwarding libraries build here and export what the hip backend calls.

Builds tests/hip_on_cuda with gcc (no CUDA and no GPU needed; skipped with the
reason when there is no C compiler). Where the CUDA headers are installed, the
CUDA numbers the library declares itself are checked against them.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from streamrt._backends import hip as hip_backend
from streamrt._backends.hip import _symbols
from streamrt._backends.hip._user_objects import USER_OBJECT_SYMBOLS
from support import hip_on_cuda


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A warning-free build (HIP_ON_CUDA_WERROR=1) into a fresh directory."""
    outdir = tmp_path_factory.mktemp("hip_on_cuda")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HIP_ON_CUDA_WERROR", "1")
        try:
            return hip_on_cuda.ensure_built(outdir)
        except hip_on_cuda.PrerequisiteMissing as exc:
            pytest.skip(f"cannot build HIP-on-CUDA here: {exc}")


def _exported(library: Path) -> set[str]:
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    listing = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[-1] for line in listing.splitlines() if line.strip()}


def test_build_produces_both_libraries_and_rocm_names(built: Path) -> None:
    lib = built / "lib"
    assert (lib / "libamdhip64.so").is_file()
    assert (lib / "libhiprtc.so").is_file()
    for major in (6, 7):
        assert (lib / f"libamdhip64.so.{major}").resolve() == (lib / "libamdhip64.so").resolve()
        assert (lib / f"libhiprtc.so.{major}").resolve() == (lib / "libhiprtc.so").resolve()


def test_every_hip_symbol_the_backend_calls_is_exported(built: Path) -> None:
    exported = _exported(built / "lib" / "libamdhip64.so")
    missing = sorted((set(hip_backend.REQUIRED_HIP_SYMBOLS) | set(USER_OBJECT_SYMBOLS)) - exported)
    assert not missing, f"libamdhip64.so lacks {missing}"


def test_every_hiprtc_symbol_the_backend_calls_is_exported(built: Path) -> None:
    exported = _exported(built / "lib" / "libhiprtc.so")
    missing = sorted(set(hip_backend.REQUIRED_HIPRTC_SYMBOLS) - exported)
    assert not missing, f"libhiprtc.so lacks {missing}"


def test_only_hip_entry_points_are_exported(built: Path) -> None:
    """Internal helpers stay hidden, so they cannot shadow symbols of other libraries."""
    for name, prefix in (("libamdhip64.so", "hip"), ("libhiprtc.so", "hiprtc")):
        stray = sorted(s for s in _exported(built / "lib" / name) if not s.startswith(prefix))
        assert not stray, f"{name} exports {stray}"


def test_backend_calls_only_functions_listed_in_its_symbol_tables() -> None:
    """REQUIRED_*_SYMBOLS are complete: the hip package calls HIP only through the bound ``self._hip*`` names."""
    package = Path(hip_backend.__file__).parent
    source = "\n".join(path.read_text() for path in sorted(package.glob("*.py")))
    used = set(re.findall(r"self\._(hip(?:rtc)?[A-Z]\w*)", source))
    bound = set(_symbols._HIP_CALLS) | set(_symbols._HIPRTC_CALLS)
    assert used, "found no HIP calls in the hip package"
    assert used <= bound, f"called but not in the symbol tables: {sorted(used - bound)}"


def test_second_build_of_the_same_sources_is_cached(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_rebuild(*args: object, **kwargs: object) -> None:
        raise AssertionError("build.sh ran again for unchanged sources")

    monkeypatch.setattr(hip_on_cuda.subprocess, "run", no_rebuild)
    assert hip_on_cuda.ensure_built(built) == built


def test_environment_points_hip_python_at_the_build(built: Path) -> None:
    env = hip_on_cuda.environment(built)
    assert env["ROCM_PATH"] == str(built)
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(built / "lib")


def _load(built: Path) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(built / "lib" / "libamdhip64.so"))
    except OSError as exc:  # libcudart found at build time but not loadable here
        pytest.skip(f"libamdhip64.so cannot be loaded here: {exc}")


def test_error_names_follow_hip(built: Path) -> None:
    lib = _load(built)
    lib.hipGetErrorName.restype = ctypes.c_char_p
    lib.hipGetErrorString.restype = ctypes.c_char_p
    expected = {
        0: b"hipSuccess",
        1: b"hipErrorInvalidValue",
        2: b"hipErrorOutOfMemory",
        100: b"hipErrorNoDevice",
        400: b"hipErrorInvalidHandle",
        600: b"hipErrorNotReady",
        901: b"hipErrorStreamCaptureInvalidated",
        908: b"hipErrorStreamCaptureWrongThread",
        999: b"hipErrorUnknown",
    }
    for code, name in expected.items():
        assert lib.hipGetErrorName(code) == name
    assert lib.hipGetErrorString(2) == b"out of memory"
    assert lib.hipGetErrorName(123456) == b"hipErrorUnknown"


def test_device_count_reports_a_hip_code(built: Path) -> None:
    """Without a GPU, the failure arrives as HIP's code: 35 no driver, 100 no device, 303 no libcudart."""
    lib = _load(built)
    lib.hipGetErrorName.restype = ctypes.c_char_p
    lib.hipGetErrorString.restype = ctypes.c_char_p
    count = ctypes.c_int(-1)
    code = lib.hipGetDeviceCount(ctypes.byref(count))
    if code == 0:
        assert count.value >= 0
        return
    names = {35: b"hipErrorInsufficientDriver", 100: b"hipErrorNoDevice", 303: b"hipErrorSharedObjectInitFailed"}
    assert code in names, code
    assert lib.hipGetErrorName(code) == names[code]
    assert b"[HIP-on-CUDA: " in lib.hipGetErrorString(code)  # names the CUDA error or the missing library


def test_device_properties_struct_matches_hip_python_layout(built: Path) -> None:
    """hipDeviceProp_tR0600 is 1472 bytes in hip-python 10.0 (checked against c_sizeof())."""
    lib = _load(built)
    lib.hipOnCudaDevicePropSize.restype = ctypes.c_size_t
    lib.hipOnCudaPointerAttributeSize.restype = ctypes.c_size_t
    assert lib.hipOnCudaDevicePropSize() == 1472
    assert lib.hipOnCudaPointerAttributeSize() == 32
    try:
        from rocm.bindings import hip
    except ImportError:
        return
    assert lib.hipOnCudaDevicePropSize() == hip.hipDeviceProp_t().c_sizeof()
    assert lib.hipOnCudaPointerAttributeSize() == hip.hipPointerAttribute_t().c_sizeof()


def _cuda_include_dir() -> Path | None:
    """A complete set of CUDA runtime headers (cuda_runtime_api.h and its crt/ includes), if installed."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for root in filter(None, candidates):
        include = Path(root) / "include"
        if (include / "cuda_runtime_api.h").is_file() and (include / "crt" / "host_defines.h").is_file():
            return include
    return None


def test_cuda_numbers_match_the_cuda_headers(tmp_path: Path) -> None:
    """Every CUDA constant, error code, handle type and struct offset written down by hand is CUDA's."""
    include = _cuda_include_dir()
    if include is None:
        pytest.skip("no CUDA runtime headers installed (set CUDA_HOME)")
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    abi = (hip_on_cuda.SOURCE_DIR / "cuda_abi.h").read_text()
    source = (hip_on_cuda.SOURCE_DIR / "hip_on_cuda.c").read_text()
    checks = ['#include <cuda_runtime_api.h>', '#include <stddef.h>', '#include "cuda_abi.h"']
    constants = re.findall(r"#define HOC_(cuda\w+) ", abi)
    plain = [c for c in constants if not c.endswith(("Mask",))]
    assert len(plain) > 60
    checks += [f'_Static_assert(HOC_{c} == {c}, "{c}");' for c in plain]
    checks += [
        "_Static_assert(HOC_cudaEventFlagsMask == (cudaEventBlockingSync | cudaEventDisableTiming"
        ' | cudaEventInterprocess), "event flags");',
        "_Static_assert(HOC_cudaHostAllocFlagsMask == (cudaHostAllocPortable | cudaHostAllocMapped"
        ' | cudaHostAllocWriteCombined), "host alloc flags");',
    ]
    table = re.findall(r"\{(\d+), hip\w+\},\s*/\* (cuda\w+)", source)
    assert len(table) > 80
    checks += [f'_Static_assert({number} == {name}, "{name}");' for number, name in table]
    for ours, theirs in (
        ("hoc_stream", "cudaStream_t"),
        ("hoc_event", "cudaEvent_t"),
        ("hoc_graph", "cudaGraph_t"),
        ("hoc_graph_exec", "cudaGraphExec_t"),
        ("hoc_library", "cudaLibrary_t"),
        ("hoc_kernel", "cudaKernel_t"),
        ("hoc_host_fn", "cudaHostFn_t"),
        ("hoc_user_object", "cudaUserObject_t"),
    ):
        checks.append(f'_Static_assert(__builtin_types_compatible_p({ours}, {theirs}), "{theirs}");')
    for field in ("type", "device", "devicePointer", "hostPointer"):
        checks.append(
            f"_Static_assert(offsetof(hoc_pointer_attributes, {field})"
            f' == offsetof(struct cudaPointerAttributes, {field}), "{field}");'
        )
    checks += [
        '_Static_assert(sizeof(struct cudaPointerAttributes) <= HOC_POINTER_ATTRIBUTES_BUFFER, "attr size");',
        '_Static_assert(sizeof(struct cudaDeviceProp) <= HOC_DEVICE_PROP_BUFFER, "prop size");',
        '_Static_assert(offsetof(struct cudaDeviceProp, name) == HOC_DEVICE_PROP_NAME_OFFSET, "name");',
        '_Static_assert(sizeof(((struct cudaDeviceProp*)0)->name) == HOC_DEVICE_PROP_NAME_SIZE, "name size");',
        '_Static_assert(offsetof(struct cudaDeviceProp, uuid) == HOC_DEVICE_PROP_UUID_OFFSET, "uuid");',
        "_Static_assert(offsetof(struct cudaDeviceProp, totalGlobalMem)"
        ' == HOC_DEVICE_PROP_TOTAL_GLOBAL_MEM_OFFSET, "totalGlobalMem");',
        '_Static_assert(sizeof(dim3) == sizeof(hoc_dim3) && offsetof(dim3, z) == offsetof(hoc_dim3, z), "dim3");',
    ]
    check = tmp_path / "cuda_abi_check.c"
    check.write_text("\n".join(checks) + "\n")
    result = subprocess.run(
        ["gcc", "-std=c11", "-fsyntax-only", f"-I{include}", f"-I{hip_on_cuda.SOURCE_DIR}", str(check)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
