"""torch, imported on first use, and the dtype maps between torch and numpy.

``import streamrt`` and ``import streamrt.torch`` never import torch; the
first call that needs it does (:func:`torch_module`), and raises
``ImportError`` with the install hint when torch is missing.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import numpy as np

__all__ = ["host_dtype", "is_tensor", "numpy_to_torch_dtype", "torch_module"]


@functools.cache
def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - exercised only without torch
        raise ImportError("streamrt.torch needs PyTorch: pip install 'streamrt[torch]' (or a torch build for your GPU)") from exc
    return torch


def torch_module() -> Any:
    """The ``torch`` module; ``ImportError`` with the install hint when it is not installed."""
    return _import_torch()


def is_tensor(obj: Any) -> bool:
    """``True`` if ``obj`` is a torch tensor. Never imports torch: without it loaded, nothing is a tensor."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


@functools.cache
def _dtype_table() -> dict[Any, tuple[np.dtype, bool]]:
    torch = torch_module()
    table: dict[Any, tuple[np.dtype, bool]] = {
        torch.float64: (np.dtype(np.float64), False),
        torch.float32: (np.dtype(np.float32), False),
        torch.float16: (np.dtype(np.float16), False),
        torch.bfloat16: (np.dtype(np.uint16), True),  # widened to float32 on the host (exact)
        torch.int64: (np.dtype(np.int64), False),
        torch.int32: (np.dtype(np.int32), False),
        torch.int16: (np.dtype(np.int16), False),
        torch.int8: (np.dtype(np.int8), False),
        torch.uint8: (np.dtype(np.uint8), False),
        torch.bool: (np.dtype(np.bool_), False),
        torch.complex64: (np.dtype(np.complex64), False),
        torch.complex128: (np.dtype(np.complex128), False),
    }
    for name, np_type in (("uint16", np.uint16), ("uint32", np.uint32), ("uint64", np.uint64)):
        dt = getattr(torch, name, None)
        if dt is not None:
            table[dt] = (np.dtype(np_type), False)
    return table


def host_dtype(dtype: Any) -> tuple[np.dtype, bool]:
    """``(numpy dtype of the bytes, widen_bf16)`` for a torch dtype.

    ``bfloat16`` has no numpy dtype: its bytes are read as ``uint16`` and
    widened to ``float32`` on the host, which is exact. Raises ``TypeError``
    for dtypes without a numpy counterpart (float8 variants, quantized types).
    """
    try:
        return _dtype_table()[dtype]
    except KeyError:
        raise TypeError(f"torch dtype {dtype} has no numpy counterpart; convert the tensor first (tensor.float())") from None


def numpy_to_torch_dtype(dtype: np.dtype) -> Any:
    """The torch dtype of a numpy dtype (``TypeError`` when torch has none)."""
    torch = torch_module()
    try:
        return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    except TypeError:
        raise TypeError(f"numpy dtype {dtype} has no torch counterpart") from None
