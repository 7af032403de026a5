"""Probes of ``train_loop_bench.py``: host-synchronizing calls counted, GPU activity from a profiler trace.

Not a benchmark (``streamrt bench`` skips modules whose name starts with ``_``).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import streamrt as srt

__all__ = ["GpuProfile", "SyncCounter"]


# -- counting host synchronization -----------------------------------------------------------------------------


class SyncCounter:
    """Counts host-synchronizing calls while active: torch's (sync debug mode warnings) and streamrt's."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.torch_syncs = 0
        self.streamrt_syncs = 0
        self.kinds: dict[str, int] = {}
        self._active = False
        self._saved: list[tuple[Any, str, Any]] = []
        self._warnings: Any = None
        self._log: list[warnings.WarningMessage] | None = None

    def _wrap(self, owner: Any, name: str, blocking: Callable[[Any], bool]) -> None:
        original = getattr(owner, name)
        counter = self

        def counted(obj: Any, *args: Any, **kwargs: Any) -> Any:
            if counter._active and blocking(obj):
                counter.streamrt_syncs += 1
                key = f"{owner.__name__}.{name}"
                counter.kinds[key] = counter.kinds.get(key, 0) + 1
            return original(obj, *args, **kwargs)

        self._saved.append((owner, name, original))
        setattr(owner, name, counted)

    def start(self) -> None:
        self._wrap(srt.Stream, "synchronize", lambda s: True)
        self._wrap(srt.Event, "synchronize", lambda e: True)
        self._wrap(srt.Runtime, "synchronize", lambda r: True)
        self._wrap(srt.Completion, "wait", lambda c: not c.is_done)
        if self.cuda:
            self._warnings = warnings.catch_warnings(record=True)
            self._log = self._warnings.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        self._active = True

    def stop(self) -> None:
        self._active = False
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
            assert self._log is not None
            for w in self._log:
                if "synchroniz" in str(w.message):
                    self.torch_syncs += 1
                    key = "torch: " + str(w.message)[:60]
                    self.kinds[key] = self.kinds.get(key, 0) + 1
            self._warnings.__exit__(None, None, None)
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()


# -- GPU idle fraction from a profiler trace ----------------------------------------------------------------------------


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total = 0.0
    end = float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


class GpuProfile:
    """A torch profiler window: device activity intervals -> busy time and idle fraction."""

    def __init__(self) -> None:
        self.prof: Any = None
        self.t0 = 0.0
        self.result: dict[str, Any] = {}

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        self.prof = profile(activities=[ProfilerActivity.CUDA])  # host ops unrecorded: less slowdown
        self.prof.__enter__()
        self.t0 = time.perf_counter()

    def stop(self, steps: int) -> None:
        torch.cuda.synchronize()
        wall = time.perf_counter() - self.t0
        self.prof.__exit__(None, None, None)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            self.prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f).get("traceEvents", [])
        ops = [
            (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), str(e.get("name", "?")))
            for e in events
            if e.get("ph") == "X" and str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset")
        ]
        if not ops:
            self.result = {"error": "the profiler recorded no GPU activity"}
            return
        intervals = [(s, e) for s, e, _n in ops]
        span = max(e for _s, e in intervals) - min(s for s, _e in intervals)
        busy = _union_us(intervals)
        self.result = {
            "gpu_busy_us_per_step": busy / steps,
            "span_us_per_step": span / steps,
            "gpu_idle_fraction": 1.0 - busy / span if span > 0 else 0.0,
            "profiled_step_ms": wall * 1e3 / steps,
            "device_ops": len(ops),
            "idle_gaps": _idle_gaps(ops, steps),
        }


def _idle_gaps(ops: list[tuple[float, float, str]], steps: int, top: int = 5) -> list[tuple[float, float, str]]:
    """Where the GPU idles: each gap between busy spans, named by the op that ended last before it and the
    op that starts it, summed per pair of names; the ``top`` pairs as (µs per step, gaps per step, names)."""
    gaps: dict[str, list[float]] = {}
    end, last = float("-inf"), ""
    for start, stop, name in sorted(ops):
        if start > end and last:
            key = f"{last[:48]} -> {name[:48]}"
            total = gaps.setdefault(key, [0.0, 0.0])
            total[0] += start - end
            total[1] += 1
        if stop > end:
            end, last = stop, name
    ranked = sorted(gaps.items(), key=lambda kv: kv[1][0], reverse=True)[:top]
    return [(us / steps, n / steps, key) for key, (us, n) in ranked]
