"""Helpers for the interop tests (imported by name; pytest puts this folder on sys.path)."""

from __future__ import annotations

from typing import Any

import streamrt as srt
from streamrt._interop._memory import _tensor_of

KDL_CUDA = 2


def races(rt: srt.Runtime) -> list[str]:
    """The race hazards the simulator found so far, as messages."""
    return [h.message for h in rt.backend.hazards() if h.kind == "race"]


def fake_cuda_capsule(mem: srt.Buffer, *, versioned: bool, readonly: bool = False) -> Any:
    """A DLPack capsule over ``mem`` that says kDLCUDA device 0: another library's export of device memory,
    played on the simulator (whose own exports say kDLCPU)."""
    view = mem.base.view(mem.offset, mem.nbytes)
    if readonly:
        view._readonly = True
    capsule = view.__dlpack__(max_version=(1, 0) if versioned else None)
    tensor, _ = _tensor_of(capsule)
    tensor.device.device_type = KDL_CUDA
    return capsule
