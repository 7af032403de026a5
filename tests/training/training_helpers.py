"""Helpers shared by the training-loop tests."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch

import streamrt as srt
import streamrt.torch as st


def on_device(rt: srt.Runtime, t: torch.Tensor) -> torch.Tensor:
    """``t`` where torch computes for ``rt``: CUDA on a GPU runtime, simulator memory on the simulator."""
    dev = st.device_empty(rt, t.shape, t.dtype)
    if rt.capabilities.is_simulated:
        dev.copy_(t)
    else:
        dev.copy_(t.to(dev.device))  # on torch's current stream
    return dev


@contextmanager
def no_blocking_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Inside the block every streamrt call that blocks the host raises."""

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("a blocking call was made")

    with monkeypatch.context() as m:
        for owner, name in ((srt.Stream, "synchronize"), (srt.Event, "synchronize"), (srt.Runtime, "synchronize"), (srt.Completion, "wait")):
            m.setattr(owner, name, refuse)
        yield


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``predicate`` until true (``True``) or ``timeout`` seconds (``False``)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True
