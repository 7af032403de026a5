"""Workspace layout of the group-mode FMHA backward prepare: parameters, sizes and the metadata bytes.

The workspace is one device allocation::

    [ metadata region (metadata block, zero padded to a multiple of 4096 bytes) | dq_acc region (fp32) ]

Its size depends only on :class:`WorkspaceParams`, never on ``seqstart``: that
is what lets the prepare run stream-asynchronously (DESIGN §8). The dq_acc
region is the upper bound ``4 * nhead * nsplits_bound * total_q_padded * hdim_q``
bytes with ``nsplits_bound = ceil(max_seqlen_k / kN0)`` in deterministic mode
and ``1`` otherwise; the metadata says how much of it is used.

Metadata block (version 1). All integers little-endian; every array starts on
an 8-byte boundary; byte offsets are from the start of the block (= the start
of the workspace). The host pack, the numpy reference and the device kernel
write these exact bytes, padding included (zeros up to ``region_bytes``)::

    offset size type    field
    0      4    u32     magic                 0x4D574246 (the ASCII bytes "FBWM")
    4      4    u32     version               1
    8      4    u32     header_bytes          128
    12     4    u32     status                0 = ok; else a bit set of STATUS_* (below)
    16     4    i32     batch
    20     4    i32     nhead
    24     4    i32     hdim_q
    28     4    i32     kM0
    32     4    i32     kN0
    36     4    i32     num_workers           num_cus in deterministic mode, 0 otherwise
    40     4    i32     deterministic         0 or 1
    44     4    i32     nsplits_max           max over b of nsplits[b]
    48     8    i64     dq_acc_used_bytes     4 * offsets[batch]: the prefix of dq_acc to zero
    56     8    i64     dq_acc_offset_bytes   byte offset of dq_acc in the workspace (= region_bytes)
    64     8    i64     dq_acc_bound_bytes    size of the dq_acc region (the upper bound)
    72     8    i64     total_units           deterministic: number of (batch, head, key-block) units
    80     8    i64     total_weight          deterministic: sum of unit weights
    88     8    i64     unit_quota            deterministic: ceil(total_weight / num_workers)
    96     4    u32     offsets_offset        -> i64 offsets[batch + 1]
    100    4    u32     nsplits_offset        -> i32 nsplits[batch]
    104    4    u32     worker_start_offset   -> i32 worker_start[num_workers][4]
    108    4    u32     worker_units_offset   -> i32 worker_units[num_workers]
    112    4    u32     metadata_bytes        end of the last array, rounded up to 8
    116    4    u32     region_bytes          metadata_bytes rounded up to 4096
    120    8    u32[2]  reserved              0
    128    ...          the arrays, in the order above:
                        offsets_offset      = 128
                        nsplits_offset      = 128 + 8 * (batch + 1)
                        worker_start_offset = align8(nsplits_offset + 4 * batch)
                        worker_units_offset = worker_start_offset + 16 * num_workers
                        metadata_bytes      = align8(worker_units_offset + 4 * num_workers)

Field meanings (the algorithm is in :mod:`.reference`): ``nsplits[b]`` is the
number of partial dq accumulators of batch ``b``; ``offsets`` are the prefix
sums of ``nhead * nsplits[b] * sq_b * hdim_q`` (fp32 elements, ``offsets[0] = 0``);
batch ``b``'s dq_acc is laid out ``[nhead][nsplits[b]][sq_b][hdim_q]`` at element
``offsets[b]``. ``worker_start[i] = (batch, split, head, key_block)`` of worker
``i``'s first unit and ``worker_units[i]`` its unit count; an idle worker has
``(-1, -1, -1, -1)`` and 0 units.

When ``status != 0`` the input was invalid: the header is written with its
static fields, ``dq_acc_used_bytes``, the totals, ``nsplits_max`` and every
``offsets``/``nsplits`` entry are 0, and every worker is idle, so a kernel that
trusts the block touches nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "DQ_ACC_ELEMENT_BYTES",
    "HEADER_BYTES",
    "HEADER_DTYPE",
    "IDLE",
    "METADATA_ALIGN",
    "METADATA_MAGIC",
    "METADATA_VERSION",
    "STATUS_NEGATIVE_LENGTH",
    "STATUS_OK",
    "STATUS_SEQLEN_K_EXCEEDED",
    "STATUS_SEQLEN_Q_EXCEEDED",
    "STATUS_TOTAL_Q_EXCEEDED",
    "MetadataLayout",
    "WorkspaceInputError",
    "WorkspaceMetadata",
    "WorkspaceParams",
    "parse_metadata",
    "status_message",
    "workspace_size",
    "write_metadata",
]

METADATA_MAGIC = 0x4D574246  # b"FBWM" read as a little-endian u32
METADATA_VERSION = 1
HEADER_BYTES = 128
METADATA_ALIGN = 4096
DQ_ACC_ELEMENT_BYTES = 4  # fp32 accumulators
IDLE = -1  # every field of an idle worker's worker_start entry

STATUS_OK = 0
STATUS_NEGATIVE_LENGTH = 1  #: a seqstart array decreases somewhere (a negative sequence length)
STATUS_TOTAL_Q_EXCEEDED = 2  #: seqstart_q[batch] - seqstart_q[0] > total_q_padded
STATUS_SEQLEN_K_EXCEEDED = 4  #: some seqlen_k > max_seqlen_k
STATUS_SEQLEN_Q_EXCEEDED = 8  #: some seqlen_q > max_seqlen_q

_STATUS_TEXT = {
    STATUS_NEGATIVE_LENGTH: "a seqstart array decreases (negative sequence length)",
    STATUS_TOTAL_Q_EXCEEDED: "seqstart_q[batch] - seqstart_q[0] exceeds total_q_padded",
    STATUS_SEQLEN_K_EXCEEDED: "a key sequence is longer than max_seqlen_k",
    STATUS_SEQLEN_Q_EXCEEDED: "a query sequence is longer than max_seqlen_q",
}

HEADER_DTYPE = np.dtype(
    [
        ("magic", "<u4"),
        ("version", "<u4"),
        ("header_bytes", "<u4"),
        ("status", "<u4"),
        ("batch", "<i4"),
        ("nhead", "<i4"),
        ("hdim_q", "<i4"),
        ("kM0", "<i4"),
        ("kN0", "<i4"),
        ("num_workers", "<i4"),
        ("deterministic", "<i4"),
        ("nsplits_max", "<i4"),
        ("dq_acc_used_bytes", "<i8"),
        ("dq_acc_offset_bytes", "<i8"),
        ("dq_acc_bound_bytes", "<i8"),
        ("total_units", "<i8"),
        ("total_weight", "<i8"),
        ("unit_quota", "<i8"),
        ("offsets_offset", "<u4"),
        ("nsplits_offset", "<u4"),
        ("worker_start_offset", "<u4"),
        ("worker_units_offset", "<u4"),
        ("metadata_bytes", "<u4"),
        ("region_bytes", "<u4"),
        ("reserved", "<u4", (2,)),
    ]
)
assert HEADER_DTYPE.itemsize == HEADER_BYTES

_INT32_MAX = 2**31 - 1


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def status_message(status: int) -> str:
    """A human-readable description of a metadata ``status`` bit set."""
    if status == STATUS_OK:
        return "ok"
    parts = [text for bit, text in _STATUS_TEXT.items() if status & bit]
    unknown = status & ~sum(_STATUS_TEXT)
    if unknown:
        parts.append(f"unknown status bits 0x{unknown:x}")
    return "; ".join(parts)


class WorkspaceInputError(ValueError):
    """The seqstart arrays do not fit the :class:`WorkspaceParams` the workspace was sized for.

    Attributes:
        status: the metadata ``status`` bit set (``STATUS_*``).
    """

    def __init__(self, status: int) -> None:
        self.status = int(status)
        super().__init__(f"invalid FMHA backward workspace input (status 0x{self.status:x}): {status_message(self.status)}")


@dataclass(frozen=True)
class MetadataLayout:
    """Byte offsets of the metadata arrays, derived from the parameters only."""

    batch: int
    num_workers: int
    offsets_offset: int
    nsplits_offset: int
    worker_start_offset: int
    worker_units_offset: int
    metadata_bytes: int
    region_bytes: int


@dataclass(frozen=True)
class WorkspaceParams:
    """Everything the workspace size and metadata depend on besides ``seqstart``. Frozen.

    Attributes:
        batch: number of sequences (``seqstart_q``/``seqstart_k`` have ``batch + 1`` entries).
        nhead: query heads.
        hdim_q: query head dimension.
        kM0: query tile rows of the backward kernel (weights are rounded up to it).
        kN0: key tile rows (``nc_b = ceil(sk_b / kN0)`` key blocks per sequence).
        num_cus: workers the deterministic split deals units to (CUs / SMs).
        deterministic: split dq accumulation across workers without atomics.
        max_seqlen_q: longest query sequence allowed.
        max_seqlen_k: longest key sequence allowed (bounds the number of splits).
        total_q_padded: bound on ``seqstart_q[batch] - seqstart_q[0]``, the physical
            (padded) query rows that dq_acc is indexed with.

    Raises ``TypeError``/``ValueError`` on construction for non-int or out-of-range values.
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

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
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
        # Work units (batch, head, key-block) are counted in int32 by the metadata.
        if self.nhead * self.batch * self.nsplits_bound > _INT32_MAX:
            raise ValueError("nhead * batch * ceil(max_seqlen_k / kN0) exceeds 2**31 - 1 work units")

    # -- sizes (no seqstart needed) ------------------------------------------------------
    @property
    def nsplits_bound(self) -> int:
        """Upper bound of ``nsplits[b]``: ``ceil(max_seqlen_k / kN0)`` if deterministic, else 1."""
        return -(-self.max_seqlen_k // self.kN0) if self.deterministic else 1

    @property
    def num_workers(self) -> int:
        """Workers recorded in the metadata: ``num_cus`` if deterministic, else 0."""
        return self.num_cus if self.deterministic else 0

    @functools.cached_property
    def layout(self) -> MetadataLayout:
        """The byte layout of the metadata block (see the module docstring)."""
        nw = self.num_workers
        offsets_offset = HEADER_BYTES
        nsplits_offset = offsets_offset + 8 * (self.batch + 1)
        worker_start_offset = _align(nsplits_offset + 4 * self.batch, 8)
        worker_units_offset = worker_start_offset + 16 * nw
        metadata_bytes = _align(worker_units_offset + 4 * nw, 8)
        return MetadataLayout(
            batch=self.batch,
            num_workers=nw,
            offsets_offset=offsets_offset,
            nsplits_offset=nsplits_offset,
            worker_start_offset=worker_start_offset,
            worker_units_offset=worker_units_offset,
            metadata_bytes=metadata_bytes,
            region_bytes=_align(metadata_bytes, METADATA_ALIGN),
        )

    @property
    def metadata_region_bytes(self) -> int:
        """Bytes of the metadata region: the metadata block padded to a multiple of 4096."""
        return self.layout.region_bytes

    @property
    def dq_acc_bound_bytes(self) -> int:
        """``4 * nhead * nsplits_bound * total_q_padded * hdim_q``: the dq_acc region's size."""
        return DQ_ACC_ELEMENT_BYTES * self.nhead * self.nsplits_bound * self.total_q_padded * self.hdim_q

    @property
    def workspace_bytes(self) -> int:
        """Total workspace bytes: metadata region + dq_acc region."""
        return self.metadata_region_bytes + self.dq_acc_bound_bytes


def workspace_size(params: WorkspaceParams) -> int:
    """Bytes of the workspace for ``params``, computed without reading seqstart."""
    if not isinstance(params, WorkspaceParams):
        raise TypeError(f"workspace_size takes WorkspaceParams, not {type(params).__name__}")
    return params.workspace_bytes


# -- serialization ----------------------------------------------------------------------------------


def write_metadata(
    out: np.ndarray,
    params: WorkspaceParams,
    *,
    status: int,
    offsets: Any,
    nsplits: Any,
    worker_start: Any,
    worker_units: Any,
    total_units: int,
    total_weight: int,
    unit_quota: int,
) -> None:
    """Serialize a metadata block into ``out`` (a writable uint8 array of ``region_bytes``).

    Writes every byte of ``out``: header, arrays, and zero padding. When
    ``status != 0`` the arrays and totals passed are ignored and the error
    block of the module docstring is written instead.
    """
    lay = params.layout
    if out.dtype != np.uint8 or out.ndim != 1 or out.size != lay.region_bytes:
        raise ValueError(f"metadata output must be a 1-D uint8 array of {lay.region_bytes} bytes")
    nw = lay.num_workers
    out[:] = 0
    if status != STATUS_OK:
        total_units = total_weight = unit_quota = 0
    off = out[lay.offsets_offset : lay.nsplits_offset].view("<i8")
    nsp = out[lay.nsplits_offset : lay.nsplits_offset + 4 * params.batch].view("<i4")
    wst = out[lay.worker_start_offset : lay.worker_units_offset].view("<i4").reshape(nw, 4)
    wun = out[lay.worker_units_offset : lay.worker_units_offset + 4 * nw].view("<i4")
    if status == STATUS_OK:
        off[:] = offsets
        nsp[:] = nsplits
        wst[:] = worker_start
        wun[:] = worker_units
    else:
        wst[:] = IDLE
    # One structured assignment: far cheaper than a field at a time (this runs in every prepare's host pack).
    out[:HEADER_BYTES].view(HEADER_DTYPE)[0] = (
        METADATA_MAGIC,
        METADATA_VERSION,
        HEADER_BYTES,
        status,
        params.batch,
        params.nhead,
        params.hdim_q,
        params.kM0,
        params.kN0,
        nw,
        int(params.deterministic),
        int(nsp.max()) if params.batch else 0,
        DQ_ACC_ELEMENT_BYTES * int(off[-1]),
        lay.region_bytes,
        params.dq_acc_bound_bytes,
        total_units,
        total_weight,
        unit_quota,
        lay.offsets_offset,
        lay.nsplits_offset,
        lay.worker_start_offset,
        lay.worker_units_offset,
        lay.metadata_bytes,
        lay.region_bytes,
        (0, 0),
    )


@dataclass(frozen=True, eq=False)
class WorkspaceMetadata:
    """A decoded metadata block (copies of its arrays). See the module docstring for the fields."""

    status: int
    batch: int
    nhead: int
    hdim_q: int
    kM0: int
    kN0: int
    num_workers: int
    deterministic: bool
    nsplits_max: int
    dq_acc_used_bytes: int
    dq_acc_offset_bytes: int
    dq_acc_bound_bytes: int
    total_units: int
    total_weight: int
    unit_quota: int
    offsets: np.ndarray  # int64[batch + 1]
    nsplits: np.ndarray  # int32[batch]
    worker_start: np.ndarray  # int32[num_workers, 4]
    worker_units: np.ndarray  # int32[num_workers]

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    def raise_for_status(self) -> None:
        """Raise :class:`WorkspaceInputError` when ``status`` is not 0."""
        if self.status != STATUS_OK:
            raise WorkspaceInputError(self.status)


def parse_metadata(data: Any) -> WorkspaceMetadata:
    """Decode a metadata block from bytes, a uint8 numpy array, or a host :class:`~streamrt.Buffer`.

    Raises ``ValueError`` when the magic, version or sizes are wrong.
    """
    if hasattr(data, "numpy") and hasattr(data, "kind"):  # a host streamrt Buffer
        raw = np.array(data.numpy(np.uint8), copy=True)
    else:
        raw = np.frombuffer(bytes(data), dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8).ravel()
    if raw.size < HEADER_BYTES:
        raise ValueError(f"a metadata block is at least {HEADER_BYTES} bytes, got {raw.size}")
    h = raw[:HEADER_BYTES].view(HEADER_DTYPE)[0]
    if int(h["magic"]) != METADATA_MAGIC:
        raise ValueError(f"bad metadata magic 0x{int(h['magic']):08x} (expected 0x{METADATA_MAGIC:08x}, 'FBWM')")
    if int(h["version"]) != METADATA_VERSION or int(h["header_bytes"]) != HEADER_BYTES:
        raise ValueError(f"unsupported metadata version {int(h['version'])} / header size {int(h['header_bytes'])}")
    batch, nw = int(h["batch"]), int(h["num_workers"])
    if raw.size < int(h["metadata_bytes"]):
        raise ValueError(f"metadata block truncated: {raw.size} < {int(h['metadata_bytes'])} bytes")

    def arr(offset_field: str, dtype: str, count: int) -> np.ndarray:
        start = int(h[offset_field])
        return raw[start : start + np.dtype(dtype).itemsize * count].view(dtype).copy()

    return WorkspaceMetadata(
        status=int(h["status"]),
        batch=batch,
        nhead=int(h["nhead"]),
        hdim_q=int(h["hdim_q"]),
        kM0=int(h["kM0"]),
        kN0=int(h["kN0"]),
        num_workers=nw,
        deterministic=bool(h["deterministic"]),
        nsplits_max=int(h["nsplits_max"]),
        dq_acc_used_bytes=int(h["dq_acc_used_bytes"]),
        dq_acc_offset_bytes=int(h["dq_acc_offset_bytes"]),
        dq_acc_bound_bytes=int(h["dq_acc_bound_bytes"]),
        total_units=int(h["total_units"]),
        total_weight=int(h["total_weight"]),
        unit_quota=int(h["unit_quota"]),
        offsets=arr("offsets_offset", "<i8", batch + 1),
        nsplits=arr("nsplits_offset", "<i4", batch),
        worker_start=arr("worker_start_offset", "<i4", 4 * nw).reshape(nw, 4),
        worker_units=arr("worker_units_offset", "<i4", nw),
    )
