"""Fixtures for the multi-device tests: runtimes on the devices of one simulated machine."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import streamrt as srt

Machine = Callable[..., list[srt.Runtime]]


@pytest.fixture
def machine() -> Iterator[Machine]:
    """``machine(n, **options)``: one runtime per device of an ``n``-device simulator (all closed after the test)."""
    opened: list[srt.Runtime] = []

    def open_machine(n: int, **options: Any) -> list[srt.Runtime]:
        rts = [srt.open_runtime("sim", device=i, devices=n, **options) for i in range(n)]
        opened.extend(rts)
        return rts

    try:
        yield open_machine
    finally:
        for rt in reversed(opened):
            rt.close()


@pytest.fixture
def pair(machine: Machine) -> list[srt.Runtime]:
    """Runtimes on devices 0 and 1 of a two-device simulator."""
    return machine(2)
