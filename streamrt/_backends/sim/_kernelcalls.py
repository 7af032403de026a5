"""Kernel calls of the sim backend: compile, modules, launches of numpy twins.

See ``_kernels`` for the twin mechanism.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from . import _codes as C
from ._codes import fail, make_error
from ._core import FUNCTION_BASE, MODULE_BASE, FunctionState, ModuleState, SimCore, check_count
from ._hazards import READ, WRITE
from ._kernels import (
    COMPILER_VERSION,
    Twin,
    TwinContext,
    compile_twins,
    decode_args,
    get_twin,
    parse_image,
)

__all__ = ["KernelCalls"]

_MAX_SHARED_MEM = 232_448  # 227 KiB, the H200's per-block dynamic shared memory limit


def _dim3(value: Any, what: str, call: str) -> tuple[int, int, int]:
    try:
        dims = tuple(operator.index(v) for v in value)
    except TypeError:
        fail(C.INVALID_CONFIGURATION, f"{what} must be a tuple of three ints, got {value!r}", call)
    if len(dims) != 3 or any(d < 1 for d in dims):
        fail(C.INVALID_CONFIGURATION, f"{what} must be three ints >= 1, got {value!r}", call)
    return dims[0], dims[1], dims[2]


class KernelCalls(SimCore):
    """compiler_version / compile_source / module_* / launch_kernel."""

    # == kernels ===========================================================================================
    def compiler_version(self) -> str:
        """``"sim-twins-1"``: the twin mechanism's version."""
        self._enter("compiler_version")
        return COMPILER_VERSION

    def compile_source(self, source: str, name: str, options: Sequence[str]) -> bytes:
        """Check ``source``'s ``extern "C"`` kernels against registered twins; see ``_kernels``."""
        call = "compile_source"
        tls = self._enter(call)
        image = compile_twins(source, str(name), list(options))
        with self._lock:
            self._charge(tls)
        return image

    def module_load_data(self, image: bytes) -> int:
        call = "module_load_data"
        tls = self._enter(call)
        try:
            program, kernels = parse_image(image)
        except (ValueError, TypeError) as exc:
            fail(C.INVALID_KERNEL_IMAGE, str(exc), call)
        twins: dict[str, Twin] = {}
        for k in kernels:
            twin = get_twin(k)
            if twin is None:
                fail(C.SYMBOL_NOT_FOUND, f"kernel {k!r} of program {program!r} has no registered twin any more", call)
            twins[k] = twin
        with self._lock:
            handle = self._new_handle(MODULE_BASE)
            self._modules[handle] = ModuleState(handle, program, twins)
            self._charge(tls)
            return handle

    def module_get_function(self, module: int, name: str) -> int:
        call = "module_get_function"
        tls = self._enter(call)
        with self._lock:
            mod: ModuleState = self._lookup(self._modules, module, "module", call)
            if not isinstance(name, str):
                fail(C.INVALID_VALUE, f"the kernel name must be a str, got {type(name).__name__}", call)
            twin = mod.twins.get(name)
            if twin is None:
                fail(C.SYMBOL_NOT_FOUND, f"module {mod.handle:#x} ({mod.program!r}) has no kernel {name!r}", call)
            handle = mod.functions.get(name)
            if handle is None:
                handle = self._new_handle(FUNCTION_BASE)
                mod.functions[name] = handle
                self._functions[handle] = FunctionState(handle, twin, mod.handle)
            self._charge(tls)
            return handle

    def module_unload(self, module: int) -> None:
        """Unload; its function handles become invalid (launches already enqueued still run)."""
        call = "module_unload"
        tls = self._enter(call)
        with self._lock:
            mod: ModuleState = self._lookup(self._modules, module, "module", call)
            del self._modules[mod.handle]
            for h in mod.functions.values():
                self._functions.pop(h, None)
            self._charge(tls)

    def launch_kernel(
        self,
        function: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        stream: int,
        arg_ptrs: int,
    ) -> None:
        """Decode the arguments now, run the twin on the executor in stream order."""
        call = "launch_kernel"
        tls = self._enter(call)
        g = _dim3(grid, "grid", call)
        b = _dim3(block, "block", call)
        if g[0] > 2**31 - 1 or g[1] > 65535 or g[2] > 65535:
            fail(C.INVALID_CONFIGURATION, f"grid {g} exceeds (2**31-1, 65535, 65535)", call)
        if b[0] > 1024 or b[1] > 1024 or b[2] > 64 or b[0] * b[1] * b[2] > 1024:
            fail(C.INVALID_CONFIGURATION, f"block {b} exceeds 1024 threads (or (1024, 1024, 64))", call)
        smem = check_count(shared_mem, "shared_mem", call)
        if smem > _MAX_SHARED_MEM:
            fail(C.INVALID_VALUE, f"shared_mem {smem} exceeds {_MAX_SHARED_MEM} bytes", call)
        ap = check_count(arg_ptrs, "arg_ptrs", call)
        with self._lock:
            f: FunctionState = self._lookup(self._functions, function, "function", call)
            s = self._stream(stream, tls, call)
            twin = f.twin
            try:
                args = decode_args(ap, twin.signature)
            except ValueError as exc:
                fail(C.INVALID_VALUE, f"kernel {twin.name!r}: {exc}", call)
            p = self._profile
            try:
                cost = twin.cost(g, b, args, p.kernel_default_us)
            except Exception as exc:
                raise make_error(
                    C.INVALID_VALUE, f"the cost model of kernel {twin.name!r} failed: {exc!r}", call
                ) from exc
            seq = self._seq + 1
            desc = f"kernel#{seq} {twin.name!r} on stream {s.handle:#x}"
            accesses: list[Any] = []
            allocs: list[Any] = [twin]
            for i, mode in twin.pointer_modes():
                ptr = args[i]
                if not ptr:
                    continue
                alloc = self._mem.find(ptr)
                if alloc is None:
                    tomb = self._mem.find_freed(ptr)
                    if tomb is not None and self._hz is not None:
                        self._hz.report([self._hz.freed_access(tomb, ptr, tomb.end, desc)], call)
                    continue
                allocs.append(alloc)
                if ptr < alloc.end:
                    accesses.append((alloc, ptr, alloc.end, READ if mode == "r" else WRITE))
            ctx = TwinContext(self._resolve, twin.name, g, b, smem, s.handle, s.device)
            full = (ctx, g, b, *args)
            if s.capture is not None:
                self._capture_node(
                    tls,
                    s,
                    "kernel",
                    call,
                    name=twin.name,
                    duration_us=cost,
                    gap_after_us=p.graph_node_gap_us,
                    fn=twin.fn,
                    args=full,
                    refs=tuple(allocs),
                    accesses=tuple(accesses),
                )
                return
            seq = self._next_seq()
            self._hazard_check(s, "kernel", seq, accesses, call)
            self._enqueue(
                tls,
                s,
                "kernel",
                seq,
                duration=cost,
                work=True,
                gap_after=p.op_gap_us,
                fn=twin.fn,
                args=full,
                refs=tuple(allocs),
                name=twin.name,
            )
