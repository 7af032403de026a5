"""Kernel tests write their compiled-kernel cache to a temporary directory, never to ~/.cache."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _kernel_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    mp = pytest.MonkeyPatch()
    mp.setenv("STREAMRT_KERNEL_CACHE", str(tmp_path_factory.mktemp("kernel-cache")))
    yield
    mp.undo()
