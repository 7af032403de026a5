"""Simulated device and pinned memory: real addresses, classification, accounting, checks."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from _sim_helpers import Gate, view

from streamrt._backends import sim
from streamrt._backends.protocol import MemcpyKind, PointerKind
from streamrt._backends.sim import SimBackend, SimProfile
from streamrt._errors import BackendError, OutOfMemoryError

H2D, D2H, D2D = MemcpyKind.HOST_TO_DEVICE, MemcpyKind.DEVICE_TO_HOST, MemcpyKind.DEVICE_TO_DEVICE


def test_addresses_are_real_and_256_byte_aligned(sb: SimBackend) -> None:
    ptrs = [sb.malloc(n) for n in (1, 255, 4097, 1 << 20)] + [sb.host_malloc(n) for n in (1, 3000)]
    assert len(set(ptrs)) == len(ptrs)
    for p in ptrs:
        assert p % 256 == 0
    d = ptrs[2]
    ctypes.memset(d, 0x5A, 4097)  # the runtime may memmove through device pointers
    assert np.all(view(d, 4097) == 0x5A)


def test_pointer_kind_classifies_any_address_by_interval(sb: SimBackend) -> None:
    d = sb.malloc(1000)
    h = sb.host_malloc(1000)
    d_async = sb.malloc_async(500, 0)
    pageable = np.zeros(16, np.uint8)
    assert sb.pointer_kind(d) is PointerKind.DEVICE
    assert sb.pointer_kind(d + 999) is PointerKind.DEVICE  # interior addresses too
    assert sb.pointer_kind(d_async + 10) is PointerKind.DEVICE
    assert sb.pointer_kind(h) is PointerKind.HOST
    assert sb.pointer_kind(h + 500) is PointerKind.HOST
    assert sb.pointer_kind(pageable.ctypes.data) is PointerKind.PAGEABLE
    assert sb.pointer_kind(0) is PointerKind.PAGEABLE
    assert sb.pointer_kind(12345) is PointerKind.PAGEABLE
    sb.free(d)
    assert sb.pointer_kind(d) is PointerKind.PAGEABLE


def test_zero_byte_allocations_are_null_and_null_frees_are_no_ops(sb: SimBackend) -> None:
    assert sb.malloc(0) == 0
    assert sb.host_malloc(0) == 0
    assert sb.malloc_async(0, 0) == 0
    sb.free(0)
    sb.host_free(0)
    sb.free_async(0, 0)


def test_free_of_unknown_interior_double_or_wrong_kind_pointer_fails(sb: SimBackend) -> None:
    d = sb.malloc(4096)
    h = sb.host_malloc(4096)
    cases = [
        (lambda: sb.free(123456), "not a sim allocation"),
        (lambda: sb.free(d + 256), "not its start"),
        (lambda: sb.free(h), "host_free"),
        (lambda: sb.host_free(d), "free or free_async"),
        (lambda: sb.free_async(h, 0), "host_free"),
    ]
    for call, words in cases:
        with pytest.raises(BackendError, match=words) as exc:
            call()
        assert (exc.value.code, exc.value.name) == (1, "simErrorInvalidValue")
    sb.free(d)
    with pytest.raises(BackendError, match="already freed") as exc:
        sb.free(d)
    assert exc.value.code == 1
    sb.host_free(h)
    with pytest.raises(BackendError, match="already freed"):
        sb.host_free(h)


def test_free_waits_for_pending_work_on_the_device(sb: SimBackend, gate: Gate) -> None:
    import threading

    s = sb.stream_create()
    d = sb.malloc(64)
    h = sb.host_malloc(64)
    gate.block(sb, s)
    sb.memset_async(d, 3, 64, s)
    sb.memcpy_async(h, d, 64, D2H, s)
    threading.Timer(0.05, gate.open).start()
    sb.free(d)  # like cudaFree: returns only once the device is idle
    assert sb.stream_query(s)
    assert np.all(view(h, 64) == 3)


def test_out_of_memory_beyond_the_profile_total() -> None:
    b = sim.create(profile=SimProfile(total_memory=1 << 20))
    try:
        a = b.malloc(600_000)
        assert b.mem_get_info() == ((1 << 20) - 600_064, 1 << 20)  # accounted in 256-byte granules
        with pytest.raises(OutOfMemoryError) as exc:
            b.malloc(600_000)
        err = exc.value
        assert isinstance(err, MemoryError)
        assert (err.requested, err.limit, err.in_use, err.backend, err.code) == (600_000, 1 << 20, 600_064, "sim", 2)
        with pytest.raises(OutOfMemoryError):
            b.malloc_async(600_000, 0)
        b.free(a)
        assert b.mem_get_info() == (1 << 20, 1 << 20)
        b.free(b.malloc(1 << 20))  # all of it fits again
        b.host_free(b.host_malloc(2 << 20))  # pinned memory is not device memory
    finally:
        b.close()


def test_an_allocation_the_host_cannot_map_raises_out_of_memory(sb: SimBackend) -> None:
    with pytest.raises(OutOfMemoryError):
        sb.host_malloc(1 << 62)


def test_malloc_async_and_free_async_are_stream_ordered(sb: SimBackend, gate: Gate) -> None:
    s = sb.stream_create()
    free0, total = sb.mem_get_info()
    gate.block(sb, s)
    d = sb.malloc_async(1 << 20, s)
    h = sb.host_malloc(1 << 20)
    sb.memset_async(d, 7, 1 << 20, s)
    sb.memcpy_async(h, d, 1 << 20, D2H, s)
    sb.free_async(d, s)
    assert sb.mem_get_info()[0] == free0 - (1 << 20)
    # the pointer is invalid for new work at once...
    with pytest.raises(BackendError, match="freed"):
        sb.memset_async(d, 0, 16, s)
    assert sb.pointer_kind(d) is PointerKind.PAGEABLE
    # ...but the bytes return only when the free runs in stream order
    gate.open()
    sb.stream_synchronize(s)
    assert np.all(view(h, 1 << 20) == 7)
    assert sb.mem_get_info() == (free0, total)
    kinds = [r.kind for r in sb.op_log()]
    assert kinds == ["host_func", "malloc_async", "memset", "copy_d2h", "free_async"]


def test_copies_check_sizes_against_known_allocations(sb: SimBackend) -> None:
    s = sb.stream_create()
    d = sb.malloc(100)
    h = sb.host_malloc(100)
    for call in (
        lambda: sb.memcpy_async(d, h, 101, H2D, s),
        lambda: sb.memcpy_async(d + 50, h, 51, H2D, s),
        lambda: sb.memcpy_async(h, d + 1, 100, D2H, s),
        lambda: sb.memset_async(d, 0, 101, s),
        lambda: sb.memset_async(d + 99, 0, 2, s),
    ):
        with pytest.raises(BackendError, match="overrun") as exc:
            call()
        assert exc.value.code == 1
    assert sb.op_log() == [] and sb.stream_query(s)  # nothing was enqueued


def test_bad_arguments_are_invalid_values_and_enqueue_nothing(sb: SimBackend) -> None:
    s = sb.stream_create()
    d = sb.malloc(64)
    h = sb.host_malloc(64)
    pageable = np.zeros(64, np.uint8)
    calls = [
        lambda: sb.memset_async(d, 0, -1, s),
        lambda: sb.memset_async(d, 0, 1.5, s),
        lambda: sb.memset_async(d, 0, True, s),
        lambda: sb.memset_async(d, "x", 4, s),
        lambda: sb.memset_async(0, 0, 4, s),
        lambda: sb.memset_async(pageable.ctypes.data, 0, 4, s),  # memset needs device or pinned memory
        lambda: sb.malloc(-5),
        lambda: sb.malloc("big"),
        lambda: sb.memcpy_async(d, h, 4, 9, s),
        lambda: sb.memcpy_async(d, h, 4, "h2d", s),
        lambda: sb.memcpy_async(d, h, 4, D2H, s),  # direction does not match the pointers
        lambda: sb.memcpy_async(h, d, 4, H2D, s),
        lambda: sb.memcpy_async(d, d, 4, MemcpyKind.HOST_TO_HOST, s),
        lambda: sb.memcpy_async(0, h, 4, H2D, s),
        lambda: sb.launch_host_func(s, 0, 0),
        lambda: sb.launch_host_func(s, -3, 0),
    ]
    for call in calls:
        with pytest.raises(BackendError) as exc:
            call()
        assert exc.value.code == 1, exc.value
    assert sb.op_log() == [] and sb.stream_query(s)


def test_pageable_copies_run_synchronously_with_the_caller(sb: SimBackend, gate: Gate) -> None:
    import threading

    s = sb.stream_create()
    d = sb.malloc(64)
    src = np.full(64, 9, np.uint8)
    dst = np.zeros(64, np.uint8)
    gate.block(sb, s)
    threading.Timer(0.05, gate.open).start()
    sb.memcpy_async(d, src.ctypes.data, 64, H2D, s)  # returns once copied: src may be reused
    assert sb.stream_query(s)
    src[:] = 0
    sb.memcpy_async(dst.ctypes.data, d, 64, D2H, s)
    assert np.all(dst == 9)
    assert [r.kind for r in sb.op_log()][-2:] == ["copy_h2d", "copy_d2h"]
    # and the host clock moved to the copy's completion
    assert sb.host_now_us() >= sb.op_log()[-1].end_us


def test_zero_byte_copies_and_memsets_enqueue_nothing(sb: SimBackend) -> None:
    s = sb.stream_create()
    sb.memset_async(0, 0, 0, s)
    sb.memcpy_async(0, 0, 0, H2D, s)
    sb.stream_synchronize(s)
    assert sb.op_log() == []


def test_memory_of_another_device_is_refused_until_peer_links_exist() -> None:
    b = sim.create(devices=2)
    try:
        b.set_device(1)
        d1 = b.malloc(64)
        b.set_device(0)
        d0 = b.malloc(64)
        s0 = b.stream_create()
        with pytest.raises(BackendError, match="peer"):
            b.memcpy_async(d0, d1, 64, D2D, s0)
        with pytest.raises(BackendError, match="device 1"):
            b.memset_async(d1, 0, 64, s0)
    finally:
        b.close()


def test_multiple_devices_have_their_own_memory_threads_and_null_streams() -> None:
    import threading

    b = sim.create(devices=2, profile=SimProfile(total_memory=1 << 20))
    try:
        assert b.device_count() == 2
        b.malloc(1 << 19)
        assert b.mem_get_info()[0] == 1 << 19
        seen: dict[str, object] = {}

        def on_device_1() -> None:
            b.set_device(1)
            seen["free"] = b.mem_get_info()[0]
            h = b.host_malloc(8)
            b.memset_async(h, 1, 8, 0)  # the null stream of device 1
            b.stream_synchronize(0)
            seen["rec"] = b.op_log()[-1]

        t = threading.Thread(target=on_device_1)
        t.start()
        t.join()
        assert seen["free"] == 1 << 20  # device 1 is untouched; set_device is per thread
        assert seen["rec"].device == 1  # type: ignore[attr-defined]
        names = {th.name for th in threading.enumerate()}
        assert {"streamrt-sim-exec-1", "streamrt-sim-callback-1"} <= names
        with pytest.raises(BackendError) as exc:
            b.set_device(2)
        assert (exc.value.code, exc.value.name) == (101, "simErrorInvalidDevice")
        with pytest.raises(BackendError):
            b.capabilities(5)
    finally:
        b.close()
