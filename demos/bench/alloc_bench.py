"""Allocator benchmark: streamrt's caching allocators side by side with torch and CuPy, in one run.

Measures, interleaving the contenders round by round and taking medians:

* cached pinned alloc + release round trip: streamrt ``rt.host_allocator``
  vs ``torch.empty(n, dtype=uint8, pin_memory=True)`` + del vs CuPy
  ``cupy.cuda.alloc_pinned_memory(n)`` + del;
* cached device round trip: streamrt ``rt.device_allocator`` (with and
  without ``stream=``) vs ``torch.empty(n, dtype=uint8, device="cuda")`` + del
  (and CuPy ``cupy.cuda.alloc(n)`` + del), both of which allocate on their
  current stream. With ``stream=s`` streamrt reuses the block from ``s``'s own
  free list with no event (per-stream free lists); the run checks that no
  fence was recorded during those rounds (``stream_fences``). Also timed:
  ``streamrt stream=, no capture check`` (an allocator with
  ``detect_capture=False``: the same path without the one
  ``stream_is_capturing`` call per allocation);
* ``streamrt, python hot path`` (pinned) and ``streamrt stream=, python hot
  path`` (device): the same round trips on allocators over the Python twin of
  the hot path (``allocators._fastpath.PyFastPath``: what runs where the C
  module is not built);
* a reference row, ``python floor``: the least Python an allocator that hands
  out an object can run per round trip (a method that pops a cached pointer
  into a new ``__slots__`` object, and that object's ``release`` method that
  appends it back; no validation, no statistics). Any allocator written in
  Python with streamrt's API costs at least this much;
* held / requested bytes on a mixed workload of 60 live requests of 1-48 MiB
  (random sizes, fixed seed), pinned and device: streamrt ``statistics()``;
  torch ``torch.cuda.host_memory_stats()`` / ``memory_reserved()``; CuPy a
  counting allocator under a fresh pinned pool / the memory pool's ``total_bytes()``.

Goals (issues 4 and 21): pinned round trip <= 0.5x torch and <= 0.6x CuPy;
device round trip <= torch, with and without ``stream=``; held/requested <=
1.25. The first line of the report says which hot path ran (C or its Python
twin). Peers that are not installed (or have no GPU, as on the simulator) are
skipped. Run:

    python demos/bench/alloc_bench.py --backend cuda --out allocators_cuda.json
    python demos/bench/alloc_bench.py --backend sim --out allocators_sim.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from typing import Any, Callable

import allocators
import allocators._caching
import streamrt as srt
from allocators import _fastpath

MiB = 1 << 20
GOALS = {
    "pinned_vs_torch": 0.5,
    "pinned_vs_cupy": 0.6,
    "device_vs_torch": 1.0,
    "device_stream_vs_torch": 1.0,
    "held_over_requested": 1.25,
}


def _round_ns(fn: Callable[[], Any], loops: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(loops):
        fn()
    return (time.perf_counter_ns() - t0) / loops


def _interleaved(contenders: dict[str, Callable[[], Any]], loops: int, rounds: int, settle: Callable[[], Any]) -> dict[str, float]:
    """Median over ``rounds`` of the mean ns per call, contenders interleaved within each round.

    ``settle`` runs after each timed loop (a device synchronize), so that work one
    contender queued does not run during the next one's timing.
    """
    for fn in contenders.values():  # warm every cache first
        for _ in range(100):
            fn()
    settle()
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for r in range(rounds):
        order = list(contenders.items())
        if r % 2:
            order.reverse()
        for name, fn in order:
            samples[name].append(_round_ns(fn, loops))
            settle()
    return {name: statistics.median(v) for name, v in samples.items()}


# -- peers ------------------------------------------------------------------------------------------


def _torch(rt: srt.Runtime) -> Any | None:
    if rt.capabilities.is_simulated:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _cupy(rt: srt.Runtime) -> Any | None:
    if rt.capabilities.is_simulated:
        return None
    try:
        import cupy
    except ImportError:
        return None
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return None
    return cupy


# -- round trips ---------------------------------------------------------------------------------------


class _FloorBlock:
    """The ``python floor`` row's handle: what a Buffer must at least be (no checks, no statistics)."""

    __slots__ = ("_nbytes", "_pool", "_ptr", "_released")

    def __init__(self, ptr: int, nbytes: int, pool: _FloorPool) -> None:
        self._ptr = ptr
        self._nbytes = nbytes
        self._pool = pool
        self._released = False

    def release(self) -> None:
        self._released = True
        self._pool._free.append(self._ptr)


class _FloorPool:
    """The ``python floor`` row's allocator: one free list of cached pointers."""

    def __init__(self, ptrs: list[int]) -> None:
        self._free = ptrs

    def allocate(self, nbytes: int) -> _FloorBlock:
        return _FloorBlock(self._free.pop(), nbytes, self)



def round_trips(rt: srt.Runtime, nbytes: int, loops: int, rounds: int) -> dict[str, dict[str, float]]:
    torch, cupy = _torch(rt), _cupy(rt)
    host, dev = rt.host_allocator, rt.device_allocator
    stream = rt.create_stream()
    halloc, dalloc = host.allocate, dev.allocate

    floor = _FloorPool([0x1000, 0x2000]).allocate
    twin = _python_hot_path_allocator(rt, allocators.CachingPinnedAllocator)
    dtwin = _python_hot_path_allocator(rt, allocators.CachingDeviceAllocator)
    unchecked = allocators.CachingDeviceAllocator(rt, detect_capture=False)
    talloc, dtalloc, ualloc = twin.allocate, dtwin.allocate, unchecked.allocate
    pinned: dict[str, Callable[[], Any]] = {
        "streamrt": lambda: halloc(nbytes).release(),
        "streamrt, python hot path": lambda: talloc(nbytes).release(),
        "python floor": lambda: floor(nbytes).release(),
    }
    device: dict[str, Callable[[], Any]] = {
        "streamrt": lambda: dalloc(nbytes).release(),
        "streamrt stream=": lambda: dalloc(nbytes, stream=stream).release(),
        "streamrt stream=, no capture check": lambda: ualloc(nbytes, stream=stream).release(),
        "streamrt stream=, python hot path": lambda: dtalloc(nbytes, stream=stream).release(),
    }
    if torch is not None:
        u8 = torch.uint8
        empty = torch.empty
        cuda = torch.device("cuda", rt.device)
        pinned["torch"] = lambda: empty(nbytes, dtype=u8, pin_memory=True)
        device["torch"] = lambda: empty(nbytes, dtype=u8, device=cuda)
    if cupy is not None:
        pinned["cupy"] = lambda: cupy.cuda.alloc_pinned_memory(nbytes)
        with cupy.cuda.Device(rt.device):
            device["cupy"] = lambda: cupy.cuda.alloc(nbytes)
    def settle() -> None:
        rt.synchronize()
        if torch is not None:
            torch.cuda.synchronize(rt.device)

    out: dict[str, Any] = {"pinned_ns": _interleaved(pinned, loops, rounds, settle)}
    stream_allocators = [a for a in (dev, unchecked, dtwin) if isinstance(a, allocators.CachingAllocator)]
    for _ in range(2):  # settle which list each contender's block lives in (the second pass fences nothing)
        for fn in device.values():
            for _ in range(100):
                fn()
        settle()
    before = [a.statistics().fences for a in stream_allocators]
    if cupy is not None:
        with cupy.cuda.Device(rt.device):
            out["device_ns"] = _interleaved(device, loops, rounds, settle)
    else:
        out["device_ns"] = _interleaved(device, loops, rounds, settle)
    # Same-stream reuse records no event: fences recorded during the timed device rounds (expect 0).
    out["stream_fences"] = sum(a.statistics().fences - b for a, b in zip(stream_allocators, before))
    rt.synchronize()
    stream.close()
    for a in (twin, dtwin, unchecked):
        a.close()
    return out


def _python_hot_path_allocator(rt: srt.Runtime, cls: type[allocators.CachingAllocator]) -> allocators.CachingAllocator:
    """A caching allocator over the Python twin of the hot path (what runs where the C module is not built)."""
    native = allocators._caching.FastPath
    allocators._caching.FastPath = _fastpath.PyFastPath
    try:
        return cls(rt)
    finally:
        allocators._caching.FastPath = native


# -- held / requested ---------------------------------------------------------------------------------------


def _workload(seed: int, count: int = 60) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(MiB, 48 * MiB) for _ in range(count)]


def _streamrt_ratio(rt: srt.Runtime, kind: str, sizes: list[int]) -> float:
    cls = allocators.CachingPinnedAllocator if kind == "host" else allocators.CachingDeviceAllocator
    a = cls(rt)
    try:
        bufs = [a.allocate(n) for n in sizes]
        st = a.statistics()
        for b in bufs:
            b.release()
        return st.held_bytes / st.requested_bytes
    finally:
        a.close()


def _torch_pinned_held(torch: Any) -> int | None:
    stats = torch.cuda.host_memory_stats()
    for key in ("reserved_bytes.current", "allocated_bytes.current"):
        if key in stats:
            return int(stats[key])
    return None


def _torch_ratio(torch: Any, rt: srt.Runtime, kind: str, sizes: list[int]) -> dict[str, Any]:
    if kind == "host":
        before = _torch_pinned_held(torch)
        tensors = [torch.empty(n, dtype=torch.uint8, pin_memory=True) for n in sizes]
        after = _torch_pinned_held(torch)
        pow2 = sum(1 << (n - 1).bit_length() for n in sizes) / sum(sizes)
        del tensors
        if before is None or after is None:
            return {"ratio": None, "note": "torch.cuda.host_memory_stats has no byte counter here", "power_of_two_estimate": pow2}
        return {"ratio": (after - before) / sum(sizes), "power_of_two_estimate": pow2}
    dev = torch.device("cuda", rt.device)
    torch.cuda.synchronize(dev)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved(dev)
    tensors = [torch.empty(n, dtype=torch.uint8, device=dev) for n in sizes]
    after = torch.cuda.memory_reserved(dev)
    del tensors
    torch.cuda.empty_cache()
    return {"ratio": (after - before) / sum(sizes)}


def _cupy_ratio(cupy: Any, rt: srt.Runtime, kind: str, sizes: list[int]) -> dict[str, Any]:
    with cupy.cuda.Device(rt.device):
        if kind == "host":
            held = [0]

            def counting(size: int) -> Any:
                held[0] += size
                return cupy.cuda.PinnedMemoryPointer(cupy.cuda.PinnedMemory(size), 0)

            pool = cupy.cuda.PinnedMemoryPool(allocator=counting)
            ptrs = [pool.malloc(n) for n in sizes]
            ratio = held[0] / sum(sizes)
            del ptrs
            pool.free_all_blocks()
            return {"ratio": ratio}
        pool = cupy.cuda.MemoryPool()
        ptrs = [pool.malloc(n) for n in sizes]
        ratio = pool.total_bytes() / sum(sizes)
        del ptrs
        pool.free_all_blocks()
        return {"ratio": ratio}


def held_ratios(rt: srt.Runtime, seed: int) -> dict[str, dict[str, Any]]:
    sizes = _workload(seed)
    torch, cupy = _torch(rt), _cupy(rt)
    out: dict[str, dict[str, Any]] = {}
    for kind in ("host", "device"):
        row: dict[str, Any] = {"streamrt": {"ratio": _streamrt_ratio(rt, kind, sizes)}}
        if torch is not None:
            row["torch"] = _torch_ratio(torch, rt, kind, sizes)
        if cupy is not None:
            row["cupy"] = _cupy_ratio(cupy, rt, kind, sizes)
        out["pinned" if kind == "host" else "device"] = row
    out["workload"] = {"requests": len(sizes), "requested_bytes": sum(sizes), "seed": seed}
    return out


# -- report ---------------------------------------------------------------------------------------------------


def _versions() -> dict[str, str | None]:
    v: dict[str, str | None] = {"python": platform.python_version(), "streamrt": srt.__version__}
    for mod in ("torch", "cupy"):
        try:
            v[mod] = __import__(mod).__version__
        except Exception:
            v[mod] = None
    return v


def _verdicts(trips: dict[str, dict[str, float]], held: dict[str, Any]) -> dict[str, Any]:
    p, d = trips["pinned_ns"], trips["device_ns"]
    r: dict[str, Any] = {}
    if "torch" in p:
        r["pinned_vs_torch"] = p["streamrt"] / p["torch"]
        r["python_floor_vs_torch"] = p["python floor"] / p["torch"]
    if "cupy" in p:
        r["pinned_vs_cupy"] = p["streamrt"] / p["cupy"]
        r["python_floor_vs_cupy"] = p["python floor"] / p["cupy"]
    if "torch" in d:
        r["device_vs_torch"] = d["streamrt"] / d["torch"]
        r["device_stream_vs_torch"] = d["streamrt stream="] / d["torch"]
        r["device_stream_unchecked_vs_torch"] = d["streamrt stream=, no capture check"] / d["torch"]
    if "cupy" in d:
        r["device_stream_vs_cupy"] = d["streamrt stream="] / d["cupy"]
    r["held_over_requested"] = max(held["pinned"]["streamrt"]["ratio"], held["device"]["streamrt"]["ratio"])
    r["met"] = {k: r[k] <= goal for k, goal in GOALS.items() if k in r}
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="auto", help="auto, cuda, hip or sim")
    ap.add_argument("--size", type=int, default=4096, help="bytes per round-trip allocation")
    ap.add_argument("--loops", type=int, default=20000, help="calls per timed round")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds (the median is reported)")
    ap.add_argument("--seed", type=int, default=4, help="seed of the mixed-size workload")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    with srt.open_runtime(args.backend) as rt:
        trips = round_trips(rt, args.size, args.loops, args.rounds)
        held = held_ratios(rt, args.seed)
        result = {
            "backend": rt.backend_name,
            "device": rt.capabilities.device_name,
            "versions": _versions(),
            "hot_path": "C" if _fastpath.NATIVE else "Python (allocators._fastpath_c not built)",
            "size": args.size,
            "loops": args.loops,
            "rounds": args.rounds,
            "round_trip_ns": trips,
            "held_over_requested": held,
            "ratios": _verdicts(trips, held),
            "goals": GOALS,
        }
    print(f"allocator benchmark on {result['backend']} ({result['device']}), {args.size}-byte round trips, "
          f"median of {args.rounds} rounds x {args.loops}; hot path: {result['hot_path']}")
    print(f"{'round trip':<44}{'ns':>10}")
    for group in ("pinned_ns", "device_ns"):
        for name, ns in trips[group].items():
            print(f"  {group[:-3] + ' ' + name:<42}{ns:>10.0f}")
    print(f"  fences recorded by the device rounds: {trips['stream_fences']} (same-stream reuse needs none)")
    print(f"{'held / requested (60 x 1-48 MiB)':<36}{'pinned':>8}{'device':>8}")
    names = sorted({n for k in ("pinned", "device") for n in held[k]})
    for name in names:
        cells = []
        for k in ("pinned", "device"):
            ratio = held[k].get(name, {}).get("ratio")
            cells.append(f"{ratio:>8.3f}" if isinstance(ratio, float) else f"{'-':>8}")
        print(f"  {name:<34}{''.join(cells)}")
    print("ratios vs goals:")
    for key, goal in GOALS.items():
        if key in result["ratios"]:
            value = result["ratios"][key]
            print(f"  {key:<26}{value:>8.3f}  goal <= {goal}  {'met' if value <= goal else 'NOT met'}")
    for key in ("python_floor_vs_torch", "python_floor_vs_cupy"):
        if key in result["ratios"]:
            print(f"  {key:<26}{result['ratios'][key]:>8.3f}  (reference: the floor of any Python allocator)")
    for key, what in (("device_stream_unchecked_vs_torch", "without the capture check"), ("device_stream_vs_cupy", "against CuPy")):
        if key in result["ratios"]:
            print(f"  {key:<26}{result['ratios'][key]:>8.3f}  (reference: the stream= round trip {what})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
