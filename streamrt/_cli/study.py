"""``streamrt study script.py``: run a user script with tracing on and write what it did.

Every runtime the script opens with ``open_runtime(...)`` (leaving ``trace``
at its default) is traced from the moment it opens until it closes (or the
script ends). Afterwards the study prints each trace's report (host blocking,
bubbles, overlap, critical path) and writes ``trace.json`` (all traces side by
side) and ``timeline.png`` to ``out_dir``.

The script runs in this process as ``__main__`` with ``sys.argv`` set to
``[script, *args]``; ``sys.exit`` in it ends the script, not the study. An
exception in the script is printed and makes the exit status 1, but what was
traced until then is still written.

Blocking: runs the script to completion. Thread rules: call from the main thread.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from typing import IO, Sequence

from .._trace import study_session
from .inputs import CommandError, output_dir

__all__ = ["run_study"]


def run_study(script: str, args: Sequence[str] = (), *, out_dir: str = ".", plot: bool = True, out: IO[str] | None = None) -> int:
    """Run ``script`` traced; print reports and write the trace files. Returns the exit status.

    Raises :class:`~.inputs.CommandError` when ``script`` is not a file or ``out_dir`` cannot be made.
    """
    out = out or sys.stdout
    if not os.path.isfile(script):
        raise CommandError(f"{script!r}: no such file" if not os.path.exists(script) else f"{script!r} is not a file")
    output_dir(out_dir)
    status = 0
    saved_argv = sys.argv
    saved_path = list(sys.path)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    with study_session() as session:
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            code = exc.code
            status = code if isinstance(code, int) else (0 if code is None else 1)
        except Exception:  # the user's bug: report it, keep what was traced
            traceback.print_exc()
            status = 1
        finally:
            sys.argv = saved_argv
            sys.path[:] = saved_path
    traces = session.traces
    if not traces:
        print(
            "streamrt study: the script opened no runtime (or opened it with trace=False): nothing was traced",
            file=out,
        )
        return status or 1
    for t in traces:
        print(t.report(), file=out)
        print("", file=out)
    from .._trace_export import save_chrome, save_timeline

    trace_path = os.path.join(out_dir, "trace.json")
    save_chrome(traces, trace_path)
    written = [trace_path]
    if plot:
        timeline_path = os.path.join(out_dir, "timeline.png")
        try:
            save_timeline(traces, timeline_path, title=f"streamrt study: {os.path.basename(script)}")
            written.append(timeline_path)
        except ImportError as exc:
            print(f"timeline.png not written: {exc}", file=out)
    print(f"wrote {' and '.join(written)}", file=out)
    print(f"open {trace_path} in https://ui.perfetto.dev (Open trace file) or chrome://tracing (Load)", file=out)
    return status
