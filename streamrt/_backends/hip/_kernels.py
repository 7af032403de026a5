"""Kernel calls of the hip backend: hiprtc compiles, modules and launches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._errors import KernelCompileError
from .._cstring import c_string
from . import _loading as L
from ._codes import _HIPRTC_ERROR_COMPILATION, _HIPRTC_ERROR_INVALID_OPTION, _check, _rtc_error
from ._core import HipCore

__all__ = ["KernelCalls"]


class KernelCalls(HipCore):
    """compiler_version / compile_source / module_load_data / module_get_function / module_unload / launch_kernel."""

    # -- compiling ---------------------------------------------------------------------------
    def compiler_version(self) -> str:
        """``"hiprtc MAJOR.MINOR"`` (on HIP-on-CUDA: NVRTC's version)."""
        if self._compiler_version is None:
            err, major, minor = self._hiprtcVersion()
            if err:
                raise _rtc_error(err, "hiprtcVersion")
            self._compiler_version = f"hiprtc {int(major)}.{int(minor)}"
        return self._compiler_version

    def compile_source(self, source: str, name: str, options: Sequence[str]) -> bytes:
        """Compile HIP C++ with hiprtc for the current device; the code object.

        Adds ``--offload-arch=<gcnArchName>`` and ``-D__STREAMRT_HIP__=1`` to
        ``options``. A compile error (or an option hiprtc rejects) raises
        :class:`KernelCompileError` with hiprtc's log.
        """
        device = self._current_device()
        self.capabilities(device)
        arch = self._offload_arch[device]
        opts = [f"--offload-arch={arch}".encode(), b"-D__STREAMRT_HIP__=1"]
        opts += [str(option).encode() for option in options]
        err, prog = self._hiprtcCreateProgram(source.encode(), name.encode(), 0, [], [])
        if err:
            raise _rtc_error(err, "hiprtcCreateProgram")
        try:
            err = self._hiprtcCompileProgram(prog, len(opts), opts)[0]
            if err in (_HIPRTC_ERROR_COMPILATION, _HIPRTC_ERROR_INVALID_OPTION):
                reason = L._hiprtc.hiprtcResult(int(err)).name
                raise KernelCompileError(f"hiprtc could not compile {name!r} for {arch} ({reason})", self._log(prog))
            if err:
                raise _rtc_error(err, "hiprtcCompileProgram")
            err, size = self._hiprtcGetCodeSize(prog)
            if err:
                raise _rtc_error(err, "hiprtcGetCodeSize")
            code = bytearray(int(size))
            err = self._hiprtcGetCode(prog, code)[0]
            if err:
                raise _rtc_error(err, "hiprtcGetCode")
            return bytes(code)
        finally:
            self._hiprtcDestroyProgram(prog.createRef())

    def _log(self, prog: Any) -> str:
        """hiprtc's log for ``prog`` (empty if it cannot be read)."""
        err, size = self._hiprtcGetProgramLogSize(prog)
        if err or not size:
            return ""
        log = bytearray(int(size))
        if self._hiprtcGetProgramLog(prog, log)[0]:
            return ""
        return c_string(bytes(log)).rstrip()

    # -- modules and launches ----------------------------------------------------------------
    def module_load_data(self, image: bytes) -> int:
        """Load a code object from :meth:`compile_source` (``hipModuleLoadData``)."""
        err, module = self._hipModuleLoadData(bytes(image))
        _check(err, "hipModuleLoadData")
        return self._keep(self._modules, module)

    def module_get_function(self, module: int, name: str) -> int:
        mod = self._modules.get(module)
        if mod is None:
            mod = self._remember(self._modules, self._new_module, module)
        err, function = self._hipModuleGetFunction(mod, name.encode())
        _check(err, "hipModuleGetFunction")
        handle = self._keep(self._functions, function)
        self._module_functions.setdefault(module, []).append(handle)
        return handle

    def module_unload(self, module: int) -> None:
        mod = self._modules.get(module)
        if mod is None:
            mod = self._new_module(module)
        _check(self._hipModuleUnload(mod)[0], "hipModuleUnload")
        self._modules.pop(module, None)
        for function in self._module_functions.pop(module, ()):
            self._functions.pop(function, None)

    def launch_kernel(
        self,
        function: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        stream: int,
        arg_ptrs: int,
    ) -> None:
        """``hipModuleLaunchKernel`` with ``kernelParams=arg_ptrs`` and no ``extra``."""
        f = self._functions.get(function)
        if f is None:
            f = self._remember(self._functions, self._new_function, function)
        st = self._streams.get(stream)
        if st is None:
            st = self._remember(self._streams, self._new_stream, stream)
        args = self._arg_arrays.get(arg_ptrs)
        if args is None:
            args = self._remember(self._arg_arrays, self._new_arg_array, arg_ptrs)
        gx, gy, gz = grid
        bx, by, bz = block
        err = self._hipModuleLaunchKernel(f, gx, gy, gz, bx, by, bz, shared_mem, st, args, self._no_extra)[0]
        if err:
            _check(err, "hipModuleLaunchKernel")
