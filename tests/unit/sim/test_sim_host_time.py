"""The simulator's model of host time: Python host functions (timed by the runtime) and, optionally, real host work."""

from __future__ import annotations

import time

import pytest

import streamrt as srt
from streamrt._backends.sim import SimProfile

PROFILE = SimProfile(host_func_us=10.0, python_host_call_us=25.0, api_call_us=2.0, charge_host_time=True)


def _stall_us(rt: srt.Runtime, s: srt.Stream, work: object) -> float:
    """Stream time between two events around ``work()``'s enqueue."""
    a, b = rt.create_event(timing=True), rt.create_event(timing=True)
    s.record(a)
    work()  # type: ignore[operator]
    s.record(b)
    s.synchronize()
    return a.elapsed_ms(b) * 1000.0


def _busy(seconds: float) -> None:
    """``seconds`` of host work (CPU time: what the simulator charges)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _work_2ms() -> None:
    _busy(0.002)


def test_a_python_host_function_holds_the_stream_for_as_long_as_it_runs() -> None:
    """After a few runs the engine's estimate of the function's run time reaches the simulated stream."""
    with srt.open_runtime("sim", profile=PROFILE) as rt:
        s = rt.create_stream()
        for _ in range(3):
            s.launch_host_func(_work_2ms)
        s.synchronize()
        later = _stall_us(rt, s, lambda: s.launch_host_func(_work_2ms))
        assert 2 * 10.0 + 25.0 + 1900.0 < later < 2 * 10.0 + 25.0 + 20_000.0


@pytest.mark.parametrize(("signals", "host_functions"), [(True, 1), (False, 2)])
def test_without_charge_host_time_a_python_host_function_costs_the_model_alone(signals: bool, host_functions: int) -> None:
    """The default: deterministic times, however long the function really runs.

    Held by a signal, the call is one host function (``sem_post(ready)``) and a
    wait; else two host functions.
    """
    profile = PROFILE.replace(charge_host_time=False)
    with srt.open_runtime("sim", profile=profile, stream_signals=signals) as rt:
        s = rt.create_stream()
        s.launch_host_func(_work_2ms)  # the first call also makes the stream's worker (and signal)
        stalls = [_stall_us(rt, s, lambda: s.launch_host_func(_work_2ms)) for _ in range(4)]
        assert stalls == [pytest.approx(host_functions * 10.0 + 25.0, abs=PROFILE.api_call_us)] * 4


def test_a_native_host_function_costs_the_model_alone() -> None:
    import ctypes

    with srt.open_runtime("sim", profile=PROFILE.replace(charge_host_time=False)) as rt:
        s = rt.create_stream()
        noop = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _p: None)
        assert _stall_us(rt, s, lambda: s.launch_host_func(noop)) == pytest.approx(10.0, abs=PROFILE.api_call_us)


def _work_10ms() -> None:
    _busy(0.010)


def test_a_captured_python_host_node_reads_the_estimate_at_every_replay() -> None:
    """The first replay cannot know the run time; later ones charge it.

    The stalls also hold the host's own CPU work inside ``launch`` (charged
    too), which on a slow or busy machine reaches milliseconds on a first
    launch (a garbage collection, say): hence 10 ms of work and wide bounds.
    """
    with srt.open_runtime("sim", profile=PROFILE) as rt:
        s = rt.create_stream()
        p = srt.Pipeline("sleepy")
        p.host(_work_10ms)
        g = p.capture(s)
        stalls = [_stall_us(rt, s, lambda: g.launch(s)) for _ in range(5)]
        assert stalls[0] < 6000.0  # captured before the function ever ran
        assert stalls[-1] > 9500.0
        g.close()


def test_time_blocked_is_not_host_work() -> None:
    with srt.open_runtime("sim", profile=PROFILE) as rt:
        b = rt.backend
        s = rt.create_stream()
        buf = rt.device_allocator.allocate(64, stream=s)
        s.memset(buf, 0)
        t0 = b.host_now_us()
        time.sleep(0.05)
        s.memset(buf, 1)
        assert b.host_now_us() - t0 < 10_000.0  # the 50 ms asleep are not charged; the CPU work is
        s.synchronize()


@pytest.mark.parametrize("charge", [False, True])
def test_charge_host_time_adds_the_real_time_between_calls(charge: bool) -> None:
    with srt.open_runtime("sim", profile=PROFILE.replace(charge_host_time=charge)) as rt:
        b = rt.backend
        s = rt.create_stream()
        buf = rt.device_allocator.allocate(64, stream=s)
        s.memset(buf, 0)
        t0 = b.host_now_us()
        _busy(0.005)
        s.memset(buf, 1)
        spent = b.host_now_us() - t0
        s.synchronize()
        if charge:
            assert spent >= 5000.0
        else:
            assert spent < 100.0  # the model alone: a few api_call_us
