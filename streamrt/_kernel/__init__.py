"""Runtime-compiled HIP/CUDA kernels: sources, the compile cache, Kernel objects, launches, kernel nodes.

Layout of this package (one topic per module):

* :mod:`._source` — the shipped sources (``kernels/``, package data ``streamrt.kernels``) and include expansion;
* :mod:`._signature` — parsing ``extern "C" __global__`` declarations;
* :mod:`._spec` — :class:`KernelSpec`: sizes, access modes and checks the C signature cannot express;
* :mod:`._cache` — :class:`KernelCache`: in-process memo + atomic on-disk images;
* :mod:`._library` — :class:`KernelLibrary` (``rt.kernels``), :class:`KernelModule`;
* :mod:`._binding` — :class:`Kernel`, argument checking and packing;
* :mod:`._launch` — :func:`launch_kernel` (``Stream.launch_kernel``), :class:`KernelNode` (``Pipeline.kernel``);
* :mod:`._builtin` — specs, simulator twins and launchers of the verification and study kernels (registered
  on import, which the first :class:`KernelLibrary` does);
* :mod:`._register` — :func:`register_kernel` for packages above this layer that ship a kernel source
  (the FMHA recipe), and the ``// streamrt-register:`` line that makes loading the source import them;
* :mod:`._reference` — numpy references of the verification kernels.

See docs/kernels.md.
"""

from __future__ import annotations

from ._binding import BoundArgs, Kernel, PackedArgs
from ._cache import KernelCache, KernelCacheStatistics, cache_key, default_cache, default_cache_dir
from ._launch import KernelNode, add_kernel_node, launch_kernel, launch_prepared, prepare_launch
from ._library import (
    Compiler,
    KernelLibrary,
    KernelLibraryStatistics,
    KernelModule,
    close_library_for,
    library_for,
    load_kernel,
)
from ._reference import checksum_words, fill_words
from ._register import register_kernel
from ._signature import Param, Signature, parse_kernels
from ._source import expand_includes, read_shipped, shipped_sources
from ._spec import KernelArgs, KernelSpec, get_kernel_spec, register_kernel_spec, registered_kernel_specs

__all__ = [
    "BoundArgs",
    "Compiler",
    "Kernel",
    "KernelArgs",
    "KernelCache",
    "KernelCacheStatistics",
    "KernelLibrary",
    "KernelLibraryStatistics",
    "KernelModule",
    "KernelNode",
    "KernelSpec",
    "PackedArgs",
    "Param",
    "Signature",
    "add_kernel_node",
    "cache_key",
    "checksum_words",
    "close_library_for",
    "default_cache",
    "default_cache_dir",
    "expand_includes",
    "fill_words",
    "get_kernel_spec",
    "launch_kernel",
    "launch_prepared",
    "library_for",
    "load_kernel",
    "parse_kernels",
    "prepare_launch",
    "read_shipped",
    "register_kernel",
    "register_kernel_spec",
    "registered_kernel_specs",
    "shipped_sources",
]

from .._extensions import provide as _provide

_provide("kernels", library_for)  # Runtime.kernels
_provide("close_kernels", close_library_for)  # Runtime.close
_provide("launch_kernel", launch_kernel)  # Stream.launch_kernel
_provide("kernel_node", add_kernel_node)  # Pipeline.kernel
