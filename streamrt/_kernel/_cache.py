"""The compiled-kernel cache: an in-process memo over an on-disk directory of images.

Key: :func:`cache_key` hashes the (include-expanded) source, the compile
options, the device architecture, the compiler version and the backend. So a
source is compiled once per architecture and compiler, and any change to the
source (or the header it includes) is a miss.

Directory: ``$STREAMRT_KERNEL_CACHE`` if set (``off``, ``0`` or an empty value
disable the disk), else ``$XDG_CACHE_HOME/streamrt/kernels``, else
``~/.cache/streamrt/kernels``. One file per key, ``<key>.img``: a magic line,
the SHA-256 of the image, the image. Writes go to a temporary file in the same
directory that is then renamed over the final name (atomic on POSIX and
Windows), so concurrent processes never read half a file; a file that fails its
checksum is treated as a miss and rewritten. A directory that cannot be
written is a warning (once per cache) and the image stays in memory.

Thread rules: a :class:`KernelCache` is thread-safe. Blocking: disk I/O.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KernelCache", "KernelCacheStatistics", "cache_key", "default_cache", "default_cache_dir"]

_FORMAT = 1
_MAGIC = b"STREAMRT-KERNEL-IMAGE 1\n"
_DISABLED = ("", "0", "off", "none", "false")


def cache_key(source: str, options: Sequence[str], architecture: str, compiler: str, backend: str) -> str:
    """The hex SHA-256 naming one compiled image."""
    body = json.dumps(
        {
            "format": _FORMAT,
            "source": hashlib.sha256(source.encode("utf-8")).hexdigest(),
            "options": list(options),
            "architecture": architecture,
            "compiler": compiler,
            "backend": backend,
        },
        sort_keys=True,
    )
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def default_cache_dir() -> Path | None:
    """The disk directory from the environment (see the module docstring); ``None`` when disabled."""
    env = os.environ.get("STREAMRT_KERNEL_CACHE")
    if env is not None:
        return None if env.strip().lower() in _DISABLED else Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "streamrt" / "kernels"


@dataclass(frozen=True)
class KernelCacheStatistics:
    """Counters of one :class:`KernelCache` since it was made.

    Attributes:
        memory_hits: lookups answered from the in-process memo.
        disk_hits: lookups answered from the directory.
        misses: lookups that found nothing (the caller then compiles).
        disk_writes: images written to the directory.
        disk_errors: unreadable/corrupt files and failed writes.
    """

    memory_hits: int
    disk_hits: int
    misses: int
    disk_writes: int
    disk_errors: int


class KernelCache:
    """Compiled images by :func:`cache_key`: memory first, then ``directory`` (``None``: memory only)."""

    def __init__(self, directory: str | os.PathLike[str] | None) -> None:
        self._dir = None if directory is None else Path(directory)
        self._memo: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._warned = False
        self._memory_hits = self._disk_hits = self._misses = self._writes = self._errors = 0

    @property
    def directory(self) -> Path | None:
        return self._dir

    def path(self, key: str) -> Path | None:
        """The file that holds ``key``'s image (``None`` without a directory)."""
        return None if self._dir is None else self._dir / f"{key}.img"

    def get(self, key: str) -> bytes | None:
        """The image for ``key``, or ``None`` (a miss)."""
        with self._lock:
            image = self._memo.get(key)
            if image is not None:
                self._memory_hits += 1
                return image
        image = self._read(key)
        with self._lock:
            if image is None:
                self._misses += 1
                return None
            self._disk_hits += 1
            self._memo[key] = image
            return image

    def put(self, key: str, image: bytes) -> None:
        """Keep ``image`` for ``key`` in memory and (atomically) on disk."""
        image = bytes(image)
        with self._lock:
            self._memo[key] = image
        self._write(key, image)

    def clear_memory(self) -> None:
        """Forget the in-process memo (the directory is kept)."""
        with self._lock:
            self._memo.clear()

    def statistics(self) -> KernelCacheStatistics:
        with self._lock:
            return KernelCacheStatistics(self._memory_hits, self._disk_hits, self._misses, self._writes, self._errors)

    # -- disk ------------------------------------------------------------------------------
    def _read(self, key: str) -> bytes | None:
        path = self.path(key)
        if path is None:
            return None
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError:
            self._count_error()
            return None
        head = len(_MAGIC)
        if not data.startswith(_MAGIC) or len(data) < head + 32:
            self._count_error()
            return None
        digest, image = data[head : head + 32], data[head + 32 :]
        if hashlib.sha256(image).digest() != digest:
            self._count_error()
            return None
        return image

    def _write(self, key: str, image: bytes) -> None:
        path = self.path(key)
        if path is None:
            return
        tmp: str | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + hashlib.sha256(image).digest() + image)
            os.replace(tmp, path)
            tmp = None
            with self._lock:
                self._writes += 1
        except OSError as exc:
            self._count_error()
            with self._lock:
                warn, self._warned = not self._warned, True
            if warn:
                warnings.warn(
                    f"streamrt kernel cache: cannot write {path} ({exc}); compiled kernels stay in memory only "
                    "(set STREAMRT_KERNEL_CACHE to a writable directory, or to 'off')",
                    RuntimeWarning,
                    stacklevel=4,
                )
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def _count_error(self) -> None:
        with self._lock:
            self._errors += 1

    def __repr__(self) -> str:
        return f"<KernelCache {self._dir if self._dir is not None else 'memory only'}>"


_defaults: dict[Path | None, KernelCache] = {}
_defaults_lock = threading.Lock()


def default_cache() -> KernelCache:
    """The process-wide cache for :func:`default_cache_dir` (one per directory, so runtimes share compiles)."""
    directory = default_cache_dir()
    with _defaults_lock:
        cache = _defaults.get(directory)
        if cache is None:
            cache = _defaults[directory] = KernelCache(directory)
        return cache
