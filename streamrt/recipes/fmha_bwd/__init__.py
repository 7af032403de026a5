"""Group-mode (varlen) FMHA backward workspace prepare (DESIGN §8), the seed workload.

* :mod:`.layout` — :class:`WorkspaceParams`, :func:`workspace_size` and the
  documented metadata byte layout (the contract a device kernel must match).
* :mod:`.reference` — the numpy oracle :func:`reference_metadata` and the fast
  host pack :func:`pack_metadata` (byte-identical).
* :mod:`.native` — the same host pack in C, run as a native host function
  (:func:`pack_metadata_native`, :class:`NativePack`; optional, built by ``pip install``).
* :mod:`.pipeline` — the prepare as a streamrt pipeline (:class:`WorkspacePrepare`,
  :func:`prepare_workspace`; strategies ``"stream"``, ``"fork"``, ``"graph"``; packs
  ``"python"`` and ``"native"``) and the old synchronous baseline (``"sync"``,
  :func:`prepare_workspace_sync`).
* :mod:`.device` — the device-side prepare (strategies ``"device"``, ``"device_graph"``):
  :class:`DevicePrepare`, one kernel launch of ``kernels/fmha_bwd_prepare.hip``.
"""

from __future__ import annotations

from .device import DEVICE_STRATEGIES, DevicePrepare, prepare_workspace_device
from .layout import (
    METADATA_MAGIC,
    METADATA_VERSION,
    STATUS_NEGATIVE_LENGTH,
    STATUS_OK,
    STATUS_SEQLEN_K_EXCEEDED,
    STATUS_SEQLEN_Q_EXCEEDED,
    STATUS_TOTAL_Q_EXCEEDED,
    MetadataLayout,
    WorkspaceInputError,
    WorkspaceMetadata,
    WorkspaceParams,
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
from .reference import pack_metadata, reference_metadata

__all__ = [
    "DEVICE_STRATEGIES",
    "DevicePrepare",
    "METADATA_MAGIC",
    "METADATA_VERSION",
    "PACKS",
    "STATUS_NEGATIVE_LENGTH",
    "STATUS_OK",
    "STATUS_SEQLEN_K_EXCEEDED",
    "STATUS_SEQLEN_Q_EXCEEDED",
    "STATUS_TOTAL_Q_EXCEEDED",
    "STRATEGIES",
    "MetadataLayout",
    "NativePack",
    "WorkspaceInputError",
    "WorkspaceMetadata",
    "WorkspaceParams",
    "WorkspacePrepare",
    "native_pack_available",
    "pack_metadata",
    "pack_metadata_native",
    "parse_metadata",
    "prepare_workspace",
    "prepare_workspace_device",
    "prepare_workspace_sync",
    "reference_metadata",
    "workspace_size",
]
