"""``streamrt bench``: run the benchmark suite and write ``bench.json`` and ``bench.md``.

The suite is a directory of scripts (default: the repository's ``demos/bench``).
Each script is run in its own Python process as
``python SCRIPT --backend BACKEND --out RESULT.json``, where ``BACKEND`` is the
one ``--backend auto`` resolves to here (the simulator on a machine without a
GPU), and must write its results there as a JSON object. A script that cannot
run on this machine (it needs a library or a device that is not here) exits
with status 77 (:data:`SKIP_STATUS`, the "skipped" of automake and meson) and
writes why as its last line on stderr: it is recorded as skipped, with that
reason. A script that fails otherwise, times out or writes no JSON is recorded
as failed, with the tail of its output. A progress bar shows which script runs.

``bench.json`` holds every result with the machine description; ``bench.md``
renders each script's JSON as a markdown table (rows from nested objects,
columns from their keys). Exit status: 0 when no script failed (skipped ones
do not count), 1 otherwise; 2 for bad input (an unknown ``--only`` name, a
missing suite, a backend that is not available here), before any script runs.

Blocking: runs the scripts one after another.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Sequence

from .._version import __version__
from .inputs import CommandError, output_dir
from .progress import Progress

__all__ = ["SKIP_STATUS", "default_suite", "markdown_report", "run_bench"]

#: The exit status of a benchmark that cannot run here; its last line on stderr says why.
SKIP_STATUS = 77


def default_suite() -> Path | None:
    """The repository's ``demos/bench`` next to the installed package (editable installs), if present."""
    here = Path(__file__).resolve().parents[2] / "demos" / "bench"
    return here if here.is_dir() else None


def _scripts(suite: Path, only: Sequence[str] | None) -> list[Path]:
    scripts = sorted(p for p in suite.glob("*.py") if not p.name.startswith("_"))
    if only:
        wanted = set(only)
        unknown = sorted(wanted - {p.stem for p in scripts})
        if unknown:
            have = ", ".join(p.stem for p in scripts) or "none"
            raise CommandError(f"--only: no benchmark named {', '.join(map(repr, unknown))} in {suite} (have: {have})")
        scripts = [p for p in scripts if p.stem in wanted]
    return scripts


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def _run_one(script: Path, backend: str, out_json: Path, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, str(script), "--backend", backend, "--out", str(out_json)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        tail = _text(exc.stdout) + _text(exc.stderr)
        return {"status": "timeout", "seconds": round(time.perf_counter() - t0, 3), "output": tail[-2000:]}
    seconds = round(time.perf_counter() - t0, 3)
    output = (proc.stdout + proc.stderr)[-2000:]
    if proc.returncode == SKIP_STATUS:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        return {"status": "skipped", "seconds": seconds, "reason": lines[-1] if lines else "(the script gave no reason)"}
    if proc.returncode != 0:
        return {"status": "failed", "returncode": proc.returncode, "seconds": seconds, "output": output}
    try:
        with open(out_json, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        return {"status": "failed", "seconds": seconds, "output": output, "error": f"no JSON result: {exc}"}
    return {"status": "ok", "seconds": seconds, "result": data}


def _backend(backend: str) -> str:
    """``backend`` resolved (``auto``: the best one here); ``CommandError`` when it is not available here."""
    from .._backends import probe_backend, select_auto

    if backend == "auto":
        return select_auto()
    reason = probe_backend(backend)
    if reason is not None:
        raise CommandError(f"backend {backend!r} is not available: {reason}")
    return backend


def _rows(obj: Any, prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Flatten nested dicts into (row name, {column: scalar}) pairs for a table."""
    if not isinstance(obj, dict):
        return [(prefix or "value", {"value": obj})]
    scalars = {k: v for k, v in obj.items() if not isinstance(v, (dict, list))}
    nested = {k: v for k, v in obj.items() if isinstance(v, dict)}
    rows: list[tuple[str, dict[str, Any]]] = []
    if scalars and (not nested or prefix):
        rows.append((prefix or "-", scalars))
    for k, v in nested.items():
        rows += _rows(v, f"{prefix}.{k}" if prefix else k)
    return rows


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:.1f}"
    return str(v)


def markdown_report(report: dict[str, Any]) -> str:
    """``bench.md``: one section per benchmark, its JSON as tables."""
    lines = [
        "# streamrt benchmarks",
        "",
        f"backend `{report['backend']}`, streamrt {report['streamrt']}, python {report['python']}, {report['date']}",
        "",
    ]
    for name, entry in report["benchmarks"].items():
        lines += [f"## {name}", "", f"status: {entry['status']}, {entry['seconds']} s", ""]
        if entry["status"] == "skipped":
            lines += [f"skipped: {entry['reason']}", ""]
            continue
        if entry["status"] != "ok":
            lines += ["```", entry.get("output", "").strip()[-1500:], "```", ""]
            continue
        # Consecutive rows with the same columns share one table.
        groups: list[tuple[list[str], list[tuple[str, dict[str, Any]]]]] = []
        for rname, row in _rows(entry["result"]):
            cols = list(row)
            if groups and groups[-1][0] == cols:
                groups[-1][1].append((rname, row))
            else:
                groups.append((cols, [(rname, row)]))
        for cols, rows in groups:
            lines.append("| row | " + " | ".join(cols) + " |")
            lines.append("| --- |" + " --- |" * len(cols))
            for rname, row in rows:
                lines.append(f"| {rname} | " + " | ".join(_fmt(row.get(c, "")) for c in cols) + " |")
            lines.append("")
    return "\n".join(lines)


def run_bench(
    backend: str = "auto",
    *,
    out_dir: str = "bench-results",
    suite: str | None = None,
    only: Sequence[str] | None = None,
    timeout: float = 600.0,
    out: IO[str] | None = None,
) -> int:
    """Run the suite; write ``bench.json``/``bench.md`` into ``out_dir``. Returns the exit status.

    Raises :class:`~.inputs.CommandError` before any script runs for a suite that is not
    a folder, an ``only`` name that is not in it, a backend that is not available here,
    or an ``out_dir`` that cannot be made.
    """
    out = out or sys.stdout
    suite_dir = Path(suite) if suite else default_suite()
    if suite_dir is None:
        raise CommandError("no benchmark suite found: pass --suite DIR (the repository keeps it in demos/bench)")
    if not suite_dir.is_dir():
        raise CommandError(f"--suite {str(suite_dir)!r} is not a folder")
    scripts = _scripts(suite_dir, only)
    resolved = _backend(backend)
    output_dir(out_dir)
    report: dict[str, Any] = {
        "backend": resolved,
        "streamrt": __version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "benchmarks": {},
    }
    counts = {"ok": 0, "skipped": 0, "failed": 0}
    with Progress(len(scripts), "bench", stream=sys.stderr) as bar:
        for script in scripts:
            bar.advance(0, note=script.stem)
            entry = _run_one(script, resolved, Path(out_dir) / f"{script.stem}.json", timeout)
            report["benchmarks"][script.stem] = entry
            status = entry["status"]
            counts[status if status in counts else "failed"] += 1
            bar.advance(1, note=f"{script.stem}: {status}")
            why = f": {entry['reason']}" if status == "skipped" else ""
            bar.echo(f"{script.stem}: {status} ({entry['seconds']} s){why}", file=out)
    with open(Path(out_dir) / "bench.json", "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=2)
    with open(Path(out_dir) / "bench.md", "w", encoding="utf-8") as fh:
        fh.write(markdown_report(report) + "\n")
    print(f"{counts['ok']} ok, {counts['skipped']} skipped, {counts['failed']} failed on {resolved}", file=out)
    print(f"wrote {Path(out_dir) / 'bench.json'} and {Path(out_dir) / 'bench.md'}", file=out)
    return 1 if counts["failed"] else 0
