"""Host-side cost per op: streamrt's Stream methods against the raw binding call.

Run on a GPU machine (and on sim, where the "raw" column is the sim backend's
own primitive). Side by side, interleaved rounds, medians:

    python demos/bench/core_ops.py --backend cuda --out core_ops_cuda.json

Goal (issue 2): streamrt adds at most 1.5 us per op over the raw call.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from typing import Callable

import streamrt as srt
from streamrt._backends.protocol import MemcpyKind

# A native no-op host function: libc's free() called with NULL user data does nothing.
_LIBC = ctypes.CDLL(None)
_NOOP_ADDRESS = ctypes.cast(_LIBC.free, ctypes.c_void_p).value
_NATIVE_NOOP = ctypes.cast(_NOOP_ADDRESS, ctypes.CFUNCTYPE(None, ctypes.c_void_p))


def _per_call_ns(fn: Callable[[], None], n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n


def measure(backend: str, n: int, rounds: int) -> dict[str, dict[str, float]]:
    with srt.open_runtime(backend) as rt:
        be = rt.backend
        s = rt.create_stream()
        h = s.handle
        d = rt.device_allocator.allocate(256)
        p = rt.host_allocator.allocate(256)
        ev = rt.create_event()
        noop = _NOOP_ADDRESS
        raw_memset = be.memset_async
        raw_copy = be.memcpy_async
        raw_record = be.event_record
        raw_host = be.launch_host_func
        dptr, pptr, evh = d.ptr, p.ptr, ev.handle
        pairs: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
            "memset": (lambda: raw_memset(dptr, 0, 256, h), lambda: s.memset(d, 0)),
            "copy": (lambda: raw_copy(pptr, dptr, 256, MemcpyKind.DEVICE_TO_HOST, h), lambda: s.copy(p, d)),
            "record": (lambda: raw_record(evh, h), lambda: s.record(ev)),
            "launch_host_func": (lambda: raw_host(h, noop, 0), lambda: s.launch_host_func(_NATIVE_NOOP)),
        }
        results: dict[str, dict[str, list[float]]] = {k: {"raw": [], "streamrt": []} for k in pairs}
        for name, (raw, ours) in pairs.items():
            count = n if name != "launch_host_func" else max(n // 20, 50)
            for _ in range(rounds):
                for label, fn in (("raw", raw), ("streamrt", ours)):
                    results[name][label].append(_per_call_ns(fn, count))
                    s.synchronize()
        out = {}
        for name, r in results.items():
            raw_us = statistics.median(r["raw"]) / 1000
            ours_us = statistics.median(r["streamrt"]) / 1000
            out[name] = {"raw_us": raw_us, "streamrt_us": ours_us, "added_us": ours_us - raw_us}
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out")
    args = ap.parse_args()
    res = measure(args.backend, args.n, args.rounds)
    print(f"{'op':<20}{'raw us':>10}{'streamrt us':>13}{'added us':>10}")
    for name, r in res.items():
        print(f"{name:<20}{r['raw_us']:>10.2f}{r['streamrt_us']:>13.2f}{r['added_us']:>10.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"backend": args.backend, "results": res}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
