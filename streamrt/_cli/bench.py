"""``streamrt bench``: run the benchmark suite and write ``bench.json`` and ``bench.md``.

The suite is a directory of scripts (default: the repository's ``demos/bench``).
Each script is run in its own Python process as
``python SCRIPT --backend BACKEND --out RESULT.json`` and must write its results
there as a JSON object; a script that fails, times out or writes no JSON is
recorded as failed, with the tail of its output. A progress bar shows which
script runs.

``bench.json`` holds every result with the machine description; ``bench.md``
renders each script's JSON as a markdown table (rows from nested objects,
columns from their keys). Exit status: 0 when every script succeeded, 1 otherwise.

Blocking: runs the scripts one after another.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Sequence

from .progress import Progress

__all__ = ["default_suite", "markdown_report", "run_bench"]


def default_suite() -> Path | None:
    """The repository's ``demos/bench`` next to the installed package (editable installs), if present."""
    here = Path(__file__).resolve().parents[2] / "demos" / "bench"
    return here if here.is_dir() else None


def _scripts(suite: Path, only: Sequence[str] | None) -> list[Path]:
    scripts = sorted(p for p in suite.glob("*.py") if not p.name.startswith("_"))
    if only:
        wanted = set(only)
        unknown = wanted - {p.stem for p in scripts}
        if unknown:
            raise ValueError(f"no benchmark named {sorted(unknown)} in {suite} (have: {', '.join(p.stem for p in scripts)})")
        scripts = [p for p in scripts if p.stem in wanted]
    return scripts


def _run_one(script: Path, backend: str, out_json: Path, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, str(script), "--backend", backend, "--out", str(out_json)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stdout or "") if isinstance(exc.stdout, str) else ""
        return {"status": "timeout", "seconds": round(time.perf_counter() - t0, 3), "output": tail[-2000:]}
    seconds = round(time.perf_counter() - t0, 3)
    output = (proc.stdout + proc.stderr)[-2000:]
    if proc.returncode != 0:
        return {"status": "failed", "returncode": proc.returncode, "seconds": seconds, "output": output}
    try:
        with open(out_json, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        return {"status": "failed", "seconds": seconds, "output": output, "error": f"no JSON result: {exc}"}
    return {"status": "ok", "seconds": seconds, "result": data}


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
    """Run the suite; write ``bench.json``/``bench.md`` into ``out_dir``. Returns the exit status."""
    from .. import __version__

    out = out or sys.stdout
    suite_dir = Path(suite) if suite else default_suite()
    if suite_dir is None or not suite_dir.is_dir():
        print("streamrt bench: no benchmark suite found (pass --suite DIR; the repository keeps it in demos/bench)", file=out)
        return 2
    scripts = _scripts(suite_dir, only)
    os.makedirs(out_dir, exist_ok=True)
    from .._backends import select_auto

    resolved = select_auto() if backend == "auto" else backend
    report: dict[str, Any] = {
        "backend": resolved,
        "streamrt": __version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "benchmarks": {},
    }
    failed = 0
    with Progress(len(scripts), "bench", stream=sys.stderr) as bar:
        for script in scripts:
            bar.advance(0, note=script.stem)
            entry = _run_one(script, resolved, Path(out_dir) / f"{script.stem}.json", timeout)
            report["benchmarks"][script.stem] = entry
            failed += entry["status"] != "ok"
            bar.advance(1, note=f"{script.stem}: {entry['status']}")
            print(f"{script.stem}: {entry['status']} ({entry['seconds']} s)", file=out)
    with open(Path(out_dir) / "bench.json", "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=2)
    with open(Path(out_dir) / "bench.md", "w", encoding="utf-8") as fh:
        fh.write(markdown_report(report) + "\n")
    print(f"wrote {Path(out_dir) / 'bench.json'} and {Path(out_dir) / 'bench.md'}", file=out)
    return 1 if failed else 0
