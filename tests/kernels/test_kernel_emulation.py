"""The kernel sources themselves, compiled for the host and run with emulated GPU threads and barriers
(tests/kernels/emulation): the C++ of the device prepare writes the oracle's metadata and result bit for bit,
over edge cases, lengths near the 32-bit limits and random seqlens, and touches nothing else; the prezero
zeroes exactly the count it reads, with one to three blocks; fill, checksum and sleep do what their twins do.

This is what checks the kernels' code on machines without a GPU (the simulator runs the numpy twins,
not the C++). Skipped when no C++20 compiler is available."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from kernel_cases import EDGE_CASES, LIMIT_CASES, Case, random_cases
from kernel_helpers import aligned_bytes, emulation_library

from streamrt._kernel import checksum_words, fill_words
from streamrt.recipes.fmha_bwd import PrepareResult, reference_metadata, reference_result
from streamrt.recipes.fmha_bwd._kernels import prepare_scalars

FILL = 0xAB


@pytest.fixture(scope="module")
def emu() -> object:
    lib = emulation_library()
    if isinstance(lib, str):
        pytest.skip(lib)
    return lib


def run_prepare(emu: object, case: Case) -> None:
    params, q, k = case
    ref = reference_metadata(params, q, k)
    region = params.metadata_region_bytes
    tail = 4096  # bytes past the metadata region that must stay untouched (the kernel writes no dq_acc)
    _owner, ws = aligned_bytes(region + tail, FILL)
    record = np.zeros(2, np.uint64)
    qq, kk = np.ascontiguousarray(q, np.int32), np.ascontiguousarray(k, np.int32)
    emu.emu_fmha_bwd_prepare(  # type: ignore[attr-defined]
        1, 256, qq.ctypes.data, kk.ctypes.data, ws.ctypes.data, record.ctypes.data, *prepare_scalars(params)
    )
    meta = ws[:region]
    if not np.array_equal(meta, ref):
        bad = np.flatnonzero(meta != ref)
        raise AssertionError(f"metadata differs at bytes {bad[:16].tolist()} (of {bad.size})")
    assert (ws[region:] == FILL).all()
    assert PrepareResult.from_record(record.view(np.uint8)) == reference_result(params, q, k)


@pytest.mark.parametrize("name", list(EDGE_CASES) + list(LIMIT_CASES))
def test_emulated_prepare_matches_the_oracle_on_edge_cases(emu: object, name: str) -> None:
    run_prepare(emu, {**EDGE_CASES, **LIMIT_CASES}[name])


@settings(max_examples=30, deadline=None)
@given(case=random_cases())
def test_emulated_prepare_matches_the_oracle_on_random_seqlens(emu: object, case: Case) -> None:
    run_prepare(emu, case)


@pytest.mark.parametrize("grid", [1, 2, 3])
@pytest.mark.parametrize("count", [0, 3, 4, 257, 1027, 5000, 9000])
def test_emulated_prezero_zeroes_exactly_the_count_it_reads(emu: object, grid: int, count: int) -> None:
    max_count = 6000
    _owner, ws = aligned_bytes(4096 + 4 * max_count + 64, FILL)
    ws[512:520].view(np.int64)[0] = count
    emu.emu_fmha_bwd_dq_acc_prezero(grid, 256, ws.ctypes.data, 512, 4096, max_count)  # type: ignore[attr-defined]
    zeroed = 4 * min(count, max_count)
    assert (ws[4096 : 4096 + zeroed] == 0).all() and (ws[4096 + zeroed :] == FILL).all()
    assert (ws[:512] == FILL).all() and (ws[520:4096] == FILL).all()


def test_emulated_fill_and_checksum_match_numpy(emu: object) -> None:
    count = 3001
    _o, raw = aligned_bytes(4 * (count + 1), 0xEE)
    words = raw.view(np.uint32)
    emu.emu_fill_u32(3, 128, words.ctypes.data, count, 0xFFFFFFFE, 3)  # type: ignore[attr-defined]
    assert np.array_equal(words[:count], fill_words(count, 0xFFFFFFFE, 3))
    assert words[count] == 0xEEEEEEEE
    result = np.zeros(1, np.uint64)
    emu.emu_checksum_u32(2, 100, words.ctypes.data, count, result.ctypes.data)  # type: ignore[attr-defined]
    assert int(result[0]) == checksum_words(words[:count])


@pytest.mark.parametrize("timer_step_ns", [1, 1000, 1024])
@pytest.mark.parametrize("microseconds", [10.0, 35.0, 500.0])
def test_emulated_sleep_is_never_short_even_with_a_coarse_timer(emu: object, timer_step_ns: int, microseconds: float) -> None:
    """A timer that advances by ~1 µs (as %globaltimer does on some GPUs) must not make a 10 µs sleep
    end early, and the time the kernel reports is no more than it really ran (so it is not short either).
    (No upper bound on the real time: this machine may preempt the thread.)"""
    out = np.zeros(2, np.float64)
    real_ns = emu.emu_spin_sleep(out.ctypes.data, microseconds, 0.0, timer_step_ns, 0, 0)  # type: ignore[attr-defined]
    assert out[1] == 1000.0
    assert out[0] >= microseconds
    assert real_ns >= microseconds * 1000 * 0.999
    assert out[0] <= real_ns / 1000 * 1.01 + 0.2


@pytest.mark.parametrize("stall_at_read", range(1, 40))
def test_emulated_sleep_is_never_short_when_the_thread_is_held_up_between_clock_reads(emu: object, stall_at_read: int) -> None:
    """A 10 us sleep on a 1 us timer, with the thread held up 5 us right after one of its timer
    reads (before the cycle read that goes with it): whichever read it is, the sleep is not short."""
    out = np.zeros(2, np.float64)
    real_ns = emu.emu_spin_sleep(out.ctypes.data, 10.0, 0.0, 1024, stall_at_read, 5000)  # type: ignore[attr-defined]
    assert real_ns >= 10.0 * 1000 * 0.999
    assert out[0] <= real_ns / 1000 * 1.01 + 0.2
