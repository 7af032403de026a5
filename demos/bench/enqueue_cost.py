"""Host enqueue cost of the seed's 4-node prepare pipeline (issue 5): eager and graph launch.

The pipeline is the seed's (docs/pipelines.md): memset(dq_acc) ∥ [D2H seqstart_q → D2H seqstart_k
→ host pack → H2D metadata]. Per call, the wall time of the call that
enqueues it, measured two ways:

* ``idle``: the GPU is idle and the previous run has completed (and been
  retired) before each call: the enqueue cost alone;
* ``busy``: each call is followed by a spin kernel of ``--spin-us`` on the
  same stream, and up to ``--window`` runs are in flight, as in a training
  loop; the runtime's threads retire earlier runs and run earlier packs while
  the host enqueues, so this includes the contention for the GIL.

Columns, interleaved per round (medians over rounds of per-call medians):

* ``raw ops``: the same backend calls made directly with pre-converted
  handles (memset, 2 D2H, 2 native host functions, H2D, one event record): the
  floor an eager launch cannot go below. Each raw call records its own tail
  event (a ring of ``--window`` + 2), which the busy mode waits for as it waits
  for a Run, so both keep the same work in flight;
* ``stream``/``fork``: ``Pipeline.launch`` with each policy (fork with
  ``wait_for=None``);
* ``raw graph``: the backend's graph launch of the captured executable plus
  one event record;
* ``graph``: ``Graph.launch``.

Where the C pack was built, the same prepare with ``pack="native"`` adds
``raw ops native`` (one native host function instead of two), ``stream
native``, ``fork native``, ``raw graph native`` and ``graph native``; where
the fork launch is compiled (a fork plan), ``raw fork native`` makes the
plan's backend calls directly plus the tail record: the fork launch's floor.

``--profile`` also prints the functions that took the most time per call
(cProfile) for each streamrt column in the idle mode.

``--split`` also splits each streamrt column's idle call into the backend
calls made inside it (wall time around each, the GIL re-acquired on return
included) and the rest: streamrt's own Python, plus any time the GIL was taken
from it between backend calls. Medians of per-call values, measured after the
rounds with the backend's calls wrapped by timers.

    python demos/bench/enqueue_cost.py --backend cuda --out enqueue_cuda.json
"""

from __future__ import annotations

import argparse
import gc
import cProfile
import io
import json
import pstats
import statistics
import sys
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
from train_step import (  # the seed workload of the training-step harness
    add_workload_arguments,
    seed_workload,
)

import streamrt as srt
from streamrt._backends.protocol import MemcpyKind
from streamrt._native import SEM_POST_ADDRESS, Semaphore
from streamrt.recipes.fmha_bwd import WorkspacePrepare, native_pack_available, workspace_size

COLUMNS = ("raw ops", "stream", "fork", "raw graph", "graph")
NATIVE_COLUMNS = tuple(f"{c} native" for c in COLUMNS)
#: The backend calls a launch makes, timed by ``--split``.
_LAUNCH_CALLS = (
    "memset_async",
    "memcpy_async",
    "launch_host_func",
    "event_record",
    "stream_wait_event",
    "graph_launch",
    "stream_is_capturing",
    "ensure_device",
)


class _RawTail:
    """A raw call's tail event: ``wait()`` synchronizes it, as a Run's wait does."""

    __slots__ = ("backend", "event")

    def __init__(self, backend: Any, event: int) -> None:
        self.backend, self.event = backend, event

    def wait(self) -> None:
        self.backend.event_synchronize(self.event)


class _RawTails:
    """The raw columns' tail events, recorded in turn (``size`` > the busy window, so each one has
    been waited for before it is recorded again)."""

    def __init__(self, backend: Any, size: int) -> None:
        self.backend = backend
        self.tails = [_RawTail(backend, backend.event_create(timing=False, blocking_sync=True)) for _ in range(size)]
        self.turn = 0

    def record(self, stream: int) -> _RawTail:
        tail = self.tails[self.turn]
        self.turn = (self.turn + 1) % len(self.tails)
        self.backend.event_record(tail.event, stream)
        return tail

    def close(self) -> None:
        for tail in self.tails:
            self.backend.event_destroy(tail.event)


def _recompile_plans() -> None:
    """Drop every pipeline's launch plans (they hold the backend calls they bound)."""
    for obj in gc.get_objects():
        if issubclass(type(obj), srt.Pipeline):  # not isinstance: it reads __class__, which warns on some modules
            obj._plans = {}


def _split(backend: Any, calls: dict[str, Callable[[], Any]], s: srt.Stream, warmup: int, n: int) -> dict[str, dict[str, float]]:
    """Per column (idle): median µs of the whole call, of its backend calls, and of the rest (see ``--split``)."""
    main = threading.get_ident()
    spent = [0.0]

    def timed(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != main:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - t0

        return call

    originals = {name: getattr(backend, name) for name in _LAUNCH_CALLS}
    for name, fn in originals.items():
        setattr(backend, name, timed(fn))
    # the native executor's calls (a launch plan's program, a graph replay, the tail record) count as backend calls
    engine = s._runtime._engine
    ops, record = getattr(backend, "native_ops", None), engine._record
    if ops is not None:
        backend.native_ops = SimpleNamespace(run=timed(ops.run), replay=timed(ops.replay), record=timed(ops.record), compile=ops.compile)
    engine._record = timed(record)
    _recompile_plans()  # launch plans bound the backend's calls: bind the timed ones
    out: dict[str, dict[str, float]] = {}
    try:
        for name, fn in calls.items():
            whole: list[float] = []
            inside: list[float] = []
            for i in range(warmup + n):
                s.synchronize()
                spent[0] = 0.0
                t0 = time.perf_counter()
                r = fn()
                t1 = time.perf_counter()
                backend_s = spent[0]
                r.wait()
                if i >= warmup:
                    whole.append(t1 - t0)
                    inside.append(backend_s)
            rest = [w - b for w, b in zip(whole, inside)]
            out[name] = {k: statistics.median(v) * 1e6 for k, v in (("call", whole), ("backend", inside), ("rest", rest))}
    finally:
        for name, fn in originals.items():
            setattr(backend, name, fn)
        if ops is not None:
            backend.native_ops = ops
        engine._record = record
        _recompile_plans()
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    params, seq_q, seq_k = seed_workload(args)
    with srt.open_runtime(args.backend) as rt:
        s = rt.create_stream(name="enqueue")
        b, h = rt.backend, s._handle
        q = rt.device_allocator.allocate(seq_q.nbytes, stream=s)
        k = rt.device_allocator.allocate(seq_k.nbytes, stream=s)
        ws = rt.device_allocator.allocate(workspace_size(params), stream=s)
        stage = rt.host_allocator.allocate(seq_q.nbytes + seq_k.nbytes)
        stage.numpy(np.int32)[:] = np.concatenate([seq_q, seq_k])
        s.copy(q, stage.view(0, seq_q.nbytes))
        s.copy(k, stage.view(seq_q.nbytes))
        s.synchronize()
        prep = WorkspacePrepare(rt, params, q, k, ws)
        graph = prep.capture(s)
        exec_handle = graph._state.exec  # type: ignore[union-attr]
        scratch = rt.host_allocator.allocate(4096)
        sem = Semaphore()
        tails = _RawTails(b, args.window + 2)
        dq, meta_dev = ws.ptr + params.metadata_region_bytes, ws.ptr
        dq_n, meta_n = params.dq_acc_bound_bytes, params.metadata_region_bytes
        d2h, h2d = MemcpyKind.DEVICE_TO_HOST, MemcpyKind.HOST_TO_DEVICE

        def raw_ops(host_functions: int) -> _RawTail:
            b.memset_async(dq, 0, dq_n, h)
            b.memcpy_async(scratch.ptr, q.ptr, seq_q.nbytes, d2h, h)
            b.memcpy_async(scratch.ptr + 1024, k.ptr, seq_k.nbytes, d2h, h)
            for _ in range(host_functions):
                b.launch_host_func(h, SEM_POST_ADDRESS, sem.address)
            b.memcpy_async(meta_dev, scratch.ptr + 2048, min(meta_n, 2048), h2d, h)
            return tails.record(h)

        def raw_steps(steps: Any) -> _RawTail:
            for fn, fn_args in steps:
                fn(*fn_args)
            return tails.record(h)

        def raw_graph(exec_handle: Any) -> _RawTail:
            b.graph_launch(exec_handle, h)
            return tails.record(h)

        calls: dict[str, Callable[[], Any]] = {
            "raw ops": lambda: raw_ops(2),  # a Python host node: two host functions (post, hold)
            "stream": lambda: prep.launch(s, "stream"),
            "fork": lambda: prep.launch(s, "fork", wait_for=None),
            "raw graph": lambda: raw_graph(exec_handle),
            "graph": lambda: graph.launch(s),
        }
        columns = COLUMNS
        preps = [prep]
        if native_pack_available():
            native = WorkspacePrepare(rt, params, q, k, ws, pack="native")
            native_graph = native.capture(s)
            native_exec = native_graph._state.exec  # type: ignore[union-attr]
            preps.append(native)
            columns = COLUMNS + NATIVE_COLUMNS
            native.launch(s, "fork", wait_for=None).wait()  # compiles the fork launch, where it can be
            fork_plan = native._pipeline._plans.get((s, None, True, False))  # type: ignore[attr-defined]
            if fork_plan is not None:  # its bound backend calls made directly, plus the tail record
                calls["raw fork native"] = lambda: raw_steps(fork_plan.steps)
                columns += ("raw fork native",)
            calls.update(
                {
                    "raw ops native": lambda: raw_ops(1),
                    "stream native": lambda: native.launch(s, "stream"),
                    "fork native": lambda: native.launch(s, "fork", wait_for=None),
                    "raw graph native": lambda: raw_graph(native_exec),
                    "graph native": lambda: native_graph.launch(s),
                }
            )
        spin: Callable[[], None] | None = None
        if not rt.capabilities.is_simulated:
            try:
                rt.kernels.spin_sleep(s, 1.0)
                spin = lambda: rt.kernels.spin_sleep(s, args.spin_us)  # noqa: E731
            except Exception as exc:  # noqa: BLE001
                print(f"no spin kernel ({exc}): the busy mode is skipped", file=sys.stderr)
        s.synchronize()

        def measure(name: str, mode: str) -> float:
            fn = calls[name]
            times: list[float] = []
            inflight: list[Any] = []
            for i in range(args.warmup + args.calls):
                if mode == "idle":
                    s.synchronize()
                    for r in inflight:
                        r.wait()
                    inflight.clear()
                t0 = time.perf_counter()
                r = fn()
                t1 = time.perf_counter()
                if i >= args.warmup:
                    times.append(t1 - t0)
                if mode == "busy":
                    assert spin is not None
                    spin()
                    inflight.append(r)
                    if len(inflight) > args.window:
                        inflight.pop(0).wait()
            s.synchronize()
            for r in inflight:
                r.wait()
            return statistics.median(times) * 1e6

        modes = ["idle"] + (["busy"] if spin is not None else [])
        per_round: dict[str, dict[str, list[float]]] = {m: {c: [] for c in columns} for m in modes}
        for rnd in range(args.rounds):
            order = columns[rnd % len(columns) :] + columns[: rnd % len(columns)]
            for mode in modes:
                for c in order:
                    per_round[mode][c].append(measure(c, mode))
        profiles: dict[str, str] = {}
        if args.profile:
            for c in (c for c in columns if not c.startswith("raw")):
                pr = cProfile.Profile()
                fn = calls[c]
                for _ in range(200):
                    s.synchronize()
                    pr.enable()
                    r = fn()
                    pr.disable()
                    r.wait()
                buf = io.StringIO()
                pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(18)
                profiles[c] = buf.getvalue()
        streamrt_calls = {c: calls[c] for c in columns if not c.startswith("raw")}
        split = _split(b, streamrt_calls, s, args.warmup, args.calls) if args.split else {}
        s.synchronize()
        for p in preps:
            p.close()
        scratch.release()
        stage.release()
        sem.destroy()
        tails.close()
        device = f"{rt.backend_name}: {rt.capabilities.device_name}"
    summary = {m: {c: statistics.median(v) for c, v in cols.items()} for m, cols in per_round.items()}
    return {
        "device": device,
        "rounds": args.rounds,
        "calls": args.calls,
        "window": args.window,
        "spin_us": args.spin_us,
        "columns": list(columns),
        "summary_us": summary,
        "rounds_us": per_round,
        "profiles": profiles,
        "split_us": split,
    }


def _print(result: dict[str, Any]) -> None:
    print(result["device"])
    print(f"{result['rounds']} interleaved rounds x {result['calls']} calls; median us per call")
    columns = result["columns"]
    width = max(11, *(len(c) + 2 for c in columns))
    print(f"{'mode':<6}" + "".join(f"{c:>{width}}" for c in columns))
    for mode, cols in result["summary_us"].items():
        print(f"{mode:<6}" + "".join(f"{cols[c]:>{width}.2f}" for c in columns))
    if result["split_us"]:
        print("\nsplit (idle; median us per call): call = backend calls + the rest (streamrt's Python, GIL waits)")
        for name, parts in result["split_us"].items():
            print(f"  {name:<13} call {parts['call']:8.2f}  backend {parts['backend']:8.2f}  rest {parts['rest']:8.2f}")
    for name, text in result["profiles"].items():
        print(f"\n== cProfile, {name} (200 idle calls)\n{text}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--window", type=int, default=4, help="runs in flight in the busy mode")
    ap.add_argument("--spin-us", type=float, default=300.0, help="device work after each call in the busy mode")
    add_workload_arguments(ap)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--split", action="store_true", help="split each idle streamrt call into backend calls and the rest")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    result = run(args)
    _print(result)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
