"""Size classes bound the waste: held < 1.25x requested from 2 KiB up (so for every request >= 1 MiB)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from allocators import SizeClasses

MiB = 1 << 20


@given(st.integers(min_value=0, max_value=1 << 44))
def test_a_block_fits_its_request_and_is_a_granule_multiple(n: int) -> None:
    sc = SizeClasses()
    block = sc.round(n)
    assert block >= max(n, 1)
    assert block % sc.granule == 0


@given(st.integers(min_value=MiB, max_value=1 << 44))
def test_requests_of_a_mebibyte_and_up_waste_less_than_a_quarter(n: int) -> None:
    assert SizeClasses().round(n) < 1.25 * n


@given(st.integers(min_value=2049, max_value=1 << 30), st.sampled_from([1, 2, 4, 8, 16]))
def test_the_bound_is_one_step_per_doubling(n: int, per_doubling: int) -> None:
    sc = SizeClasses(classes_per_doubling=per_doubling)
    if n > sc.bounded_from:
        assert sc.round(n) < sc.max_waste_ratio * n


@given(st.integers(min_value=0, max_value=1 << 40), st.integers(min_value=0, max_value=1 << 40))
def test_rounding_is_monotonic_and_idempotent(a: int, b: int) -> None:
    sc = SizeClasses()
    lo, hi = min(a, b), max(a, b)
    assert sc.round(lo) <= sc.round(hi)
    assert sc.round(sc.round(a)) == sc.round(a)


def test_not_power_of_two_rounding() -> None:
    """The peers' failure case: a 20.4 GiB request must not pin 32 GiB."""
    request = int(20.4 * (1 << 30))
    block = SizeClasses().round(request)
    assert block == 24 * (1 << 30)  # the 16-32 GiB doubling has 4 GiB steps: 20, 24, 28, 32 GiB
    assert SizeClasses().round(MiB) == MiB
    assert SizeClasses().round(MiB + 1) == MiB + MiB // 4


def test_small_requests_share_512_byte_steps() -> None:
    sc = SizeClasses()
    assert [sc.round(n) for n in (0, 1, 512, 513, 1024, 1500, 2048, 2049)] == [512, 512, 512, 1024, 1024, 1536, 2048, 2560]
    assert sc.classes(4096) == [512, 1024, 1536, 2048, 2560, 3072, 3584, 4096]


@pytest.mark.parametrize("bad", [0, 3, -4, 1.0, True])
def test_parameters_must_be_powers_of_two(bad: object) -> None:
    with pytest.raises(ValueError, match="power of two"):
        SizeClasses(granule=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="power of two"):
        SizeClasses(classes_per_doubling=bad)  # type: ignore[arg-type]
