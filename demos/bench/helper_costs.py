"""Main-thread time per call of each per-step helper, side by side with the bare calls it makes (issue 22).

For ``Prefetcher.__next__``, ``fetch`` and ``MetricsLogger.log`` at the training loop's size ``s``
(``demos/train_loop.py``: tokens and targets int64 x 2048, ``cu_seqlens`` int32 x 17), it times,
on the main thread, ``--calls`` calls in a row of

* the helper, and
* the **bare** sequence of torch and backend calls that does the same work with nothing
  around it, written out by hand: for a batch, one ``memmove`` per leaf into a pinned
  block, an event recorded on the consumer's stream and waited for by the copy stream
  (the reused device block's order), the H2D copy into a device block allocated once, an
  event record and the consumer's wait, handing out views made once; for a fetch, the
  capture check, the D2H copy and an event record; for a log, those plus an event query
  and copying an older value out of its staging.

The helper and its bare sequence alternate, round after round (``--rounds``); each round
gives one sample per row (mean µs per call), and the table shows the median and the range
over the rounds, and the helper's overhead (helper minus bare, per round). The goal of
issue 22 is at most 20 µs of main-thread time per helper call on the H200 (cuda backend).
Futures are resolved and staging given back between the timed stretches, not inside them.

``--cold`` times each call on its own right after a stand-in for a training step's host work
(a CPU torch forward and backward of a small MLP, which leaves the helper's code and data
out of the CPU's caches, as a loop's step does), the median over the calls of a sample: a
helper called once per step runs cold.

    PYTHONPATH=. python demos/bench/helper_costs.py --backend cuda --out helper_costs.json
    python demos/bench/helper_costs.py --backend sim --device cpu     # functional run (CI)
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import torch
except ImportError:  # `streamrt bench` reads exit status 77 as "skipped", the last stderr line as why
    print("needs torch: pip install 'streamrt[torch]'", file=sys.stderr)
    sys.exit(77)

import numpy as np  # noqa: E402
from helper_calls import batches  # noqa: E402

import streamrt as srt  # noqa: E402
import streamrt.torch as st  # noqa: E402
from streamrt._backends.protocol import MemcpyKind  # noqa: E402

GOAL_US = 20.0
_ALIGN = 256


class Bare:
    """The bare calls of each helper, on preallocated staging, events and (simulator) device memory."""

    def __init__(self, rt: srt.Runtime, copy_stream: srt.Stream, sample: dict[str, torch.Tensor]) -> None:
        self.rt, self.backend, self.copies = rt, rt.backend, copy_stream
        self.on_gpu = not rt.capabilities.is_simulated
        self.consumer = st.current_stream(rt)
        self.leaves = list(sample.values())
        offsets, total = [], 0
        for leaf in self.leaves:
            offset = -(-total // _ALIGN) * _ALIGN
            offsets.append(offset)
            total = offset + leaf.nbytes
        self.offsets, self.total = offsets, total
        self.padded = -(-total // _ALIGN) * _ALIGN
        self.staging = rt.host_allocator.allocate(self.padded)
        self.small = [rt.host_allocator.allocate(_ALIGN) for _ in range(4)]
        self.events = [rt.create_event() for _ in range(4)]
        self.turn = 0
        if self.on_gpu:
            self.device = torch.device("cuda", rt.device)
            self.device_tensor = torch.empty(self.padded, dtype=torch.uint8, device=self.device)
        else:  # the simulator: an aliased device block
            self.device_tensor = st.device_empty(rt, self.padded, torch.uint8)
        self.device_ptr = self.device_tensor.data_ptr()
        self.progress = rt.create_event()
        self.views = [
            self.device_tensor.view(leaf.dtype).as_strided(tuple(leaf.shape), (1,), off // leaf.element_size())
            for leaf, off in zip(self.leaves, self.offsets)
        ]

    def _event(self) -> srt.Event:
        self.turn = (self.turn + 1) % len(self.events)
        return self.events[self.turn]

    def prefetch(self, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        base = self.staging.ptr
        for leaf, offset in zip(batch.values(), self.offsets):
            ctypes.memmove(base + offset, leaf.data_ptr(), leaf.nbytes)
        b, copies, consumer, ev = self.backend, self.copies.handle, self.consumer.handle, self._event()
        b.event_record(self.progress.handle, consumer)
        b.stream_wait_event(copies, self.progress.handle)
        b.memcpy_async(self.device_ptr, base, self.total, MemcpyKind.HOST_TO_DEVICE, copies)
        b.event_record(ev.handle, copies)
        b.stream_wait_event(consumer, ev.handle)
        return self.views

    def fetch(self, loss: torch.Tensor) -> srt.Event:
        stream = self.consumer
        self.backend.stream_is_capturing(stream.handle)
        src = loss.data_ptr() if self.on_gpu else self.device_tensor.data_ptr()
        ev = self._event()
        self.backend.memcpy_async(self.small[self.turn].ptr, src, loss.nbytes, MemcpyKind.DEVICE_TO_HOST, stream.handle)
        self.backend.event_record(ev.handle, stream.handle)
        return ev

    def log(self, loss: torch.Tensor) -> float:
        self.fetch(loss)
        older = (self.turn + 2) % len(self.events)  # the value logged two calls ago
        self.backend.event_query(self.events[older].handle)
        return float(self.small[older].numpy(np.float32)[0])

    def close(self) -> None:
        self.rt.synchronize()
        for buf in (self.staging, *self.small):
            buf.release()
        self.progress.close()


#: ``Prefetcher(group=GROUP)`` and ``MetricsLogger(group=GROUP)`` (as the demo's (b) logs): one call in
#: GROUP stages or sends the group. Their cold samples are the mean over the calls (the median would be
#: a call that only hands out or holds); the bare calls beside them are an ungrouped call's.
GROUP = 8
GROUPED = (f"Prefetcher, group={GROUP}", f"log, group={GROUP}")


def sample(fn: Callable[[], Any], calls: int, after: Callable[[], None], evict: Callable[[], None] | None = None, mean: bool = False) -> float:
    """Mean µs per call of ``calls`` calls of ``fn`` in a row, or with ``evict``, the median (``mean``: the
    mean) of each call timed alone right after ``evict()`` (``after`` runs untimed, to settle what they left)."""
    if evict is None:
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter_ns() - t0
        after()
        return elapsed / calls / 1e3
    times = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        evict()
        t0 = clock()
        fn()
        times.append(clock() - t0)
    after()
    return (statistics.fmean(times) if mean else statistics.median(times)) / 1e3


def evictor() -> Callable[[], None]:
    """A stand-in for a training step's host work: a CPU torch forward and backward of a small MLP."""
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(30)])
    x = torch.randn(8, 64)

    def step() -> None:
        model(x).sum().backward()

    return step


def measure(backend: str, rounds: int, calls: int, cold: bool = False) -> dict[str, dict[str, list[float]]]:
    with srt.open_runtime(backend) as rt:
        on_gpu = not rt.capabilities.is_simulated
        made = batches(8)
        loss = st.device_empty(rt, (), torch.float32)
        loss.fill_(1.5)
        copies = rt.create_stream(name="bare-copies")
        bare = Bare(rt, copies, made[0])
        prefetcher = st.Prefetcher(itertools.cycle(made), rt, depth=2)
        logger = st.MetricsLogger(rt, lag=2, sink=None, keep=False)
        grouped = st.MetricsLogger(rt, lag=2, sink=None, keep=False, group=GROUP)
        grouped_prefetcher = st.Prefetcher(itertools.cycle(made), rt, depth=2, group=GROUP)
        futures: list[Any] = []
        step = itertools.count()
        sync = torch.cuda.synchronize if on_gpu else (lambda: None)

        def settle() -> None:
            sync()
            rt.synchronize()
            for fut in futures:
                fut.result(30)
            futures.clear()

        rows: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {
            "Prefetcher.__next__": (lambda: next(prefetcher), lambda: bare.prefetch(made[0])),
            GROUPED[0]: (lambda: next(grouped_prefetcher), lambda: bare.prefetch(made[0])),
            "fetch": (lambda: futures.append(st.fetch(rt, loss)), lambda: bare.fetch(loss)),
            "MetricsLogger.log": (lambda: logger.log(next(step), loss), lambda: bare.log(loss)),
            GROUPED[1]: (lambda: grouped.log(next(step), loss), lambda: bare.log(loss)),
        }
        out: dict[str, dict[str, list[float]]] = {name: {"helper": [], "bare": []} for name in rows}
        evict = evictor() if cold else None
        for name, (helper, plain) in rows.items():  # warm: plans, pools, lanes, torch's allocator
            sample(helper, 20, settle)
            sample(plain, 20, settle)
        for _ in range(rounds):
            for name, (helper, plain) in rows.items():
                out[name]["helper"].append(sample(helper, calls, settle, evict, mean=name in GROUPED))
                out[name]["bare"].append(sample(plain, calls, settle, evict))
        logger.flush(30)
        grouped.flush(30)
        prefetcher.close()
        grouped_prefetcher.close()
        bare.close()
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default=None, help="streamrt backend (default: auto with --device cuda, sim with cpu)")
    ap.add_argument("--device", default=None, choices=("cuda", "cpu"), help="torch's device (default: cpu with --backend sim, else cuda)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of interleaved samples (default 15; 3 on cpu)")
    ap.add_argument("--calls", type=int, default=None, help="calls per sample (default 200; 20 on cpu)")
    ap.add_argument("--cold", action="store_true", help="time each call alone after a stand-in for a step's host work")
    ap.add_argument("--out", help="write the samples and the summary as JSON here")
    args = ap.parse_args(argv)
    on_gpu = (args.device or ("cpu" if args.backend == "sim" else "cuda")) == "cuda"
    if on_gpu and not torch.cuda.is_available():
        print(f"torch {torch.__version__} has no CUDA device here; --backend sim --device cpu runs the benchmark on the simulator", file=sys.stderr)
        return 77
    backend = args.backend or ("auto" if on_gpu else "sim")
    rounds = args.rounds or (15 if on_gpu else 3)
    calls = args.calls or (200 if on_gpu else 20)
    out = measure(backend, rounds, calls, args.cold)
    how = "each call alone after a stand-in step (--cold)" if args.cold else "in a row"
    print(f"main-thread us per call, median [min-max] over {rounds} rounds of {calls} calls {how} ({backend}; goal <= {GOAL_US:g} us per helper call)")
    print(f"{'helper':<22} {'helper':>22} {'bare calls':>22} {'overhead':>10}  goal")
    summary = {}
    for name, s in out.items():
        over = [h - b for h, b in zip(s["helper"], s["bare"])]
        med = statistics.median(s["helper"])
        summary[name] = {"helper_us": med, "bare_us": statistics.median(s["bare"]), "overhead_us": statistics.median(over)}
        cells = [f"{statistics.median(v):7.2f} [{min(v):6.2f}-{max(v):6.2f}]" for v in (s["helper"], s["bare"])]
        print(f"{name:<22} {cells[0]:>22} {cells[1]:>22} {statistics.median(over):10.2f}  {'met' if med <= GOAL_US else 'NOT met'}")
    if args.out:
        device = torch.cuda.get_device_name() if on_gpu else "cpu (sim)"
        Path(args.out).write_text(json.dumps({"backend": backend, "device": device, "rounds": rounds, "calls": calls, "cold": args.cold, "samples": out, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
