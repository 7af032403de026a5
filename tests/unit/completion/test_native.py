"""libc semaphores through ctypes (streamrt._native): the GIL-free driver-to-runtime bridge."""

from __future__ import annotations

import ctypes
import sys
import threading
import time

import pytest
from _completion_helpers import wait_until

from streamrt import _native
from streamrt._native import HOLD_ADDRESS, SEM_POST_ADDRESS, SEM_WAIT_ADDRESS, TIMER_SLACK_NS, Semaphore, tighten_timer_slack

pytestmark = pytest.mark.skipif(_native.native_unavailable_reason() is not None, reason=str(_native.native_unavailable_reason()))

_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def test_function_pointers_are_libc_sem_post_and_sem_wait() -> None:
    libc = ctypes.CDLL(None)
    assert SEM_POST_ADDRESS == ctypes.cast(libc.sem_post, ctypes.c_void_p).value
    assert SEM_WAIT_ADDRESS == ctypes.cast(libc.sem_wait, ctypes.c_void_p).value
    assert SEM_POST_ADDRESS != SEM_WAIT_ADDRESS


def test_the_hold_is_the_c_extensions_wait_where_it_is_built() -> None:
    """Where the extension is built the hold is its signal-proof wait (a silent fallback to libc's would
    leave the contract test that signals the driver's thread skipped), and it holds until a post."""
    try:
        from streamrt import _graph_release_c
    except ImportError:
        pytest.skip("streamrt._graph_release_c is not built: the hold is libc sem_wait")
    assert HOLD_ADDRESS == _graph_release_c.HOLD_ADDRESS != SEM_WAIT_ADDRESS
    sem = Semaphore(0)
    hold = _HOST_FN(HOLD_ADDRESS)
    t = threading.Thread(target=hold, args=(sem.address,))
    try:
        t.start()
        time.sleep(0.02)
        assert t.is_alive()
        sem.post()
        t.join(5)
        assert not t.is_alive() and sem.value == 0
    finally:
        sem.post()
        t.join(5)
        sem.destroy()


def test_post_then_wait_counts() -> None:
    sem = Semaphore(0)
    try:
        assert sem.value == 0
        assert sem.try_wait() is False
        sem.post()
        sem.post()
        assert sem.value == 2
        assert sem.wait() is True
        assert sem.try_wait() is True
        assert sem.try_wait() is False
    finally:
        sem.destroy()


def test_initial_value_and_negative_rejected() -> None:
    sem = Semaphore(3)
    assert sem.value == 3
    sem.destroy()
    with pytest.raises(ValueError):
        Semaphore(-1)


def test_timed_wait_times_out_and_zero_only_tries() -> None:
    sem = Semaphore(0)
    try:
        t0 = time.monotonic()
        assert sem.wait(0.05) is False
        assert time.monotonic() - t0 >= 0.045
        assert sem.wait(0) is False
        sem.post()
        assert sem.wait(0) is True
    finally:
        sem.destroy()


def test_native_function_pointers_work_as_void_fn_void_ptr() -> None:
    """A driver thread calls the pointers as `void fn(void*)` with the semaphore address."""
    sem = Semaphore(0)
    try:
        post = _HOST_FN(SEM_POST_ADDRESS)
        wait = _HOST_FN(SEM_WAIT_ADDRESS)
        post(sem.address)
        assert sem.value == 1
        wait(sem.address)
        assert sem.value == 0
    finally:
        sem.destroy()


def test_wait_releases_the_gil() -> None:
    """While one thread blocks in sem_wait, another thread keeps running Python."""
    sem = Semaphore(0)
    entered = threading.Event()

    def waiter() -> None:
        entered.set()
        sem.wait()

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    entered.wait()
    # If sem_wait held the GIL, this loop could not make progress until the post.
    count = 0
    deadline = time.monotonic() + 0.05
    while time.monotonic() < deadline:
        count += 1
    assert count > 1000
    assert t.is_alive()
    sem.post()
    t.join(5)
    assert not t.is_alive()
    sem.destroy()


def test_post_from_native_thread_wakes_python_waiter() -> None:
    """A post made by native code on another thread (as a driver does) wakes a blocked waiter."""
    sem = Semaphore(0)
    woke = threading.Event()

    def waiter() -> None:
        assert sem.wait(5.0)
        woke.set()

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    time.sleep(0.01)
    assert not woke.is_set()
    poster = threading.Thread(target=_HOST_FN(SEM_POST_ADDRESS), args=(sem.address,))
    poster.start()
    poster.join()
    assert woke.wait(5.0)
    t.join(5)
    sem.destroy()


def test_destroy_and_leak_are_idempotent_and_final() -> None:
    sem = Semaphore()
    sem.destroy()
    sem.destroy()
    assert not sem.is_alive
    with pytest.raises(ValueError):
        sem.post()
    before = _native.leaked_semaphores()
    other = Semaphore()
    other.leak()
    other.leak()
    assert _native.leaked_semaphores() == before + 1
    with pytest.raises(ValueError):
        _ = other.address
    assert "destroyed" in repr(other)


def test_address_is_aligned() -> None:
    sems = [Semaphore() for _ in range(16)]
    try:
        assert all(s.address % 16 == 0 for s in sems)
    finally:
        for s in sems:
            s.destroy()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_TIMERSLACK) is Linux only")
def test_tighten_timer_slack_sets_the_calling_threads_slack_only() -> None:
    libc = ctypes.CDLL(None)
    get_slack = lambda: libc.prctl(30, 0, 0, 0, 0)  # noqa: E731 - PR_GET_TIMERSLACK
    seen: dict[str, int] = {}

    def worker() -> None:
        seen["before"] = get_slack()
        assert tighten_timer_slack(2000)
        seen["after"] = get_slack()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["after"] == 2000 and seen["before"] != 2000
    assert get_slack() != 2000  # this thread is untouched


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_TIMERSLACK) is Linux only")
def test_runtime_worker_and_lane_threads_run_with_a_tight_timer_slack() -> None:
    import streamrt as srt

    libc = ctypes.CDLL(None)

    def slack_here() -> tuple[str, int]:
        return threading.current_thread().name, libc.prctl(30, 0, 0, 0, 0)  # PR_GET_TIMERSLACK

    with srt.open_runtime("sim") as rt:
        s = rt.create_stream()
        worker = s.launch_host_func(slack_here).result(5)  # runs on the stream's worker
        seen: list[tuple[str, int]] = []
        added = threading.Event()
        slow = s.launch_host_func(added.wait, 5)  # still running when the callback is added
        slow.add_done_callback(lambda _c: seen.append(slack_here()))  # so it runs on the stream's lane
        added.set()
        slow.result(5)
        assert wait_until(lambda: bool(seen))
    (lane,) = seen
    assert worker[0].startswith("streamrt-host-") and worker[1] == TIMER_SLACK_NS
    assert lane[0].startswith("streamrt-lane-") and lane[1] == TIMER_SLACK_NS
