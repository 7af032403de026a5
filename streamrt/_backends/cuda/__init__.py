"""The CUDA backend, over NVIDIA cuda-python's ``cuda.bindings``.

Runtime calls go through ``cuda.bindings.runtime`` (cudart), modules and kernel
launches through ``cuda.bindings.driver``, runtime compilation through
``cuda.bindings.nvrtc``. Nothing here is imported until :func:`probe`,
:func:`create` or :class:`CudaBackend` needs it, so ``import streamrt`` works
without cuda-bindings.

Host functions do *not* go through the bindings' ``cudaLaunchHostFunc`` /
``cuLaunchHostFunc``: those wrap the function pointer in a trampoline that
takes the GIL on the driver thread and frees its payload after the first call,
so a captured host node runs once and then reads freed memory on replay
(cuda-python issue 790). :meth:`CudaBackend.launch_host_func` calls the driver's
``cuLaunchHostFunc`` directly through ctypes (which releases the GIL), passing
the native function pointer and user data untouched.

Handle conversion: the bindings accept plain ``int`` handles, but convert each
one by building a wrapper object per call. The hot paths therefore pass cached
wrapper objects (``driver.CUstream``, ``cudaEvent_t``, ``cudaGraphExec_t``,
``driver.CUfunction``) looked up by the int handle; pointers, sizes and enum
values are passed as plain ints.

Modules, one concept each: ``_loading`` (lazy imports, :func:`probe`, libcuda),
``_codes`` (return codes -> errors), ``_compile`` (NVRTC), ``_core`` (state,
handle caches, devices), the call groups ``_streams``, ``_memory``,
``_hostcalls``, ``_graphs``, ``_kernels``, and ``_backend`` composing them.
"""

from __future__ import annotations

from typing import Any

from .. import unavailable
from ._backend import CudaBackend
from ._compile import nvrtc_compile
from ._loading import MIN_CUDA_BINDINGS, _diagnose, probe

__all__ = ["CudaBackend", "MIN_CUDA_BINDINGS", "create", "nvrtc_compile", "probe", "share_key"]


def share_key(**options: Any) -> object:
    """Runtimes of one process share one CUDA backend object (the driver is process-wide).

    Equal options (normally none) give the same key; unhashable options a private backend.
    """
    key = tuple(sorted(options.items()))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def create(**options: Any) -> CudaBackend:
    """Create the CUDA backend. Options: ``device`` (int; made current on the calling thread).

    Raises ``BackendUnavailableError`` naming what is missing and how to install it.
    """
    missing = _diagnose()
    if missing is not None:
        raise unavailable("cuda", missing.what, missing.how)
    return CudaBackend(**options)
