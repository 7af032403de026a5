"""Where the stall of a Python host function goes: the parts of holding a stream, measured apart.

A script, not a test. On a GPU backend with stream signals::

    python demos/bench/host_hold_parts.py --backend cuda [--n 60]

Each row is the GPU time between two timing events around what holds the
stream (median and p99 µs over ``n`` samples, rows interleaved), with the main
thread either idle (asleep) or busy running Python. Everything is enqueued
while the stream is held by a signal wait on the device, let go just before
the main thread sleeps or gets busy, so no row holds the host's enqueue time
(a host function as the gate would not do: one queued right behind another
runs at once, without the GPU -> host notice):

* ``native no-op``: one host function, libc ``sem_post`` (a GPU -> host -> GPU round trip);
* ``native signal``: ``sem_post(ready)`` host function + a signal wait; a *native*
  thread (compiled here with the C compiler, no GIL anywhere) waits on ``ready``
  and stores the ticket: the floor of the signal hold;
* ``native sem_wait``: ``sem_post(ready)`` + ``sem_wait(done)`` host functions with
  the same native thread posting ``done``: the floor of the old hold;
* ``python signal``: the same as ``native signal`` but the waiting thread is
  Python (ctypes ``sem_wait``, then a ctypes store): adds the GIL;
* ``python signal, slack 1us``: the same with the thread's timer slack at 1 µs
  (as streamrt's workers set it), so its timed wait for the GIL ends on time;
* ``python event wake``: one host function: a blocking-sync *wake event* is
  recorded, then ``sem_wait(done)``; the enqueuing thread posts a semaphore
  that wakes a Python thread (timer slack 1 µs), which waits for the wake
  event (``event_synchronize``, GIL released) and posts ``done``: the stream
  pays one GPU -> host -> GPU round trip, and the thread's wake-up overlaps it;
* ``streamrt``: ``Stream.launch_host_func(lambda: None)`` (held by ``sem_wait(done)``,
  the default), and ``streamrt, signal hold`` with ``stream_signals=True``.

``--switch`` sets the interpreter's switch interval (and the runtime's
``python_host_switch_interval``), the runtime's default (10 µs) unless given.

It needs a C compiler (``$CC`` or ``cc``) for the native thread.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from completion_bench import _busy, _Gate, _pct  # the stall rows' busy loop, gate and percentile

import streamrt as srt
from streamrt._native import SEM_POST_ADDRESS, SEM_WAIT_ADDRESS, Semaphore, tighten_timer_slack
from streamrt._switch_interval import DEFAULT_SWITCH_INTERVAL

_HELPER = r"""
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
struct job { sem_t* ready; sem_t* done; volatile uint64_t* signal; volatile int stop; };
static void* serve(void* arg) {
    struct job* j = arg;
    uint64_t ticket = 0;
    for (;;) {
        sem_wait(j->ready);
        if (j->stop) return 0;
        if (j->signal) __atomic_store_n(j->signal, ++ticket, __ATOMIC_RELEASE);
        else sem_post(j->done);
    }
}
int start_server(struct job* j) { pthread_t t; return pthread_create(&t, 0, serve, j); }
"""


class _Job(ctypes.Structure):
    _fields_ = [("ready", ctypes.c_void_p), ("done", ctypes.c_void_p), ("signal", ctypes.c_void_p), ("stop", ctypes.c_int)]


def _build_helper(directory: str) -> ctypes.CDLL:
    src = Path(directory) / "hold_helper.c"
    lib = Path(directory) / "hold_helper.so"
    src.write_text(_HELPER)
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-pthread", str(src), "-o", str(lib)], check=True)
    return ctypes.CDLL(str(lib))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--switch", type=float, default=DEFAULT_SWITCH_INTERVAL, help="switch interval, s")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    sys.setswitchinterval(args.switch)
    with (
        tempfile.TemporaryDirectory() as tmp,
        srt.open_runtime(args.backend, python_host_switch_interval=args.switch) as rt,
        srt.open_runtime(args.backend, python_host_switch_interval=args.switch, stream_signals=True) as rt_signal,
    ):
        helper = _build_helper(tmp)
        b = rt.backend
        if not rt.capabilities.supports_stream_signals:
            raise SystemExit(f"{args.backend}: no stream signals on {rt.capabilities.device_name}")
        s = rt.create_stream()
        h = s.handle
        # ready/done of the native servers, the Python server's ready, and one nobody waits on
        sem_ready, ready2, sem_done, sem_py, sem_py_slack, sem_dummy = (Semaphore(0) for _ in range(6))
        native_signal, python_signal, python_signal_slack = b.signal_alloc(), b.signal_alloc(), b.signal_alloc()
        jobs = [_Job(sem_ready.address, None, native_signal, 0), _Job(ready2.address, sem_done.address, None, 0)]
        for j in jobs:
            assert helper.start_server(ctypes.byref(j)) == 0
        tickets = {"native": 0, "python": 0, "python_slack": 0}

        def python_server(ready: Semaphore, signal: int, slack: bool) -> None:
            if slack:
                tighten_timer_slack()
            word = ctypes.c_uint64.from_address(signal)
            ticket = 0
            while True:
                ready.wait()
                ticket += 1
                word.value = ticket

        for server in ((sem_py, python_signal, False), (sem_py_slack, python_signal_slack, True)):
            threading.Thread(target=python_server, args=server, daemon=True).start()

        wake_event = b.event_create(timing=False, blocking_sync=True)
        sem_wake, sem_wake_done = Semaphore(0), Semaphore(0)

        def event_woken_server() -> None:
            tighten_timer_slack()
            b.ensure_device(rt.device)
            while True:
                sem_wake.wait()
                b.event_synchronize(wake_event)
                sem_wake_done.post()

        threading.Thread(target=event_woken_server, daemon=True).start()

        def event_wake() -> None:
            b.event_record(wake_event, h)
            b.launch_host_func(h, SEM_WAIT_ADDRESS, sem_wake_done.address)
            sem_wake.post()

        def native_noop() -> None:
            b.launch_host_func(h, SEM_POST_ADDRESS, sem_dummy.address)

        def signal_hold(ready: Semaphore, signal: int, key: str) -> Callable[[], None]:
            """``sem_post(ready)`` + a wait for the next ticket on ``signal`` (its server stores it)."""

            def enqueue() -> None:
                tickets[key] += 1
                b.launch_host_func(h, SEM_POST_ADDRESS, ready.address)
                b.stream_wait_signal(h, signal, tickets[key])

            return enqueue

        def native_semwait() -> None:
            b.launch_host_func(h, SEM_POST_ADDRESS, ready2.address)
            b.launch_host_func(h, SEM_WAIT_ADDRESS, sem_done.address)

        def streamrt_call() -> None:
            s.launch_host_func(lambda: None)

        def streamrt_signal_call() -> None:
            s_signal.launch_host_func(lambda: None)

        variants: dict[str, Callable[[], None]] = {
            "native no-op": native_noop,
            "native signal": signal_hold(sem_ready, native_signal, "native"),
            "native sem_wait": native_semwait,
            "python signal": signal_hold(sem_py, python_signal, "python"),
            "python signal, slack 1us": signal_hold(sem_py_slack, python_signal_slack, "python_slack"),
            "python event wake": event_wake,
            "streamrt": streamrt_call,
        }
        if rt_signal.backend is b:  # GPU backends: one per device, so the stream can be shared
            s_signal = rt_signal.wrap_stream(h)  # the same stream, its host calls held by a signal
            variants["streamrt, signal hold"] = streamrt_signal_call
        t0, t1 = rt.create_event(timing=True), rt.create_event(timing=True)
        gate = _Gate(rt)  # a signal wait: this script requires stream signals
        samples: dict[str, list[float]] = {f"{k} [{m}]": [] for m in ("idle", "busy") for k in variants}
        for _ in range(args.n):
            for mode in ("idle", "busy"):
                for name, enqueue in variants.items():
                    gate.hold(s)
                    s.record(t0)
                    enqueue()
                    s.record(t1)
                    gate.open()
                    if mode == "busy":
                        _busy(0.005)
                    else:
                        time.sleep(0.005)
                    t1.synchronize()
                    samples[f"{name} [{mode}]"].append(t0.elapsed_ms(t1) * 1000.0)
            while sem_dummy.try_wait():  # the no-op's posts
                pass
        report = {k: {"median_us": round(statistics.median(v), 1), "p99_us": round(_pct(v, 0.99), 1)} for k, v in samples.items()}
        report["backend"] = args.backend  # type: ignore[assignment]
        report["switch_interval_s"] = args.switch  # type: ignore[assignment]
        for k, v in report.items():
            print(f"{k:32s} {v}")
        if args.out:
            args.out.write_text(json.dumps(report, indent=2))
        s.synchronize()
        gate.close()


if __name__ == "__main__":
    main()
