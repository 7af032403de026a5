"""Kernel calls of the CUDA backend: NVRTC compiles, modules and launches (driver API)."""

from __future__ import annotations

from collections.abc import Sequence

from ._codes import _CUDA_ERROR_INVALID_CONTEXT, _check_driver
from ._compile import _nvrtc, nvrtc_compile
from ._core import CudaCore

__all__ = ["KernelCalls"]


class KernelCalls(CudaCore):
    """compiler_version / compile_source / module_load_data / module_get_function / module_unload / launch_kernel."""

    def compiler_version(self) -> str:
        err, major, minor = _nvrtc().nvrtcVersion()
        return f"nvrtc {int(major)}.{int(minor)}"

    def compile_source(self, source: str, name: str, options: Sequence[str]) -> bytes:
        """Compile for the calling thread's current device; see :func:`nvrtc_compile`."""
        return nvrtc_compile(source, name, options, self._current_capability())

    def module_load_data(self, image: bytes) -> int:
        self._make_context_current()  # the driver loads into the thread's current context
        err, module = self._drv.cuModuleLoadData(image)
        _check_driver(err, "cuModuleLoadData")
        handle = int(self._native_handle(module))
        self._modules[handle] = module
        return handle

    def module_get_function(self, module: int, name: str) -> int:
        mod = self._modules.get(module)
        err, function = self._drv.cuModuleGetFunction(self._drv.CUmodule(module) if mod is None else mod, name.encode())
        _check_driver(err, f"cuModuleGetFunction({name!r})")
        handle = int(self._native_handle(function))
        self._functions[handle] = function
        return handle

    def module_unload(self, module: int) -> None:
        mod = self._modules.get(module)
        (err,) = self._drv.cuModuleUnload(self._drv.CUmodule(module) if mod is None else mod)
        _check_driver(err, "cuModuleUnload")
        self._modules.pop(module, None)

    def launch_kernel(
        self,
        function: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        stream: int,
        arg_ptrs: int,
    ) -> None:
        """Launch; ``arg_ptrs`` is the address of a ``void*[]`` of argument addresses."""
        f = self._functions.get(function)
        if f is None:
            f = self._CUfunction(function)
        s = self._stream_get(stream)
        gx, gy, gz = grid
        bx, by, bz = block
        err = self._cuLaunchKernel(
            f, gx, gy, gz, bx, by, bz, shared_mem, self._stream(stream) if s is None else s, arg_ptrs, 0
        )[0]
        if err:
            if int(err) == _CUDA_ERROR_INVALID_CONTEXT:
                self._make_context_current()
                err = self._cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared_mem, self._stream(stream), arg_ptrs, 0)[0]
            _check_driver(err, "cuLaunchKernel")
