"""The ``streamrt`` command (``python -m streamrt``): demo, study, doctor, bench, calibrate, fidelity.

One module per command (:mod:`.demo`, :mod:`.study`, :mod:`.doctor`,
:mod:`.bench`, :mod:`.calibrate`, :mod:`.fidelity`), imported only when its
command runs, so ``streamrt doctor`` works even where a backend library is
broken; :mod:`.parser` holds the options, :mod:`.inputs` the checks of files
and folders, :mod:`.progress` the progress bar. :func:`main` returns the exit
status instead of exiting, so tests call it in-process.

Exit status:

* 0: the command did what was asked (and its check passed).
* 1: the command ran and its check failed (``demo``: a strategy computed
  wrong metadata; ``bench``: a benchmark failed; ``fidelity``: the goal is
  not met; ``doctor``: no backend is usable; ``study``: the script failed);
  or the system refused an operation on the way (a full disk):
  ``streamrt <command>: error: <message>``; or streamrt hit an internal
  error, which prints one line,
  ``streamrt <command>: internal error: <type>: <message> (a bug in streamrt; run with --debug for the traceback)``.
* 2: a mistake in the command line or its inputs (an option's value, a file
  that is missing or not what it should be, a folder that cannot be made, a
  backend that is not available here): one line,
  ``streamrt <command>: error: <message>``, and no traceback.
* 130: interrupted (Ctrl-C).

``--debug`` (before or after the command) prints the traceback as well.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Sequence

from .._errors import BackendUnavailableError
from .inputs import CommandError
from .parser import build_parser

__all__ = ["CommandError", "build_parser", "main"]

# What a user can get wrong (exit status 2). A backend that is missing here is the user's
# choice of backend (or of machine), not a bug; its message says what to install.
_USER_ERRORS = (CommandError, BackendUnavailableError)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors: argparse has printed them
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    try:
        status = _dispatch(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
        return status
    except KeyboardInterrupt:
        return _failed(args, "interrupted", 130)
    except _USER_ERRORS as exc:
        return _failed(args, f"error: {exc}", 2)
    except BrokenPipeError:  # the reader of the output went away (`streamrt doctor | head -3`)
        _discard_stdout()
        return 1
    except OSError as exc:  # the system refused an operation on the way (a full disk, a folder gone)
        return _failed(args, f"error: {exc}", 1)
    except Exception as exc:
        hint = "" if args.debug else " (a bug in streamrt; run with --debug for the traceback)"
        return _failed(args, f"internal error: {type(exc).__name__}: {exc}{hint}", 1)


def _failed(args: argparse.Namespace, line: str, status: int) -> int:
    """Print ``streamrt <command>: <line>`` to stderr (under the traceback with ``--debug``); return ``status``."""
    if args.debug:
        traceback.print_exc()
    print(f"streamrt {args.command}: {line}", file=sys.stderr)
    return status


def _discard_stdout() -> None:
    """Point stdout at the null device, so that the interpreter's flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file (an in-process caller's stream)
        pass


def _dispatch(args: argparse.Namespace) -> int:
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
    raise AssertionError(f"no handler for the command {args.command!r}")  # the parser offers only the commands above
