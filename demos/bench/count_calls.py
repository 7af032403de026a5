"""Count streamrt's Python calls per warm launch, on the caller's thread (deterministic, on the simulator).

Method: ``sys.setprofile`` counts the Python function calls made on the calling
thread during one warm launch whose code lives in ``streamrt/`` or
``allocators/``, leaving out frames under ``streamrt/_backends/`` (the simulator
stands in for the driver, whose cost the host-time benchmarks measure). The
pipeline is memset(acc) ∥ D2H(in → h_in) → Python host(h_in → h_out) → H2D(h_out → out),
and the same without its host node; each is launched eagerly and as a captured
graph. Also counted: the pipeline without its host node as a deferred ``"fork"`` launch (the
submission thread makes its driver calls, so the caller's thread pays this bookkeeping alone), the
seed's workspace prepare launched deferred as the training demo launches it, and a single
``Stream.memset``.

    python demos/bench/count_calls.py [--json out.json] [--show eager]

``--show KIND`` prints the calls of one launch (function, file:line), to see where they go.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import streamrt as srt  # noqa: E402

_COUNTED = (str(ROOT / "streamrt") + os.sep, str(ROOT / "allocators") + os.sep)
_LEFT_OUT = str(ROOT / "streamrt" / "_backends") + os.sep


def _counted(filename: str) -> bool:
    return filename.startswith(_COUNTED) and not filename.startswith(_LEFT_OUT)


def count(fn: Callable[[], Any]) -> tuple[Any, list[str]]:
    """Run ``fn()`` with the profiler on; its result and the streamrt calls it made on this thread."""
    calls: list[str] = []

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if _counted(code.co_filename):
                calls.append(f"{code.co_qualname} ({Path(code.co_filename).relative_to(ROOT)}:{code.co_firstlineno})")

    sys.setprofile(profile)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
    return result, calls


def _settle(rt: srt.Runtime) -> None:
    """Let the runtime threads finish retiring earlier launches (and drop their last references), so
    that the counted launch starts from the same state every time."""
    deadline = time.monotonic() + 10
    while rt._engine.statistics().pending or rt._engine.statistics().host_calls_pending:
        if time.monotonic() > deadline:
            raise TimeoutError("earlier launches did not retire")
        time.sleep(0.001)
    time.sleep(0.005)  # the lane drops its references just after it resolved the Run
    gc.collect()


def _double(src: srt.Buffer, dst: srt.Buffer) -> None:
    dst.numpy()[:] = src.numpy() * 2


def build(rt: srt.Runtime, s: srt.Stream, *, host_node: bool, n: int = 4096) -> srt.Pipeline:
    acc = rt.device_allocator.allocate(n, stream=s)
    src = rt.device_allocator.allocate(n, stream=s)
    out = rt.device_allocator.allocate(n, stream=s)
    h_in = rt.host_allocator.allocate(n)
    h_out = rt.host_allocator.allocate(n)
    p = srt.Pipeline("count")
    p.memset(acc, 0)
    p.copy(dst=h_in, src=src)
    if host_node:
        p.host(_double, h_in, h_out, reads=[h_in], writes=[h_out])
        p.copy(dst=out, src=h_out)
    else:
        p.copy(dst=out, src=h_in)
    return p


def measure() -> dict[str, list[str]]:
    rt = srt.open_runtime("sim")
    try:
        s = rt.create_stream()
        capture_stream = rt.create_stream()
        rows: dict[str, list[str]] = {}
        for host_node, suffix in ((True, ""), (False, " copies-only")):
            p = build(rt, s, host_node=host_node)
            graph = p.capture(capture_stream)
            launches: list[tuple[str, Callable[[], Any]]] = [("eager", lambda: p.launch(s)), ("graph", lambda: graph.launch(s))]
            if not host_node:  # its calls made by the submission thread
                launches.append(("deferred", lambda: p.launch(s, policy="fork", join=False, deferred=True)))
            for kind, launch in launches:
                for _ in range(3):  # warm: plans built, events pooled, lanes started
                    launch().result(10)
                s.synchronize()
                _settle(rt)
                run, calls = count(launch)
                run.result(10)
                rows[kind if kind == "deferred" else kind + suffix] = calls
            graph.close()
        prepare = measure_deferred_prepare(rt, s)
        if prepare is not None:
            rows["deferred prepare"], rows["deferred prepare, seqstart given"] = prepare
        d = rt.device_allocator.allocate(4096, stream=s)
        s.memset(d, 0)
        s.synchronize()
        _settle(rt)
        _, calls = count(lambda: s.memset(d, 1))
        rows["Stream.memset"] = calls
        s.synchronize()
        return rows
    finally:
        rt.close()


def measure_deferred_prepare(rt: srt.Runtime, s: srt.Stream) -> tuple[list[str], list[str]] | None:
    """The calls of one warm deferred launch of the seed's prepare (deterministic, native pack): reading the
    seqstart it was built with, and reading seqstart given to the launch, as the training demo launches it;
    ``None`` where the C pack was not built (the launch is not deferred)."""
    from streamrt.recipes.fmha_bwd import WorkspaceParams, WorkspacePrepare, native_pack_available, workspace_size

    if not native_pack_available():
        return None
    params = WorkspaceParams(
        batch=16, nhead=4, hdim_q=64, kM0=64, kN0=64, num_cus=8, deterministic=True, max_seqlen_q=512, max_seqlen_k=512, total_q_padded=8192
    )
    seq = rt.device_allocator.allocate(4 * 17, stream=s)
    given = rt.device_allocator.allocate(4 * 17, stream=s)
    ws = rt.device_allocator.allocate(workspace_size(params), stream=s)
    s.memset(seq, 0)
    s.memset(given, 0)
    with WorkspacePrepare(rt, params, seq, seq, ws, pack="native") as prep:
        for _ in range(3):
            prep.launch(s, "fork", join=False, deferred=True).result(10)
        s.synchronize()
        _settle(rt)
        run, calls = count(lambda: prep.launch(s, "fork", join=False, deferred=True))
        run.result(10)
        for _ in range(3):
            prep.launch(s, "fork", seqstart_q=given, seqstart_k=given, join=False, deferred=True).result(10)
        s.synchronize()
        _settle(rt)
        run, given_calls = count(lambda: prep.launch(s, "fork", seqstart_q=given, seqstart_k=given, join=False, deferred=True))
        run.result(10)
    s.synchronize()
    for b in (seq, given, ws):
        b.release()
    return calls, given_calls


#: The goals of the lean-core issue (streamrt Python calls per warm launch). "deferred" (the copies-only
#: pipeline under ``policy="fork", join=False, deferred=True``: two side streams, a tail each) bounds
#: what a deferred launch pays; "deferred prepare, seqstart given" is the training demo's (where the C pack is
#: built): the checks of the memory given cost two calls over "deferred prepare".
GOALS = {
    "eager": 14, "graph": 6, "eager copies-only": 8, "graph copies-only": 6, "deferred": 14, "deferred prepare": 11,
    "deferred prepare, seqstart given": 13, "Stream.memset": 3,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the counts (and the calls) here")
    parser.add_argument("--show", choices=sorted(GOALS), help="print the calls of one launch")
    args = parser.parse_args(argv)
    rows = measure()
    print(f"{'launch':<33} {'calls':>6} {'goal':>6}")
    for name, calls in rows.items():
        goal = GOALS.get(name)
        mark = "" if goal is None else ("  met" if len(calls) <= goal else "  NOT met")
        print(f"{name:<33} {len(calls):>6} {goal if goal is not None else '':>6}{mark}")
    if args.show:
        print(f"\ncalls of one warm {args.show!r} launch:")
        for call, n in Counter(rows[args.show]).most_common():
            print(f"  {n:3d}  {call}")
    if args.json:
        args.json.write_text(json.dumps({k: {"count": len(v), "calls": v} for k, v in rows.items()}, indent=1))
    return 0


if __name__ == "__main__":
    np.seterr(all="raise")
    raise SystemExit(main())
