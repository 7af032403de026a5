"""Size classes: how a request is rounded to the size of the block that serves it.

Peers round up to a power of two (up to 2x waste: a 20.4 GiB request pinning
32 GiB). Here every doubling ``(2^k, 2^(k+1)]`` is cut into
``classes_per_doubling`` equal steps, so a request is rounded up by less than
one step, ``2^k / classes_per_doubling``. With the default 4 classes per
doubling the block held is below ``1.25x`` the bytes requested for every
request above ``granule * classes_per_doubling`` bytes (2 KiB by default), and in
particular for every request of 1 MiB and up. Requests are never rounded to
less than ``granule`` (512 B): small requests share 512-byte steps.

Blocks are not split or merged: a block of one class only ever serves
requests of that class, which keeps the bound exact and the hot path a dict
lookup.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SizeClasses"]


@dataclass(frozen=True)
class SizeClasses:
    """The rounding rule of a caching allocator. Frozen; cheap to share.

    Attributes:
        granule: the smallest block and the finest step, in bytes (a power of two).
        classes_per_doubling: steps per doubling of the size (a power of two);
            the worst-case held/requested ratio is ``1 + 1/classes_per_doubling``
            (exclusive) for requests above ``granule * classes_per_doubling``.
    """

    granule: int = 512
    classes_per_doubling: int = 4

    def __post_init__(self) -> None:
        for name in ("granule", "classes_per_doubling"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 1, got {value!r}")

    @property
    def max_waste_ratio(self) -> float:
        """Upper bound (exclusive) of block size / requested size above :attr:`bounded_from`."""
        return 1.0 + 1.0 / self.classes_per_doubling

    @property
    def bounded_from(self) -> int:
        """Requests larger than this many bytes obey :attr:`max_waste_ratio`."""
        return self.granule * self.classes_per_doubling

    def round(self, nbytes: int) -> int:
        """The block size that serves a request of ``nbytes`` (>= 0) bytes."""
        granule = self.granule
        if nbytes <= granule:
            return granule
        # nbytes in (2^(k-1), 2^k] where k = bit_length(nbytes - 1).
        half = 1 << ((nbytes - 1).bit_length() - 1)
        step = half // self.classes_per_doubling
        if step < granule:
            step = granule
        return -(-nbytes // step) * step

    def classes(self, up_to: int) -> list[int]:
        """Every block size up to ``up_to`` bytes, ascending (for docs and tests)."""
        out: list[int] = []
        size = self.round(0)
        while size <= up_to:
            out.append(size)
            size = self.round(size + 1)
        return out
