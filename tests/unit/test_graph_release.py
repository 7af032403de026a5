"""The native release queue: the destructor pushes a token without Python; the release thread hands it on."""

from __future__ import annotations

import ctypes
import importlib

import pytest

from streamrt import _graph_release

native = pytest.importorskip("streamrt._graph_release_c", reason="the optional C extension is not built here")


def test_tokens_pushed_by_the_destructor_come_back_by_id() -> None:
    destroy = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(native.DESTRUCTOR_ADDRESS)
    tokens = [native.token(i) for i in (11, 12, 13)]
    for t in tokens:
        destroy(t)
    got: list[int] = []
    while len(got) < 3:
        got += native.take(1.0)
    assert sorted(got) == [11, 12, 13]
    native.wake()
    assert native.take(1.0) == []  # a wake with no token
    assert native.take(0.01) == []  # a timeout
    native.discard(native.token(99))
    with pytest.raises(ValueError):
        native.take(-1.0)


def test_a_missing_extension_is_a_capture_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_module(name: str) -> None:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(_graph_release, "_native", None)
    monkeypatch.setattr(_graph_release, "_native_error", None)
    monkeypatch.setattr(importlib, "import_module", no_module)
    reason = _graph_release.unavailable_reason()
    assert reason is not None and "streamrt._graph_release_c" in reason and "C compiler" in reason
