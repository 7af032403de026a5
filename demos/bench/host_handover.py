"""The host's part of a Python host function's hold, with no GPU in it: the worker's wake-up and its GIL.

A script, not a test. It runs on any backend, the simulator included (no device call is timed)::

    python demos/bench/host_handover.py [--backend sim] [--n 300] [--switch-us 1,10] [--out handover.json]

A native thread stands in for the driver's callback thread (compiled here with
the C compiler; it never takes the GIL). For each sample it runs a call's first
host function, the one streamrt enqueues (``sem_post(ready)``), then waits on
the call's ``done`` semaphore as streamrt's second host function does, and
times the two, from before the first to after the second. The call is a real
one of a real stream worker (``HostChannel``, a no-op Python function): only
the GPU is left out. On a GPU, a Python host function's stall is its GPU ->
host -> GPU round trip plus this, so this is what a change to the hand-over
can save, measured on any machine.

Rows, interleaved per round, median and p99 µs over ``--n`` samples each:

* ``native no-op``: libc ``sem_post`` on a spare semaphore, nothing waited for
  (the stand-in's own cost);
* ``worker, switch N us``: the switch interval lowered to N µs while the call
  is in flight, for each N of ``--switch-us`` (default: the runtime's 10);
* ``worker, switch 5ms (not lowered)``: ``python_host_switch_interval=None``
  (main thread busy only: each sample then takes about 5 ms);

with the main thread busy running Python until the sample ends, and asleep
(blocked in C, the GIL released). Exits with status 77 (skipped) where no C
compiler is found.

What it found (run 141, this machine's CPython 3.11, 2 cores): a main thread
busy in Python is not interrupted by a pending call (``Py_AddPendingCall``) or
a simulated signal (``PyErr_SetInterruptEx``) made on a thread that is not
Python's: CPython up to 3.12 sets the eval breaker for them only when the
calling thread is the main thread. So the main thread cannot be asked, GIL-free,
to run a host function at its next bytecode (docs/performance-history.md).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from completion_bench import _summary  # median, p99 and n, as the stall rows report them

import streamrt as srt
from streamrt._hostcall import HostChannel, HostRequest
from streamrt._native import SEM_POST_ADDRESS, Semaphore

SKIP = 77

_STAND_IN = r"""
#include <pthread.h>
#include <semaphore.h>
#include <time.h>
typedef void (*host_fn)(void *);
static sem_t go, finished;
static host_fn first;
static void *first_data;
static sem_t *done;
static double held_us;
static double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static void *driver(void *unused) {
    for (;;) {
        while (sem_wait(&go) != 0) {}
        double t0 = now_us();
        first(first_data);
        if (done) while (sem_wait(done) != 0) {}
        held_us = now_us() - t0;
        sem_post(&finished);
    }
    return 0;
}
int start_driver(void) { pthread_t t; sem_init(&go, 0, 0); sem_init(&finished, 0, 0); return pthread_create(&t, 0, driver, 0); }
void trigger(void *fn, void *data, void *done_sem) { first = (host_fn)fn; first_data = data; done = (sem_t *)done_sem; sem_post(&go); }
int finished_now(void) { return sem_trywait(&finished) == 0; }
void wait_finished(void) { while (sem_wait(&finished) != 0) {} }
double held(void) { return held_us; }
"""


def _build(directory: str) -> tuple[ctypes.PyDLL, ctypes.CDLL]:
    """The stand-in, loaded twice: calls that keep the GIL (never block) and calls that release it."""
    src, lib = Path(directory) / "stand_in.c", Path(directory) / "stand_in.so"
    src.write_text(_STAND_IN)
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-pthread", str(src), "-o", str(lib)], check=True)
    held, released = ctypes.PyDLL(str(lib)), ctypes.CDLL(str(lib))
    held.trigger.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    held.held.restype = ctypes.c_double
    return held, released


def _nothing() -> None:
    """The Python host function of the worker rows."""


def _sample(lib: ctypes.PyDLL, wait: Any, channel: HostChannel | None, spare: Semaphore, busy: bool) -> float:
    if channel is None:
        lib.trigger(SEM_POST_ADDRESS, spare.address, None)
    else:
        channel._push(HostRequest(_nothing, ()))
        lib.trigger(SEM_POST_ADDRESS, channel._ready_address, channel._done_address)
    if busy:
        while not lib.finished_now():  # Python bytecode all along: the main thread is busy
            pass
    else:
        wait()  # blocked in C, the GIL released
    us = float(lib.held())
    if channel is not None and not channel.wait_idle(10.0):  # the worker finishes its bookkeeping
        raise RuntimeError("the worker did not finish a call within 10 s")
    return us


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="sim")
    ap.add_argument("--n", type=int, default=150, help="samples per row, a multiple of --rounds (default 150)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds the samples are split over, rows interleaved (default 3)")
    ap.add_argument("--switch-us", default="10", help="the switch intervals of the worker rows, µs (default: the runtime's 10)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.n < args.rounds or args.n % args.rounds:
        ap.error("--n must be a positive multiple of --rounds >= 1")
    try:
        switch_us = [float(x) for x in args.switch_us.split(",")]
    except ValueError:
        ap.error(f"--switch-us: not a list of numbers: {args.switch_us!r}")
    if not all(us > 0 for us in switch_us):
        ap.error("--switch-us: intervals must be positive")
    if shutil.which(os.environ.get("CC", "cc")) is None:
        print("skipped: no C compiler ($CC or cc) for the driver stand-in", file=sys.stderr)
        return SKIP
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        rt_slow = stack.enter_context(srt.open_runtime(args.backend, python_host_switch_interval=None))
        runtimes = {us: stack.enter_context(srt.open_runtime(args.backend, python_host_switch_interval=us * 1e-6)) for us in switch_us}
        lib, released = _build(tmp)
        if lib.start_driver() != 0:
            raise RuntimeError("could not start the driver stand-in thread")
        spare = Semaphore(0)
        # Channels of real streams; nothing is enqueued on the streams (the stand-in runs the host functions).
        workers = {us: rt._engine._channel(rt.create_stream().handle) for us, rt in runtimes.items()}
        slow = rt_slow._engine._channel(rt_slow.create_stream().handle)
        rows: dict[str, tuple[HostChannel | None, bool]] = {}
        for busy, how in ((True, "main thread busy"), (False, "main thread asleep")):
            rows[f"native no-op [{how}]"] = (None, busy)
            rows.update({f"worker, switch {us:g}us [{how}]": (channel, busy) for us, channel in workers.items()})
        rows["worker, switch 5ms (not lowered) [main thread busy]"] = (slow, True)
        samples: dict[str, list[float]] = {name: [] for name in rows}
        per_round = args.n // args.rounds
        for _ in range(args.rounds):
            for name, (channel, busy) in rows.items():
                samples[name] += [_sample(lib, released.wait_finished, channel, spare, busy) for _ in range(per_round)]
        report = {
            "backend": rt_slow.backend_name,
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "handover": {name: _summary(xs) for name, xs in samples.items()},
        }
        spare.destroy()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
