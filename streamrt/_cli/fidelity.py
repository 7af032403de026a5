"""``streamrt fidelity``: how well the simulator predicted a GPU's ``streamrt demo``.

Compares two ``streamrt demo --json`` results of the same workload: one from
a GPU (the reference) and one from the simulator running a profile calibrated
on that GPU (``streamrt calibrate``). Per strategy it puts the GPU time added
per step side by side and checks

* the prediction error: ``|sim - gpu| <= tolerance * max(|gpu|, floor)``
  (±25 % by default), where ``floor`` is ``floor_fraction`` (5 %) of the
  GPU's baseline step time. The floor matters only for strategies that add
  almost nothing (a fork that hides the prepare): a relative error of a
  near-zero figure means nothing, so such a row is judged against 25 % of 5 %
  of the step instead, and says so (``near zero``);
* the ranking: every pair of strategies the GPU orders clearly must be
  ordered the same way by the simulator. Clearly: the larger added time
  exceeds the smaller by more than the tolerance allows a prediction to be
  off (``tolerance * max(|smaller|, floor)``). Closer pairs are tied: when
  each figure may be predicted 25 % off, their order cannot be demanded.

Non-blocking, pure: reads two JSON files, prints a table.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import IO, Any

from .inputs import CommandError, read_json

__all__ = ["FidelityReport", "FidelityRow", "compare_demos", "run_fidelity"]

BASELINE = "none"


@dataclass(frozen=True)
class FidelityRow:
    """One strategy: GPU and simulated added time per step (µs), the error, and the verdict."""

    strategy: str
    gpu_added_us: float
    sim_added_us: float
    error: float | None  # (sim - gpu) / |gpu|; None when |gpu| is under the floor
    within: bool

    @property
    def basis(self) -> str:
        return "relative" if self.error is not None else "near zero"


@dataclass(frozen=True)
class FidelityReport:
    """The comparison: one row per strategy both runs measured, and the two rankings."""

    rows: tuple[FidelityRow, ...]
    gpu_ranking: tuple[str, ...]
    sim_ranking: tuple[str, ...]
    tolerance: float
    floor_us: float
    misordered: tuple[tuple[str, str], ...]  # (a, b): the GPU adds clearly less for a; the simulator does not
    gpu_device: str
    sim_device: str

    @property
    def same_ranking(self) -> bool:
        return not self.misordered

    @property
    def all_within(self) -> bool:
        return all(r.within for r in self.rows)

    @property
    def met(self) -> bool:
        return self.all_within and self.same_ranking

    def table(self) -> str:
        head = ("strategy", "GPU added us", "sim added us", "error", f"within ±{self.tolerance:.0%}")
        body = [
            (
                r.strategy,
                f"{r.gpu_added_us:+.1f}",
                f"{r.sim_added_us:+.1f}",
                f"{r.error:+.1%}" if r.error is not None else "n/a",
                ("yes" if r.within else "NO") + ("" if r.error is not None else f" (near zero: ±{self.tolerance * self.floor_us:.1f} us)"),
            )
            for r in self.rows
        ]
        widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(head)]
        line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
        lines = [f"GPU: {self.gpu_device}   simulator: {self.sim_device}", line(head), line(tuple("-" * w for w in widths))]
        lines += [line(row) for row in body]
        lines.append(f"ranking by added time, GPU:       {' < '.join(self.gpu_ranking)}")
        lines.append(f"ranking by added time, simulator: {' < '.join(self.sim_ranking)}")
        for a, b in self.misordered:
            lines.append(f"misordered: the GPU adds clearly less for {a} than for {b}; the simulator does not")
        lines.append(
            f"same ranking (pairs within ±{self.tolerance:.0%} on the GPU tied): {'yes' if self.same_ranking else 'NO'}; "
            f"every strategy within tolerance: {'yes' if self.all_within else 'NO'}"
        )
        return "\n".join(lines)


def _strategies(result: dict[str, Any], what: str) -> dict[str, dict[str, float]]:
    """``{strategy: {"step_us": ..., "added_us": ...}}`` of a demo result."""
    try:
        rows = {str(r["name"]): {k: float(r[k]) for k in ("step_us", "added_us")} for r in result["results"]}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"the {what} file is not a `streamrt demo --json` result (no results list of name, step_us, added_us)") from exc
    if BASELINE not in rows:
        raise ValueError(f"the {what} result has no {BASELINE!r} baseline row")
    return rows


def compare_demos(gpu: dict[str, Any], sim: dict[str, Any], *, tolerance: float = 0.25, floor_fraction: float = 0.05) -> FidelityReport:
    """Compare a GPU demo result with a simulated one (both as written by ``streamrt demo --json``).

    Raises ``ValueError`` when either is not a demo result, when the GPU one
    ran on a virtual clock or the simulated one did not, or when they share
    no strategy besides the baseline.
    """
    if not tolerance > 0 or not floor_fraction >= 0:
        raise ValueError(f"tolerance must be positive and floor_fraction not negative, got {tolerance}, {floor_fraction}")
    for what, result in (("GPU", gpu), ("simulator", sim)):
        if not isinstance(result, dict):
            raise ValueError(f"the {what} file is not a `streamrt demo --json` result (a JSON {type(result).__name__}, not an object)")
    if gpu.get("clock") == "virtual":
        raise ValueError("the GPU file comes from the simulator (virtual clock): pass a GPU run first")
    if sim.get("clock") != "virtual":
        raise ValueError("the simulator file was not measured on the simulator's virtual clock")
    g, s = _strategies(gpu, "GPU"), _strategies(sim, "simulator")
    names = [n for n in g if n in s and n != BASELINE]
    if not names:
        raise ValueError("the two results share no strategy besides the baseline")
    floor = floor_fraction * g[BASELINE]["step_us"]
    rows = []
    for n in names:
        ga, sa = g[n]["added_us"], s[n]["added_us"]
        err = (sa - ga) / abs(ga) if abs(ga) >= floor and ga != 0 else None
        rows.append(FidelityRow(n, ga, sa, err, abs(sa - ga) <= tolerance * max(abs(ga), floor)))
    ga_of = {r.strategy: r.gpu_added_us for r in rows}
    sa_of = {r.strategy: r.sim_added_us for r in rows}
    misordered = tuple(
        (a, b)
        for a in names
        for b in names
        if ga_of[b] - ga_of[a] > tolerance * max(abs(ga_of[a]), floor) and not sa_of[a] < sa_of[b]
    )
    return FidelityReport(
        rows=tuple(rows),
        misordered=misordered,
        gpu_ranking=tuple(sorted(names, key=lambda n: g[n]["added_us"])),
        sim_ranking=tuple(sorted(names, key=lambda n: s[n]["added_us"])),
        tolerance=tolerance,
        floor_us=floor,
        gpu_device=f"{gpu.get('backend')}: {gpu.get('device_name')}",
        sim_device=f"{sim.get('backend')}: {sim.get('device_name')}",
    )


def run_fidelity(gpu_path: str, sim_path: str, *, tolerance: float = 0.25, out: IO[str] | None = None) -> int:
    """Print the comparison of two demo JSON files; returns 0 when the goal is met, 1 otherwise.

    Raises :class:`~.inputs.CommandError` when a file cannot be read or the two are not
    the demo results that :func:`compare_demos` takes.
    """
    out = out or sys.stdout
    gpu = read_json(gpu_path, "the GPU result")
    sim = read_json(sim_path, "the simulator result")
    try:
        report = compare_demos(gpu, sim, tolerance=tolerance)
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    print(report.table(), file=out)
    return 0 if report.met else 1
