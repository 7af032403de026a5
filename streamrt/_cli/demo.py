"""``streamrt demo``: the seed workload in every strategy, compared, traced and drawn.

The workload is a training step in miniature: each step prepares the
group-mode FMHA backward workspace (:mod:`streamrt.recipes.fmha_bwd`) with one
strategy, runs a block of "compute" on the same stream (a stand-in for the
step's matmuls: spin kernels of a set device time, or memsets where no kernel
can be built), then a consumer that reads the workspace. The compute keeps the
device busy longer than the host takes to enqueue a step, so on a GPU the
step time measures the device, as in a real training step. Strategies come
from the recipe (:data:`streamrt.recipes.fmha_bwd.pipeline.STRATEGIES`); ones
the recipe or the device lacks are skipped with a note; ``stream_native`` and
``graph_native`` run the recipe's C pack as a native host function
(``pack="native"``) where it was built. ``none`` (compute and consumer only) is
the baseline that "GPU time added" is measured against.

For each strategy the demo measures, on the main stream, the step time
(timing events between step starts: virtual time on the simulator), the host
time blocked per step and the bubbles per step (from a traced run), checks the
workspace metadata against the numpy oracle, and prints a table. It writes
``trace.json`` (one device and one host process per strategy) and
``timeline.png`` (one panel per strategy) to ``out_dir``.

On a GPU, untraced rounds of all strategies are interleaved and medians taken
(single runs differ by 2x there); the trace comes from a separate short run so
tracing's event records do not perturb the step times. On the simulator every
step takes the same virtual time, so a few steps suffice and the run takes a
few seconds of real time.

Blocking: runs the workload to completion. Thread rules: call from one thread.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Callable, Sequence

import numpy as np

from .._runtime import Runtime
from .._trace import Trace, start_trace, stop_trace
from .inputs import CommandError, load_profile, open_runtime_for, output_dir, output_file
from .progress import Progress

__all__ = ["DemoResult", "StrategyResult", "discover_strategies", "run_demo", "run_workload"]

#: The strategies the demo wants, in table order; the recipe says which exist. ``*_native``: the
#: same with the recipe's C pack as a native host function (``pack="native"``), where it was built.
WANTED = ("sync", "stream", "fork", "graph", "fork_graph", "stream_native", "graph_native", "device")
NATIVE_SUFFIX = "_native"
BASELINE = "none"
MAIN = "main"


@dataclass(frozen=True)
class StrategyInfo:
    """A strategy the demo knows of: whether it can run here, and if not, why."""

    name: str
    available: bool
    note: str = ""


@dataclass(frozen=True)
class StrategyResult:
    """One row of the comparison. Times in µs; per-step figures are averages over the traced steps."""

    name: str
    step_us: float
    added_us: float
    host_blocked_us: float
    bubbles: float
    bubble_us: float
    bubble_causes: dict[str, float]
    critical_path: dict[str, float]
    correct: bool
    steps_measured: int
    step_spread_us: float = 0.0


@dataclass(frozen=True)
class DemoResult:
    """What the demo measured: one :class:`StrategyResult` per strategy that ran, and the skipped ones."""

    backend: str
    device_name: str
    clock: str
    compute: str
    results: tuple[StrategyResult, ...]
    skipped: tuple[StrategyInfo, ...]
    trace_path: str | None = None
    timeline_path: str | None = None
    notes: tuple[str, ...] = field(default=())

    def table(self) -> str:
        """The comparison table (what the demo prints)."""
        head = ["strategy", "step us", "GPU time added us", "host blocked us/step", "bubbles/step", "bubble us/step", "main cause", "metadata"]
        rows = []
        for r in self.results:
            causes = {k: v for k, v in r.bubble_causes.items() if v > 0 and k != "launch"}
            main = max(causes, key=lambda k: causes[k]).replace("_", " ") if causes else "-"
            rows.append(
                [
                    r.name,
                    f"{r.step_us:.1f}",
                    "(baseline)" if r.name == BASELINE else f"{r.added_us:+.1f}",
                    f"{r.host_blocked_us:.1f}",
                    f"{r.bubbles:.1f}",
                    f"{r.bubble_us:.1f}",
                    main,
                    "-" if r.name == BASELINE else ("ok" if r.correct else "WRONG"),
                ]
            )
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
        line = lambda cells: "  ".join(c.ljust(w) if i in (0, 6) else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
        return "\n".join([line(head), line(["-" * w for w in widths]), *(line(r) for r in rows)])

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- strategies ------------------------------------------------------------------------------------


def discover_strategies(rt: Runtime | None = None) -> list[StrategyInfo]:
    """The demo's strategies, in order, each marked available or not with the reason.

    A strategy is available when the recipe module lists it and the device
    supports what it needs (graphs need ``capabilities.supports_graphs``).
    Recipe strategies the demo does not know yet are appended (run through
    ``prepare_workspace``).
    """
    try:
        from ..recipes.fmha_bwd import pipeline as recipe
    except ImportError as exc:
        return [StrategyInfo(n, False, f"the workspace recipe is not available ({exc})") for n in WANTED]
    offered = tuple(getattr(recipe, "STRATEGIES", ()))
    from ..recipes.fmha_bwd.native import native_pack_unavailable_reason

    no_native = native_pack_unavailable_reason()
    out = []
    for name in WANTED:
        if name.endswith(NATIVE_SUFFIX) and no_native is not None:
            out.append(StrategyInfo(name, False, f"needs the recipe's C pack: {no_native}"))
            continue
        match = _recipe_name(name, offered)
        if match is None:
            why = "needs the device-side pack kernel (kernels issue); not in this build" if name == "device" else "not offered by the recipe"
            out.append(StrategyInfo(name, False, why))
        elif "graph" in name and rt is not None and not rt.capabilities.supports_graphs:
            out.append(StrategyInfo(match, False, f"the {rt.backend_name} backend does not support graphs"))
        else:
            out.append(StrategyInfo(match, True))
    known = {i.name for i in out}
    for name in offered:
        if name not in known:
            out.append(StrategyInfo(name, True))
    return out


def _recipe_name(wanted: str, offered: Sequence[str]) -> str | None:
    if wanted in offered:
        return wanted
    if wanted.endswith(NATIVE_SUFFIX) and wanted.removesuffix(NATIVE_SUFFIX) in offered:
        return wanted
    if wanted == "device":
        for name in offered:
            if "device" in name:
                return name
    return None


class _Workload:
    """Buffers, the prepare and the per-step enqueue of one runtime."""

    def __init__(self, rt: Runtime, stream: Any, *, compute_ops: int, compute_bytes: int, compute_us: float, seed: int = 0) -> None:
        from ..recipes.fmha_bwd import WorkspaceParams, native_pack_available, reference_metadata
        from ..recipes.fmha_bwd.pipeline import WorkspacePrepare

        self.rt = rt
        self.stream = stream
        caps = rt.capabilities
        batch = 16
        self.params = WorkspaceParams(
            batch=batch, nhead=4, hdim_q=64, kM0=64, kN0=128, num_cus=caps.multiprocessor_count,
            deterministic=True, max_seqlen_q=512, max_seqlen_k=512, total_q_padded=batch * 512,
        )  # fmt: skip
        rng = np.random.default_rng(seed)
        sq = np.concatenate([[0], np.cumsum(rng.integers(0, 513, batch))]).astype(np.int32)
        sk = np.concatenate([[0], np.cumsum(rng.integers(0, 513, batch))]).astype(np.int32)
        self.expected = reference_metadata(self.params, sq, sk)
        dev = rt.device_allocator
        self.seq_q = dev.allocate(sq.nbytes, stream=stream)
        self.seq_k = dev.allocate(sk.nbytes, stream=stream)
        self.workspace = dev.allocate(self.params.workspace_bytes, stream=stream)
        upload = rt.host_allocator.allocate(sq.nbytes + sk.nbytes)
        upload.numpy(np.int32)[:] = np.concatenate([sq, sk])
        stream.copy(self.seq_q, upload.view(0, sq.nbytes))
        stream.copy(self.seq_k, upload.view(sq.nbytes, sk.nbytes))
        upload.release()
        self.region = self.params.metadata_region_bytes
        self.consumed = dev.allocate(self.region, stream=stream)
        self.check_host = rt.host_allocator.allocate(self.region)
        self.compute_ops = compute_ops
        self.compute_us = compute_us if compute_us > 0 and _spin_kernel_works(rt, stream) else 0.0
        # memsets of the activations stand in only where no spin kernel runs
        self.activations = None if self.compute_us else dev.allocate(compute_bytes, stream=stream)
        self.prep = WorkspacePrepare(rt, self.params, self.seq_q, self.seq_k, self.workspace)
        self.native_prep = (
            WorkspacePrepare(rt, self.params, self.seq_q, self.seq_k, self.workspace, pack="native") if native_pack_available() else None
        )
        stream.synchronize()

    @property
    def compute_note(self) -> str:
        if self.activations is None:
            return f"{self.compute_ops} x spin kernel {self.compute_us:g} us"
        return f"{self.compute_ops} x memset {self.activations.nbytes} B"

    def compute(self) -> None:
        """The stand-in for the step's matmuls: device work on the main stream that does not need the workspace.

        Spin kernels of ``compute_us`` each (a known device time, the same on a GPU and the
        simulator), or memsets of the activations where no kernel can be built.
        """
        s = self.stream
        if self.activations is None:
            kernels = self.rt.kernels
            for _ in range(self.compute_ops):
                kernels.spin_sleep(s, self.compute_us)
            return
        for i in range(self.compute_ops):
            s.memset(self.activations, i & 0xFF)

    def consume(self) -> None:
        """The stand-in for the kernel that reads the workspace."""
        self.stream.copy(self.consumed, self.workspace.view(0, self.region))

    def step(self, strategy: str) -> None:
        s = self.stream
        join: Callable[[], None] | None = None
        prep = self.prep
        if strategy.endswith(NATIVE_SUFFIX):
            assert self.native_prep is not None  # discover_strategies offers *_native only then
            prep, strategy = self.native_prep, strategy.removesuffix(NATIVE_SUFFIX)
        if strategy == "sync":
            prep.run_sync(s)
        elif strategy == "stream":
            prep.launch(s, "stream")
        elif strategy in ("fork", "fork_graph"):
            run = prep.launch(s, strategy, join=False)
            join = lambda: run.join(s)  # noqa: E731
        elif strategy == "graph":
            prep.replay(s)
        elif strategy != BASELINE:
            from ..recipes.fmha_bwd.pipeline import prepare_workspace

            prepare_workspace(self.rt, s, self.params, self.seq_q, self.seq_k, self.workspace, strategy=strategy)
        self.compute()
        if join is not None:
            join()
        self.consume()

    def check(self) -> bool:
        """Whether the workspace metadata the consumer read equals the numpy oracle."""
        s = self.stream
        s.synchronize()
        self.check_host.numpy()[:] = 0
        s.copy(self.check_host, self.consumed)
        s.synchronize()
        return bool(np.array_equal(self.check_host.numpy(), self.expected))

    def close(self) -> None:
        self.stream.synchronize()
        self.prep.close()
        if self.native_prep is not None:
            self.native_prep.close()
        for b in (self.seq_q, self.seq_k, self.workspace, self.consumed, self.check_host, self.activations):
            if b is not None:
                b.release()


def _spin_kernel_works(rt: Runtime, stream: Any) -> bool:
    """Whether the spin kernel can run here (it needs a kernel compiler on a GPU)."""
    try:
        rt.kernels.spin_sleep(stream, 1.0)
        stream.synchronize()
    except Exception:  # noqa: BLE001 - no compiler or no kernel support: memsets stand in
        return False
    return True


def _timed_steps(w: _Workload, strategy: str, steps: int) -> list[float]:
    """Run ``steps`` steps; return each step's device time (µs) from timing events at step starts."""
    rt, s = w.rt, w.stream
    marks = [rt.create_event(timing=True) for _ in range(steps + 1)]
    try:
        for i in range(steps):
            s.record(marks[i])
            w.step(strategy)
        s.record(marks[steps])
        s.synchronize()
        return [marks[i].elapsed_ms(marks[i + 1]) * 1000.0 for i in range(steps)]
    finally:
        for m in marks:
            m.close()


def run_workload(
    rt: Runtime,
    strategies: Sequence[str],
    *,
    steps: int,
    warmup: int,
    rounds: int,
    trace_steps: int,
    compute_ops: int = 8,
    compute_bytes: int = 48 << 20,
    compute_us: float = 200.0,
    progress: Progress | None = None,
) -> tuple[list[StrategyResult], list[Trace], str]:
    """Measure ``strategies`` (plus the baseline) on ``rt``; return the rows, one trace per strategy and what the compute was."""
    s = rt.create_stream(name=MAIN)
    w = _Workload(rt, s, compute_ops=compute_ops, compute_bytes=compute_bytes, compute_us=compute_us)
    compute_note = w.compute_note
    variants = [BASELINE, *strategies]
    try:
        for v in variants:  # warm-up: allocator caches, worker threads, graph capture
            _timed_steps(w, v, warmup)
            if progress:
                progress.advance(note=f"warm-up {v}")
        times: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(rounds):
            for v in variants:
                times[v] += _timed_steps(w, v, steps)
                if progress:
                    progress.advance(note=v)
        traces: dict[str, Trace] = {}
        correct: dict[str, bool] = {}
        for v in variants:
            start_trace(rt, name=v)
            try:
                for _ in range(trace_steps):
                    w.step(v)
            finally:
                traces[v] = stop_trace(rt)
            correct[v] = w.check() if v != BASELINE else True
            if progress:
                progress.advance(note=f"trace {v}")
    finally:
        w.close()
        s.close()
    base = statistics.median(times[BASELINE])
    rows = []
    for v in variants:
        t = traces[v]
        rep = t.report()
        main = next((st for st in rep.streams if st.stream == MAIN), None)
        main_bubbles = [b for b in rep.bubbles if b.stream == MAIN]
        causes = {c: round(u / trace_steps, 3) for c, u in (main.by_cause.items() if main else ())}
        med = statistics.median(times[v])
        rows.append(
            StrategyResult(
                name=v,
                step_us=round(med, 3),
                added_us=round(med - base, 3),
                host_blocked_us=round(t.host_blocked_us / trace_steps, 3),
                bubbles=round(len(main_bubbles) / trace_steps, 3),
                bubble_us=round(sum(b.duration_us for b in main_bubbles) / trace_steps, 3),
                bubble_causes=causes,
                critical_path={k: round(u, 3) for k, u in rep.critical_path_by_kind().items()},
                correct=correct[v],
                steps_measured=len(times[v]),
                step_spread_us=round(max(times[v]) - min(times[v]), 3),
            )
        )
    return rows, [traces[v] for v in variants], compute_note


def run_demo(
    backend: str = "auto",
    *,
    out_dir: str = ".",
    steps: int | None = None,
    warmup: int | None = None,
    rounds: int | None = None,
    trace_steps: int = 2,
    profile: str | None = None,
    plot: bool = True,
    json_path: str | None = None,
    compute_ops: int = 8,
    compute_bytes: int = 48 << 20,
    compute_us: float = 200.0,
    out: IO[str] | None = None,
) -> int:
    """Run the demo and print the comparison; returns the exit status (0 ok, 1 a strategy computed wrong metadata).

    The counts are at least 1 (``warmup`` at least 0, ``compute_us`` not negative): the
    parser's option types see to that. Raises :class:`~.inputs.CommandError` before
    anything runs for a ``profile`` that is not a simulator profile or goes with a GPU
    backend, and for an ``out_dir`` or ``json_path`` that cannot be written.
    """
    out = out or sys.stdout
    options: dict[str, Any] = {}
    if profile is not None:
        if backend not in ("sim", "auto"):
            raise CommandError(f"--profile configures the simulator: use it with --backend sim, not {backend}")
        backend = "sim"
        options["profile"] = load_profile(profile)
    with open_runtime_for(backend, **options) as rt:
        output_dir(out_dir)
        if json_path:
            output_file(json_path, "--json")
        caps = rt.capabilities
        simulated = caps.virtual_clock
        steps = steps if steps is not None else (3 if simulated else 30)
        warmup = warmup if warmup is not None else (1 if simulated else 5)
        rounds = rounds if rounds is not None else (1 if simulated else 3)
        infos = discover_strategies(rt)
        runnable = [i.name for i in infos if i.available]
        skipped = tuple(i for i in infos if not i.available)
        print(f"streamrt demo on {rt.backend_name}: {caps.device_name} ({caps.architecture})", file=out)
        print(
            f"workload: group-mode FMHA bwd workspace prepare + {compute_ops} compute ops "
            "(a stand-in for the step's matmuls) + a consumer; "
            f"{rounds} round(s) x {steps} steps per strategy, interleaved",
            file=out,
        )
        for i in skipped:
            print(f"  skipping {i.name}: {i.note}", file=out)
        total = (len(runnable) + 1) * (2 + rounds)
        with Progress(total, "demo", stream=sys.stderr) as bar:
            rows, traces, compute_note = run_workload(
                rt, runnable, steps=steps, warmup=warmup, rounds=rounds, trace_steps=trace_steps,
                compute_ops=compute_ops, compute_bytes=compute_bytes, compute_us=compute_us, progress=bar,
            )  # fmt: skip
        result = DemoResult(
            backend=rt.backend_name,
            device_name=caps.device_name,
            clock="virtual" if simulated else "events",
            compute=compute_note,
            results=tuple(rows),
            skipped=skipped,
        )
    print("", file=out)
    print(result.table(), file=out)
    print(f"compute per step: {result.compute}", file=out)
    print("", file=out)
    print(
        "step us: median device time per step (virtual on the simulator); GPU time added: vs the 'none' baseline; "
        "host blocked and bubbles: per step, on the main stream, from a traced run.",
        file=out,
    )
    trace_path = os.path.join(out_dir, "trace.json")
    from .._trace_export import save_chrome, save_timeline

    save_chrome(traces, trace_path)
    timeline_path: str | None = os.path.join(out_dir, "timeline.png")
    notes: list[str] = []
    if plot:
        try:
            save_timeline(traces, timeline_path, title=f"streamrt demo: seed workload per strategy ({result.backend}: {result.device_name})")  # type: ignore[arg-type]
        except ImportError as exc:
            timeline_path = None
            notes.append(f"timeline.png not written: {exc}")
    else:
        timeline_path = None
    print(f"\nwrote {trace_path}" + (f" and {timeline_path}" if timeline_path else ""), file=out)
    for n in notes:
        print(n, file=out)
    print(
        f"open {trace_path} in https://ui.perfetto.dev (Open trace file) or chrome://tracing (Load): "
        "one device process (a track per stream, plus bubble tracks) and one host process per strategy.",
        file=out,
    )
    result = dataclasses.replace(result, trace_path=trace_path, timeline_path=timeline_path, notes=tuple(notes))
    if json_path:
        with open(json_path, "w", encoding="utf-8") as fh:
            json.dump(result.as_dict(), fh, indent=2)
        print(f"wrote {json_path}", file=out)
    return 0 if all(r.correct for r in result.results) else 1
