"""One runtime per device in one process: shared backends, devices carried by streams, events and buffers."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from support.transfer import download, upload

import streamrt as srt
from streamrt._backends._shared import shared_backend_users
from streamrt._backends.sim import SimProfile


def test_runtimes_of_one_simulated_machine_share_one_backend(machine) -> None:
    rts = machine(3)
    backend = rts[0].backend
    assert all(rt.backend is backend for rt in rts)
    assert [rt.device for rt in rts] == [0, 1, 2]
    assert backend.device_count() == 3
    assert shared_backend_users(backend) == 3


def test_the_shared_backend_closes_with_its_last_runtime() -> None:
    rt0 = srt.open_runtime("sim", device=0, devices=2)
    rt1 = srt.open_runtime("sim", device=1, devices=2)
    backend = rt0.backend
    rt0.close()
    assert not backend.closed  # rt1 still uses it
    s1 = rt1.create_stream()
    d1 = rt1.device_allocator.allocate(64, stream=s1)
    s1.memset(d1, 3)
    assert (download(rt1, s1, d1) == 3).all()
    rt1.close()
    assert backend.closed
    assert shared_backend_users(backend) == 0
    with srt.open_runtime("sim", device=0, devices=2) as again:
        assert again.backend is not backend  # a fresh machine once the last runtime closed


def test_a_one_device_simulator_stays_private_to_its_runtime() -> None:
    with srt.open_runtime("sim") as a, srt.open_runtime("sim") as b:
        assert a.backend is not b.backend
        assert shared_backend_users(a.backend) == 0


def test_different_machines_are_different_backends() -> None:
    with (
        srt.open_runtime("sim", device=0, devices=2) as two,
        srt.open_runtime("sim", device=0, devices=3) as three,
        srt.open_runtime("sim", device=0, devices=2, profile=SimProfile(peer_bandwidth_gbps=100.0)) as slow,
        srt.open_runtime("sim", device=1, devices=2, profile=SimProfile()) as two_again,
    ):
        assert two.backend is not three.backend
        assert two.backend is not slow.backend
        assert two_again.backend is two.backend  # the default profile, spelled out


def test_a_missing_device_releases_the_shared_backend() -> None:
    with pytest.raises(ValueError, match="device 2 does not exist"):
        srt.open_runtime("sim", device=2, devices=2)
    with srt.open_runtime("sim", device=1, devices=2) as rt:
        assert shared_backend_users(rt.backend) == 1


def test_streams_events_and_buffers_carry_their_device(pair) -> None:
    for rt in pair:
        s = rt.create_stream()
        ev = s.record()
        d = rt.device_allocator.allocate(256, stream=s)
        h = rt.host_allocator.allocate(256)
        assert s.device == ev.device == d.device == h.device == rt.device
        assert d.view(128, 64).device == rt.device
        assert f"device={rt.device}" in repr(s) and f"device={rt.device}" in repr(ev)
        s.synchronize()


def test_each_runtime_allocates_on_its_own_device_whatever_the_thread_made_current(pair) -> None:
    """Opening runtime 1 made device 1 current on this thread; runtime 0 still allocates on device 0."""
    rt0, _ = pair
    backend = rt0.backend
    total = backend.profile.total_memory
    s0 = rt0.create_stream()
    d0 = rt0.device_allocator.allocate(1 << 20, stream=s0)
    backend.set_device(0)
    used0 = total - backend.mem_get_info()[0]
    backend.set_device(1)
    used1 = total - backend.mem_get_info()[0]
    assert used0 >= 1 << 20 and used1 < 1 << 20
    s0.memset(d0, 9)  # legal: the buffer is device 0's, like the stream
    assert (download(rt0, s0, d0) == 9).all()


def test_events_streams_and_completions_are_made_on_the_runtime_device(pair) -> None:
    """The simulator refuses an event recorded on another device's stream, as CUDA does: every event the
    runtime makes (its own, the completion engine's) must come from the runtime's device."""
    rt0, rt1 = pair
    s0 = rt0.create_stream()
    rt1.create_stream()  # device 1 is now current on this thread
    ev = rt0.create_event(timing=True)
    s0.record(ev)
    s0.wait_idle().wait(5)
    assert s0.launch_host_func(lambda: 41 + 1).result(5) == 42
    ev.synchronize()


def test_work_of_many_threads_on_many_devices(machine) -> None:
    rts = machine(4)
    errors: list[BaseException] = []
    results: dict[int, bool] = {}

    def work(rt: srt.Runtime) -> None:
        try:
            s = rt.create_stream()
            data = np.full(4096, rt.device + 1, np.uint8)
            d = upload(rt, s, data)
            for _ in range(20):
                s.memset(d, rt.device + 1)
            results[rt.device] = bool((download(rt, s, d) == rt.device + 1).all())
            d.release()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(rt,)) for rt in rts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert results == {0: True, 1: True, 2: True, 3: True}


def test_closing_one_runtime_leaves_the_others_work_running(pair) -> None:
    rt0, rt1 = pair
    s1 = rt1.create_stream()
    d1 = rt1.device_allocator.allocate(1 << 16, stream=s1)
    s1.memset(d1, 0x5A)
    rt0.close()
    assert (download(rt1, s1, d1) == 0x5A).all()
