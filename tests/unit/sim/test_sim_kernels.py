"""Kernels on the simulator: numpy twins behind compile_source / module / launch_kernel."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _sim_helpers import Gate, view

from streamrt._backends import sim
from streamrt._backends.protocol import CaptureMode, MemcpyKind
from streamrt._backends.sim import SimBackend, TwinContext
from streamrt._errors import BackendError, KernelCompileError

SOURCE = r"""
#include <stdint.h>
// extern "C" __global__ void commented_out(int* p) {}
extern "C" __global__ void sim_test_fill(int32_t* __restrict__ out, long long n, int value) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}
extern "C" __global__ __launch_bounds__(256) void sim_test_axpy(const float* x, float* y, float a, uint64_t n) {
    uint64_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
__device__ int helper(int v) { return v; }
"""

calls: list[tuple[str, str]] = []


def _fill(
    ctx: TwinContext, grid: tuple[int, int, int], block: tuple[int, int, int], out: int, n: int, value: int
) -> None:
    calls.append(("fill", threading.current_thread().name))
    ctx.view(out, n, np.int32)[:] = value


def _axpy(ctx: TwinContext, grid: Any, block: Any, x: int, y: int, a: float, n: int) -> None:
    ys = ctx.view(y, n, np.float32)
    ys += np.float32(a) * ctx.view(x, n, np.float32)


@pytest.fixture(autouse=True)
def twins() -> Iterator[None]:
    sim.register_twin(
        "sim_test_fill", ("ptr:w", "i64", "i32"), _fill, cost_us=lambda grid, block, out, n, v: 5.0 + n / 1e3
    )
    sim.register_twin("sim_test_axpy", ("ptr:r", "ptr", "f32", "u64"), _axpy)
    calls.clear()
    yield
    sim.unregister_twin("sim_test_fill")
    sim.unregister_twin("sim_test_axpy")
    sim.unregister_twin("sim_test_broken")


class Args:
    """A ``void*[]`` of argument addresses, as the runtime passes to launch_kernel."""

    def __init__(self, *values: ctypes._SimpleCData) -> None:  # type: ignore[name-defined]
        self.values = values
        self.array = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        self.address = ctypes.addressof(self.array)


def _load(b: SimBackend) -> tuple[int, int, int]:
    image = b.compile_source(SOURCE, "sim_test.hip", ["-O3"])
    module = b.module_load_data(image)
    return module, b.module_get_function(module, "sim_test_fill"), b.module_get_function(module, "sim_test_axpy")


def test_compile_source_finds_the_extern_c_kernels(sb: SimBackend) -> None:
    image = sb.compile_source(SOURCE, "sim_test.hip", [])
    assert isinstance(image, bytes)
    module = sb.module_load_data(image)
    assert sb.module_get_function(module, "sim_test_fill") == sb.module_get_function(module, "sim_test_fill")
    with pytest.raises(BackendError) as exc:
        sb.module_get_function(module, "commented_out")
    assert (exc.value.code, exc.value.name) == (500, "simErrorSymbolNotFound")
    with pytest.raises(BackendError) as exc:
        sb.module_get_function(module, "helper")
    assert exc.value.code == 500
    assert sb.compiler_version() == "sim-twins-1"


def test_a_kernel_without_a_twin_is_a_compile_error_with_a_log(sb: SimBackend) -> None:
    src = SOURCE + 'extern "C" __global__ void sim_test_missing(float* p) {}\n'
    with pytest.raises(KernelCompileError) as exc:
        sb.compile_source(src, "prog.hip", [])
    assert "sim_test_missing" in exc.value.log and "register_twin" in exc.value.log
    assert "prog.hip(" in exc.value.log
    with pytest.raises(KernelCompileError, match="no extern"):
        sb.compile_source("int main() { return 0; }", "empty.hip", [])


def test_a_twin_that_does_not_match_the_declaration_is_a_compile_error(sb: SimBackend) -> None:
    sim.register_twin("sim_test_fill", ("ptr", "i64"), _fill)  # one argument short
    with pytest.raises(KernelCompileError, match="declares 3 parameter"):
        sb.compile_source(SOURCE, "p.hip", [])
    sim.register_twin("sim_test_fill", ("ptr", "i64", "f64"), _fill)  # int declared, f64 twin
    with pytest.raises(KernelCompileError, match="parameter 2"):
        sb.compile_source(SOURCE, "p.hip", [])
    sim.register_twin("sim_test_fill", ("i64", "i64", "i32"), _fill)  # pointer declared
    with pytest.raises(KernelCompileError, match="parameter 0"):
        sb.compile_source(SOURCE, "p.hip", [])


def test_register_twin_validates() -> None:
    with pytest.raises(ValueError):
        sim.register_twin("not an identifier", ("ptr",), _fill)
    with pytest.raises(ValueError):
        sim.register_twin("k", ("pointer",), _fill)
    with pytest.raises(TypeError):
        sim.register_twin("k", "ptr", _fill)
    with pytest.raises(TypeError):
        sim.register_twin("k", ("ptr",), 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        sim.register_twin("k", ("ptr",), _fill, cost_us=-1.0)
    assert "sim_test_fill" in sim.registered_twins()


def test_launch_decodes_arguments_and_runs_the_twin_in_stream_order(sb: SimBackend, gate: Gate) -> None:
    _, fill, axpy = _load(sb)
    s = sb.stream_create()
    n = 1000
    d_out = sb.malloc(4 * n)
    x, y = sb.malloc(4 * n), sb.malloc(4 * n)
    h = sb.host_malloc(4 * n)
    view(h, 4 * n, np.float32)[:] = np.arange(n, dtype=np.float32)
    gate.block(sb, s)
    fill_args = Args(ctypes.c_uint64(d_out), ctypes.c_int64(n), ctypes.c_int32(-7))
    sb.launch_kernel(fill, (4, 1, 1), (256, 1, 1), 0, s, fill_args.address)
    del fill_args  # arguments are copied at launch, as on CUDA/HIP
    sb.memcpy_async(x, h, 4 * n, MemcpyKind.HOST_TO_DEVICE, s)
    sb.memset_async(y, 0, 4 * n, s)
    axpy_args = Args(ctypes.c_uint64(x), ctypes.c_uint64(y), ctypes.c_float(2.0), ctypes.c_uint64(n))
    sb.launch_kernel(axpy, (4, 1, 1), (256, 1, 1), 0, s, axpy_args.address)
    sb.launch_kernel(axpy, (4, 1, 1), (256, 1, 1), 0, s, axpy_args.address)
    assert calls == []  # nothing ran yet: the stream is held
    gate.open()
    h2 = sb.host_malloc(4 * n)
    sb.memcpy_async(h2, y, 4 * n, MemcpyKind.DEVICE_TO_HOST, s)
    sb.memcpy_async(h, d_out, 4 * n, MemcpyKind.DEVICE_TO_HOST, s)
    sb.stream_synchronize(s)
    assert calls == [("fill", "streamrt-sim-exec-0")]
    assert np.array_equal(view(h2, 4 * n, np.float32), 4.0 * np.arange(n, dtype=np.float32))
    assert np.all(view(h, 4 * n, np.int32) == -7)
    kernels = [r for r in sb.op_log() if r.kind == "kernel"]
    assert [k.name for k in kernels] == ["sim_test_fill", "sim_test_axpy", "sim_test_axpy"]
    assert kernels[0].duration_us == pytest.approx(5.0 + n / 1e3)  # the twin's cost model
    assert kernels[1].duration_us == pytest.approx(sb.profile.kernel_default_us)


def test_kernels_are_captured_and_replayed(sb: SimBackend) -> None:
    _, fill, _ = _load(sb)
    s = sb.stream_create()
    d = sb.malloc(64)
    h = sb.host_malloc(64)
    value = ctypes.c_int32(3)
    args = Args(ctypes.c_uint64(d), ctypes.c_int64(16), value)
    sb.stream_begin_capture(s, CaptureMode.GLOBAL)
    sb.launch_kernel(fill, (1, 1, 1), (16, 1, 1), 0, s, args.address)
    sb.memcpy_async(h, d, 64, MemcpyKind.DEVICE_TO_HOST, s)
    exe = sb.graph_instantiate(sb.stream_end_capture(s))
    value.value = 99  # captured arguments are fixed at capture
    for _ in range(2):
        view(h, 64)[:] = 0
        sb.graph_launch(exe, s)
        sb.stream_synchronize(s)
        assert np.all(view(h, 64, np.int32) == 3)
    assert len(calls) == 2


def test_a_failing_twin_is_reported_by_the_next_synchronize_and_the_stream_continues(sb: SimBackend) -> None:
    src = 'extern "C" __global__ void sim_test_broken(float* p) {}'

    def broken(ctx: TwinContext, grid: Any, block: Any, p: int) -> None:
        raise ZeroDivisionError("boom")

    sim.register_twin("sim_test_broken", ("ptr",), broken)
    module = sb.module_load_data(sb.compile_source(src, "b.hip", []))
    fn = sb.module_get_function(module, "sim_test_broken")
    s = sb.stream_create()
    h = sb.host_malloc(4)
    args = Args(ctypes.c_uint64(0))
    sb.launch_kernel(fn, (1, 1, 1), (1, 1, 1), 0, s, args.address)
    sb.memset_async(h, 1, 4, s)
    with pytest.raises(BackendError, match="ZeroDivisionError: boom") as exc:
        sb.stream_synchronize(s)
    assert (exc.value.code, exc.value.name) == (719, "simErrorLaunchFailure")
    assert isinstance(exc.value.__cause__, ZeroDivisionError)
    assert view(h, 4)[0] == 1  # later work still ran
    sb.stream_synchronize(s)  # reported once


def test_a_twin_touching_memory_outside_allocations_is_an_illegal_address(sb: SimBackend) -> None:
    _, fill, _ = _load(sb)
    s = sb.stream_create()
    d = sb.malloc(16)
    args = Args(ctypes.c_uint64(d), ctypes.c_int64(1000), ctypes.c_int32(1))  # 4000 bytes into a 16-byte buffer
    sb.launch_kernel(fill, (1, 1, 1), (1, 1, 1), 0, s, args.address)
    with pytest.raises(BackendError) as exc:
        sb.device_synchronize()
    assert (exc.value.code, exc.value.name) == (700, "simErrorIllegalAddress")


def test_launch_argument_errors(sb: SimBackend) -> None:
    module, fill, _ = _load(sb)
    s = sb.stream_create()
    d = sb.malloc(16)
    args = Args(ctypes.c_uint64(d), ctypes.c_int64(4), ctypes.c_int32(1))
    bad = [
        (lambda: sb.launch_kernel(fill, (0, 1, 1), (1, 1, 1), 0, s, args.address), 9),
        (lambda: sb.launch_kernel(fill, (1, 1), (1, 1, 1), 0, s, args.address), 9),
        (lambda: sb.launch_kernel(fill, (1, 1, 1), (2048, 1, 1), 0, s, args.address), 9),
        (lambda: sb.launch_kernel(fill, (1, 1, 1), (32, 32, 2), 0, s, args.address), 9),
        (lambda: sb.launch_kernel(fill, (1, 1, 1), (1, 1, 1), 10**6, s, args.address), 1),
        (lambda: sb.launch_kernel(fill, (1, 1, 1), (1, 1, 1), 0, s, 0), 1),
        (lambda: sb.launch_kernel(12345, (1, 1, 1), (1, 1, 1), 0, s, args.address), 400),
    ]
    for call, code in bad:
        with pytest.raises(BackendError) as exc:
            call()
        assert exc.value.code == code, exc.value
    sb.module_unload(module)
    with pytest.raises(BackendError) as exc:
        sb.launch_kernel(fill, (1, 1, 1), (1, 1, 1), 0, s, args.address)
    assert exc.value.code == 400
    assert sb.op_log() == []
    with pytest.raises(BackendError) as exc:
        sb.module_load_data(b"\x7fELF not a sim image")
    assert exc.value.code == 200
