"""Fixtures for the simulator's unit tests: they drive the backend protocol directly."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _sim_helpers import Gate

from streamrt._backends import sim


@pytest.fixture
def sb() -> Iterator[sim.SimBackend]:
    """A fresh simulator backend, closed after the test."""
    backend = sim.create()
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture
def hz() -> Iterator[sim.SimBackend]:
    """A simulator backend recording hazards."""
    backend = sim.create(check_hazards=True)
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    try:
        yield g
    finally:
        g.open()  # never leave a stream blocked
        g.open()
