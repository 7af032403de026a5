"""Bad input gets a clear error and enqueues nothing, on every backend."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import streamrt as srt


@pytest.fixture
def setup(rt: srt.Runtime):
    s = rt.create_stream()
    d = rt.device_allocator.allocate(64)
    h = rt.host_allocator.allocate(64)
    h.numpy()[:] = 0xEE
    s.memset(d, 0x11)
    s.synchronize()
    return s, d, h


def _nothing_enqueued(rt: srt.Runtime, s: srt.Stream, d: srt.Buffer, h: srt.Buffer) -> None:
    """The device buffer still holds 0x11 and the host buffer 0xEE: nothing ran."""
    assert s.is_idle
    probe = rt.host_allocator.allocate(64)
    s.copy(probe, d)
    s.synchronize()
    assert (probe.numpy() == 0x11).all()
    assert (h.numpy() == 0xEE).all()


@pytest.mark.parametrize("nbytes", [65, 1 << 40])
def test_copy_larger_than_either_buffer(rt, setup, nbytes) -> None:
    s, d, h = setup
    with pytest.raises(ValueError, match="exceeds"):
        s.copy(h, d, nbytes=nbytes)
    small = rt.host_allocator.allocate(8)
    with pytest.raises(ValueError, match="exceeds"):
        s.copy(small, d, nbytes=16)
    _nothing_enqueued(rt, s, d, h)


def test_memset_larger_than_the_buffer(rt, setup) -> None:
    s, d, h = setup
    with pytest.raises(ValueError, match="exceeds"):
        s.memset(d, 0, nbytes=65)
    _nothing_enqueued(rt, s, d, h)


@pytest.mark.parametrize("nbytes, error", [(-1, ValueError), (1.5, TypeError), ("8", TypeError), (True, TypeError)])
def test_negative_or_non_integer_sizes(rt, setup, nbytes, error) -> None:
    s, d, h = setup
    with pytest.raises(error, match="nbytes"):
        s.copy(h, d, nbytes=nbytes)
    with pytest.raises(error, match="nbytes"):
        s.memset(d, 0, nbytes=nbytes)
    with pytest.raises(error):
        rt.device_allocator.allocate(nbytes)
    _nothing_enqueued(rt, s, d, h)


@pytest.mark.parametrize("value", [-1, 256, 1.0, None])
def test_memset_value_must_be_a_byte(rt, setup, value) -> None:
    s, d, h = setup
    with pytest.raises(ValueError, match="memset value"):
        s.memset(d, value)
    _nothing_enqueued(rt, s, d, h)


def test_none_where_a_buffer_is_expected(rt, setup) -> None:
    s, d, h = setup
    with pytest.raises(TypeError, match="None"):
        s.copy(None, d)
    with pytest.raises(TypeError, match="None"):
        s.copy(h, None)
    with pytest.raises(TypeError, match="None"):
        s.memset(None, 0)
    _nothing_enqueued(rt, s, d, h)


def test_closed_stream(rt, setup) -> None:
    s, d, h = setup
    other = rt.create_stream()
    other.close()
    for call in (lambda: other.memset(d, 0), lambda: other.copy(h, d), lambda: other.record(),
                 lambda: other.launch_host_func(print), lambda: other.synchronize()):
        with pytest.raises(srt.ClosedError):
            call()
    other.close()  # idempotent
    _nothing_enqueued(rt, s, d, h)


def test_closed_runtime(backend) -> None:
    rt = srt.open_runtime(backend)
    s = rt.create_stream()
    d = rt.device_allocator.allocate(8)
    rt.close()
    rt.close()  # idempotent
    with pytest.raises(srt.ClosedError):
        s.memset(d, 0)
    with pytest.raises(srt.ClosedError):
        rt.create_stream()
    with pytest.raises(srt.ClosedError):
        rt.create_event()


def test_buffer_from_another_runtime(rt, setup, backend) -> None:
    """A buffer of another runtime on the same device is refused (only a device buffer of another device is
    accepted, by copy, as a peer copy). An event of another runtime is refused only when that runtime has a
    different backend instance (one-device simulators are private); GPU backends are one object per process,
    whose streams may wait on any of its runtimes' events."""
    s, d, h = setup
    with srt.open_runtime(backend) as other:
        foreign = other.device_allocator.allocate(64)
        with pytest.raises(ValueError, match="another runtime"):
            s.copy(h, foreign)
        with pytest.raises(ValueError, match="another runtime"):
            s.memset(foreign, 0)
        ev = other.create_event()
        if other.backend is rt.backend:
            s.wait(ev)  # never recorded: a no-op
        else:
            with pytest.raises(ValueError, match="another runtime"):
                s.wait(ev)
    _nothing_enqueued(rt, s, d, h)


def test_pageable_host_memory_in_an_async_copy_is_an_error(rt, setup) -> None:
    s, d, h = setup
    pageable = np.zeros(64, np.uint8)
    with pytest.raises(ValueError, match="pinned"):
        s.copy(pageable, d)
    with pytest.raises(ValueError, match="pinned"):
        s.copy(d, pageable)
    with pytest.raises(ValueError, match="pageable"):
        s.memset(pageable, 0)
    _nothing_enqueued(rt, s, d, h)


def test_read_only_destination(rt, setup) -> None:
    s, d, h = setup
    ro = rt.as_buffer(bytes(64))
    with pytest.raises(ValueError, match="read-only"):
        s.copy(ro, d)
    _nothing_enqueued(rt, s, d, h)


def test_read_only_memset_destination(rt, setup) -> None:
    s, d, h = setup
    ro = srt.Buffer(d.ptr, d.nbytes, "device", rt, owner=d, readonly=True)
    with pytest.raises(ValueError, match="read-only"):
        s.memset(ro, 0)
    _nothing_enqueued(rt, s, d, h)


def test_event_and_ordering_calls_take_their_own_types(rt, setup) -> None:
    s, d, h = setup
    timing = rt.create_event(timing=True)
    with pytest.raises(TypeError, match="record takes an Event"):
        s.record("event")
    with pytest.raises(TypeError, match="wait takes an Event"):
        s.wait(None)
    with pytest.raises(TypeError, match="wait_stream takes a Stream"):
        s.wait_stream(0)
    with pytest.raises(TypeError, match="elapsed_ms takes an Event"):
        timing.elapsed_ms(1.0)
    closed = rt.create_event()
    closed.close()
    for call in (lambda: s.record(closed), lambda: s.wait(closed), lambda: closed.synchronize(),
                 lambda: timing.elapsed_ms(closed), lambda: closed.completion()):  # fmt: skip
        with pytest.raises(srt.ClosedError, match="event is closed"):
            call()
    _nothing_enqueued(rt, s, d, h)
    timing.close()


def test_native_host_function_user_data_is_one_address_like_value(rt, setup) -> None:
    import ctypes

    s, d, h = setup
    noop = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _p: None)
    with pytest.raises(TypeError, match="one user-data argument"):
        s.launch_host_func(noop, 1, 2)
    with pytest.raises(TypeError, match="cannot pass str as user data"):
        s.launch_host_func(noop, "data")
    _nothing_enqueued(rt, s, d, h)


def test_buffer_used_after_release_and_released_twice(rt, setup) -> None:
    s, d, h = setup
    tmp = rt.device_allocator.allocate(64)
    tmp.release()
    with pytest.raises(ValueError, match="after release"):
        s.memset(tmp, 0)
    with pytest.raises(ValueError, match="released twice"):
        tmp.release()
    _nothing_enqueued(rt, s, d, h)


def test_non_callable_host_function(rt, setup) -> None:
    s, d, h = setup
    with pytest.raises(TypeError, match="callable"):
        s.launch_host_func(42)
    _nothing_enqueued(rt, s, d, h)


def test_unknown_backend_name() -> None:
    with pytest.raises(ValueError, match="unknown backend 'metal'"):
        srt.open_runtime("metal")


def test_device_out_of_range(backend) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        srt.open_runtime(backend, device=4096)


class _ClosingRecorded(srt.RawAllocator):
    closed = False

    def close(self) -> None:
        self.closed = True
        super().close()


def _runtime_threads() -> int:
    return sum(t.name.startswith("streamrt") and t.is_alive() for t in threading.enumerate())


def test_bad_runtime_arguments_are_refused_and_leave_nothing_open(backend) -> None:
    threads = _runtime_threads()
    with pytest.raises(TypeError, match="backend must be a str"):
        srt.open_runtime(0)
    for device in (-1, True, 1.0):
        with pytest.raises(ValueError, match="non-negative int"):
            srt.open_runtime(backend, device)
    with pytest.raises(ValueError, match="unknown allocator 'bogus'"):
        srt.open_runtime(backend, host_allocator="bogus")
    with pytest.raises(TypeError, match="cannot use int as an allocator"):
        srt.open_runtime(backend, device_allocator=3)
    with pytest.raises(TypeError, match="must return an object implementing"):
        srt.open_runtime(backend, host_allocator=lambda rt, kind: object())
    made: list[_ClosingRecorded] = []

    def host_factory(rt: srt.Runtime, kind: str) -> srt.Allocator:
        made.append(_ClosingRecorded(rt, kind))
        return made[-1]

    with pytest.raises(TypeError, match="cannot use int as an allocator"):
        srt.open_runtime(backend, host_allocator=host_factory, device_allocator=3)
    assert len(made) == 1 and made[0].closed  # the host allocator it had made is closed again
    assert _runtime_threads() <= threads  # the failed opens stopped what they started (earlier tests' may still be exiting)
    with srt.open_runtime(backend) as rt:
        with pytest.raises(ValueError, match="cannot serve device memory"):
            srt.open_runtime(backend, device_allocator=rt.host_allocator)
        with pytest.raises(TypeError, match="priority must be an int"):
            rt.create_stream("high")
        with pytest.raises(TypeError, match="cannot wrap str as a stream"):
            rt.wrap_stream("default")
        with srt.open_runtime(backend) as other:
            with pytest.raises(ValueError, match="another runtime"):
                rt.wrap_stream(other.create_stream())
        s = rt.create_stream()
        s.synchronize()


def _peek_last_error(rt: srt.Runtime) -> int | None:
    """The calling thread's runtime-API last error, without clearing it (``None`` on the simulator)."""
    if rt.backend_name == "cuda":
        from cuda.bindings import runtime as cudart

        return int(cudart.cudaPeekAtLastError()[0])
    if rt.backend_name == "hip":
        from hip import hip

        result = hip.hipPeekAtLastError()
        return int(result[0] if isinstance(result, tuple) else result)
    return None


def test_a_failed_backend_call_leaves_no_last_error_behind(rt: srt.Runtime) -> None:
    """The error is raised once, by streamrt: the thread's last error is clear afterwards, so a library
    that checks it after its own calls (PyTorch does) does not report streamrt's failure as its own."""
    if rt.capabilities.is_simulated:
        pytest.skip("the simulator has no runtime-API last error")
    a, b = rt.backend.event_create(timing=True), rt.backend.event_create(timing=True)
    try:
        with pytest.raises(srt.BackendError):
            rt.backend.event_elapsed_ms(a, b)  # never recorded: an error from the runtime API
        assert _peek_last_error(rt) == 0
    finally:
        rt.backend.event_destroy(a)
        rt.backend.event_destroy(b)


def test_copy_between_overlapping_ranges_of_one_buffer(rt, setup) -> None:
    s, d, h = setup
    for dst, src in [(d.view(0, 32), d.view(16, 32)), (d.view(16, 32), d.view(0, 32)), (h.view(8, 16), h.view(0, 16))]:
        with pytest.raises(ValueError, match="overlap"):
            s.copy(dst, src)
    s.copy(d.view(0, 16), d.view(16, 16))  # adjacent ranges are fine
    s.memset(d, 0x11)
    s.synchronize()
    _nothing_enqueued(rt, s, d, h)


@pytest.mark.parametrize("timeout, error", [("x", TypeError), (True, TypeError), (-1, ValueError), (float("nan"), ValueError)])
def test_completion_wait_timeout_is_checked(rt, setup, timeout, error) -> None:
    s, _d, _h = setup
    done = s.wait_idle()
    pending = s.launch_host_func(lambda: None)
    for c in (done, pending):
        for call in (c.wait, c.result, c.exception):
            with pytest.raises(error, match="timeout"):
                call(timeout)
    assert pending.result(10) is None


def test_graph_launch_on_a_capturing_stream_is_a_capture_error(rt, setup) -> None:
    if not rt.capabilities.supports_graphs:
        pytest.skip("no graphs on this backend")
    s, d, h = setup
    p = srt.Pipeline("g")
    p.copy(dst=h, src=d)
    g = p.capture(s)
    other = rt.create_stream()
    rt.backend.stream_begin_capture(other.handle, srt.CaptureMode.RELAXED)
    try:
        with pytest.raises(srt.CaptureError, match="capturing"):
            g.launch(other)
    finally:
        graph = rt.backend.stream_end_capture(other.handle)
        if graph:
            rt.backend.graph_destroy(graph)
    g.launch(s).result(10)
    g.close()


def test_kernel_shared_memory_beyond_the_device_limit(rt, setup) -> None:
    s, d, _h = setup
    kernel = rt.kernels.get("fill_u32")
    limit = rt.capabilities.max_shared_memory_per_block
    assert limit > 0
    with pytest.raises(ValueError, match="shared_mem"):
        s.launch_kernel(kernel, 1, 32, [d, 16, 0xAB, 0], shared_mem=limit + 1)
    with pytest.raises(ValueError, match="shared_mem"):
        s.launch_kernel(kernel, 1, 32, [d, 16, 0xAB, 0], shared_mem=1 << 30)
    p = srt.Pipeline("k")
    with pytest.raises(ValueError, match="shared_mem"):
        p.kernel(kernel, 1, 32, [d, 16, 0xAB, 0], shared_mem=1 << 30)
    s.memset(d, 0x11)
    s.synchronize()
