"""The raw allocator and kernel launches act on their runtime's device, whatever device the calling
thread made current, and add no device switch on a backend with one device.

The simulator binds an event to the device current at its creation and refuses to record it on a
stream of another device, as CUDA and HIP do; :func:`device_1_is_current` uses that to tell which
device a thread has current.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from support.transfer import download

import streamrt as srt
from streamrt._allocator import RawAllocator
from streamrt._kernel import checksum_words, fill_words

N = 1024  # words of the kernel tests' buffers
MiB = 1 << 20


@pytest.fixture(autouse=True)
def _kernel_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled kernels go to a temporary directory, never to ~/.cache."""
    monkeypatch.setenv("STREAMRT_KERNEL_CACHE", str(tmp_path_factory.mktemp("kernel-cache")))


@pytest.fixture
def raw_pair(machine: Callable[..., list[srt.Runtime]]) -> list[srt.Runtime]:
    """Runtimes on devices 0 and 1 of a two-device simulator, with raw (non-caching) allocators."""
    return machine(2, device_allocator="raw", host_allocator="raw")


@pytest.fixture
def one_device_raw() -> Iterator[srt.Runtime]:
    with srt.open_runtime("sim", device_allocator="raw", host_allocator="raw") as rt:
        yield rt


def device_1_is_current(backend: Any, s1: srt.Stream) -> bool:
    """Whether device 1 is current on the calling thread: an event made now records on ``s1`` (device 1)."""
    ev = backend.event_create(timing=False, blocking_sync=True)
    try:
        backend.event_record(ev, s1.handle)
    except srt.StreamRTError:
        return False
    finally:
        backend.event_destroy(ev)
    return True


def wait_for_frees(allocator: Any, frees: int, rt: srt.Runtime) -> None:
    """Wait until ``allocator`` has freed ``frees`` blocks (frees go lane -> releaser thread)."""
    deadline = time.monotonic() + 10
    while allocator.statistics().frees < frees:
        assert time.monotonic() < deadline, f"{allocator!r} freed {allocator.statistics().frees} of {frees} blocks"
        time.sleep(0.001)
    rt.releaser.drain()


def device_bytes_used(backend: Any, device: int) -> int:
    backend.set_device(device)
    free, total = backend.mem_get_info()
    return int(total - free)


class EnsureCounter:
    """Records the backend's ``ensure_device`` calls made on the given threads (by ident) while
    installed on the backend object. The completion engine's own threads (lanes, watchdog) make
    their device current once when they start; those calls are not counted."""

    def __init__(self, backend: Any, monkeypatch: pytest.MonkeyPatch, *threads: int | None) -> None:
        self.calls: list[int] = []
        watched = {threading.get_ident(), *threads}
        real = backend.ensure_device

        def counting(device: int) -> None:
            if threading.get_ident() in watched:
                self.calls.append(device)
            real(device)

        monkeypatch.setattr(backend, "ensure_device", counting)


# -- 1. the raw allocator ------------------------------------------------------------------------


def test_raw_device_memory_is_obtained_on_the_runtime_device_while_another_device_is_current(raw_pair) -> None:
    rt0, rt1 = raw_pair
    backend = rt1.backend
    assert isinstance(rt1.device_allocator, RawAllocator) and isinstance(rt1.host_allocator, RawAllocator)
    s1 = rt1.create_stream()
    before = (device_bytes_used(backend, 0), device_bytes_used(backend, 1))
    backend.set_device(0)  # e.g. a thread that last worked with runtime 0
    d1 = rt1.device_allocator.allocate(4 * MiB, stream=s1)
    h1 = rt1.host_allocator.allocate(4096)
    after = (device_bytes_used(backend, 0), device_bytes_used(backend, 1))
    assert after[0] == before[0], "runtime 1's raw allocator took device 0 memory"
    assert after[1] - before[1] >= 4 * MiB
    assert d1.device == h1.device == 1
    s1.memset(d1, 0x3C)
    assert (download(rt1, s1, d1)[: 1 << 16] == 0x3C).all()
    d1.release()
    h1.release()
    wait_for_frees(rt1.device_allocator, 1, rt1)
    wait_for_frees(rt1.host_allocator, 1, rt1)
    assert device_bytes_used(backend, 1) == before[1], "the free did not return runtime 1's device memory"
    assert rt0.device_allocator.statistics().allocations == 0


def test_raw_frees_run_with_the_runtime_device_current_on_the_releaser_thread(raw_pair) -> None:
    """Whatever device the releaser thread last had current, a free of runtime 1's memory makes device 1
    current there first (what HIP and CUDA free relative to)."""
    _rt0, rt1 = raw_pair
    backend = rt1.backend
    s1 = rt1.create_stream()
    d1 = rt1.device_allocator.allocate(MiB, stream=s1)
    s1.memset(d1, 1)
    s1.synchronize()
    rt1.releaser.submit(backend.set_device, 0)  # the releaser thread now has device 0 current
    seen: list[bool] = []
    rt1.releaser.submit(lambda: seen.append(device_1_is_current(backend, s1)))
    rt1.releaser.drain()
    assert seen == [False]  # the probe tells the two devices apart
    d1.release()  # the free is queued on the releaser thread once s1 has passed the release
    wait_for_frees(rt1.device_allocator, 1, rt1)
    rt1.releaser.submit(lambda: seen.append(device_1_is_current(backend, s1)))
    rt1.releaser.drain()
    assert seen == [False, True]


def test_a_one_device_raw_allocator_never_switches_devices(one_device_raw, monkeypatch) -> None:
    rt = one_device_raw
    s = rt.create_stream()
    counter = EnsureCounter(rt.backend, monkeypatch, rt.releaser.thread_ident)  # this thread and the frees' thread
    for kind_allocator in (rt.device_allocator, rt.host_allocator):
        buf = kind_allocator.allocate(4096, stream=s)
        buf.release()
        wait_for_frees(kind_allocator, 1, rt)
    assert counter.calls == []


# -- 3. kernel launches --------------------------------------------------------------------------


def test_a_kernel_launch_makes_the_stream_device_current_and_runs_on_it(pair) -> None:
    rt0, rt1 = pair
    backend = rt1.backend
    s1 = rt1.create_stream()
    out = rt1.device_allocator.allocate(4 * N, stream=s1)
    fill = rt1.kernels.get("fill_u32")
    s1.synchronize()
    backend.set_device(0)  # the launching thread last worked on device 0
    assert not device_1_is_current(backend, s1)
    start = max((r.seq for r in backend.op_log()), default=0)
    s1.launch_kernel(fill, 4, 256, [out, N, 9, 3])
    assert device_1_is_current(backend, s1)
    words = download(rt1, s1, out).view(np.uint32)
    assert np.array_equal(words, fill_words(N, 9, 3))
    kernels = [r for r in backend.op_log() if r.seq > start and r.kind == "kernel"]
    assert [(r.name, r.device, r.stream) for r in kernels] == [("fill_u32", 1, s1.handle)]
    assert rt0.device == 0  # runtime 0 untouched


def test_a_pipeline_kernel_node_on_device_1_runs_there(pair) -> None:
    rt0, rt1 = pair
    backend = rt1.backend
    s1 = rt1.create_stream()
    buf = rt1.device_allocator.allocate(4 * N, stream=s1)
    result = rt1.device_allocator.allocate(8, stream=s1)
    fill, checksum = rt1.kernels.get("fill_u32"), rt1.kernels.get("checksum_u32")
    p = srt.Pipeline("device-1 kernels")
    p.kernel(fill, 4, 256, [buf, N, 5, 1], name="fill")
    p.memset(result, 0, name="zero")
    p.kernel(checksum, 2, 256, [buf, N, result], name="sum")
    s1.synchronize()
    backend.set_device(0)
    start = max((r.seq for r in backend.op_log()), default=0)
    p.launch(s1).result(10)
    got = int(download(rt1, s1, result).view(np.uint64)[0])
    assert got == checksum_words(fill_words(N, 5, 1))
    kernels = [r for r in backend.op_log() if r.seq > start and r.kind == "kernel"]
    assert sorted(r.name for r in kernels) == ["checksum_u32", "fill_u32"]
    assert {r.device for r in kernels} == {1}
    assert rt0.device == 0


def test_kernel_launches_on_one_device_never_switch_devices(one_device_raw, monkeypatch) -> None:
    rt = one_device_raw
    s = rt.create_stream()
    out = rt.device_allocator.allocate(4 * N, stream=s)
    fill = rt.kernels.get("fill_u32")
    p = srt.Pipeline("one device")
    p.kernel(fill, 4, 256, [out, N, 2, 0], name="fill")
    s.synchronize()
    counter = EnsureCounter(rt.backend, monkeypatch)
    s.launch_kernel(fill, 4, 256, [out, N, 1, 0])
    p.launch(s).result(10)
    assert counter.calls == []
    assert (download(rt, s, out).view(np.uint32) == 2).all()


def test_launching_on_two_devices_switches_to_each_stream_device(pair, monkeypatch) -> None:
    rt0, rt1 = pair
    streams = [rt.create_stream() for rt in pair]
    outs = [rt.device_allocator.allocate(4 * N, stream=s) for rt, s in zip(pair, streams)]
    fills = [rt.kernels.get("fill_u32") for rt in pair]
    for s in streams:
        s.synchronize()
    counter = EnsureCounter(rt0.backend, monkeypatch)
    for i in (1, 0, 1):
        streams[i].launch_kernel(fills[i], 4, 256, [outs[i], N, 10 + i, 0])
    assert counter.calls == [1, 0, 1]
    for rt, s, out, i in zip(pair, streams, outs, (0, 1)):
        assert (download(rt, s, out).view(np.uint32) == 10 + i).all()
