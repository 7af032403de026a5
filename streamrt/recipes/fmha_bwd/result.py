"""The prepare's result: validation status and CK's 32-bit hazards, out of band (never in the workspace).

Every pack (the numpy oracle, the numpy and C host packs, the device kernel)
writes one 16-byte *result record* beside the metadata it packs, in memory of
its own (a slot of the pinned staging, or a small device buffer)::

    offset  type  field
    0       u32   status             0 = ok; else a bit set of STATUS_*
    4       u32   ck_hazards         0, or a bit set of CK_* (below)
    8       i64   dq_acc_used_bytes  the device part of the workspace CK's PrepareWorkspace reports

:class:`PrepareResult` is its decoded form.

Validation (``STATUS_*``) is streamrt's: Composable Kernel checks none of it.
When ``status != 0`` the metadata written is the *idle image* (every CU sees
the "no work" sentinel, see :mod:`.layout`), ``dq_acc_used_bytes`` is 0 and
``ck_hazards`` is 0.

Hazards (``CK_*``) say where CK's own code, which computes the work split in
``index_t`` (int32), would go wrong on this valid input: a value that leaves
int32 (``CK_INT32_OVERFLOW``; e.g. once the total weight
``sum_b nhead * nc_b * sq_w_b`` reaches 2**31, as 128 sequences of 8k x 8k at
32 heads do) or a division by ``target_w = 0`` (``CK_DIVIDE_BY_ZERO``: every
``seqlen_k`` is 0 but ``seqstart_k[0] != 0``, so CK misses its short-circuit).
streamrt computes such cases exactly, in 64 bits; the flag says CK's kernels
could not use them (the int32 fields of the image then hold the low 32 bits of
the exact positions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "CK_DIVIDE_BY_ZERO",
    "CK_INT32_OVERFLOW",
    "RESULT_BYTES",
    "RESULT_DTYPE",
    "STATUS_NEGATIVE_LENGTH",
    "STATUS_NEGATIVE_SEQSTART",
    "STATUS_OK",
    "STATUS_SEQLEN_K_EXCEEDED",
    "STATUS_SEQLEN_Q_EXCEEDED",
    "STATUS_TOTAL_Q_EXCEEDED",
    "PrepareResult",
    "WorkspaceInputError",
    "status_message",
]

STATUS_OK = 0
STATUS_NEGATIVE_LENGTH = 1  #: a seqstart array decreases somewhere (a negative sequence length)
STATUS_TOTAL_Q_EXCEEDED = 2  #: seqstart_q[batch] > total_q_padded
STATUS_SEQLEN_K_EXCEEDED = 4  #: some seqlen_k > max_seqlen_k
STATUS_SEQLEN_Q_EXCEEDED = 8  #: some seqlen_q > max_seqlen_q
STATUS_NEGATIVE_SEQSTART = 16  #: seqstart_q[0] or seqstart_k[0] is negative

CK_INT32_OVERFLOW = 1  #: CK's int32 (index_t) arithmetic would overflow on this input
CK_DIVIDE_BY_ZERO = 2  #: CK would divide by target_w = 0 (every seqlen_k is 0, seqstart_k[0] != 0)

RESULT_DTYPE = np.dtype([("status", "<u4"), ("ck_hazards", "<u4"), ("dq_acc_used_bytes", "<i8")])
RESULT_BYTES = RESULT_DTYPE.itemsize
assert RESULT_BYTES == 16

_STATUS_TEXT = {
    STATUS_NEGATIVE_LENGTH: "a seqstart array decreases (negative sequence length)",
    STATUS_TOTAL_Q_EXCEEDED: "seqstart_q[batch] exceeds total_q_padded",
    STATUS_SEQLEN_K_EXCEEDED: "a key sequence is longer than max_seqlen_k",
    STATUS_SEQLEN_Q_EXCEEDED: "a query sequence is longer than max_seqlen_q",
    STATUS_NEGATIVE_SEQSTART: "seqstart_q[0] or seqstart_k[0] is negative",
}


def status_message(status: int) -> str:
    """A human-readable description of a ``status`` bit set."""
    if status == STATUS_OK:
        return "ok"
    parts = [text for bit, text in _STATUS_TEXT.items() if status & bit]
    unknown = status & ~sum(_STATUS_TEXT)
    if unknown:
        parts.append(f"unknown status bits 0x{unknown:x}")
    return "; ".join(parts)


class WorkspaceInputError(ValueError):
    """The seqstart arrays do not fit the :class:`~.layout.WorkspaceParams` the workspace was sized for.

    Attributes:
        status: the ``status`` bit set (``STATUS_*``).
    """

    def __init__(self, status: int) -> None:
        self.status = int(status)
        super().__init__(f"invalid FMHA backward workspace input (status 0x{self.status:x}): {status_message(self.status)}")


@dataclass(frozen=True)
class PrepareResult:
    """What one prepare reports beside the workspace. Frozen. See the module docstring.

    Attributes:
        status: ``STATUS_*`` bits (0: the input fits the params).
        ck_hazards: ``CK_*`` bits (0: CK's int32 code computes this workspace as streamrt does).
        dq_acc_used_bytes: deterministic mode: ``4 * offsets[batch]``, the prefix the prezero
            zeroes; otherwise ``4 * nhead * seqstart_q[batch] * hdim_q`` (CK's absolute
            indexing). 0 for invalid input.
    """

    status: int
    ck_hazards: int
    dq_acc_used_bytes: int

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    @property
    def ck_int32_overflow(self) -> bool:
        """CK's int32 arithmetic would overflow on this input (streamrt computed it in 64 bits)."""
        return bool(self.ck_hazards & CK_INT32_OVERFLOW)

    @property
    def ck_divide_by_zero(self) -> bool:
        """CK would divide by zero on this input (streamrt short-circuits it)."""
        return bool(self.ck_hazards & CK_DIVIDE_BY_ZERO)

    def raise_for_status(self) -> None:
        """Raise :class:`WorkspaceInputError` when ``status`` is not 0."""
        if self.status != STATUS_OK:
            raise WorkspaceInputError(self.status)

    @classmethod
    def from_record(cls, data: Any) -> PrepareResult:
        """Decode a result record (16 bytes: bytes, a uint8 array or a host Buffer)."""
        if hasattr(data, "numpy") and hasattr(data, "kind"):  # a host streamrt Buffer
            data = data.numpy(np.uint8)
        raw = np.frombuffer(bytes(data), np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8).ravel()
        if raw.size < RESULT_BYTES:
            raise ValueError(f"a result record is {RESULT_BYTES} bytes, got {raw.size}")
        rec = raw[:RESULT_BYTES].view(RESULT_DTYPE)[0]
        return cls(int(rec["status"]), int(rec["ck_hazards"]), int(rec["dq_acc_used_bytes"]))

    def write_record(self, out: np.ndarray) -> None:
        """Store this result into ``out`` (a writable uint8 array of at least 16 bytes)."""
        out[:RESULT_BYTES].view(RESULT_DTYPE)[0] = (self.status, self.ck_hazards, self.dq_acc_used_bytes)
