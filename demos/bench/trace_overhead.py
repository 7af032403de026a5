"""What tracing costs on the host: ns per enqueue with tracing off, with tracing on, and the hook itself.

With tracing off, every traced call site in the core runs one extra statement,
``tracer = self._runtime._tracer`` followed by ``if tracer is None:``. This
benchmark measures, side by side in interleaved rounds (medians):

* ``raw``: the backend's ``memset_async`` called directly (no streamrt);
* ``off``: ``Stream.memset`` with tracing off (validation + the hook's None check + the call);
* ``on``: ``Stream.memset`` with tracing on (adds the tracer's bookkeeping and, on a GPU,
  two timing-event records per op);
* ``hook``: the off-path hook alone, ``t = s._runtime._tracer; if t is None: pass``,
  minus an empty loop body: what tracing-off adds to each call.

    python demos/bench/trace_overhead.py --backend sim --out trace_overhead.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

import streamrt as srt
from streamrt._trace import start_trace, stop_trace


def _per_call_ns(fn: Callable[[], None], n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n


def _loop_ns(body: Callable[[int], None], n: int) -> float:
    t0 = time.perf_counter_ns()
    body(n)
    return (time.perf_counter_ns() - t0) / n


def hook_ns(stream: Any, n: int, rounds: int) -> dict[str, float]:
    """ns of the off-path hook (attribute loads + None test), measured inside a tight loop."""

    def with_hook(count: int, s: Any = stream) -> None:
        for _ in range(count):
            tracer = s._runtime._tracer
            if tracer is None:
                pass

    def without(count: int, s: Any = stream) -> None:
        for _ in range(count):
            pass

    a, b = [], []
    for _ in range(rounds):
        a.append(_loop_ns(with_hook, n))
        b.append(_loop_ns(without, n))
    return {"hook_loop_ns": statistics.median(a), "empty_loop_ns": statistics.median(b), "hook_ns": statistics.median(a) - statistics.median(b)}


def measure(backend: str, n: int, rounds: int) -> dict[str, Any]:
    with srt.open_runtime(backend) as rt:
        s = rt.create_stream()
        d = rt.device_allocator.allocate(256, stream=s)
        be, h, ptr = rt.backend, s.handle, d.ptr
        raw = lambda: be.memset_async(ptr, 0, 256, h)  # noqa: E731
        ours = lambda: s.memset(d, 0)  # noqa: E731
        res: dict[str, list[float]] = {"raw": [], "off": [], "on": []}
        for _ in range(rounds):
            res["raw"].append(_per_call_ns(raw, n))
            s.synchronize()
            res["off"].append(_per_call_ns(ours, n))
            s.synchronize()
            start_trace(rt, name="overhead")
            try:
                res["on"].append(_per_call_ns(ours, n))
            finally:
                stop_trace(rt)
        med = {k: statistics.median(v) for k, v in res.items()}
        hook = hook_ns(s, 200_000, rounds)
        d.release()
        return {
            "backend": rt.backend_name,
            "ops_per_round": n,
            "rounds": rounds,
            "memset_ns": {
                "raw": round(med["raw"], 1),
                "tracing_off": round(med["off"], 1),
                "tracing_on": round(med["on"], 1),
                "on_minus_off": round(med["on"] - med["off"], 1),
            },
            "hook_off_ns": {k: round(v, 1) for k, v in hook.items()},
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="sim")
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out")
    args = ap.parse_args()
    r = measure(args.backend, args.n, args.rounds)
    m, k = r["memset_ns"], r["hook_off_ns"]
    print(f"backend {r['backend']}: Stream.memset, ns per call (median of {r['rounds']} rounds x {r['ops_per_round']})")
    print(f"  raw backend call   {m['raw']:>9.1f}")
    print(f"  tracing off        {m['tracing_off']:>9.1f}")
    print(f"  tracing on         {m['tracing_on']:>9.1f}   (+{m['on_minus_off']:.1f})")
    print(f"  the off hook alone {k['hook_ns']:>9.1f}   (attribute loads + None test; loop {k['hook_loop_ns']:.1f} vs empty {k['empty_loop_ns']:.1f})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(r, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
