"""Count what each per-step helper of ``streamrt.torch`` calls per warm call, on the caller's thread (deterministic).

The helpers are ``Prefetcher.__next__`` (staging the next batch and handing one out),
``fetch`` (the loss back to the host) and ``MetricsLogger.log`` (a fetch plus emitting a
landed step; and with ``group=8``, eight calls together, of which one copies the eight
values out), at the training loop's size ``s`` (``demos/train_loop.py``: tokens and
targets int64 x 2048, ``cu_seqlens`` int32 x 17), on the simulator with CPU torch.

Method (``count_calls.py``'s, extended): ``sys.setprofile`` sees every call made on the
calling thread during one warm helper call, and sorts them:

* **streamrt**: Python calls whose code lives in ``streamrt/`` or ``allocators/``, leaving
  out frames under ``streamrt/_backends/`` (the simulator stands in for the driver);
* **backend**: calls into ``streamrt/_backends/`` from outside it (each is one driver call
  on a GPU backend);
* **torch**: calls into torch from outside it: its C functions and methods, and its
  Python functions (counted once at the entry, not for what they call inside torch).

Calls made by or under the simulator variant of ``streamrt.torch``
(``streamrt/torch/_host_torch.py``: CPU torch computing on the host next to the simulator,
with its aliased device blocks, host waits and fetch snapshots) are also counted on their
own ("sim"): they are not on a GPU's path, where the GPU variant (``_device_torch.py``)
makes a few torch calls instead (the GPU benchmark ``helper_costs.py`` times them). So
"total - sim" is what the common code costs on every backend.

It also counts the **wake-ups of runtime threads** per step of a small loop made of the three
helpers (each lane batch, Python host call, releaser job or watchdog wake-up takes the GIL
once), since each one takes the GIL away from the loop's thread.

    python demos/bench/helper_calls.py [--out out.json] [--show fetch]
    PYTHONPATH=. python demos/bench/helper_calls.py --device cuda      # the same counts on a GPU backend
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import torch
except ImportError:  # `streamrt bench` reads exit status 77 as "skipped", the last stderr line as why
    print("needs torch: pip install 'streamrt[torch]'", file=sys.stderr)
    sys.exit(77)

from count_calls import _counted  # noqa: E402

import streamrt as srt  # noqa: E402
import streamrt.torch as st  # noqa: E402

_BACKENDS = str(ROOT / "streamrt" / "_backends") + os.sep
_HOST_VARIANT = str(ROOT / "streamrt" / "torch" / "_host_torch.py")
_TORCH = str(Path(torch.__file__).resolve().parent) + os.sep
#: The loop's batch at size s: token budget 16 x 128, 16 sequences.
TOKENS, SEQS = 2048, 16


_KINDS = ("streamrt", "backend", "torch")


@dataclass
class Calls:
    """The calls one helper call made on the calling thread, by kind (``"name (where)"`` each), and
    of those, the ones made by or under the simulator variant (``sim``, by kind)."""

    streamrt: list[str] = field(default_factory=list)
    backend: list[str] = field(default_factory=list)
    torch: list[str] = field(default_factory=list)
    sim: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in _KINDS})

    def add(self, kind: str, call: str, in_sim_variant: bool) -> None:
        getattr(self, kind).append(call)
        if in_sim_variant:
            self.sim[kind].append(call)

    def counts(self) -> dict[str, int]:
        out = {}
        for kind in _KINDS:
            out[kind] = len(getattr(self, kind))
            out[f"{kind} (sim)"] = len(self.sim[kind])
        return out


def _where(code: Any) -> str:
    path = Path(code.co_filename)
    try:
        path = path.relative_to(ROOT)
    except ValueError:
        pass
    return f"{code.co_qualname} ({path}:{code.co_firstlineno})"


def _is_torch_builtin(fn: Any) -> bool:
    owner = getattr(fn, "__self__", None)
    module = getattr(fn, "__module__", None) or ""
    return module.startswith("torch") or isinstance(owner, torch.Tensor) or (type(owner).__module__ or "").startswith("torch")


def profile(fn: Callable[[], Any]) -> tuple[Any, Calls]:
    """Run ``fn()`` with the profiler on; its result and the calls it made on this thread."""
    calls = Calls()

    def in_sim_variant(frame: Any) -> bool:
        while frame is not None:
            if frame.f_code.co_filename == _HOST_VARIANT:
                return True
            frame = frame.f_back
        return False

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            filename = code.co_filename
            if _counted(filename):
                calls.add("streamrt", _where(code), in_sim_variant(frame))
                return
            caller = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
            if filename.startswith(_BACKENDS):
                if not caller.startswith(_BACKENDS):
                    calls.add("backend", code.co_qualname, in_sim_variant(frame))
            elif filename.startswith(_TORCH) and not caller.startswith(_TORCH):
                calls.add("torch", code.co_qualname, in_sim_variant(frame))
        elif event == "c_call" and not frame.f_code.co_filename.startswith(_TORCH) and _is_torch_builtin(arg):
            calls.add("torch", getattr(arg, "__qualname__", repr(arg)), in_sim_variant(frame))

    sys.setprofile(hook)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
    return result, calls


def batches(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` CPU batches shaped like the loop's at size s (made up front: their making is not counted)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        cu = np.zeros(SEQS + 1, dtype=np.int32)
        np.cumsum(rng.integers(8, 129, size=SEQS), out=cu[1:])
        out.append(
            {
                "tokens": torch.from_numpy(rng.integers(0, 512, size=TOKENS)),
                "targets": torch.from_numpy(rng.integers(0, 512, size=TOKENS)),
                "cu_seqlens": torch.from_numpy(cu),
            }
        )
    return out


def measure(backend: str = "sim") -> dict[str, Calls]:
    """One warm call of each helper, profiled (the stream is idle before each, so what is due has landed)."""
    rows: dict[str, Calls] = {}
    with srt.open_runtime(backend) as rt:
        device = torch.device("cpu") if rt.capabilities.is_simulated else torch.device("cuda", rt.device)
        torch_stream = st.current_stream(rt)
        loss = st.device_empty(rt, (), torch.float32)
        loss.fill_(2.5)
        with st.Prefetcher(batches(16), rt, depth=2) as prefetcher:
            for _ in range(4):  # warm: plans made, events and staging blocks pooled
                next(prefetcher)
            rt.synchronize()
            _, rows["Prefetcher.__next__"] = profile(lambda: next(prefetcher))
            rt.synchronize()
        with st.Prefetcher(batches(5 * GROUP), rt, depth=2, group=GROUP) as prefetcher:
            for _ in range(3 * GROUP):  # warm, then the steady state: a group staged every GROUP calls
                next(prefetcher)
            rt.synchronize()
            _, rows[f"Prefetcher, group={GROUP} ({GROUP} calls)"] = profile(lambda: [next(prefetcher) for _ in range(GROUP)])
            rt.synchronize()
        for _ in range(4):
            st.fetch(rt, loss).result(10)
        torch_stream.synchronize()
        fut, rows["fetch"] = profile(lambda: st.fetch(rt, loss))
        fut.result(10)
        logger = st.MetricsLogger(rt, lag=2, sink=None)
        for step in range(6):  # the steady state: each log emits the step logged two calls before
            logger.log(step, loss)
            torch_stream.synchronize()
        _, rows["MetricsLogger.log"] = profile(lambda: logger.log(6, loss))
        logger.flush(10)
        grouped = st.MetricsLogger(rt, lag=2, sink=None, group=GROUP)
        for step in range(3 * GROUP):  # the steady state: a group sent and emitted every GROUP calls
            grouped.log(step, loss)
            torch_stream.synchronize()
        _, rows[f"log, group={GROUP} ({GROUP} calls)"] = profile(lambda: [grouped.log(3 * GROUP + i, loss) for i in range(GROUP)])
        grouped.flush(10)
        del device
    return rows


#: The grouped rows (``Prefetcher(group=GROUP)``, ``MetricsLogger(group=GROUP)``) count ``GROUP`` calls
#: together: one stages or sends the group, the others hand out or hold.
GROUP = 8

#: Bounds on the calls of one warm helper call outside the simulator variant (``total - sim``: what the
#: common code makes on every backend). What the variant makes depends on when the simulator's aliased
#: blocks come back (the releaser thread), so it has no bound. Tested on the simulator: with CUDA torch,
#: each fetch and each batch handed out also asks torch for its current stream (one streamrt and one
#: torch call), so ``fetch`` and the grouped Prefetcher are over them there (run 149).
GOALS: dict[str, dict[str, int]] = {
    "Prefetcher.__next__": {"streamrt": 14, "backend": 5, "torch": 11},
    # GROUP calls: one group staged (a memmove per leaf, one copy and event, one hand-off)
    f"Prefetcher, group={GROUP} ({GROUP} calls)": {"streamrt": 40, "backend": 5, "torch": 49},
    "fetch": {"streamrt": 14, "backend": 3, "torch": 1},
    "MetricsLogger.log": {"streamrt": 28, "backend": 4, "torch": 1},
    # GROUP calls: one copy out for all of them, a detach each and one stack; emitted as one entry
    f"log, group={GROUP} ({GROUP} calls)": {"streamrt": 36, "backend": 4, "torch": GROUP + 2},
}


def over_goals(rows: dict[str, Calls]) -> list[str]:
    """The counts above their :data:`GOALS` (empty when every goal is met)."""
    problems = []
    for name, goal in GOALS.items():
        c = rows[name].counts()
        got = {kind: c[kind] - c[f"{kind} (sim)"] for kind in _KINDS}
        problems += [f"{name}: {kind} {got[kind]} > {bound}" for kind, bound in goal.items() if got[kind] > bound]
    return problems


@dataclass
class Wakeups:
    """Wake-ups of runtime threads per step of a loop of the three helpers (each takes the GIL once)."""

    steps: int
    lane_batches: float
    host_calls: float
    releaser_jobs: float
    watchdog_wakeups: float

    @property
    def total(self) -> float:
        return self.lane_batches + self.host_calls + self.releaser_jobs + self.watchdog_wakeups


def wakeups_per_step(backend: str = "sim", steps: int = 50, fetch_every: int = 10) -> Wakeups:
    """Run ``steps`` steps (prefetch a batch, a small torch op, log its result, fetch every
    ``fetch_every`` steps as the demo checks its metadata) and count the runtime threads' wake-ups."""
    with srt.open_runtime(backend) as rt:
        jobs = [0]
        submit = rt.releaser.submit

        def counted_submit(fn: Any, *args: Any) -> None:
            jobs[0] += 1
            submit(fn, *args)

        rt.releaser.submit = counted_submit  # type: ignore[method-assign]
        logger = st.MetricsLogger(rt, lag=2, sink=None)
        futures = []
        with st.Prefetcher(batches(steps + 4), rt, depth=2) as prefetcher:
            for _ in range(3):  # warm
                logger.log(-1, next(prefetcher)["tokens"].float().mean())
            logger.flush(10)
            rt.synchronize()
            time.sleep(0.05)
            before = rt._engine.statistics()
            jobs[0] = 0
            for step in range(steps):
                batch = next(prefetcher)
                loss = batch["tokens"].float().mean()
                logger.log(step, loss)
                if step % fetch_every == 0:
                    futures.append(st.fetch(rt, batch["cu_seqlens"]))
            logger.flush(10)
            for fut in futures:
                fut.result(10)
            rt.synchronize()
            time.sleep(0.05)
            after = rt._engine.statistics()
        rt.releaser.submit = submit  # type: ignore[method-assign]
        n = float(steps)
        return Wakeups(
            steps=steps,
            lane_batches=(after.batches - before.batches) / n,
            host_calls=(after.host_calls - before.host_calls) / n,
            releaser_jobs=jobs[0] / n,
            watchdog_wakeups=(after.watchdog_wakeups - before.watchdog_wakeups) / n,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default=None, help="streamrt backend (default: sim, or auto with --device cuda)")
    parser.add_argument("--device", default=None, choices=("cuda", "cpu"), help="torch's device (default: cpu with the simulator, else cuda)")
    parser.add_argument("--out", "--json", dest="json", type=Path, help="write the counts (and the calls) here")
    parser.add_argument(
        "--show",
        choices=("Prefetcher.__next__", f"Prefetcher, group={GROUP} ({GROUP} calls)", "fetch", "MetricsLogger.log", f"log, group={GROUP} ({GROUP} calls)"),
        help="list the calls of one helper",
    )
    args = parser.parse_args(argv)
    on_gpu = (args.device or ("cuda" if args.backend not in (None, "sim") else "cpu")) == "cuda"
    if on_gpu and not torch.cuda.is_available():
        print(f"torch {torch.__version__} has no CUDA device here; --backend sim counts on the simulator", file=sys.stderr)
        return 77
    args.backend = args.backend or ("auto" if on_gpu else "sim")
    rows = measure(args.backend)
    print(f"{'helper (calls: total / sim)':<28} {'streamrt':>10} {'backend':>10} {'torch':>10}")
    for name, calls in rows.items():
        c = calls.counts()
        cells = " ".join(f"{c[k]:>5} /{c[k + ' (sim)']:>3}" for k in _KINDS)
        print(f"{name:<28} {cells}")
    problems = over_goals(rows)
    print("goals (GOALS: calls outside the sim variant):", "all met" if not problems else "NOT met: " + "; ".join(problems))
    wake = wakeups_per_step(args.backend)
    print(
        f"\nruntime-thread wake-ups per step ({wake.steps} steps: prefetch, log, a fetch every 10): {wake.total:.2f} "
        f"(lane batches {wake.lane_batches:.2f}, host calls {wake.host_calls:.2f}, releaser jobs {wake.releaser_jobs:.2f}, "
        f"watchdog {wake.watchdog_wakeups:.2f})"
    )
    if args.show:
        calls = rows[args.show]
        for kind in _KINDS:
            sim = Counter(calls.sim[kind])
            print(f"\n{kind} calls of one warm {args.show} (n, of which under the sim variant):")
            for call, n in Counter(getattr(calls, kind)).most_common():
                print(f"  {n:3d} {sim[call]:3d}  {call}")
    if args.json:
        out: dict[str, Any] = {k: {**v.counts(), "calls": {kind: getattr(v, kind) for kind in _KINDS}, "sim": v.sim} for k, v in rows.items()}
        out["wakeups_per_step"] = {**wake.__dict__, "total": wake.total}
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
