"""Fixtures for the completion-engine tests: the sim backend, a harness, an engine."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _completion_helpers import Harness

from streamrt._backends import load_backend
from streamrt._completion import CompletionEngine


@pytest.fixture
def sim_backend() -> Iterator[Any]:
    backend = load_backend("sim")
    backend.ensure_device(0)
    try:
        yield backend
    finally:
        backend.close()


@pytest.fixture
def harness(sim_backend: Any) -> Iterator[Harness]:
    h = Harness(sim_backend)
    try:
        yield h
    finally:
        h.teardown()


@pytest.fixture(params=[True, False], ids=["signal-hold", "sem_wait-hold"])
def engine(harness: Harness, request: pytest.FixtureRequest) -> CompletionEngine:
    """An engine whose Python host calls hold their stream with a signal wait, or with ``sem_wait(done)``."""
    return harness.engine(stream_signals=request.param)
