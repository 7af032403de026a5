"""Issue 3 benchmark: completion latency and throughput, host-function stalls, idle CPU.

A script, not a test (pytest does not collect it). Run it on each backend::

    python demos/bench/completion_bench.py --backend cuda [--rounds 3] [--parts awaits,stall] [--out out.json]

What it measures, side by side, interleaving variants and repeating rounds
(single runs differ by 2x on the H200):

* ``await latency``: launch (a 4-byte memset) to a resumed coroutine, idle
  device, one at a time: streamrt ``await stream.wait_idle()`` as by default
  (the loop polls the event for ``await_poll_us``, then the lane thread's
  blocking-sync wait takes over) and with ``await_poll_us=0`` ("lanes only":
  the lane thread alone, then a cross-thread wake-up of the loop) against a plain bridge (a Python ctypes host function
  on the driver thread calling ``loop.call_soon_threadsafe``) and, when
  numba-cuda is installed and the backend is cuda, numba's
  ``stream.async_done()``. Median and p99, in µs. Under asyncio and uvloop.
* ``sustained completions/s``: 64 tasks awaiting ``wait_idle()`` on 8 streams,
  both streamrt variants.
* ``host-function stall``: GPU time between two timing events around one host
  function while the main thread is busy in Python: a native no-op (libc
  ``sem_post``), a Python function through streamrt (worker thread, the
  stream held by ``sem_wait(done)``, and with ``stream_signals=True`` by a
  signal wait where the backend has them; switch
  interval lowered to the runtime's default, 10 µs, to 50 µs (the default
  before run 27), and left at 5 ms; ``--switch-us`` picks others), and a Python function run on
  the driver thread (ctypes callback). Median µs. The stream is *held* (by a
  signal wait on the device where the backend has stream signals; a native
  ``sem_wait`` host function elsewhere) while the events and the host function
  are enqueued and let go just before the main thread gets busy, so the
  interval holds what the host function costs the stream and not the host's
  time to enqueue it (a few µs for a native function, tens of µs for a
  Python one: that is the enqueue cost, measured by enqueue_cost.py). The
  rows marked ``as enqueued`` time the same without the hold, as runs before
  2026-11-29's run 27 did.
* ``loop CPU per await``: CPU µs of the loop's thread per ``await`` of 1 ms of
  GPU work (a spin kernel), both streamrt variants: what the polling costs.
* ``idle CPU``: CPU seconds used by the completion threads during 1 s idle.

On the sim backend the stall figures are virtual time and the rest is real
time of the simulator's threads: only the GPU runs are meaningful numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import dataclasses
import functools
import json
import os
import statistics
import sys
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any


import streamrt as srt
from streamrt._completion import DEFAULT_AWAIT_POLL_US
from streamrt._native import SEM_WAIT_ADDRESS, Semaphore
from streamrt._switch_interval import DEFAULT_SWITCH_INTERVAL

_libc = ctypes.CDLL(None)
_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _summary(us: list[float]) -> dict[str, float]:
    return {"median_us": round(statistics.median(us), 1), "p99_us": round(_pct(us, 0.99), 1), "n": len(us)}


# -- await latency ---------------------------------------------------------------------------------------
async def _latency_streamrt(rt: srt.Runtime, s: srt.Stream, d: srt.Buffer, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        s.memset(d, 0, 4)
        await s.wait_idle()
        out.append((time.perf_counter() - t0) * 1e6)
        await asyncio.sleep(0)  # let the lane go back to sleep: measure the idle path
    return out


async def _latency_bridge(rt: srt.Runtime, s: srt.Stream, d: srt.Buffer, n: int) -> list[float]:
    """The baseline: a Python host function on the driver thread + call_soon_threadsafe."""
    loop = asyncio.get_running_loop()
    box: list[asyncio.Future[None]] = []

    def cb(_: Any) -> None:
        fut = box[0]
        loop.call_soon_threadsafe(fut.set_result, None)

    native = _HOST_FN(cb)
    addr = ctypes.cast(native, ctypes.c_void_p).value
    assert addr is not None
    out = []
    for _ in range(n):
        fut = loop.create_future()
        box[:] = [fut]
        t0 = time.perf_counter()
        s.memset(d, 0, 4)
        rt.backend.launch_host_func(s.handle, addr, 0)
        await fut
        out.append((time.perf_counter() - t0) * 1e6)
        await asyncio.sleep(0)
    rt.synchronize()
    del native
    return out


async def _latency_numba(rt: srt.Runtime, s: srt.Stream, d: srt.Buffer, n: int) -> list[float] | None:
    if rt.backend_name != "cuda":
        return None
    try:
        from numba import cuda  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - optional comparison
        return None
    ns = cuda.external_stream(s.handle)
    if not hasattr(ns.handle, "value"):
        # numba-cuda's add_callback passes `self.handle.value` to cuStreamAddCallback; on
        # cuda-bindings 13 the handle is a CUstream, which has no `.value` (AttributeError).
        # Give it one: the mechanism measured (a Python callback on the driver thread, then
        # call_soon_threadsafe) is numba's own, unchanged.
        ns.handle = types.SimpleNamespace(value=ns.handle)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        s.memset(d, 0, 4)
        await ns.async_done()
        out.append((time.perf_counter() - t0) * 1e6)
        await asyncio.sleep(0)
    return out


def _run(loop_kind: str, coro: Any) -> Any:
    loop: asyncio.AbstractEventLoop
    if loop_kind == "uvloop":
        import uvloop

        loop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()


# -- throughput ------------------------------------------------------------------------------------------------
async def _throughput(rt: srt.Runtime, streams: list[srt.Stream], seconds: float) -> float:
    stop = time.perf_counter() + seconds
    count = 0

    async def task(i: int) -> None:
        nonlocal count
        s = streams[i % len(streams)]
        while time.perf_counter() < stop:
            await s.wait_idle()
            count += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(task(i) for i in range(64)))
    return count / (time.perf_counter() - t0)


def _fire_and_forget(rt: srt.Runtime, streams: list[srt.Stream], n: int) -> float:
    engine = rt._engine
    done = 0
    lock = threading.Lock()
    all_done = threading.Event()

    def cb(_: Any) -> None:
        nonlocal done
        with lock:
            done += 1
            if done == n:
                all_done.set()

    t0 = time.perf_counter()
    for i in range(n):
        engine.completion_for_stream(streams[i % len(streams)].handle).add_done_callback(cb)
    all_done.wait(120)
    return n / (time.perf_counter() - t0)


# -- host-function stall -------------------------------------------------------------------------------------
def _busy(seconds: float) -> int:
    x = 0
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        for i in range(200):
            x += i * i
    return x


class _Gate:
    """Holds a stream until opened: a signal wait on the device, else a native ``sem_wait`` host function.

    Not a host function where it can be helped: a host function queued right
    behind another one runs at once on the driver's callback thread, without
    the GPU -> host notice that a host function normally waits for.
    """

    def __init__(self, rt: srt.Runtime) -> None:
        self._backend = rt.backend
        self._signal = rt.backend.signal_alloc() if rt.capabilities.supports_stream_signals else None
        self._sem = Semaphore(0)
        self._ticket = 0

    def hold(self, s: srt.Stream) -> None:
        if self._signal is None:
            self._backend.launch_host_func(s.handle, SEM_WAIT_ADDRESS, self._sem.address)
        else:
            self._ticket += 1
            self._backend.stream_wait_signal(s.handle, self._signal, self._ticket)

    def open(self) -> None:
        if self._signal is None:
            self._sem.post()
        else:
            ctypes.c_uint64.from_address(self._signal).value = self._ticket

    def close(self) -> None:
        if self._signal is not None:
            self._backend.signal_free(self._signal)
        self._sem.destroy()


def _nothing() -> None:
    """The Python host function of the stall rows."""


def _stall(rt: srt.Runtime, s: srt.Stream, enqueue: Callable[[], object], rounds: int, held: bool) -> list[float]:
    t0, t1 = rt.create_event(timing=True), rt.create_event(timing=True)
    gate = _Gate(rt)
    out = []
    for _ in range(rounds):
        if held:
            gate.hold(s)
        s.record(t0)
        enqueue()
        s.record(t1)
        if held:
            gate.open()
        _busy(0.03)  # the main thread is busy in Python while the host function is due
        t1.synchronize()
        out.append(t0.elapsed_ms(t1) * 1000.0)
    t0.close()
    t1.close()
    s.synchronize()
    gate.close()
    return out


def _stall_variants(backend: str, rounds: int, switch_us: list[float | None]) -> dict[str, dict[str, float]]:
    """The stall rows for each interval of ``switch_us`` (µs; ``None``: the interpreter's 5 ms, not lowered)."""
    results: dict[str, dict[str, float]] = {}
    sem = Semaphore(0)
    sem_post = _libc.sem_post
    py_driver = _HOST_FN(lambda _: None)
    intervals = [(f"switch {us:g}us", us * 1e-6) if us is not None else ("switch 5ms (not lowered)", None) for us in switch_us]
    for label, interval in intervals:
        with (
            srt.open_runtime(backend, python_host_switch_interval=interval) as rt,
            srt.open_runtime(backend, python_host_switch_interval=interval, stream_signals=True) as rt_signal,
        ):
            sys.setswitchinterval(0.005)
            s = rt.create_stream()
            variants: dict[str, Callable[[], object]] = {
                "native no-op (sem_post)": functools.partial(s.launch_host_func, sem_post, sem.address),
                "python fn on worker (streamrt)": functools.partial(s.launch_host_func, _nothing),
            }
            # opt-in: the stream is held by a signal wait. The two runtimes share the backend on a GPU
            # (one per device), so they can share the stream; two simulators cannot.
            if rt_signal._engine.stream_signals and rt_signal.backend is rt.backend:
                s_signal = rt_signal.wrap_stream(s.handle)  # the same stream, its host calls held by a signal
                variants["python fn on worker (streamrt, signal hold)"] = functools.partial(s_signal.launch_host_func, _nothing)
            if interval is None:
                variants["python fn on driver thread"] = functools.partial(s.launch_host_func, py_driver)
            samples: dict[str, list[float]] = {}
            for _ in range(3):  # interleave the variants
                for name, enq in variants.items():
                    for held, how in ((True, ""), (False, ", as enqueued")):
                        samples.setdefault(f"{name} [{label}{how}]", []).extend(
                            _stall(rt, s, enq, max(1, rounds // 3), held)
                        )
            for name, xs in samples.items():
                results[name] = _summary(xs)
    while sem.try_wait():
        pass
    sem.destroy()
    return results


# -- idle CPU --------------------------------------------------------------------------------------------------
def _thread_cpu_s(native_id: int) -> float:
    with open(f"/proc/self/task/{native_id}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _idle_cpu(rt: srt.Runtime) -> float | None:
    if not os.path.exists("/proc/self/task"):
        return None
    ids = [t.native_id for t in threading.enumerate() if t.name.startswith(("streamrt-lane", "streamrt-host")) and t.native_id]
    before = sum(_thread_cpu_s(i) for i in ids)
    time.sleep(1.0)
    return sum(_thread_cpu_s(i) for i in ids) - before


async def _loop_cpu_per_await(s: srt.Stream, rt: srt.Runtime, n: int) -> float:
    """CPU µs the loop's thread spends per ``await`` of 1 ms of GPU work (polling included)."""
    cpu = 0.0
    for _ in range(n):
        rt.kernels.spin_sleep(s, 1000.0)
        t0 = time.thread_time()
        await s.wait_idle()
        cpu += time.thread_time() - t0
    return cpu / n * 1e6


#: The parts of the benchmark (``--parts``): latency, throughput, loop and idle CPU; the host-function stall.
PARTS = ("awaits", "stall")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=2000, help="awaits per latency sample set")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument(
        "--parts", default=",".join(PARTS), help=f"what to measure, a subset of {','.join(PARTS)} (default all; 'awaits' is all but the stall)"
    )
    ap.add_argument(
        "--switch-us",
        default=f"{DEFAULT_SWITCH_INTERVAL * 1e6:g},50,off",
        help="the stall's switch intervals in µs, 'off' for the interpreter's 5 ms (default: the runtime's 10, 50, off)",
    )
    args = ap.parse_args()
    try:
        switch_us = [None if x.strip() == "off" else float(x) for x in args.switch_us.split(",")]
    except ValueError:
        ap.error(f"--switch-us: {args.switch_us!r} is not a list of µs (or 'off')")
    if any(x is not None and x <= 0 for x in switch_us):
        ap.error("--switch-us: intervals must be positive")
    parts = set(args.parts.split(","))
    if not parts <= set(PARTS):
        ap.error(f"--parts: unknown {sorted(parts - set(PARTS))}; choose from {','.join(PARTS)}")

    report: dict[str, Any] = {"python": sys.version.split()[0]}
    if "awaits" in parts:
        _awaits(args, report)
    if "stall" in parts:
        report["host_function_stall"] = _stall_variants(report.get("backend", args.backend), rounds=30 * args.rounds, switch_us=switch_us)
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


def _awaits(args: argparse.Namespace, report: dict[str, Any]) -> None:
    """Await latency, sustained completions, the loop's CPU per await, callbacks and idle CPU, into ``report``."""
    with srt.open_runtime(args.backend) as rt, srt.open_runtime(args.backend, await_poll_us=0) as rt_lanes:
        report["backend"] = rt.backend_name
        report["device"] = rt.capabilities.device_name
        report["await_poll_us"] = DEFAULT_AWAIT_POLL_US
        s = rt.create_stream()
        d = rt.device_allocator.allocate(4, stream=s)
        s_lanes = rt_lanes.create_stream()
        d_lanes = rt_lanes.device_allocator.allocate(4, stream=s_lanes)
        # "streamrt": the default (the loop polls for await_poll_us); "streamrt, lanes only": await_poll_us=0
        variants = (
            ("streamrt", _latency_streamrt, rt, s, d),
            ("streamrt, lanes only", _latency_streamrt, rt_lanes, s_lanes, d_lanes),
            ("bridge", _latency_bridge, rt, s, d),
            ("numba", _latency_numba, rt, s, d),
        )
        latency: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for loop_kind in ("asyncio", "uvloop"):
                for name, fn, runtime, stream, buf in variants:
                    try:
                        xs = _run(loop_kind, fn(runtime, stream, buf, args.n))
                    except Exception as exc:  # a peer that fails here is reported, not fatal
                        report.setdefault("unavailable", {})[name] = f"{type(exc).__name__}: {exc}"
                        continue
                    if xs is not None:
                        latency.setdefault(f"{name} [{loop_kind}]", []).extend(xs[10:])
        report["await_latency"] = {k: _summary(v) for k, v in latency.items()}
        streams = [rt.create_stream() for _ in range(8)]
        streams_lanes = [rt_lanes.create_stream() for _ in range(8)]
        sustained: dict[str, int] = {}
        for _ in range(args.rounds):
            for loop_kind in ("asyncio", "uvloop"):
                for name, runtime, group in (("streamrt", rt, streams), ("streamrt, lanes only", rt_lanes, streams_lanes)):
                    key = f"{name} [{loop_kind}]"
                    sustained[key] = max(sustained.get(key, 0), round(_run(loop_kind, _throughput(runtime, group, 1.0))))
        report["sustained_completions_per_s"] = sustained
        try:  # what the polling costs the loop's thread when the work takes long
            report["loop_cpu_us_per_1ms_await"] = {
                name: round(_run("asyncio", _loop_cpu_per_await(stream, runtime, 200)), 1)
                for name, _fn, runtime, stream, _buf in variants[:2]
            }
        except Exception as exc:  # noqa: BLE001 - no spin kernel on this backend
            report.setdefault("unavailable", {})["loop_cpu_us_per_1ms_await"] = f"{type(exc).__name__}: {exc}"
        report["fire_and_forget_completions_per_s"] = round(
            max(_fire_and_forget(rt, streams, 50_000) for _ in range(args.rounds))
        )
        rt._engine.drain()
        report["engine"] = dataclasses.asdict(rt._engine.statistics())
        report["idle_cpu_s_per_s"] = _idle_cpu(rt)


if __name__ == "__main__":
    main()
