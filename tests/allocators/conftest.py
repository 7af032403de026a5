"""Fixtures for the allocator tests: gates that are always opened, allocators that are always closed."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from alloc_helpers import Gate

import allocators
import allocators._caching
import streamrt as srt
from allocators import _fastpath


@pytest.fixture(autouse=True, params=["native", "python"])
def fastpath(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every allocator test runs twice: over the C hot path and over its Python twin (allocators/_fastpath.py).

    Applies to allocators made during the test (``make_allocator``, a test's own ``open_runtime``).
    """
    if request.param == "native":
        if not _fastpath.NATIVE:
            pytest.skip("allocators._fastpath_c is not built (no C compiler at install time)")
        monkeypatch.setattr(allocators._caching, "FastPath", _fastpath.FastPath)
    else:
        monkeypatch.setattr(allocators._caching, "FastPath", _fastpath.PyFastPath)
    return str(request.param)


@pytest.fixture
def make_allocator(rt: srt.Runtime) -> Iterator[Callable[..., allocators.CachingAllocator]]:
    """``make_allocator(kind, **options)``: a caching allocator of ``rt``, closed at teardown."""
    made: list[allocators.CachingAllocator] = []

    def make(kind: str = "host", source: Any = None, **options: Any) -> allocators.CachingAllocator:
        cls = allocators.CachingPinnedAllocator if kind == "host" else allocators.CachingDeviceAllocator
        a = cls(rt, source, **options)
        made.append(a)
        return a

    try:
        yield make
    finally:
        for a in made:
            a.close()


@pytest.fixture
def gate(rt: srt.Runtime, make_allocator: Callable[..., allocators.CachingAllocator]) -> Iterator[Callable[[srt.Stream], Gate]]:
    """``gate(stream)`` holds ``stream`` until ``.open()``; every gate is opened at teardown.

    Depends on ``make_allocator`` so that gates open before the test's allocators
    close (closing waits for in-flight work).
    """
    made: list[Gate] = []

    def make(stream: srt.Stream) -> Gate:
        g = Gate(stream)
        made.append(g)
        return g

    try:
        yield make
    finally:
        for g in made:
            g.open()
