"""Group-mode (varlen) FMHA backward workspace prepare, the seed workload, byte for byte Composable Kernel's.

The workspace is the one CK's ``FmhaBwdWorkspaceManager`` lays out (ROCm/rocm-libraries at
commit ``40bda5c94c135c56b58540d7c30bd90bec53b848``); docs/pipelines.md has its byte map.

* :mod:`.layout` — :class:`WorkspaceParams`, :func:`workspace_size`, the byte map and
  :func:`parse_metadata`.
* :mod:`.result` — :class:`PrepareResult`: the validation status and CK's int32 hazards,
  reported out of band (never in the workspace).
* :mod:`.reference` — the numpy oracle transcribed from CK (:func:`reference_metadata`,
  :func:`reference_result`) and the fast host pack :func:`pack_metadata` (byte-identical).
* :mod:`.native` — the same host pack in C, run as a native host function
  (:func:`pack_metadata_native`, :class:`NativePack`; optional, built by ``pip install``).
* :mod:`.pipeline` — the prepare as a streamrt pipeline (:class:`WorkspacePrepare`,
  :func:`prepare_workspace`; strategies ``"stream"``, ``"fork"``, ``"graph"``, ``"fork_graph"``; packs
  ``"python"`` and ``"native"``) and the old synchronous baseline (``"sync"``,
  :func:`prepare_workspace_sync`).
* :mod:`.device` — the device-side prepare (strategies ``"device"``, ``"device_graph"``):
  :class:`DevicePrepare`, the kernels ``kernels/fmha_bwd_prepare.hip`` and
  ``kernels/fmha_bwd_prezero.hip``, whose specs and simulator twins this package registers
  (:mod:`._kernels`) when it is imported.
"""

from __future__ import annotations

from . import _kernels  # noqa: F401 - registers the recipe's kernel specs and simulator twins
from .device import DEVICE_STRATEGIES, DevicePrepare, prepare_workspace_device
from .layout import (
    BATCH_STATE_DTYPE,
    CU_STATE_DTYPE,
    MetadataLayout,
    WorkspaceMetadata,
    WorkspaceParams,
    cu_state_slots,
    parse_metadata,
    workspace_size,
)
from .native import NativePack, native_pack_available, pack_metadata_native
from .pipeline import (
    PACKS,
    STRATEGIES,
    WorkspacePrepare,
    prepare_workspace,
    prepare_workspace_sync,
)
from .reference import pack_metadata, reference_metadata, reference_result
from .result import (
    CK_DIVIDE_BY_ZERO,
    CK_INT32_OVERFLOW,
    STATUS_NEGATIVE_LENGTH,
    STATUS_NEGATIVE_SEQSTART,
    STATUS_OK,
    STATUS_SEQLEN_K_EXCEEDED,
    STATUS_SEQLEN_Q_EXCEEDED,
    STATUS_TOTAL_Q_EXCEEDED,
    PrepareResult,
    WorkspaceInputError,
)

__all__ = [
    "BATCH_STATE_DTYPE",
    "CK_DIVIDE_BY_ZERO",
    "CK_INT32_OVERFLOW",
    "CU_STATE_DTYPE",
    "DEVICE_STRATEGIES",
    "DevicePrepare",
    "MetadataLayout",
    "NativePack",
    "PACKS",
    "PrepareResult",
    "STATUS_NEGATIVE_LENGTH",
    "STATUS_NEGATIVE_SEQSTART",
    "STATUS_OK",
    "STATUS_SEQLEN_K_EXCEEDED",
    "STATUS_SEQLEN_Q_EXCEEDED",
    "STATUS_TOTAL_Q_EXCEEDED",
    "STRATEGIES",
    "WorkspaceInputError",
    "WorkspaceMetadata",
    "WorkspaceParams",
    "WorkspacePrepare",
    "cu_state_slots",
    "native_pack_available",
    "pack_metadata",
    "pack_metadata_native",
    "parse_metadata",
    "prepare_workspace",
    "prepare_workspace_device",
    "prepare_workspace_sync",
    "reference_metadata",
    "reference_result",
    "workspace_size",
]
