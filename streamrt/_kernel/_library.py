"""The kernel library of a runtime: compile (through the cache), load once, hand out Kernels.

``rt.kernels`` is a :class:`KernelLibrary`::

    k = rt.kernels.get("fill_u32")                 # a shipped kernel, found by name
    m = rt.kernels.load("verify.hip")              # a shipped source -> KernelModule
    m = rt.kernels.from_source(text, name="mine.hip", specs=[KernelSpec("mine", ...)])
    stream.launch_kernel(k, grid, block, [buf, n, 7, 1])

Compiling. Each source is include-expanded (:mod:`._source`), keyed by
:func:`~._cache.cache_key` (source hash, options, architecture, compiler
version, backend) and looked up in the :class:`~._cache.KernelCache` before the
backend's ``compile_source`` runs; compile errors raise
:class:`~streamrt.KernelCompileError` with the compiler's log. On the simulator
"compiling" checks the source's kernels against the registered numpy twins: it
is cheap and depends on the twin registry, so simulated devices use no cache
unless one is given.

Loading. A runtime loads each distinct image once (``module_load_data``) and
keeps the module until :meth:`KernelLibrary.close` (the runtime's close).

Thread rules: thread-safe; compiling and loading hold the library's lock.
Blocking: compiling blocks the calling thread (NVRTC: ~0.1-1 s; a cache hit: a file read).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._errors import ClosedError
from ._binding import Kernel
from ._cache import KernelCache, KernelCacheStatistics, cache_key, default_cache
from ._register import import_registrars
from ._signature import Signature, parse_kernels
from ._source import expand_includes, read_shipped, shipped_sources
from ._spec import KernelSpec, get_kernel_spec

if TYPE_CHECKING:
    from .._buffer import Buffer
    from .._runtime import Runtime
    from .._stream import Stream

__all__ = ["Compiler", "KernelLibrary", "KernelLibraryStatistics", "KernelModule", "close_library_for", "library_for", "load_kernel"]

#: ``compiler(source, name, options) -> image``: what the library calls on a cache miss.
Compiler = Callable[[str, str, Sequence[str]], bytes]

_DEFAULT: Any = object()


@dataclass(frozen=True)
class KernelLibraryStatistics:
    """Counters of one library. ``compiles``: compiler calls (cache misses); ``modules``: modules
    loaded on the device; ``cache``: the cache's counters (``None`` without a cache)."""

    compiles: int
    modules: int
    cache: KernelCacheStatistics | None


class KernelModule:
    """One compiled source loaded on the runtime's device. ``kernel(name)`` hands out its kernels."""

    __slots__ = ("_library", "_name", "_key", "_handle", "_signatures", "_specs", "_kernels", "_lock")

    def __init__(
        self, library: KernelLibrary, name: str, key: str, handle: int, signatures: dict[str, Signature], specs: dict[str, KernelSpec]
    ) -> None:
        self._library = library
        self._name = name
        self._key = key
        self._handle = handle
        self._signatures = signatures
        self._specs = specs
        self._kernels: dict[str, Kernel] = {}
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """The source's name (its file name for shipped sources)."""
        return self._name

    @property
    def key(self) -> str:
        """The cache key of the image."""
        return self._key

    @property
    def handle(self) -> int:
        """The backend module handle: an escape hatch."""
        return self._handle

    @property
    def runtime(self) -> Runtime:
        return self._library.runtime

    @property
    def kernel_names(self) -> tuple[str, ...]:
        return tuple(self._signatures)

    def signature(self, name: str) -> Signature:
        try:
            return self._signatures[name]
        except KeyError:
            raise KeyError(f"module {self._name!r} has no kernel {name!r}; it has {', '.join(self._signatures) or 'none'}") from None

    def kernel(self, name: str) -> Kernel:
        """The :class:`Kernel` ``name`` (made once). ``KeyError`` if the source has no such kernel;
        ``TypeError`` if its signature has a parameter type streamrt cannot pass."""
        with self._lock:
            k = self._kernels.get(name)
            if k is not None:
                return k
            sig = self.signature(name)
            if sig.error is not None:
                raise TypeError(sig.error)
            spec = self._specs.get(name) or get_kernel_spec(name)
            lib = self._library
            lib._check_open()
            backend = lib.runtime.backend
            backend.ensure_device(lib.runtime.device)
            function = backend.module_get_function(self._handle, name)
            k = self._kernels[name] = Kernel(self, sig, spec, function)
            return k

    def __repr__(self) -> str:
        return f"<KernelModule {self._name!r} kernels={list(self._signatures)}>"


class KernelLibrary:
    """Runtime-compiled kernels of one runtime. See the module docstring.

    Args:
        runtime: the runtime.
        cache: a :class:`KernelCache`, ``None`` for none, or (default) the process-wide
            cache of ``$STREAMRT_KERNEL_CACHE`` on GPUs and none on the simulator.
        compiler: ``compiler(source, name, options) -> image`` (default: the backend's
            ``compile_source``); tests inject a counting or failing one here.
        compiler_version: what keys the cache for ``compiler`` (default: the backend's).
        options: compile options added to every source.
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        cache: KernelCache | None = _DEFAULT,
        compiler: Compiler | None = None,
        compiler_version: str | None = None,
        options: Sequence[str] = (),
    ) -> None:
        from . import _builtin  # noqa: F401 - registers the shipped kernels' specs and simulator twins

        self._runtime = runtime
        if cache is _DEFAULT:
            cache = None if runtime.capabilities.is_simulated else default_cache()
        if cache is not None and not isinstance(cache, KernelCache):
            raise TypeError(f"cache must be a KernelCache or None, not {type(cache).__name__}")
        if compiler is not None and not callable(compiler):
            raise TypeError("compiler must be callable(source, name, options) -> bytes")
        self._cache = cache
        self._compiler = compiler
        self._compiler_version = compiler_version
        self._options = tuple(str(o) for o in options)
        self._lock = threading.RLock()
        self._modules: dict[str, KernelModule] = {}  # cache key -> module
        self._by_source: dict[str, KernelModule] = {}  # shipped source name -> module
        self._index: dict[str, str] | None = None  # shipped kernel name -> source name
        self._compiles = 0
        self._closed = False

    # -- properties ---------------------------------------------------------------------------
    @property
    def runtime(self) -> Runtime:
        return self._runtime

    @property
    def cache(self) -> KernelCache | None:
        return self._cache

    @property
    def sources(self) -> tuple[str, ...]:
        """File names of the kernel sources shipped with streamrt."""
        return shipped_sources()

    def statistics(self) -> KernelLibraryStatistics:
        with self._lock:
            return KernelLibraryStatistics(self._compiles, len(self._modules), None if self._cache is None else self._cache.statistics())

    # -- compiling -------------------------------------------------------------------------------
    def compiler_version(self) -> str:
        """The version string that keys the cache (the backend's compiler unless one was given)."""
        if self._compiler_version is None:
            self._compiler_version = str(self._runtime.backend.compiler_version())
        return self._compiler_version

    def compile(self, source: str, name: str = "kernel.hip", options: Sequence[str] = ()) -> tuple[str, bytes]:
        """``(cache key, image)`` of ``source`` for this runtime's device, compiling only on a cache miss.

        Raises :class:`~streamrt.KernelCompileError` (with the log) when compilation fails.
        """
        if not isinstance(source, str):
            raise TypeError(f"source must be a str, not {type(source).__name__}")
        self._check_open()
        opts = self._options + tuple(str(o) for o in options)
        expanded = expand_includes(source, name)
        caps = self._runtime.capabilities
        key = cache_key(expanded, opts, caps.architecture, self.compiler_version(), caps.backend)
        with self._lock:
            image = self._cache.get(key) if self._cache is not None else None
            if image is None:
                backend = self._runtime.backend
                backend.ensure_device(self._runtime.device)
                compiler = self._compiler or backend.compile_source
                image = bytes(compiler(expanded, name, list(opts)))
                self._compiles += 1
                if self._cache is not None:
                    self._cache.put(key, image)
        return key, image

    # -- modules -----------------------------------------------------------------------------------
    def from_source(
        self, source: str, *, name: str = "kernel.hip", options: Sequence[str] = (), specs: Iterable[KernelSpec] = ()
    ) -> KernelModule:
        """Compile (or find in the cache) and load ``source``; the same image loads once per runtime.

        ``specs`` give argument rules to its kernels (they win over registered specs).
        ``#include "streamrt_kernel.h"`` works in any source.
        """
        spec_map: dict[str, KernelSpec] = {}
        for s in specs:
            if not isinstance(s, KernelSpec):
                raise TypeError(f"specs must be KernelSpec objects, not {type(s).__name__}")
            spec_map[s.name] = s
        key, image = self.compile(source, name, options)
        with self._lock:
            module = self._modules.get(key)
            if module is not None and not spec_map:
                return module
            signatures = parse_kernels(expand_includes(source, name))
            unknown = set(spec_map) - set(signatures)
            if unknown:
                raise ValueError(f"specs for kernels {sorted(unknown)} that {name!r} does not declare")
            if module is None:
                self._check_open()
                backend = self._runtime.backend
                backend.ensure_device(self._runtime.device)
                handle = backend.module_load_data(image)
                module = KernelModule(self, name, key, handle, signatures, spec_map)
                self._modules[key] = module
                return module
            # Same image, new specs: a new view of the loaded module.
            return KernelModule(self, name, key, module.handle, signatures, spec_map)

    def load(self, source_name: str) -> KernelModule:
        """The shipped source ``source_name`` (e.g. ``"verify.hip"``), compiled and loaded once."""
        with self._lock:
            module = self._by_source.get(source_name)
            if module is None:
                text = read_shipped(source_name)
                import_registrars(text)  # the package that owns the source registers its specs and twins
                module = self._by_source[source_name] = self.from_source(text, name=source_name)
            return module

    def get(self, kernel_name: str) -> Kernel:
        """The shipped kernel ``kernel_name`` (e.g. ``"fill_u32"``), from whichever shipped source declares it."""
        with self._lock:
            if self._index is None:
                index: dict[str, str] = {}
                for source in shipped_sources():
                    for k in parse_kernels(read_shipped(source)):
                        index.setdefault(k, source)
                self._index = index
            src = self._index.get(kernel_name)
        if src is None:
            raise KeyError(f"no shipped kernel is named {kernel_name!r}; there are: {', '.join(sorted(self._index or ()))}")
        return self.load(src).kernel(kernel_name)

    # -- the shipped verification and study kernels ------------------------------------------------------
    def fill_u32(self, stream: Stream, dst: Any, value: int = 0, step: int = 0, *, count: int | None = None) -> None:
        """Enqueue ``dst[i] = value + step * i`` (uint32, mod 2**32) for ``count`` words (default: all of ``dst``)."""
        from ._builtin import fill_u32

        fill_u32(self, stream, dst, value, step, count=count)

    def checksum_u32(self, stream: Stream, src: Any, result: Any, *, count: int | None = None) -> None:
        """Enqueue: zero the uint64 ``result``, then add the checksum of ``src``'s first ``count`` uint32 words.

        Compare with :func:`streamrt._kernel.checksum_words` of the same words.
        """
        from ._builtin import checksum_u32

        checksum_u32(self, stream, src, result, count=count)

    def spin_sleep(self, stream: Stream, microseconds: float, *, out: Buffer | None = None) -> None:
        """Enqueue a kernel that spins for ``microseconds`` on the device clock (for studies).

        ``out`` (16 bytes, device or pinned) receives the spun time in µs and the clock rate, as two float64.
        """
        from ._builtin import spin_sleep

        spin_sleep(self, stream, microseconds, out=out)

    # -- lifetime ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Unload every module (call after the device is idle). Kernels of this library are unusable after. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            modules = list(self._modules.values())
            self._modules.clear()
            self._by_source.clear()
        rt = self._runtime
        if rt.is_closed:
            return
        backend = rt.backend
        for m in modules:
            backend.module_unload(m.handle)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the kernel library of this runtime is closed")
        if self._runtime.is_closed:
            raise ClosedError("runtime is closed")

    def __repr__(self) -> str:
        return f"<KernelLibrary {self._runtime!r} modules={len(self._modules)} cache={self._cache!r}>"


_libraries: weakref.WeakKeyDictionary[Any, KernelLibrary] = weakref.WeakKeyDictionary()
_libraries_lock = threading.Lock()


def library_for(runtime: Runtime) -> KernelLibrary:
    """The runtime's :class:`KernelLibrary` (made on first use, with the defaults); what ``rt.kernels`` returns."""
    with _libraries_lock:
        lib = _libraries.get(runtime)
        if lib is None:
            lib = _libraries[runtime] = KernelLibrary(runtime)
        return lib


def close_library_for(runtime: Runtime) -> None:
    """Close the runtime's library if it has one (the runtime's close calls this before closing the backend)."""
    with _libraries_lock:
        lib = _libraries.pop(runtime, None)
    if lib is not None:
        lib.close()


def load_kernel(runtime: Runtime, source_name: str, kernel_name: str) -> Kernel:
    """``runtime``'s kernel ``kernel_name`` of shipped source ``source_name`` (``srt.load_kernel``)."""
    return library_for(runtime).load(source_name).kernel(kernel_name)
