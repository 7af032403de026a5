"""Profiler ranges: streamrt's names on Nsight Systems, rocprof and other profilers' timelines.

The switch: ``STREAMRT_RANGES=1`` in the environment (read when a runtime asks,
:func:`enabled`). Then streamrt marks its launches, pipeline nodes and Python
host functions as ranges of the profiler API its device's tools read
(``Capabilities.profiler_ranges``):

* ``"nvtx"`` (CUDA): the ``nvtx`` package (``pip install nvtx``; a domain
  named ``streamrt``), else ``libnvToolsExt`` through ctypes when the process
  can load it (torch's CUDA wheels ship it);
* ``"roctx"`` (HIP): ``libroctx64.so`` (or ROCm 6.2+'s
  ``librocprofiler-sdk-roctx.so``) loaded with ctypes from ``$ROCM_PATH/lib``,
  ``/opt/rocm/lib`` or the loader path, on first use.

Without the switch, on the simulator, or without the library,
:func:`for_runtime` returns ``None`` and callers skip the calls: absent
libraries cost one ``is None`` test per op. A library is looked for once per
process.

Thread rules: :meth:`Ranges.push` and :meth:`Ranges.pop` act on the calling
thread's range stack (NVTX and roctx ranges nest per thread): pop on the
thread that pushed. Everything else may be called from any thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import importlib
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ["ENV", "Ranges", "enabled", "for_runtime", "load"]

ENV = "STREAMRT_RANGES"
_MAX_NAMES = 4096  # cached encoded names / attributes; more are made per call


class Ranges:
    """Push, pop and mark of one range library (``library``: ``"nvtx"`` or ``"roctx"``)."""

    __slots__ = ("library", "_push", "_pop", "_mark")

    def __init__(self, library: str, push: Callable[[str], Any], pop: Callable[[], Any], mark: Callable[[str], Any]) -> None:
        self.library = library
        self._push, self._pop, self._mark = push, pop, mark

    def push(self, name: str) -> None:
        """Open a range called ``name`` on the calling thread."""
        self._push(name)

    def pop(self) -> None:
        """Close the calling thread's innermost open range."""
        self._pop()

    def mark(self, name: str) -> None:
        """An instant marker called ``name``."""
        self._mark(name)

    @contextlib.contextmanager
    def range(self, name: str) -> Iterator[None]:
        """``with ranges.range("name"): ...``: a range around the block (closed on errors too)."""
        self._push(name)
        try:
            yield
        finally:
            self._pop()

    def __repr__(self) -> str:
        return f"<Ranges {self.library}>"


def enabled() -> bool:
    """Whether ``STREAMRT_RANGES`` asks for ranges (``1``, ``true``, ``yes`` or ``on``)."""
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _cached(encode: Callable[[str], Any]) -> Callable[[str], Any]:
    cache: dict[str, Any] = {}

    def get(name: str) -> Any:
        got = cache.get(name)
        if got is None:
            got = encode(name)
            if len(cache) < _MAX_NAMES:
                cache[name] = got
        return got

    return get


def _nvtx_package() -> Ranges | None:
    try:
        nvtx = importlib.import_module("nvtx")  # optional, untyped
    except ImportError:
        return None
    domain = nvtx.get_domain("streamrt")
    attributes = _cached(lambda name: domain.get_event_attributes(message=name))
    return Ranges(
        "nvtx",
        lambda name: domain.push_range(attributes(name)),
        domain.pop_range,
        lambda name: domain.mark(attributes(name)),
    )


def _native(library: str, files: list[str], push: str, pop: str, mark: str) -> Ranges | None:
    """``push(const char*)``, ``pop()`` and ``mark(const char*)`` from the first of ``files`` that loads."""
    for path in files:
        try:
            lib = ctypes.CDLL(path)
            fpush, fpop, fmark = getattr(lib, push), getattr(lib, pop), getattr(lib, mark)
        except (OSError, AttributeError):
            continue
        fpush.argtypes, fpush.restype = [ctypes.c_char_p], ctypes.c_int
        fmark.argtypes, fmark.restype = [ctypes.c_char_p], None
        fpop.argtypes, fpop.restype = [], ctypes.c_int
        encoded = _cached(lambda name: name.encode("utf-8", "replace"))
        return Ranges(library, lambda name: fpush(encoded(name)), fpop, lambda name: fmark(encoded(name)))
    return None


def _nvtx() -> Ranges | None:
    found = _nvtx_package()
    if found is not None:
        return found
    files = ["libnvToolsExt.so.1", "libnvToolsExt.so"]
    named = ctypes.util.find_library("nvToolsExt")
    if named:
        files.append(named)
    return _native("nvtx", files, "nvtxRangePushA", "nvtxRangePop", "nvtxMarkA")


def _roctx() -> Ranges | None:
    names = ["libroctx64.so", "librocprofiler-sdk-roctx.so"]
    dirs = [d for d in (os.environ.get("ROCM_PATH"), "/opt/rocm") if d]
    files = [os.path.join(d, "lib", n) for d in dirs for n in names] + names
    return _native("roctx", files, "roctxRangePushA", "roctxRangePop", "roctxMarkA")


_LOADERS: dict[str, Callable[[], Ranges | None]] = {"nvtx": _nvtx, "roctx": _roctx}
_loaded: dict[str, Ranges | None] = {}
_lock = threading.Lock()


def load(api: str | None) -> Ranges | None:
    """The range library for ``api`` (``"nvtx"`` or ``"roctx"``), loaded once; ``None`` when absent or unknown."""
    if api is None:
        return None
    with _lock:
        if api not in _loaded:
            loader = _LOADERS.get(api)
            _loaded[api] = loader() if loader is not None else None
        return _loaded[api]


def for_runtime(rt: Runtime) -> Ranges | None:
    """The ranges for ``rt``'s device when the switch is on (:func:`enabled`); else ``None``."""
    if not enabled():
        return None
    return load(rt.capabilities.profiler_ranges)
