"""The ``streamrt`` command (``python -m streamrt``): demo, study, doctor, bench, calibrate, fidelity.

Each subcommand is a thin layer over a function of its own module (``_demo``,
``_study``, ``_doctor``, ``_bench``, ``_calibrate``, ``_fidelity``), imported only when the
subcommand runs, so ``streamrt doctor`` works even where a backend library is
broken. :func:`main` returns the exit status instead of exiting, so tests call
it in-process.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamrt",
        description="streamrt: stream scheduling for HIP/CUDA GPUs and a simulator; study tools",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")

    demo = sub.add_parser("demo", help="run the seed workload in every strategy, compare, write trace.json and timeline.png")
    demo.add_argument("--backend", default="auto", help="auto (default), cuda, hip or sim")
    demo.add_argument("--out-dir", default=".", help="where trace.json and timeline.png go (default: the current directory)")
    demo.add_argument("--steps", type=int, default=None, help="measured steps per strategy and round (default: 3 on sim, 30 on a GPU)")
    demo.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default: 1 on sim, 3 on a GPU)")
    demo.add_argument("--warmup", type=int, default=None, help="warm-up steps per strategy")
    demo.add_argument("--trace-steps", type=int, default=2, help="steps in each strategy's traced run (default 2)")
    demo.add_argument("--profile", default=None, help="a SimProfile JSON (from `streamrt calibrate`): runs the simulator with it")
    demo.add_argument("--json", dest="json_path", default=None, help="also write the results as JSON to this file")
    demo.add_argument("--no-plot", action="store_true", help="do not draw timeline.png")
    demo.add_argument("--compute-ops", type=int, default=8, help="compute ops per step (the stand-in for the step's matmuls; default 8)")
    demo.add_argument("--compute-us", type=float, default=200.0, help="device time of each compute op, a spin kernel (default 200; 0: memsets)")
    demo.add_argument("--compute-mib", type=int, default=48, help="MiB each compute op sets when memsets stand in (no kernel compiler, or --compute-us 0)")

    study = sub.add_parser("study", help="run a Python script with tracing on; write trace.json, timeline.png and a report")
    study.add_argument("script", help="the script to run (as __main__)")
    study.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    study.add_argument("--out-dir", default=".", help="where trace.json and timeline.png go")
    study.add_argument("--no-plot", action="store_true", help="do not draw timeline.png")

    doctor = sub.add_parser("doctor", help="which backends, GPUs and libraries are present, and how to get the missing ones")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")

    bench = sub.add_parser("bench", help="run the benchmark suite (demos/bench); write bench.json and bench.md")
    bench.add_argument("--backend", default="auto", help="auto (default), cuda, hip or sim")
    bench.add_argument("--out-dir", default="bench-results", help="where the JSON and markdown go (default: bench-results)")
    bench.add_argument("--suite", default=None, help="directory of benchmark scripts (default: the repository's demos/bench)")
    bench.add_argument("--only", action="append", default=None, help="run only this benchmark (script name without .py); repeatable")
    bench.add_argument("--timeout", type=float, default=600.0, help="seconds per benchmark before it is stopped (default 600)")

    cal = sub.add_parser("calibrate", help="measure the cost-model constants of this GPU into a SimProfile JSON")
    cal.add_argument("--backend", default="auto", help="auto (default), cuda or hip; sim checks the procedure against the simulator")
    cal.add_argument("--device", type=int, default=0)
    cal.add_argument("--out", default=None, help="profile file to write (default: sim-profile-<device>.json)")
    cal.add_argument("--repeats", type=int, default=7, help="samples per figure, in interleaved rounds; medians are kept (default 7)")
    cal.add_argument("--quick", action="store_true", help="small sizes and fewer repetitions (a rough profile in seconds)")

    fid = sub.add_parser("fidelity", help="compare a GPU's `demo --json` with the simulator's, per strategy (±tolerance, ranking)")
    fid.add_argument("gpu", help="`streamrt demo --json` result measured on the GPU")
    fid.add_argument("sim", help="`streamrt demo --json` result of the simulator with that GPU's calibrated profile")
    fid.add_argument("--tolerance", type=float, default=0.25, help="allowed relative error of the added time (default 0.25)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo

        return run_demo(
            args.backend,
            out_dir=args.out_dir,
            steps=args.steps,
            warmup=args.warmup,
            rounds=args.rounds,
            trace_steps=args.trace_steps,
            profile=args.profile,
            plot=not args.no_plot,
            json_path=args.json_path,
            compute_ops=args.compute_ops,
            compute_bytes=args.compute_mib << 20,
            compute_us=args.compute_us,
        )
    if args.command == "study":
        from .study import run_study

        return run_study(args.script, args.args, out_dir=args.out_dir, plot=not args.no_plot)
    if args.command == "doctor":
        from .doctor import run_doctor

        return run_doctor(as_json=args.json)
    if args.command == "bench":
        from .bench import run_bench

        return run_bench(args.backend, out_dir=args.out_dir, suite=args.suite, only=args.only, timeout=args.timeout)
    if args.command == "calibrate":
        from .calibrate import run_calibrate

        return run_calibrate(args.backend, device=args.device, out=args.out, repeats=args.repeats, quick=args.quick)
    if args.command == "fidelity":
        from .fidelity import run_fidelity

        return run_fidelity(args.gpu, args.sim, tolerance=args.tolerance)
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
