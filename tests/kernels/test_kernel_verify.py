"""The fill, checksum and sleep kernels: correct on every backend, and their simulator twins compute
what the device computed (on a GPU backend the twin runs on host copies of the same inputs)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import run_twin
from support.transfer import download, upload

import streamrt as srt
from streamrt._kernel import checksum_words, fill_words


@pytest.mark.parametrize("count", [1, 255, 256, 1000, 70_001])
def test_fill_writes_the_pattern_and_checksum_matches_numpy(rt: srt.Runtime, count: int) -> None:
    s = rt.create_stream()
    buf = rt.device_allocator.allocate(4 * (count + 3), stream=s)
    s.memset(buf, 0xEE)
    result = rt.device_allocator.allocate(8, stream=s)
    rt.kernels.fill_u32(s, buf, 0xFFFFFFF0, 0x10001, count=count)
    rt.kernels.checksum_u32(s, buf, result, count=count)
    words = download(rt, s, buf, np.uint32)
    expected = fill_words(count, 0xFFFFFFF0, 0x10001)
    assert np.array_equal(words[:count], expected)
    assert (words[count:] == 0xEEEEEEEE).all()  # nothing past count
    assert int(download(rt, s, result, np.uint64)[0]) == checksum_words(expected)


def test_checksum_changes_when_two_words_swap(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    data = (np.arange(4096, dtype=np.uint64) * 2654435761 % 2**32).astype(np.uint32)
    swapped = data.copy()
    swapped[[10, 3000]] = swapped[[3000, 10]]
    sums = []
    for arr in (data, swapped):
        buf = upload(rt, s, arr.astype(np.uint32))
        res = rt.device_allocator.allocate(8, stream=s)
        rt.kernels.checksum_u32(s, buf, res)
        sums.append(int(download(rt, s, res, np.uint64)[0]))
    assert sums[0] == checksum_words(data) and sums[0] != sums[1]


def test_the_fill_and_checksum_twins_agree_with_the_device(rt: srt.Runtime) -> None:
    count = 5000
    s = rt.create_stream()
    dev = rt.device_allocator.allocate(4 * count, stream=s)
    res = rt.device_allocator.allocate(8, stream=s)
    s.launch_kernel(rt.kernels.get("fill_u32"), 20, 256, [dev, count, 123, 77])
    s.memset(res, 0)
    s.launch_kernel(rt.kernels.get("checksum_u32"), 7, 96, [dev, count, res])
    on_device = download(rt, s, dev, np.uint32)
    device_sum = download(rt, s, res, np.uint64)

    host = np.zeros(count, np.uint32)
    run_twin("fill_u32", (20, 1, 1), (256, 1, 1), [host], [host.ctypes.data, count, 123, 77])
    assert np.array_equal(host, on_device)
    host_sum = np.zeros(1, np.uint64)
    run_twin("checksum_u32", (7, 1, 1), (96, 1, 1), [host, host_sum], [host.ctypes.data, count, host_sum.ctypes.data])
    assert host_sum[0] == device_sum[0]


@pytest.mark.parametrize("microseconds", [50.0, 2000.0])
def test_the_sleep_kernel_runs_at_least_the_requested_time(rt: srt.Runtime, microseconds: float) -> None:
    s = rt.create_stream()
    out = rt.host_allocator.allocate(16)
    t0, t1 = rt.create_event(timing=True), rt.create_event(timing=True)
    rt.kernels.spin_sleep(s, 1.0)  # warm-up (module load, first launch)
    s.record(t0)
    rt.kernels.spin_sleep(s, microseconds, out=out)
    s.record(t1)
    s.synchronize()
    spun_us, rate = out.numpy(np.float64)
    elapsed_us = t0.elapsed_ms(t1) * 1000
    assert spun_us >= microseconds * 0.999
    assert elapsed_us >= microseconds * 0.95  # event timing: a loose lower bound only
    assert rate > 0
    host = np.zeros(2, np.float64)
    run_twin("spin_sleep", (1, 1, 1), (1, 1, 1), [host], [host.ctypes.data, microseconds, 0.0])
    assert host[0] == pytest.approx(spun_us, abs=2.0)  # the device overshoots by at most a timer tick or two


def test_the_sleep_kernel_refuses_bad_durations_and_shapes(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    k = rt.kernels.get("spin_sleep")
    for us in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="microseconds"):
            s.launch_kernel(k, 1, 1, [None, us, 0.0])
    with pytest.raises(ValueError, match="one thread"):
        s.launch_kernel(k, 2, 1, [None, 1.0, 0.0])
    with pytest.raises(ValueError, match="out has 8 bytes"):
        s.launch_kernel(k, 1, 1, [rt.host_allocator.allocate(8), 1.0, 0.0])
