"""The process-wide switch-interval guard used while Python host calls are in flight."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from streamrt._switch_interval import SwitchIntervalGuard


@pytest.fixture
def restore_interval() -> Iterator[float]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        yield 0.005
    finally:
        sys.setswitchinterval(before)


def test_lowers_while_held_and_restores_after(restore_interval: float) -> None:
    g = SwitchIntervalGuard()
    g.acquire(5e-5)
    assert sys.getswitchinterval() == pytest.approx(5e-5)
    assert g.is_lowered
    g.release()
    assert sys.getswitchinterval() == pytest.approx(restore_interval)
    assert not g.is_lowered


def test_nested_holders_restore_only_at_the_last_release(restore_interval: float) -> None:
    g = SwitchIntervalGuard()
    g.acquire(1e-4)
    g.acquire(5e-5)  # the lowest asked-for value applies
    assert sys.getswitchinterval() == pytest.approx(5e-5)
    g.release()
    assert sys.getswitchinterval() == pytest.approx(5e-5)
    g.release()
    assert sys.getswitchinterval() == pytest.approx(restore_interval)


def test_never_raises_an_interval_already_lower(restore_interval: float) -> None:
    sys.setswitchinterval(1e-5)
    g = SwitchIntervalGuard()
    g.acquire(5e-5)
    assert sys.getswitchinterval() == pytest.approx(1e-5)
    assert not g.is_lowered
    g.release()
    assert sys.getswitchinterval() == pytest.approx(1e-5)


def test_a_value_set_by_the_user_meanwhile_is_kept(restore_interval: float) -> None:
    g = SwitchIntervalGuard()
    g.acquire(5e-5)
    sys.setswitchinterval(0.002)  # the user changes it while lowered
    g.release()
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_extra_release_is_harmless(restore_interval: float) -> None:
    g = SwitchIntervalGuard()
    g.release()
    assert sys.getswitchinterval() == pytest.approx(restore_interval)
