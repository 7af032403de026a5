"""Fixtures for the training-loop tests (streamrt.torch). Every test here needs torch.

``trt`` is the shared contract ``rt`` fixture (every backend), skipped on GPU
backends when the installed torch has no CUDA/ROCm device (CI installs the CPU
build of torch: there the GPU backends are absent anyway).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

import streamrt as srt

try:
    import torch
except ImportError:  # each test module skips itself with the reason
    torch = None

NO_TORCH = "torch is not installed (make test installs torch==2.13.0, the CPU build)"


@pytest.fixture
def trt(rt: srt.Runtime) -> srt.Runtime:
    """The contract runtime, usable with torch: the simulator with CPU torch, or a GPU with GPU torch."""
    if torch is None:
        pytest.skip(NO_TORCH)
    if not rt.capabilities.is_simulated and not torch.cuda.is_available():
        pytest.skip(f"the {rt.backend_name} backend needs a torch build with CUDA/ROCm")
    return rt


@pytest.fixture
def gate() -> Iterator[Callable[[srt.Stream], threading.Event]]:
    """``gate(stream)`` blocks ``stream`` until the returned event is set (set at teardown at the latest).

    A Python host function waits for the event: every later op on the stream waits for it,
    as a long kernel would.
    """
    opened: list[threading.Event] = []

    def close_stream(stream: srt.Stream) -> threading.Event:
        ev = threading.Event()
        opened.append(ev)
        stream.launch_host_func(ev.wait, 30.0)
        return ev

    yield close_stream
    for ev in opened:
        ev.set()
