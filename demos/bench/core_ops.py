"""Host-side cost per op: streamrt's Stream methods against the raw binding call.

Three columns, side by side in interleaved rounds (medians):
  binding   the hip-python / cuda.bindings function itself, called with handle
            objects converted once beforehand (the fastest way to call it);
  backend   streamrt's backend primitive (int handles);
  streamrt  the public Stream method (validation, direction inference, tracking).
On sim there is no binding column.

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


def _binding_calls(be: object, h: int, dptr: int, pptr: int, evh: int) -> dict[str, Callable[[], object]]:
    """The raw binding calls, with every handle converted once (warm the backend caches first)."""
    name = getattr(be, "name", "")
    if name == "cuda":
        from cuda.bindings import runtime as cr

        so, eo = be._streams[h], be._events[evh]  # type: ignore[attr-defined]
        d2h = cr.cudaMemcpyKind.cudaMemcpyDeviceToHost
        fn = cr.cudaHostFn_t(_NOOP_ADDRESS)
        return {
            "memset": lambda: cr.cudaMemsetAsync(dptr, 0, 256, so),
            "copy": lambda: cr.cudaMemcpyAsync(pptr, dptr, 256, d2h, so),
            "record": lambda: cr.cudaEventRecord(eo, so),
            "launch_host_func": lambda: cr.cudaLaunchHostFunc(so, fn, 0),
        }
    if name == "hip":
        from hip import hip

        so, eo = be._streams[h], be._events[evh]  # type: ignore[attr-defined]
        dp, pp = be._pointers[dptr], be._pointers[pptr]  # type: ignore[attr-defined]
        fo, zero = be._host_fns[_NOOP_ADDRESS], be._pointers[0]  # type: ignore[attr-defined]
        d2h = hip.hipMemcpyKind.hipMemcpyDeviceToHost
        return {
            "memset": lambda: hip.hipMemsetAsync(dp, 0, 256, so),
            "copy": lambda: hip.hipMemcpyAsync(pp, dp, 256, d2h, so),
            "record": lambda: hip.hipEventRecord(eo, so),
            "launch_host_func": lambda: hip.hipLaunchHostFunc(so, fo, zero),
        }
    return {}


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
        calls: dict[str, dict[str, Callable[[], object]]] = {
            "memset": {"backend": lambda: raw_memset(dptr, 0, 256, h), "streamrt": lambda: s.memset(d, 0)},
            "copy": {
                "backend": lambda: raw_copy(pptr, dptr, 256, MemcpyKind.DEVICE_TO_HOST, h),
                "streamrt": lambda: s.copy(p, d),
            },
            "record": {"backend": lambda: raw_record(evh, h), "streamrt": lambda: s.record(ev)},
            "launch_host_func": {"backend": lambda: raw_host(h, noop, 0), "streamrt": lambda: s.launch_host_func(_NATIVE_NOOP)},
        }
        for fns in calls.values():  # warm every path (and the backend's handle caches)
            for fn in fns.values():
                fn()
        s.synchronize()
        for name, fn in _binding_calls(be, h, dptr, pptr, evh).items():
            calls[name]["binding"] = fn
        samples: dict[str, dict[str, list[float]]] = {k: {c: [] for c in v} for k, v in calls.items()}
        for name, fns in calls.items():
            count = n if name != "launch_host_func" else max(n // 20, 50)
            for _ in range(rounds):
                for label, fn in fns.items():
                    samples[name][label].append(_per_call_ns(fn, count))
                    s.synchronize()
        out: dict[str, dict[str, float]] = {}
        for name, r in samples.items():
            row = {f"{label}_us": statistics.median(v) / 1000 for label, v in r.items()}
            base = row.get("binding_us", row["backend_us"])
            row["added_us"] = row["streamrt_us"] - base
            out[name] = row
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out")
    args = ap.parse_args()
    res = measure(args.backend, args.n, args.rounds)
    print(f"{'op':<20}{'binding us':>12}{'backend us':>12}{'streamrt us':>13}{'added us':>10}")
    for name, r in res.items():
        binding = f"{r['binding_us']:>12.2f}" if "binding_us" in r else f"{'-':>12}"
        print(f"{name:<20}{binding}{r['backend_us']:>12.2f}{r['streamrt_us']:>13.2f}{r['added_us']:>10.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"backend": args.backend, "results": res}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
