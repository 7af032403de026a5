"""The simulator's stream signals: checks, capture, frees and virtual time."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pytest

from streamrt._backends.protocol import CaptureMode
from streamrt._backends.sim import SimBackend
from streamrt._errors import BackendError


@pytest.fixture
def stream_and_signal(sb: SimBackend) -> Iterator[tuple[int, int]]:
    s = sb.stream_create()
    sig = sb.signal_alloc()
    try:
        yield s, sig
    finally:
        ctypes.c_uint64.from_address(sig).value = (1 << 64) - 1  # lets any wait left behind go
        sb.stream_synchronize(s)
        sb.signal_free(sig)
        sb.stream_destroy(s)


def test_stream_wait_signal_refuses_what_is_not_a_signal(sb: SimBackend, stream_and_signal: tuple[int, int]) -> None:
    s, sig = stream_and_signal
    dev = sb.malloc(64)
    host = sb.host_malloc(64)
    for bad in (dev, host + 4, 0x1234):
        with pytest.raises(BackendError, match="not a signal"):
            sb.stream_wait_signal(s, bad, 1)
    with pytest.raises(BackendError, match="64 bits"):
        sb.stream_wait_signal(s, sig, 1 << 64)
    assert sb.stream_query(s)  # nothing was enqueued
    sb.free(dev)
    sb.host_free(host)


def test_a_signal_wait_cannot_be_captured_and_invalidates_the_capture(sb: SimBackend, stream_and_signal: tuple[int, int]) -> None:
    s, sig = stream_and_signal
    sb.stream_begin_capture(s, CaptureMode.THREAD_LOCAL)
    with pytest.raises(BackendError, match="cannot be captured"):
        sb.stream_wait_signal(s, sig, 1)
    with pytest.raises(Exception, match="invalidated"):
        sb.stream_end_capture(s)


def test_signal_free_refuses_a_signal_a_stream_still_waits_on(sb: SimBackend) -> None:
    s = sb.stream_create()
    sig = sb.signal_alloc()
    sb.stream_wait_signal(s, sig, 1)
    with pytest.raises(BackendError, match="still waited on"):
        sb.signal_free(sig)
    ctypes.c_uint64.from_address(sig).value = 1
    sb.signal_free(sig)  # reached: freed once the wait is through, without a synchronize first
    assert sb.stream_query(s)
    sb.stream_destroy(s)


def test_a_signal_wait_takes_no_virtual_time_of_its_own(sb: SimBackend, stream_and_signal: tuple[int, int]) -> None:
    s, sig = stream_and_signal
    ctypes.c_uint64.from_address(sig).value = 1
    sb.stream_wait_signal(s, sig, 1)
    sb.stream_synchronize(s)
    (rec,) = [r for r in sb.op_log() if r.kind == "wait_signal"]
    assert rec.duration_us == 0.0 and rec.stream == s


def _wake_ups(native_id: int) -> int:
    """The thread's voluntary context switches so far: one per sleep it woke from."""
    with open(f"/proc/self/task/{native_id}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))


def test_the_signal_watcher_sleeps_once_no_wait_is_pending(sb: SimBackend, stream_and_signal: tuple[int, int]) -> None:
    import os
    import threading
    import time

    s, sig = stream_and_signal
    sb.stream_wait_signal(s, sig, 1)
    ctypes.c_uint64.from_address(sig).value = 1
    sb.stream_synchronize(s)
    (watcher,) = [t for t in threading.enumerate() if t.name.startswith("streamrt-sim-signal-")]
    assert watcher.native_id is not None
    if not os.path.exists(f"/proc/self/task/{watcher.native_id}/status"):
        pytest.skip("no /proc/self/task here")
    time.sleep(0.05)  # let it reach its untimed wait
    before = _wake_ups(watcher.native_id)
    time.sleep(0.5)
    assert _wake_ups(watcher.native_id) - before <= 1  # asleep: polling at even 1 ms would wake 500 times
