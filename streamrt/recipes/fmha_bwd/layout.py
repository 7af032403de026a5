"""The group-mode FMHA backward workspace as Composable Kernel lays it out: parameters, sizes, the byte map.

Upstream: ROCm/rocm-libraries at commit ``40bda5c94c135c56b58540d7c30bd90bec53b848``,
``projects/composablekernel/include/ck_tile/ops/fmha/kernel/fmha_bwd_kernel.hpp``
(``FmhaBwdWorkspaceManager`` for ``kIsGroupMode``, the workspace-bearing pipelines).
The workspace is one device allocation::

    [ metadata region: CK's host size, a multiple of 4096 | dq_acc region: CK's device upper bound (fp32) ]

Both sizes depend only on :class:`WorkspaceParams`, never on ``seqstart``: that is
what lets the prepare run stream-asynchronously. ``workspace_size(params)`` is
``GetWorkspaceHostSize(batch) + GetWorkspaceDeviceSizeUpperBound(...)``.

Metadata region, deterministic mode (offsets from the start of the workspace; every
array starts 16-byte aligned; integers little-endian; no header, no status)::

    offset                   type                 field
    0                        i32[batch]           nsplits             dq_acc splits of each batch
    A = align16(4 batch)     i64[batch + 1]       offsets             fp32 element offset of each batch's
                                                                      dq_acc; offsets[batch] = the total
    C = A + align16(8 (batch + 1))
                             32 B x num_cus       cu_state            FmhaBwdGroupPersistentCuState, in
                                                                      CK's XCD output order (below)
    S = C + 32 num_cus       16 B x batch         batch_state         FmhaBwdBatchState
    S + 16 batch             ...                  zero up to region_bytes = align4096(S + 16 batch)

    cu_state (32 bytes):    i32 w_lo, w_hi, ibatch, isplit, head_start, c_start; 8 bytes zero
    batch_state (16 bytes): i32 sq_w, nc, nsplits; 4 bytes zero   (CK names sq_w "sq")

Non-deterministic mode: ``nsplits[0] = 1`` (bytes 0-3) and zeros up to 4096.

``cu_state[slot]`` holds logical CU ``CuStateOutputToLogical(slot)``: CK's
persistent kernel reads ``cu_state_ptr + blockIdx.x`` and the hardware deals
``blockIdx.x`` round-robin over ``NUM_XCDS = 8`` XCDs, so each XCD's slots hold a
contiguous range of logical CUs (:func:`cu_state_slots`). CK leaves the padding
bytes and the tail of the region unwritten; streamrt writes zeros there, so the
image is one exact byte string. What the fields mean is in :mod:`.reference`.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "BATCH_STATE_DTYPE",
    "CU_STATE_DTYPE",
    "DQ_ACC_ELEMENT_BYTES",
    "LAYOUTS",
    "METADATA_ALIGN",
    "NUM_XCDS",
    "MetadataLayout",
    "WorkspaceMetadata",
    "WorkspaceParams",
    "cu_state_slots",
    "parse_metadata",
    "workspace_size",
    "write_metadata",
]

LAYOUTS = ("ck",)
ARRAY_ALIGN = 16  # FmhaBwdWorkspaceManager::ALIGNMENT
METADATA_ALIGN = 4096  # GetWorkspaceHostSize pads to a page, so dq_acc starts page aligned
DQ_ACC_ELEMENT_BYTES = 4  # fp32 accumulators (AccDataType)
NUM_XCDS = 8  # FmhaBwdWorkspaceManager::NUM_XCDS

CU_STATE_DTYPE = np.dtype(
    [
        ("w_lo", "<i4"),
        ("w_hi", "<i4"),
        ("ibatch", "<i4"),
        ("isplit", "<i4"),
        ("head_start", "<i4"),
        ("c_start", "<i4"),
        ("pad", "<i4", (2,)),
    ]
)
BATCH_STATE_DTYPE = np.dtype([("sq_w", "<i4"), ("nc", "<i4"), ("nsplits", "<i4"), ("pad", "<i4")])
assert CU_STATE_DTYPE.itemsize == 32 and BATCH_STATE_DTYPE.itemsize == 16

_INT32_MAX = 2**31 - 1


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def cu_state_slots(num_cus: int) -> np.ndarray:
    """``slots[c]``: the cu_state slot of logical CU ``c`` (CK's ``CuStateLogicalToOutput``), int64[num_cus].

    With ``per = ceil(num_cus / 8)`` and ``tall = num_cus % 8`` (8 when that is 0), XCD ``x``
    holds ``per`` logical CUs for ``x < tall`` and ``per - 1`` after, in order; logical CU
    ``c``, the ``i``-th of XCD ``x``, goes to slot ``8 i + x``.
    """
    c = np.arange(num_cus, dtype=np.int64)
    per = -(-num_cus // NUM_XCDS)
    tall = num_cus % NUM_XCDS or NUM_XCDS
    span = tall * per
    short = max(per - 1, 1)
    xcd = np.where(c < span, c // per, tall + (c - span) // short)
    local = np.where(c < span, c % per, (c - span) % short)
    return local * NUM_XCDS + xcd


@dataclass(frozen=True)
class MetadataLayout:
    """Byte offsets and element counts of the metadata arrays, derived from the parameters only."""

    nsplits_offset: int
    nsplits_count: int
    offsets_offset: int
    offsets_count: int
    cu_state_offset: int
    cu_state_count: int
    batch_state_offset: int
    batch_state_count: int
    metadata_bytes: int  # end of the last array
    region_bytes: int  # metadata_bytes rounded up to 4096: CK's host size

    @property
    def total_offset(self) -> int:
        """Byte offset of ``offsets[batch]``, the used dq_acc element count the prezero reads
        (deterministic mode; CK's ``MakeDqAccPrezeroKargs``)."""
        return self.offsets_offset + 8 * (self.offsets_count - 1)


@dataclass(frozen=True)
class WorkspaceParams:
    """Everything the workspace size and metadata depend on besides ``seqstart``. Frozen.

    Attributes:
        batch: number of sequences (``seqstart_q``/``seqstart_k`` have ``batch + 1`` entries).
        nhead: query heads (``nhead_q``).
        hdim_q: query head dimension.
        kM0: query tile rows of the backward kernel (``sq_w`` rounds up to it).
        kN0: key tile rows (``nc_b = ceil(sk_b / kN0)`` key chunks per sequence).
        num_cus: CUs the persistent deterministic kernel runs on (CK's ``get_num_cus()``).
        deterministic: the persistent deterministic kernel (split dq accumulation, no atomics
            across splits) rather than atomic accumulation.
        max_seqlen_q: longest query sequence allowed (streamrt's check; CK does not use it here).
        max_seqlen_k: longest key sequence allowed: bounds the splits.
        total_q_padded: CK's ``total_seqlen_q_padded``, in group mode ``seqstart_q[batch]``:
            a bound on it.
        layout: ``"ck"``, the only layout: CK's byte map at the commit the module docstring names.

    Raises ``TypeError``/``ValueError`` on construction for non-int or out-of-range values.
    Every value is an ``index_t`` (int32) in CK, so at most ``2**31 - 1``.
    """

    batch: int
    nhead: int
    hdim_q: int
    kM0: int
    kN0: int
    num_cus: int
    deterministic: bool
    max_seqlen_q: int
    max_seqlen_k: int
    total_q_padded: int
    layout: str = "ck"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "layout":
                if value not in LAYOUTS:
                    raise ValueError(f"layout must be 'ck' (Composable Kernel's workspace), got {value!r}")
                continue
            if f.name == "deterministic":
                if not isinstance(value, (bool, np.bool_)):
                    raise TypeError(f"deterministic must be a bool, not {type(value).__name__}")
                object.__setattr__(self, f.name, bool(value))
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"{f.name} must be an int, not {type(value).__name__}")
            value = int(value)
            object.__setattr__(self, f.name, value)
            minimum = 0 if f.name in ("max_seqlen_q", "max_seqlen_k", "total_q_padded") else 1
            if not minimum <= value <= _INT32_MAX:
                raise ValueError(f"{f.name} must be in [{minimum}, 2**31 - 1], got {value}")
        if self.batch > 1 << 24:
            raise ValueError(f"batch must be at most 2**24, got {self.batch}")
        if self.num_cus > 1 << 20:
            raise ValueError(f"num_cus must be at most 2**20, got {self.num_cus}")
        if self.workspace_bytes >= 1 << 62:  # every pack computes offsets and sizes in int64
            raise ValueError(f"a workspace of {self.workspace_bytes} bytes (2**62 or more) is beyond the packs")
        # Every weight of the split is at most this (valid input): keeps the packs' 64-bit sums exact.
        if self.deterministic and self.nhead * self.nsplits_bound * (self.total_q_padded + self.batch * self.kM0) >= 1 << 62:
            raise ValueError("nhead * ceil(max_seqlen_k / kN0) * (total_q_padded + batch * kM0) must be below 2**62")

    # -- sizes (no seqstart needed) ------------------------------------------------------
    @property
    def nsplits_bound(self) -> int:
        """CK's ``nsplits_factor``: ``ceil(max_seqlen_k / kN0)`` if deterministic, else 1."""
        return -(-self.max_seqlen_k // self.kN0) if self.deterministic else 1

    @functools.cached_property
    def metadata_layout(self) -> MetadataLayout:
        """The byte map of the metadata region (see the module docstring)."""
        b, n = self.batch, self.num_cus
        if not self.deterministic:  # nsplits[1] only
            return MetadataLayout(0, 1, ARRAY_ALIGN, 0, ARRAY_ALIGN, 0, ARRAY_ALIGN, 0, ARRAY_ALIGN, METADATA_ALIGN)
        offsets_offset = _align(4 * b, ARRAY_ALIGN)
        cu_state_offset = offsets_offset + _align(8 * (b + 1), ARRAY_ALIGN)
        batch_state_offset = cu_state_offset + CU_STATE_DTYPE.itemsize * n
        end = batch_state_offset + BATCH_STATE_DTYPE.itemsize * b
        return MetadataLayout(0, b, offsets_offset, b + 1, cu_state_offset, n, batch_state_offset, b, end, _align(end, METADATA_ALIGN))

    @functools.cached_property
    def cu_slots(self) -> np.ndarray:
        """:func:`cu_state_slots` of ``num_cus`` (read-only)."""
        slots = cu_state_slots(self.num_cus)
        slots.flags.writeable = False
        return slots

    @property
    def metadata_region_bytes(self) -> int:
        """CK's ``GetWorkspaceHostSize(batch)``: the metadata region, a multiple of 4096."""
        return self.metadata_layout.region_bytes

    @property
    def dq_acc_bound_bytes(self) -> int:
        """CK's ``GetWorkspaceDeviceSizeUpperBound``: ``4 * nhead * nsplits_bound * total_q_padded * hdim_q``."""
        return DQ_ACC_ELEMENT_BYTES * self.nhead * self.nsplits_bound * self.total_q_padded * self.hdim_q

    @property
    def workspace_bytes(self) -> int:
        """Total workspace bytes: CK's ``fmha_bwd_launcher::workspace_size``."""
        return self.metadata_region_bytes + self.dq_acc_bound_bytes

    @property
    def ck_int32_overflow(self) -> bool:
        """CK's size bound itself overflows int32: ``max_seqlen_k + kN0 > 2**31 - 1`` in deterministic mode."""
        return self.deterministic and self.max_seqlen_k + self.kN0 > _INT32_MAX


def workspace_size(params: WorkspaceParams) -> int:
    """Bytes of the workspace for ``params``, computed without reading seqstart."""
    if not isinstance(params, WorkspaceParams):
        raise TypeError(f"workspace_size takes WorkspaceParams, not {type(params).__name__}")
    return params.workspace_bytes


# -- the image ----------------------------------------------------------------------------------------


def _low32(values: Any) -> np.ndarray:
    """int64 values as the uint32 of their low 32 bits (what an int32 field stores)."""
    return np.asarray(values, dtype=np.int64) & 0xFFFFFFFF


def write_metadata(
    out: np.ndarray, params: WorkspaceParams, *, nsplits: Any, offsets: Any, cu_state: Any, batch_state: Any
) -> None:
    """Serialize the metadata arrays into ``out`` (a writable uint8 array of ``metadata_region_bytes``).

    Writes every byte: the arrays and zeros elsewhere. ``nsplits`` (``[batch]``, or ``[1]``
    when not deterministic), ``offsets`` (``[batch + 1]``), ``cu_state`` (``[num_cus, 6]``, in
    *slot* order) and ``batch_state`` (``[batch, 3]``) are int64 values; the int32 fields keep
    their low 32 bits. Deterministic arrays are ignored when not deterministic.
    """
    lay = params.metadata_layout
    if out.dtype != np.uint8 or out.ndim != 1 or out.size != lay.region_bytes:
        raise ValueError(f"metadata output must be a 1-D uint8 array of {lay.region_bytes} bytes")
    out[:] = 0
    out[: 4 * lay.nsplits_count].view("<u4")[:] = _low32(nsplits)
    if not params.deterministic:
        return
    out[lay.offsets_offset : lay.offsets_offset + 8 * lay.offsets_count].view("<i8")[:] = offsets
    cu = out[lay.cu_state_offset : lay.batch_state_offset].view("<u4").reshape(lay.cu_state_count, 8)
    cu[:, :6] = _low32(cu_state)
    bs = out[lay.batch_state_offset : lay.metadata_bytes].view("<u4").reshape(lay.batch_state_count, 4)
    bs[:, :3] = _low32(batch_state)


@dataclass(frozen=True, eq=False)
class WorkspaceMetadata:
    """A decoded metadata region (copies of its arrays). See the module docstring for the fields.

    Attributes:
        params: the parameters it was decoded with.
        nsplits: int32 ``[batch]`` (``[1]`` when not deterministic).
        offsets: int64 ``[batch + 1]`` (empty when not deterministic).
        cu_state: ``CU_STATE_DTYPE`` ``[num_cus]`` in slot order (empty when not deterministic).
        batch_state: ``BATCH_STATE_DTYPE`` ``[batch]`` (empty when not deterministic).
    """

    params: WorkspaceParams
    nsplits: np.ndarray
    offsets: np.ndarray
    cu_state: np.ndarray
    batch_state: np.ndarray

    @property
    def cu_state_logical(self) -> np.ndarray:
        """``cu_state`` in logical CU order (CU ``c``'s record at index ``c``)."""
        return self.cu_state[self.params.cu_slots] if self.params.deterministic else self.cu_state

    @property
    def dq_acc_used_bytes(self) -> int | None:
        """``4 * offsets[batch]`` in deterministic mode; ``None`` otherwise (CK's image does not hold it)."""
        return DQ_ACC_ELEMENT_BYTES * int(self.offsets[-1]) if self.params.deterministic else None

    @property
    def dq_acc_zero_bytes(self) -> int:
        """What CK zeroes before the backward kernel: the used prefix (``DqAccPrezeroKernel``) in
        deterministic mode, the whole dq_acc bound (the launcher's memset) otherwise."""
        used = self.dq_acc_used_bytes
        return self.params.dq_acc_bound_bytes if used is None else used


def parse_metadata(params: WorkspaceParams, data: Any) -> WorkspaceMetadata:
    """Decode the metadata region of a workspace prepared for ``params``.

    ``data``: bytes, a uint8 numpy array or a host :class:`~streamrt.Buffer`, at least the
    layout's ``metadata_bytes`` long (the padding after it is not read). CK's image has no
    header, so the parameters say where each array is. Raises ``ValueError`` when too short.
    """
    if not isinstance(params, WorkspaceParams):
        raise TypeError(f"parse_metadata takes WorkspaceParams first, not {type(params).__name__}")
    if hasattr(data, "numpy") and hasattr(data, "kind"):  # a host streamrt Buffer
        data = data.numpy(np.uint8)
    raw = np.frombuffer(bytes(data), dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8).ravel()
    lay = params.metadata_layout
    if raw.size < lay.metadata_bytes:
        raise ValueError(f"a metadata region for these params is at least {lay.metadata_bytes} bytes, got {raw.size}")

    def arr(offset: int, dtype: Any, count: int) -> np.ndarray:
        dt = np.dtype(dtype)
        return raw[offset : offset + dt.itemsize * count].view(dt).copy()

    return WorkspaceMetadata(
        params=params,
        nsplits=arr(lay.nsplits_offset, "<i4", lay.nsplits_count),
        offsets=arr(lay.offsets_offset, "<i8", lay.offsets_count),
        cu_state=arr(lay.cu_state_offset, CU_STATE_DTYPE, lay.cu_state_count),
        batch_state=arr(lay.batch_state_offset, BATCH_STATE_DTYPE, lay.batch_state_count),
    )
