"""``streamrt calibrate``: measure the simulator's cost-model constants on this GPU.

The result is a :class:`~streamrt._backends.sim.SimProfile` JSON file that
``open_runtime("sim", profile=path)`` (and ``streamrt demo --profile path``)
loads, so the simulator replays programs with this GPU's timings.

Method. Device times come from timing events; host times from
``perf_counter`` (on a device with a virtual clock, from the backend's
virtual host clock, so calibrating the simulator recovers its own profile:
that is how the procedure is tested). Back-to-back device figures are
measured behind a *gate*: a ``spin_sleep`` kernel (:mod:`streamrt._kernel`) that keeps the
stream busy for longer than the host takes to enqueue every op of the
measurement, so the device, not the host, sets the pace. (A gate made of a
blocked host function would not do: the driver's queue behind a blocked host
function is bounded, and the enqueuing thread then blocks before it can open
the gate.) Where no kernel can be compiled, the gate is a ``sem_wait`` host
function and measurements enqueue at most 16 ops behind it. A gate that the
host outran (its body took longer to enqueue than the spin) is retried with a
longer spin. Each figure is the median of ``repeats`` samples, taken in
rounds that interleave the figures (so a burst of interference on the
machine spoils one sample of many figures, not every sample of one).

==========================  =====================================================================
field                       measured as
==========================  =====================================================================
api_call_us                 host time of one raw enqueue call (1-byte memset), averaged over 200
op_fixed_us, op_gap_us      period of back-to-back 1-byte memsets (the launch gap), split 1:2
                            between an op's fixed cost and the gap after it (only the sum is
                            observable on a GPU; the split matters only after host functions)
memset_gbps, *_gbps         slope of a least-squares line through back-to-back ops of 3 sizes
                            (memset, host-to-device, device-to-host, device-to-device, pinned
                            host-to-host)
host_func_us                period of back-to-back native no-op host functions
event_record_us             period of back-to-back event records
launch_latency_us,          device gap between an event the host synchronized on and the next
sync_wake_us                op it enqueued, minus one API call: the sum of wake-up and launch
                            latency, split 4:3 (the default profile's ratio)
host_func_start_us          launch of a ``sem_post`` host function on an idle stream -> the host
                            thread waiting on it wakes, minus launch latency and wake-up (GPU only)
python_host_call_us         stream time of a no-op Python host function run on the runtime's
                            worker (between two event records), minus the native host functions
                            it is made of (one when held by a signal wait, else two)
charge_host_time            set on a GPU: the simulator then charges the host's real Python time
                            between backend calls, as the calibrated GPU's host would spend it
==========================  =====================================================================

Kept from the defaults (not measurable here): ``kernel_default_us`` (needs a
kernel), ``graph_node_gap_us`` (needs graph capture), ``pageable_gbps``,
``serialize_copy_engines``. Name, memory size and SM count come from the
device's capabilities.

Blocking: runs device work for a few seconds. Thread rules: call from one thread.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass
from typing import IO, Any, Callable, Sequence

from .._backends.protocol import MemcpyKind
from .._native import HOLD_ADDRESS, SEM_POST_ADDRESS, Semaphore
from .._runtime import Runtime
from .inputs import open_runtime_for, output_file
from .progress import Progress

__all__ = ["Calibration", "calibrate", "run_calibrate"]

_MIB = 1 << 20


@dataclass(frozen=True)
class Calibration:
    """What :func:`calibrate` measured: the profile, and per field the raw figure and how it was found."""

    profile: Any  # SimProfile
    measured: dict[str, float]
    how: dict[str, str]
    notes: tuple[str, ...]

    def table(self) -> str:
        from .._backends.sim import SimProfile

        default = SimProfile()
        rows = [("field", "default", "calibrated", "how")]
        for f in dataclasses.fields(self.profile):
            if f.name in ("name",):
                continue
            new = getattr(self.profile, f.name)
            old = getattr(default, f.name)
            rows.append((f.name, _fmt(old), _fmt(new), self.how.get(f.name, "kept (default)")))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}" for r in rows)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if v < 1e6 else f"{v:.4g}"
    return str(v)


class _Bench:
    """Raw backend primitives for the measurements (no streamrt bookkeeping in the timed paths)."""

    #: Ops a measurement may enqueue behind a host-function gate (the driver's queue behind it is bounded).
    HOST_GATE_OPS = 16

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.b = rt.backend
        self._stream = rt.create_stream(name="calibrate")
        self.stream = self._stream._handle
        backend = self.b
        if rt.capabilities.virtual_clock and callable(getattr(backend, "host_now_us", None)):
            self.host_us: Callable[[], float] = getattr(backend, "host_now_us")
            self.virtual = True
        else:
            self.host_us = lambda: time.perf_counter_ns() / 1000.0
            self.virtual = False
        self._events: list[int] = []
        self._allocs: list[tuple[Callable[[int], None], int]] = []
        self.gate = Semaphore()
        self.dummy = Semaphore()
        self.kernel_gate = self._kernel_gate_works()
        self.op_host_us = 10.0  # a pessimistic host cost per enqueued op until api_call_us is measured
        self.retries = 0
        self.outrun = 0  # measurements kept although the host outran the gate every time

    def _kernel_gate_works(self) -> bool:
        try:
            self.rt.kernels.spin_sleep(self._stream, 1.0)
            self.b.stream_synchronize(self.stream)
        except Exception:  # noqa: BLE001 - no compiler or no kernel support: the host-function gate
            return False
        return True

    @property
    def max_ops(self) -> int | None:
        """The most ops one gated body may enqueue (``None``: no limit)."""
        return None if self.kernel_gate else self.HOST_GATE_OPS

    def event(self) -> int:
        ev = self.b.event_create(timing=True, blocking_sync=True)
        self._events.append(ev)
        return ev

    def device(self, n: int) -> int:
        p = self.b.malloc(n)
        self._allocs.append((self.b.free, p))
        return p

    def host(self, n: int) -> int:
        p = self.b.host_malloc(n)
        self._allocs.append((self.b.host_free, p))
        return p

    def gated(self, body: Callable[[], None], ops: int) -> None:
        """Hold the stream while ``body`` enqueues ``ops`` ops, then let it run and wait for it.

        With the kernel gate, a body the host took longer to enqueue than the
        gate spun is run again behind a longer spin (up to 4 times).
        """
        if not self.kernel_gate:
            self.b.launch_host_func(self.stream, HOLD_ADDRESS, self.gate.address)
            try:
                body()
            finally:
                self.gate.post()
                self.b.stream_synchronize(self.stream)
            return
        spin = max(200.0, 4.0 * ops * self.op_host_us + 100.0)
        for attempt in range(4):
            self.rt.kernels.spin_sleep(self._stream, spin)
            t0 = self.host_us()
            body()
            took = self.host_us() - t0
            self.b.stream_synchronize(self.stream)
            if took < 0.8 * spin:
                return
            if attempt == 3:
                self.outrun += 1
                return
            self.retries += 1
            spin *= 4.0

    def elapsed_us(self, a: int, b: int) -> float:
        return self.b.event_elapsed_ms(a, b) * 1000.0

    def close(self) -> None:
        try:
            self.b.stream_synchronize(self.stream)
        finally:
            for ev in self._events:
                self.b.event_destroy(ev)
            for free, p in self._allocs:
                free(p)
            self._stream.close()
            self.gate.destroy()
            self.dummy.destroy()


def _noop() -> None:
    """The Python host function whose stall calibrate measures."""


def _fit(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``t = c + n * k``: returns (intercept µs, GB/s = 1 / (k * 1e3))."""
    xs = [float(n) for n, _ in points]
    ys = [t for _, t in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    k = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    c = my - k * mx
    return c, (1.0 / (k * 1e3)) if k > 0 else float("inf")


def calibrate(rt: Runtime, *, repeats: int = 7, quick: bool = False, progress: Progress | None = None) -> Calibration:
    """Measure the cost-model constants on ``rt``'s device; see the module docstring."""
    from .._backends.sim import SimProfile

    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    caps = rt.capabilities
    small = quick or caps.virtual_clock
    copy_sizes = [1 * _MIB, 2 * _MIB, 4 * _MIB] if small else [4 * _MIB, 16 * _MIB, 64 * _MIB]
    fill_sizes = [1 * _MIB, 2 * _MIB, 4 * _MIB] if small else [16 * _MIB, 64 * _MIB, 256 * _MIB]
    # On a virtual clock the gate holds the stream for host_func_us of virtual time only: keep
    # the ops enqueued meanwhile few enough that the device, not the host, sets the pace.
    bench = _Bench(rt)
    n_small = 20 if caps.virtual_clock else (50 if quick else 200)
    if bench.max_ops is not None:
        n_small = min(n_small, bench.max_ops - 4)  # the measured ops plus the events around them
    b = bench.b
    s = bench.stream
    measured: dict[str, float] = {}
    how: dict[str, str] = {}
    notes: list[str] = []

    try:
        dev = bench.device(max(fill_sizes + copy_sizes))
        dev2 = bench.device(max(copy_sizes))
        pin = bench.host(max(copy_sizes))
        pin2 = bench.host(max(copy_sizes))
        e = [bench.event() for _ in range(len(fill_sizes) + 2)]

        # -- host cost of one API call (first: the gates are sized from it) --------------------------------
        def api() -> float:
            out = 0.0

            def body() -> None:
                nonlocal out
                t0 = bench.host_us()
                for _ in range(n_small):
                    b.memset_async(dev, 0, 1, s)
                out = (bench.host_us() - t0) / n_small

            bench.gated(body, n_small)
            return out

        measured["api_call_us"] = statistics.median(api() for _ in range(repeats))
        bench.op_host_us = max(measured["api_call_us"], 0.5)
        if progress:
            progress.advance()

        # Every other figure: one sample per round, the figures interleaved within a round, so
        # a burst of interference on the machine spoils one sample of many figures rather than
        # every sample of one. Each figure is the median of its samples.
        scalars: dict[str, Callable[[], float]] = {}
        lines: dict[str, Callable[[], tuple[float, float]]] = {}

        # -- launch gap: back-to-back 1-byte memsets ----------------------------------------------------
        def period(enqueue_one: Callable[[], None], lead: Callable[[], None] | None = None, count: int = n_small) -> Callable[[], float]:
            def run() -> float:
                def body() -> None:
                    if lead is not None:
                        lead()
                    b.event_record(e[0], s)
                    for _ in range(count):
                        enqueue_one()
                    b.event_record(e[1], s)

                bench.gated(body, count + 3)
                return bench.elapsed_us(e[0], e[1]) / count

            return run

        tiny = lambda: b.memset_async(dev, 0, 1, s)  # noqa: E731
        scalars["launch_gap_us"] = period(tiny, lead=tiny)

        # -- bandwidths: back-to-back ops of three sizes ------------------------------------------------------
        def series(enqueue: Callable[[int], None], sizes: Sequence[int]) -> Callable[[], tuple[float, float]]:
            def run() -> tuple[float, float]:
                def body() -> None:
                    enqueue(1)  # a work op first: every measured op then follows work (pays the gap)
                    b.event_record(e[0], s)
                    for i, n in enumerate(sizes):
                        enqueue(n)
                        b.event_record(e[i + 1], s)

                bench.gated(body, 2 * len(sizes) + 2)
                pts = [(n, bench.elapsed_us(e[i], e[i + 1])) for i, n in enumerate(sizes)]
                return _fit(pts)

            return run

        lines["memset_gbps"] = series(lambda n: b.memset_async(dev, 0, n, s), fill_sizes)
        lines["h2d_gbps"] = series(lambda n: b.memcpy_async(dev, pin, n, MemcpyKind.HOST_TO_DEVICE, s), copy_sizes)
        lines["d2h_gbps"] = series(lambda n: b.memcpy_async(pin, dev, n, MemcpyKind.DEVICE_TO_HOST, s), copy_sizes)
        lines["d2d_gbps"] = series(lambda n: b.memcpy_async(dev2, dev, n, MemcpyKind.DEVICE_TO_DEVICE, s), copy_sizes)
        lines["h2h_gbps"] = series(lambda n: b.memcpy_async(pin2, pin, n, MemcpyKind.HOST_TO_HOST, s), copy_sizes)

        # -- host functions and event records -----------------------------------------------------------------
        # few host functions at a time: the driver's queue of pending host functions is bounded
        post = lambda: b.launch_host_func(s, SEM_POST_ADDRESS, bench.dummy.address)  # noqa: E731
        scalars["host_func_us"] = period(post, count=min(n_small, 32))
        extra = bench.event()
        scalars["event_record_us"] = period(lambda: b.event_record(extra, s))

        # -- a Python host function on the runtime's worker: its stream time beyond two native ones -------------
        engine = rt._engine

        def python_host_call() -> float:
            """The median of 5 stalls: a worker's wake-up varies more than the device's figures."""
            stalls = []
            for _ in range(5):

                def body() -> None:
                    b.event_record(e[0], s)
                    engine.host_call(s, _noop, (), capture_checked=True)
                    b.event_record(e[1], s)

                bench.gated(body, 4)
                stalls.append(bench.elapsed_us(e[0], e[1]))
            return statistics.median(stalls)

        scalars["python_host_call_stall_us"] = python_host_call
        native_per_call = 1 if engine.stream_signals else 2

        # -- wake-up + launch latency: the device gap around a host synchronize ---------------------------------
        def turnaround() -> float:
            b.memset_async(dev, 0, 1, s)
            b.event_record(e[0], s)
            b.event_synchronize(e[0])
            b.event_record(e[1], s)
            b.event_synchronize(e[1])
            return bench.elapsed_us(e[0], e[1])

        scalars["sync_turnaround_us"] = turnaround

        # -- launch -> host function start (real time only) -----------------------------------------------------
        waker: Semaphore | None = None
        if not bench.virtual:
            waker = Semaphore()

            def hostfn_start() -> float:
                assert waker is not None
                b.stream_synchronize(s)
                t0 = time.perf_counter_ns()
                b.launch_host_func(s, SEM_POST_ADDRESS, waker.address)
                waker.wait()
                return (time.perf_counter_ns() - t0) / 1000.0

            scalars["host_func_launch_to_wake_us"] = hostfn_start
        else:
            notes.append("host_func_start_us kept: a host function's start is not observable on a virtual clock")

        samples: dict[str, list[float]] = {name: [] for name in scalars}
        fits: dict[str, list[tuple[float, float]]] = {name: [] for name in lines}
        try:
            for _ in range(repeats):
                for name, fn in scalars.items():
                    samples[name].append(fn())
                for name, line in lines.items():
                    fits[name].append(line())
                if progress:
                    progress.advance()
        finally:
            b.stream_synchronize(s)
            if waker is not None:
                waker.destroy()
        for name, values in samples.items():
            measured[name] = statistics.median(values)
        for name, pairs in fits.items():
            measured[name] = statistics.median(bw for _c, bw in pairs)
        gap = measured["launch_gap_us"]
    finally:
        bench.close()

    default = SimProfile()
    api_us = max(measured["api_call_us"], 0.0)
    fixed = gap / 3.0
    sync_sum = max(measured["sync_turnaround_us"] - api_us, 0.0)
    launch = sync_sum * 4.0 / 7.0
    wake = sync_sum - launch
    fields: dict[str, Any] = {
        "name": f"{caps.device_name} (calibrated)",
        "total_memory": caps.total_memory,
        "multiprocessor_count": caps.multiprocessor_count,
        "api_call_us": round(api_us, 3),
        "op_fixed_us": round(fixed, 3),
        "op_gap_us": round(gap - fixed, 3),
        "memset_gbps": round(measured["memset_gbps"], 3),
        "h2d_gbps": round(measured["h2d_gbps"], 3),
        "d2h_gbps": round(measured["d2h_gbps"], 3),
        "d2d_gbps": round(measured["d2d_gbps"], 3),
        "h2h_gbps": round(measured["h2h_gbps"], 3),
        "host_func_us": round(measured["host_func_us"], 3),
        "event_record_us": round(max(measured["event_record_us"], 0.0), 3),
        "python_host_call_us": round(
            max(measured["python_host_call_stall_us"] - native_per_call * measured["host_func_us"], 0.0), 3
        ),
        "charge_host_time": not bench.virtual,
        "launch_latency_us": round(launch, 3),
        "sync_wake_us": round(wake, 3),
    }
    how.update(
        {
            "total_memory": "device capabilities",
            "multiprocessor_count": "device capabilities",
            "api_call_us": f"raw enqueue call, mean of {n_small}",
            "op_fixed_us": f"launch gap {gap:.3f} us x 1/3",
            "op_gap_us": f"launch gap {gap:.3f} us x 2/3",
            "memset_gbps": "line through 3 sizes",
            "h2d_gbps": "line through 3 sizes",
            "d2h_gbps": "line through 3 sizes",
            "d2d_gbps": "line through 3 sizes",
            "h2h_gbps": "line through 3 sizes (pinned)",
            "host_func_us": "period of native no-op host functions",
            "event_record_us": "period of event records",
            "python_host_call_us": (
                f"stall of a no-op Python host call {measured['python_host_call_stall_us']:.3f} us"
                f" - {native_per_call} x host_func_us"
            ),
            "charge_host_time": "on: the simulator charges the host's real Python time (off when calibrating a simulator)",
            "launch_latency_us": f"sync turnaround {measured['sync_turnaround_us']:.3f} us - api, x 4/7",
            "sync_wake_us": f"sync turnaround {measured['sync_turnaround_us']:.3f} us - api, x 3/7",
        }
    )
    if bench.outrun:
        notes.append(f"{bench.outrun} sample(s) were kept although the host outran the gate 4 times: they may read high")
    if bench.retries:
        notes.append(f"the host outran the gate {bench.retries} time(s); those measurements were repeated behind a longer spin")
    if not bench.kernel_gate:
        notes.append(f"no kernel could be compiled: gated by a host function, {n_small} ops per measurement")
    if "host_func_launch_to_wake_us" in measured:
        start = max(measured["host_func_launch_to_wake_us"] - api_us - launch - wake, 0.0)
        fields["host_func_start_us"] = round(start, 3)
        how["host_func_start_us"] = f"launch->wake {measured['host_func_launch_to_wake_us']:.3f} us - api - launch - wake"
    for name, value in list(fields.items()):
        if isinstance(value, float) and name.endswith("_gbps") and not value < float("inf"):
            fields[name] = getattr(default, name)
            notes.append(f"{name}: the fit found no size dependence; kept the default")
    profile = default.replace(**fields)
    return Calibration(profile, measured, how, tuple(notes))


def run_calibrate(
    backend: str = "auto",
    *,
    device: int = 0,
    out: str | None = None,
    repeats: int = 7,
    quick: bool = False,
    stream: IO[str] | None = None,
) -> int:
    """Calibrate on ``backend``/``device``, print the table and write the profile JSON. Returns the exit status.

    Raises :class:`~.inputs.CommandError` before measuring when ``device`` does not exist
    or the profile file cannot be written.
    """
    stream = stream or sys.stdout
    if quick:
        repeats = min(repeats, 3)
    with open_runtime_for(backend, device) as rt:
        caps = rt.capabilities
        path = output_file(out or f"sim-profile-{_slug(caps.device_name)}.json", "--out")
        if caps.is_simulated:
            print("calibrating the simulator itself: this checks the procedure (it should recover the profile in use)", file=stream)
        print(f"calibrating {rt.backend_name}:{device} {caps.device_name} ({caps.architecture})", file=stream)
        with Progress(1 + repeats, "calibrate", stream=sys.stderr) as bar:
            cal = calibrate(rt, repeats=repeats, quick=quick, progress=bar)
    cal.profile.to_json(path)
    print(cal.table(), file=stream)
    for n in cal.notes:
        print(f"note: {n}", file=stream)
    print(f"\nwrote {path}; use it with open_runtime('sim', profile={path!r}) or `streamrt demo --profile {path}`", file=stream)
    return 0


def _slug(name: str) -> str:
    return "".join(c.lower() if c.isalnum() else "-" for c in name).strip("-") or "device"
