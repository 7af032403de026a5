"""The compile cache: a second compile is a hit (memory, then disk), a changed source is a miss,
corrupt or unwritable cache files are survived, and compile errors carry the compiler log."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from support.transfer import download

import streamrt as srt
from streamrt import KernelCompileError
from streamrt._kernel import KernelCache, KernelLibrary, default_cache_dir, read_shipped

SOURCE = read_shipped("verify.hip")


class CountingCompiler:
    """The backend's compiler, counted: what the library calls on a cache miss."""

    def __init__(self, rt: srt.Runtime) -> None:
        self.rt = rt
        self.calls: list[str] = []

    def __call__(self, source: str, name: str, options: Sequence[str]) -> bytes:
        self.calls.append(name)
        return self.rt.backend.compile_source(source, name, options)


def test_a_second_compile_is_a_memory_hit_then_a_disk_hit_in_a_new_process_cache(rt: srt.Runtime, tmp_path: Path) -> None:
    compiler = CountingCompiler(rt)
    lib = KernelLibrary(rt, cache=KernelCache(tmp_path), compiler=compiler)
    m1 = lib.from_source(SOURCE, name="verify.hip")
    m2 = lib.from_source(SOURCE, name="verify.hip")
    assert compiler.calls == ["verify.hip"]
    assert m1 is m2  # loaded once per runtime
    assert lib.statistics().modules == 1
    assert (tmp_path / f"{m1.key}.img").is_file()

    fresh = KernelLibrary(rt, cache=KernelCache(tmp_path), compiler=compiler)  # a new memo: as in a new process
    fresh.from_source(SOURCE, name="verify.hip")
    assert compiler.calls == ["verify.hip"]
    stats = fresh.statistics().cache
    assert stats is not None and (stats.disk_hits, stats.misses) == (1, 0)
    for library in (lib, fresh):
        library.close()


def test_a_changed_source_option_or_compiler_version_is_a_miss(rt: srt.Runtime, tmp_path: Path) -> None:
    compiler = CountingCompiler(rt)
    cache = KernelCache(tmp_path)
    lib = KernelLibrary(rt, cache=cache, compiler=compiler)
    base = lib.from_source(SOURCE, name="verify.hip")
    edited = lib.from_source(SOURCE + "\n// an edit\n", name="verify.hip")
    with_option = lib.from_source(SOURCE, name="verify.hip", options=["-DSTREAMRT_TEST_OPTION=1"])
    newer = KernelLibrary(rt, cache=cache, compiler=compiler, compiler_version="some-other-compiler 99.0")
    other = newer.from_source(SOURCE, name="verify.hip")
    assert len(compiler.calls) == 4
    assert len({base.key, edited.key, with_option.key, other.key}) == 4
    # Every image works.
    s = rt.create_stream()
    buf = rt.device_allocator.allocate(64, stream=s)
    for m in (base, edited, with_option, other):
        s.launch_kernel(m.kernel("fill_u32"), 1, 32, [buf, 16, 3, 0])
    assert (download(rt, s, buf, np.uint32) == 3).all()
    buf.release()
    for library in (lib, newer):
        library.close()


def test_a_change_to_the_included_header_is_a_miss(rt: srt.Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key hashes the include-expanded text, so editing streamrt_kernel.h invalidates every source."""
    from streamrt._kernel import _source

    compiler = CountingCompiler(rt)
    lib = KernelLibrary(rt, cache=KernelCache(tmp_path), compiler=compiler)
    key1, _ = lib.compile(SOURCE, "verify.hip")
    real = _source.read_shipped

    def edited(name: str) -> str:
        text = real(name)
        return text + "\n/* edited */\n" if name == "streamrt_kernel.h" else text

    monkeypatch.setattr(_source, "read_shipped", edited)
    key2, _ = lib.compile(SOURCE, "verify.hip")
    assert key1 != key2 and len(compiler.calls) == 2


def test_a_corrupt_cache_file_is_a_miss_and_is_rewritten(rt: srt.Runtime, tmp_path: Path) -> None:
    compiler = CountingCompiler(rt)
    key, image = KernelLibrary(rt, cache=KernelCache(tmp_path), compiler=compiler).compile(SOURCE, "verify.hip")
    path = tmp_path / f"{key}.img"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    cache = KernelCache(tmp_path)
    key2, image2 = KernelLibrary(rt, cache=cache, compiler=compiler).compile(SOURCE, "verify.hip")
    assert key2 == key and image2 == image and len(compiler.calls) == 2
    assert cache.statistics().disk_errors == 1 and cache.statistics().disk_writes == 1
    assert KernelCache(tmp_path).get(key) == image  # rewritten whole
    assert [p.name for p in tmp_path.iterdir()] == [f"{key}.img"]  # no temporary files left


def test_an_unwritable_cache_directory_warns_and_keeps_the_image_in_memory(rt: srt.Runtime, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    compiler = CountingCompiler(rt)
    lib = KernelLibrary(rt, cache=KernelCache(blocker / "kernels"), compiler=compiler)
    with pytest.warns(RuntimeWarning, match="cannot write"):
        lib.from_source(SOURCE, name="verify.hip")
    lib.compile(SOURCE, "verify.hip")
    assert len(compiler.calls) == 1
    lib.close()


def test_the_cache_directory_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STREAMRT_KERNEL_CACHE", str(tmp_path / "k"))
    assert default_cache_dir() == tmp_path / "k"
    for off in ("off", "0", ""):
        monkeypatch.setenv("STREAMRT_KERNEL_CACHE", off)
        assert default_cache_dir() is None
    monkeypatch.delenv("STREAMRT_KERNEL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "streamrt" / "kernels"


def test_concurrent_writers_leave_one_complete_file(tmp_path: Path) -> None:
    import threading

    images = [bytes([i]) * 100_000 for i in range(8)]
    caches = [KernelCache(tmp_path) for _ in images]
    threads = [threading.Thread(target=c.put, args=("k" * 64, img)) for c, img in zip(caches, images, strict=False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert KernelCache(tmp_path).get("k" * 64) in images
    assert os.listdir(tmp_path) == ["k" * 64 + ".img"]


BROKEN = '#include "streamrt_kernel.h"\n\nextern "C" __global__ void streamrt_test_broken(srt_u32* p) {\n    p[0] = ;\n}\n'


def test_a_compile_error_raises_with_the_compiler_log_and_is_not_cached(rt: srt.Runtime, tmp_path: Path) -> None:
    """On a GPU the source is a syntax error; on the simulator its kernel has no twin. Either way: the log."""
    compiler = CountingCompiler(rt)
    lib = KernelLibrary(rt, cache=KernelCache(tmp_path), compiler=compiler)
    for _ in range(2):
        with pytest.raises(KernelCompileError) as info:
            lib.from_source(BROKEN, name="broken.hip")
        assert "broken.hip" in info.value.log and "error" in info.value.log
        assert "--- compiler log ---" in str(info.value)
    assert len(compiler.calls) == 2
    assert list(tmp_path.iterdir()) == []


def test_shipped_kernels_are_found_by_name_and_loaded_once(rt: srt.Runtime) -> None:
    lib = rt.kernels
    assert lib is rt.kernels
    fill = lib.get("fill_u32")
    checksum = lib.get("checksum_u32")
    assert fill.module is checksum.module is lib.load("verify.hip")
    assert srt.load_kernel(rt, "verify.hip", "fill_u32") is fill
    assert lib.get("fmha_bwd_prepare").module.name == "fmha_bwd_prepare.hip"
    with pytest.raises(KeyError, match="no shipped kernel"):
        lib.get("no_such_kernel")
    with pytest.raises(FileNotFoundError, match="verify.hip"):
        lib.load("missing.hip")
    with pytest.raises(KeyError, match="fill_u32"):
        lib.load("verify.hip").kernel("nope")
