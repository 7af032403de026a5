"""The host pack in C: a native host function that runs on the driver's thread, without the GIL.

``_pack_c.c`` computes the bytes of :func:`~.reference.reference_metadata` (CK's
metadata image) and the result record of :func:`~.reference.reference_result` from two
int32 seqstart arrays in host memory, by CK's own one-pass loop in 64 bits. As a
pipeline's host node it is a *native* node: the driver's callback thread runs it
directly, so a prepare costs the stream one host function instead of the two of a
Python node (post, then wait for a runtime worker), takes no GIL, and lowers no switch
interval while in flight (docs/pipelines.md, "Native pack").

* :func:`native_pack_available` / :func:`native_pack_unavailable_reason`: the C
  module is optional (built by ``pip install`` where a C compiler exists).
* :class:`NativePack`: the function and its argument block for fixed seqstart,
  metadata and result addresses; a :class:`~.pipeline.WorkspacePrepare` with
  ``pack="native"`` builds one over its pinned staging.
* :func:`pack_metadata_native`: the same pack called from Python, on numpy arrays.

Errors. A native function cannot raise: seqlens that do not fit the params make it
write the idle image and ``status != 0`` in the result record, as the device kernel
does; read it with :meth:`~.result.PrepareResult.from_record`.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from .layout import WorkspaceParams
from .reference import as_seqstart
from .result import RESULT_BYTES

try:
    from . import _pack_c
except ImportError as exc:  # built without a C compiler
    _pack_c = None  # type: ignore[assignment]
    _IMPORT_ERROR: str | None = f"streamrt.recipes.fmha_bwd._pack_c was not built ({exc})"
else:
    _IMPORT_ERROR = None

__all__ = ["NativePack", "native_pack_available", "native_pack_unavailable_reason", "pack_metadata_native"]

#: The C function's type: ``void pack(void* args)``.
PACK_FUNCTION_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_ARGS_FIELDS = 14  # must equal the C module's ARGS_FIELDS (checked on first use)


def native_pack_unavailable_reason() -> str | None:
    """Why the C pack cannot be used here (``None`` when it can)."""
    if _IMPORT_ERROR is None and _pack_c.ARGS_FIELDS != _ARGS_FIELDS:
        return f"_pack_c takes {_pack_c.ARGS_FIELDS} argument fields, native.py writes {_ARGS_FIELDS}: rebuild streamrt"
    return _IMPORT_ERROR


def native_pack_available() -> bool:
    """True when the C pack was built (``pip install`` with a C compiler) and matches this module."""
    return native_pack_unavailable_reason() is None


@functools.cache
def _function() -> Any:
    reason = native_pack_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"the native FMHA pack is not available: {reason}")
    return PACK_FUNCTION_TYPE(_pack_c.PACK_ADDRESS)


class NativePack:
    """The native pack bound to fixed addresses: ``function(args)`` fills ``out_address`` (and ``result_address``).

    Args:
        params: the workspace parameters.
        seqstart_q_address, seqstart_k_address: host addresses of ``batch + 1`` int32 each.
        out_address: host address of ``params.metadata_region_bytes`` writable bytes, 16-byte aligned.
        result_address: host address of a 16-byte result record, 8-byte aligned (0: none).

    The caller keeps the host regions alive while the function may run (a pipeline's host
    node keeps :attr:`function` and :attr:`args` alive for its runs and graphs).
    :attr:`function` is a ctypes ``CFUNCTYPE(None, c_void_p)`` that a pipeline's ``host``
    node runs natively; :meth:`__call__` runs it on this thread (the GIL released). Raises
    ``RuntimeError`` when the C module is not available, ``ValueError`` for a null or
    misaligned address.
    """

    __slots__ = ("args", "function", "params")

    def __init__(
        self, params: WorkspaceParams, seqstart_q_address: int, seqstart_k_address: int, out_address: int, result_address: int = 0
    ) -> None:
        if not isinstance(params, WorkspaceParams):
            raise TypeError(f"params must be WorkspaceParams, not {type(params).__name__}")
        for what, address, align in (
            ("seqstart_q", seqstart_q_address, 4),
            ("seqstart_k", seqstart_k_address, 4),
            ("out", out_address, 16),
            ("result", result_address, 8),
        ):
            if isinstance(address, bool) or not isinstance(address, int) or address < 0 or (address == 0 and what != "result"):
                raise ValueError(f"{what}_address must be a non-null address, got {address!r}")
            if address % align:
                raise ValueError(f"{what}_address must be {align}-byte aligned, got {address:#x}")
        self.function = _function()
        self.params = params
        p = params
        self.args = (ctypes.c_int64 * _ARGS_FIELDS)(
            p.batch,
            p.nhead,
            p.hdim_q,
            p.kM0,
            p.kN0,
            p.num_cus,
            int(p.deterministic),
            p.max_seqlen_q,
            p.max_seqlen_k,
            p.total_q_padded,
            seqstart_q_address,
            seqstart_k_address,
            out_address,
            result_address,
        )

    def __call__(self) -> None:
        """Run the pack on this thread (a ctypes call: the GIL is released while it runs)."""
        self.function(ctypes.addressof(self.args))


def pack_metadata_native(
    params: WorkspaceParams, seqstart_q: Any, seqstart_k: Any, out: np.ndarray | None = None, *, result: np.ndarray | None = None
) -> np.ndarray:
    """:func:`~.reference.pack_metadata` computed by the C pack; returns ``out`` (new if ``None``).

    Same arguments, result and errors as :func:`~.reference.pack_metadata` (``ValueError``
    for a wrong shape, ``out`` or ``result``; invalid seqlens write the idle image and
    report ``status``). ``out`` must be 16-byte aligned. Raises ``RuntimeError`` when the
    C module is not available.
    """
    q = np.ascontiguousarray(as_seqstart(seqstart_q, params.batch, "seqstart_q"), dtype=np.int32)
    k = np.ascontiguousarray(as_seqstart(seqstart_k, params.batch, "seqstart_k"), dtype=np.int32)
    region = params.metadata_region_bytes
    if out is None:
        out = np.empty(region, dtype=np.uint8)
    elif not (isinstance(out, np.ndarray) and out.dtype == np.uint8 and out.ndim == 1 and out.size == region):
        raise ValueError(f"metadata output must be a 1-D uint8 array of {region} bytes")
    elif not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("metadata output must be a contiguous, writable array")
    if result is not None and not (isinstance(result, np.ndarray) and result.dtype == np.uint8 and result.size >= RESULT_BYTES):
        raise ValueError(f"result must be a uint8 array of at least {RESULT_BYTES} bytes")
    record = np.zeros(RESULT_BYTES // 8, np.uint64).view(np.uint8)  # 8-byte aligned
    NativePack(params, q.ctypes.data, k.ctypes.data, out.ctypes.data, record.ctypes.data)()
    if result is not None:
        result[:RESULT_BYTES] = record
    return out
