"""The ``streamrt`` command line: its subcommands, their options and the option types.

Options that take a count or a time are checked as they are parsed: a wrong
value is an argparse usage error (``streamrt <command>: error: argument ...``,
exit status 2) before anything runs.
"""

from __future__ import annotations

import argparse
import math

from .._backends import BACKEND_NAMES
from .._version import __version__

__all__ = ["BACKENDS", "build_parser", "non_negative_float", "non_negative_int", "positive_float", "positive_int"]

#: What ``--backend`` accepts.
BACKENDS = ("auto", *BACKEND_NAMES)


def _integer(text: str, *, least: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
    return value


def _number(text: str, *, positive: bool, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An int >= 1 (argparse ``type=``)."""
    return _integer(text, least=1, what="a positive integer")


def non_negative_int(text: str) -> int:
    """An int >= 0 (argparse ``type=``)."""
    return _integer(text, least=0, what="an integer >= 0")


def positive_float(text: str) -> float:
    """A finite number > 0 (argparse ``type=``)."""
    return _number(text, positive=True, what="a positive number")


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (argparse ``type=``)."""
    return _number(text, positive=False, what="a number >= 0")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``streamrt``: ``--version``, ``--debug`` (before or after the command) and six commands."""
    debug_help = "on an error, print its traceback too"
    parser = argparse.ArgumentParser(
        prog="streamrt",
        description="streamrt: stream scheduling for HIP/CUDA GPUs and a simulator; study tools",
        epilog="exit status: 0 done; 1 a check failed, or an error on the way; 2 a mistake in the command line or its inputs. See docs/cli.md.",
    )
    parser.add_argument("--version", action="version", version=f"streamrt {__version__}")
    parser.add_argument("--debug", action="store_true", help=debug_help)
    # --debug after the command as well; SUPPRESS keeps a command without it from resetting it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, parents=[common])

    backend_help = "auto (default), " + ", ".join(BACKEND_NAMES)

    demo = command("demo", "run the seed workload in every strategy, compare, write trace.json and timeline.png")
    demo.add_argument("--backend", default="auto", choices=BACKENDS, help=backend_help)
    demo.add_argument("--out-dir", default=".", help="where trace.json and timeline.png go (default: the current directory)")
    demo.add_argument("--steps", type=positive_int, default=None, help="measured steps per strategy and round (default: 3 on sim, 30 on a GPU)")
    demo.add_argument("--rounds", type=positive_int, default=None, help="interleaved rounds (default: 1 on sim, 3 on a GPU)")
    demo.add_argument("--warmup", type=non_negative_int, default=None, help="warm-up steps per strategy (default: 1 on sim, 5 on a GPU)")
    demo.add_argument("--trace-steps", type=positive_int, default=2, help="steps in each strategy's traced run (default 2)")
    demo.add_argument("--profile", default=None, help="a SimProfile JSON (from `streamrt calibrate`): runs the simulator with it")
    demo.add_argument("--json", dest="json_path", default=None, help="also write the results as JSON to this file")
    demo.add_argument("--no-plot", action="store_true", help="do not draw timeline.png")
    demo.add_argument("--compute-ops", type=positive_int, default=8, help="compute ops per step (the stand-in for the step's matmuls; default 8)")
    demo.add_argument(
        "--compute-us", type=non_negative_float, default=200.0, help="device time of each compute op, a spin kernel (default 200; 0: memsets)"
    )
    demo.add_argument(
        "--compute-mib", type=positive_int, default=48, help="MiB each compute op sets when memsets stand in (no kernel compiler, or --compute-us 0)"
    )

    study = command("study", "run a Python script with tracing on; write trace.json, timeline.png and a report")
    study.add_argument("script", help="the script to run (as __main__)")
    study.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    study.add_argument("--out-dir", default=".", help="where trace.json and timeline.png go")
    study.add_argument("--no-plot", action="store_true", help="do not draw timeline.png")

    doctor = command("doctor", "which backends, GPUs and libraries are present, and how to get the missing ones")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")

    bench = command("bench", "run the benchmark suite (demos/bench); write bench.json and bench.md")
    bench.add_argument("--backend", default="auto", choices=BACKENDS, help=backend_help)
    bench.add_argument("--out-dir", default="bench-results", help="where the JSON and markdown go (default: bench-results)")
    bench.add_argument("--suite", default=None, help="directory of benchmark scripts (default: the repository's demos/bench)")
    bench.add_argument("--only", action="append", default=None, help="run only this benchmark (script name without .py); repeatable")
    bench.add_argument("--timeout", type=positive_float, default=600.0, help="seconds per benchmark before it is stopped (default 600)")

    cal = command("calibrate", "measure the cost-model constants of this GPU into a SimProfile JSON")
    cal.add_argument("--backend", default="auto", choices=BACKENDS, help=backend_help + "; sim checks the procedure against the simulator")
    cal.add_argument("--device", type=non_negative_int, default=0, help="device index (default 0)")
    cal.add_argument("--out", default=None, help="profile file to write (default: sim-profile-<device>.json)")
    cal.add_argument("--repeats", type=positive_int, default=7, help="samples per figure, in interleaved rounds; medians are kept (default 7)")
    cal.add_argument("--quick", action="store_true", help="small sizes and fewer repetitions (a rough profile in seconds)")

    fid = command("fidelity", "compare a GPU's `demo --json` with the simulator's, per strategy (±tolerance, ranking)")
    fid.add_argument("gpu", help="`streamrt demo --json` result measured on the GPU")
    fid.add_argument("sim", help="`streamrt demo --json` result of the simulator with that GPU's calibrated profile")
    fid.add_argument("--tolerance", type=positive_float, default=0.25, help="allowed relative error of the added time (default 0.25)")
    return parser
