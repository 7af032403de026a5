"""Shared state of the simulated device backend and the internals every call uses.

:class:`SimCore` holds the handle tables, the scheduler, the memory map, the hazard
checker and the per-thread state, and implements what the protocol calls share:
handle look-ups, argument checks, timing and submitting an eager op
(:meth:`SimCore._enqueue`), recording a capture node, capture violations and
blocking waits. The protocol methods live in ``_backend`` (devices, streams,
events, host functions, lifetime), ``_memcalls``, ``_graphcalls`` and
``_kernelcalls``. Everything here is called with the documented lock state.
"""

from __future__ import annotations

import ctypes
import functools
import operator
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ..protocol import CaptureMode, PointerKind
from . import _codes as C
from ._codes import fail, make_error
from ._device import Executor, Scheduler
from ._graph import Capture, Graph, GraphExec, Node
from ._hazards import HazardChecker
from ._kernels import SimMemoryFault, Twin
from ._memory import Allocation, MemoryMap
from ._ops import Op
from ._profile import SimProfile

__all__ = [
    "SimCore",
    "ThreadState",
    "StreamState",
    "EventState",
    "DeviceState",
    "ModuleState",
    "FunctionState",
    "check_count",
    "check_handle",
]

DEVICE = PointerKind.DEVICE
HOST = PointerKind.HOST
PAGEABLE = PointerKind.PAGEABLE

STREAM_BASE = 0x51 << 40
EVENT_BASE = 0x52 << 40
GRAPH_BASE = 0x53 << 40
EXEC_BASE = 0x54 << 40
MODULE_BASE = 0x55 << 40
FUNCTION_BASE = 0x56 << 40
USER_OBJECT_BASE = 0x57 << 40

HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
UNRECORDED, RECORDED, CAPTURED = 0, 1, 2


class ThreadState(threading.local):
    """Per host thread: current device, virtual clock, role (engine threads), name."""

    def __init__(self) -> None:
        self.device = 0
        self.host_us = 0.0
        self.role: str | None = None
        self.name = threading.current_thread().name
        self.host_work: Any = None  # expect_host_work: an estimate for the next host function
        self.real_mark = 0.0  # charge_host_time: perf_counter at the previous backend call (0: none yet)


class StreamState:
    __slots__ = (
        "handle",
        "key",
        "device",
        "priority",
        "last_op",
        "tail_us",
        "work_ready_us",
        "capture",
        "cap_deps",
        "vc",
        "hv",
        "destroyed",
    )

    def __init__(self, handle: int, key: int, device: int, priority: int, hazards: bool) -> None:
        self.handle = handle
        self.key = key  # unique id for hazard clocks (null streams of different devices differ)
        self.device = device
        self.priority = priority
        self.last_op: Op | None = None
        self.tail_us = 0.0  # virtual end of the last op
        self.work_ready_us = 0.0  # earliest virtual start of the next work op (after the gap)
        self.capture: Capture | None = None
        self.cap_deps: list[int] = []
        self.vc: dict[int, int] | None = {} if hazards else None  # hazard vector clock
        self.hv = 0  # host clock version merged into vc
        self.destroyed = False

    def idle(self) -> bool:
        return self.last_op is None or self.last_op.done


class EventState:
    __slots__ = (
        "handle",
        "timing",
        "blocking",
        "owner",
        "state",
        "op",
        "time_us",
        "device",
        "vc",
        "capture",
        "cap_deps",
    )

    def __init__(self, handle: int, timing: bool, blocking: bool, owner: int = 0) -> None:
        self.handle = handle
        self.timing = timing
        self.blocking = blocking
        self.owner = owner  # the device current at creation: records only on its streams, as on CUDA/HIP
        self.state = UNRECORDED
        self.op: Op | None = None
        self.time_us = 0.0
        self.device = 0  # the device of the stream of the latest record
        self.vc: dict[int, int] | None = None
        self.capture: Capture | None = None
        self.cap_deps: tuple[int, ...] = ()


class DeviceState:
    __slots__ = ("index", "null", "engine_free", "executor", "streams", "loose", "time_us")

    def __init__(self, index: int, null: StreamState, executor: Executor) -> None:
        self.index = index
        self.null = null
        self.engine_free = {"h2d": 0.0, "d2h": 0.0}
        self.time_us = 0.0  # virtual end of the latest op enqueued on the device (its timeline's tail)
        self.executor = executor
        self.streams: set[StreamState] = {null}  # live streams and destroyed ones with pending work
        self.loose: list[Op] = []  # pending ops on no stream (deferred graph-memory frees)


class ModuleState:
    __slots__ = ("handle", "program", "twins", "functions")

    def __init__(self, handle: int, program: str, twins: dict[str, Twin]) -> None:
        self.handle = handle
        self.program = program
        self.twins = twins
        self.functions: dict[str, int] = {}


class FunctionState:
    __slots__ = ("handle", "twin", "module")

    def __init__(self, handle: int, twin: Twin, module: int) -> None:
        self.handle = handle
        self.twin = twin
        self.module = module


# -- argument checks (they raise simErrorInvalidValue / simErrorInvalidResourceHandle) ------------
def check_count(value: Any, what: str, call: str) -> int:
    """``value`` as an int >= 0 (numpy integers accepted, bools refused)."""
    if isinstance(value, bool):
        fail(C.INVALID_VALUE, f"{what} must be an int, got bool", call)
    try:
        number = operator.index(value)
    except TypeError:
        fail(C.INVALID_VALUE, f"{what} must be an int, got {type(value).__name__}", call)
    if number < 0:
        fail(C.INVALID_VALUE, f"{what} must be >= 0, got {number}", call)
    return number


def check_handle(value: Any, what: str, call: str) -> int:
    if type(value) is int:
        return value
    if isinstance(value, bool):
        fail(C.INVALID_HANDLE, f"{what} handle must be an int, got bool", call)
    try:
        return operator.index(value)
    except TypeError:
        fail(C.INVALID_HANDLE, f"{what} handle must be an int, got {type(value).__name__}", call)


def locked_release(lock: threading.Lock, mem: MemoryMap, alloc: Allocation) -> None:
    with lock:
        mem.release(alloc)


def locked_resolve(lock: threading.Lock, mem: MemoryMap, ptr: int, nbytes: int) -> Allocation:
    with lock:
        alloc = mem.find(ptr)
    if alloc is None:
        raise SimMemoryFault(f"address {ptr:#x} is not simulated device or pinned memory")
    if ptr + nbytes > alloc.end:
        raise SimMemoryFault(f"{nbytes} bytes at {ptr:#x} overrun the {alloc.describe()}")
    return alloc


class SimCore:
    """State and internals shared by the sim backend's call groups (see the module docstring)."""

    name = "sim"

    def __init__(
        self,
        profile: SimProfile,
        devices: int = 1,
        check_hazards: bool | str = False,
        op_log_limit: int = 100_000,
        hazard_history: int = 256,
        close_timeout: float = 10.0,
    ) -> None:
        self._profile = profile
        self._ndev = devices
        self._close_timeout = close_timeout
        self._tls = ThreadState()
        tls = self._tls

        def thread_init(role: str) -> None:
            tls.role = role

        self._sched = Scheduler(devices, op_log_limit, thread_init)
        self._lock = self._sched.lock
        self._mem = MemoryMap(devices, profile.total_memory)
        self._resolve = functools.partial(locked_resolve, self._lock, self._mem)
        self._release_async = functools.partial(locked_release, self._lock, self._mem)
        self._hz: HazardChecker | None = None
        if check_hazards:
            self._hz = HazardChecker(check_hazards == "raise", history=hazard_history)
        hz_on = self._hz is not None
        self._devices = [
            DeviceState(d, StreamState(0, -(d + 1), d, 0, hz_on), self._sched.executors[d]) for d in range(devices)
        ]
        self._streams: dict[int, StreamState] = {}
        self._events: dict[int, EventState] = {}
        self._graphs: dict[int, Graph] = {}
        self._execs: dict[int, GraphExec] = {}
        self._modules: dict[int, ModuleState] = {}
        self._functions: dict[int, FunctionState] = {}
        self._captures: list[Capture] = []
        self._user_objects: dict[int, Any] = {}  # handle -> _user_objects.UserObject
        self._counters = {b: 0 for b in (STREAM_BASE, EVENT_BASE, GRAPH_BASE, EXEC_BASE, MODULE_BASE, FUNCTION_BASE, USER_OBJECT_BASE)}
        self._capture_ids = 0
        self._seq = 0
        self._hostfns: dict[int, Any] = {}
        self._signal_waits: dict[int, list[Op]] = {}  # signal address -> wait_signal ops enqueued on it
        self._signals: set[int] = set()  # addresses returned by signal_alloc and not freed
        # cost-model constants read on the hot paths
        self._api_us = profile.api_call_us
        self._charge_host_time = profile.charge_host_time
        self._launch_us = profile.launch_latency_us
        self._gap_us = profile.op_gap_us
        self._memset_fixed_us = profile.op_fixed_us
        self._memset_rate = 1.0 / (profile.memset_gbps * 1e3)
        self._copy_rate = {
            "h2d": 1.0 / (profile.h2d_gbps * 1e3),
            "d2h": 1.0 / (profile.d2h_gbps * 1e3),
            "d2d": 1.0 / (profile.d2d_gbps * 1e3),
            "h2h": 1.0 / (profile.h2h_gbps * 1e3),
        }
        self._pageable_rate = 1.0 / (profile.pageable_gbps * 1e3)
        # several devices: enabled peer access (accessing device, peer) and per-link copy queues
        self._peer_access: set[tuple[int, int]] = set()
        self._link_free: dict[tuple[int, int], float] = {}
        self._serialize_engines = profile.serialize_copy_engines
        self._closed = False
        self._close_lock = threading.Lock()
        self._finalizer = weakref.finalize(self, self._sched.stop_nowait)
        self._finalizer.atexit = False

    # == internals ================================================================================
    def _enter(self, call: str) -> ThreadState:
        tls = self._tls
        if tls.role is not None:
            fail(
                C.NOT_PERMITTED,
                f"called from the simulator's {tls.role} thread: host functions and kernel twins must not call the backend",
                call,
            )
        if self._closed:
            fail(C.DEINITIALIZED, "the sim backend is closed", call)
        if self._charge_host_time:
            self._charge_real(tls)
        return tls

    def _charge_real(self, tls: ThreadState) -> None:
        """``charge_host_time``, on entering a backend call: add the thread's host work since it left the previous one.

        Host work is the thread's CPU time (``time.thread_time``), not wall
        time: time blocked, or waiting for the GIL while the simulator's own
        threads run Python, is not host work a GPU program would do. The
        simulator's own work inside a call is left out (:meth:`_mark_real` on
        the way out); the call costs ``api_call_us`` as always.
        """
        now = time.thread_time()
        if tls.real_mark:
            tls.host_us += (now - tls.real_mark) * 1e6
        tls.real_mark = now

    def _mark_real(self, tls: ThreadState) -> None:
        """``charge_host_time``: the thread's host work starts again now (the end of a backend call)."""
        tls.real_mark = time.thread_time()

    def _new_handle(self, base: int) -> int:
        n = self._counters[base] + 1
        self._counters[base] = n
        return base + n

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _stream(self, handle: Any, tls: ThreadState, call: str) -> StreamState:
        h = check_handle(handle, "stream", call)
        if h == 0:
            return self._devices[tls.device].null
        s = self._streams.get(h)
        if s is None:
            fail(C.INVALID_HANDLE, f"{handle!r} is not a live sim stream (destroyed, or never created)", call)
        return s

    def _stream_fast(self, handle: Any, tls: ThreadState, call: str) -> StreamState:
        s = self._streams.get(handle) if type(handle) is int and handle else None
        return s if s is not None else self._stream(handle, tls, call)

    def _event(self, handle: Any, call: str) -> EventState:
        ev = self._events.get(check_handle(handle, "event", call))
        if ev is None:
            fail(C.INVALID_HANDLE, f"{handle!r} is not a live sim event (destroyed, or never created)", call)
        return ev

    def _lookup(self, table: dict[int, Any], handle: Any, what: str, call: str) -> Any:
        obj = table.get(check_handle(handle, what, call))
        if obj is None:
            fail(C.INVALID_HANDLE, f"{handle!r} is not a live sim {what} (destroyed, or never created)", call)
        return obj

    def _check_device(self, device: Any, call: str) -> int:
        if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < self._ndev:
            fail(C.INVALID_DEVICE, f"device {device!r} does not exist; the simulator has {self._ndev} device(s)", call)
        return device

    def _charge(self, tls: ThreadState) -> float:
        tls.host_us += self._profile.api_call_us
        if self._charge_host_time:
            self._mark_real(tls)
        return tls.host_us

    def _enqueue(
        self,
        tls: ThreadState,
        s: StreamState,
        kind: str,
        seq: int,
        *,
        duration: float,
        work: bool,
        gap_after: float = 0.0,
        fn: Callable[..., Any] | None = None,
        args: tuple[Any, ...] = (),
        refs: Any = None,
        host: bool = False,
        nbytes: int = 0,
        name: str = "",
        engine: str | None = None,
        wait_op: Op | None = None,
        wait_us: float = 0.0,
        submit: bool = True,
    ) -> Op:
        """Time, link and (unless ``submit`` is false) submit one eager op on ``s``. Lock held."""
        issue = tls.host_us = tls.host_us + self._api_us
        start = issue + self._launch_us
        if s.tail_us > start:
            start = s.tail_us
        if work and s.work_ready_us > start:
            start = s.work_ready_us
        if wait_us > start:
            start = wait_us
        dev = self._devices[s.device]
        if engine is not None:
            free_at = dev.engine_free[engine]
            if free_at > start:
                start = free_at
        end = start + duration
        if engine is not None:
            dev.engine_free[engine] = end
        if end > dev.time_us:
            dev.time_us = end
        s.tail_us = end
        if work:
            s.work_ready_us = end + gap_after
        op = Op(
            seq, kind, s.device, s.handle, nbytes, issue, start, end, tls.name, fn, args, refs, dev.executor, host, name
        )
        op.depend_on(s.last_op)
        if wait_op is not None:
            op.depend_on(wait_op)
        s.last_op = op
        if submit:
            self._sched.submit(op)
        if self._charge_host_time:
            self._mark_real(tls)
        return op

    def _capture_node(self, tls: ThreadState, s: StreamState, kind: str, call: str, **fields: Any) -> Node:
        """Record a node on capturing stream ``s``. Lock held."""
        cap = s.capture
        assert cap is not None
        self._check_capture_valid(cap, call)
        node = Node(len(cap.nodes), kind, tuple(s.cap_deps), s.handle, **fields)
        cap.nodes.append(node)
        s.cap_deps = [node.index]
        self._charge(tls)
        return node

    @staticmethod
    def _check_capture_valid(cap: Capture, call: str) -> None:
        if cap.invalid is not None:
            fail(
                C.CAPTURE_INVALIDATED,
                f"the capture begun on stream {cap.origin.handle:#x} was invalidated earlier ({cap.invalid[1]}); "
                "end it with stream_end_capture",
                call,
            )

    def _violation(self, caps: Sequence[Capture], code: int, message: str, call: str) -> NoReturn:
        """Invalidate ``caps`` and raise ``code``. Lock held."""
        for cap in caps:
            cap.invalidate(code, f"{call}: {message}")
        fail(code, message + "; the capture is invalidated, and stream_end_capture will raise CaptureError", call)

    def _unsafe_during_capture(self, call: str) -> None:
        """Malloc/free-like calls are prohibited by global captures and this thread's thread-local ones. Lock held."""
        if not self._captures:
            return
        me = threading.get_ident()
        bad = [
            c
            for c in self._captures
            if c.mode == CaptureMode.GLOBAL or (c.mode == CaptureMode.THREAD_LOCAL and c.thread == me)
        ]
        if bad:
            self._violation(
                bad,
                C.CAPTURE_UNSUPPORTED,
                f"{call} is not permitted while a stream captures in global mode (or in thread-local mode on this thread)",
                call,
            )

    def _region(self, ptr: int, nbytes: int, what: str, call: str, kind: str, s: StreamState) -> Allocation | None:
        """The live allocation holding ``[ptr, ptr+nbytes)``, or ``None`` for pageable memory. Lock held.

        ``kind`` and ``s`` describe the op about to be enqueued (for a use-after-free hazard).
        """
        if not ptr:
            fail(C.INVALID_VALUE, f"the {what} pointer is NULL", call)
        alloc = self._mem.find(ptr)
        if alloc is None:
            tomb = self._mem.find_freed(ptr)
            if tomb is not None:
                if self._hz is not None:
                    desc = f"{kind}#{self._seq + 1} on stream {s.handle:#x}"
                    self._hz.report([self._hz.freed_access(tomb, ptr, ptr + nbytes, desc)], call)
                fail(C.INVALID_VALUE, f"the {what} {ptr:#x} lies in the {tomb.describe()}, which has been freed", call)
            return None
        if ptr + nbytes > alloc.end:
            fail(
                C.INVALID_VALUE,
                f"{nbytes} bytes at the {what} {ptr:#x} (offset {ptr - alloc.base}) overrun the {alloc.describe()}",
                call,
            )
        return alloc

    def _hazard_check(self, s: StreamState, kind: str, seq: int, accesses: list[Any], call: str) -> None:
        hz = self._hz
        if hz is not None and accesses:
            hz.device_access(s.key, hz.stream_clock(s), accesses, f"{kind}#{seq} on stream {s.handle:#x}", call)

    def _wait(self, tls: ThreadState, ops: list[Op], done_us: float, call: str) -> None:
        """Block until ``ops`` complete and advance the host clock. Lock NOT held.

        With ``charge_host_time`` the time spent blocked is not host work: the
        model's wake-up stands for it.
        """
        charge = self._charge_host_time
        if ops and not self._sched.wait(ops):
            fail(C.DEINITIALIZED, "the sim backend was closed while waiting; queued work was abandoned", call)
        p = self._profile
        t = tls.host_us + p.api_call_us
        woke = done_us + p.sync_wake_us
        tls.host_us = woke if woke > t else t
        if charge:
            self._mark_real(tls)

    def _raise_async_error(self, device: int, call: str) -> None:
        with self._lock:
            errors = self._sched.errors[device]
            if not errors:
                return
            (op, exc), rest = errors[0], len(errors) - 1
            errors.clear()
        code = C.ILLEGAL_ADDRESS if isinstance(exc, SimMemoryFault) else C.LAUNCH_FAILURE
        what = f"kernel {op.name!r}" if op.kind == "kernel" else op.kind
        more = f" ({rest} more error(s) since then were dropped)" if rest else ""
        raise make_error(
            code,
            f"{what} (op #{op.seq} on stream {op.stream:#x}) failed while running: {type(exc).__name__}: {exc}{more}",
            call,
        ) from exc

    def _device_tails(self, device: int) -> tuple[list[Op], float, list[dict[int, int]]]:
        """Pending last ops, latest virtual tail and clocks of every stream on ``device``. Lock held."""
        dev = self._devices[device]
        ops: list[Op] = []
        tail = 0.0
        clocks: list[dict[int, int]] = []
        for s in list(dev.streams):
            if s.destroyed and s.idle():
                dev.streams.discard(s)
                continue
            if s.last_op is not None and not s.last_op.done:
                ops.append(s.last_op)
            if s.tail_us > tail:
                tail = s.tail_us
            if s.vc:
                clocks.append(dict(s.vc))
        dev.loose = [op for op in dev.loose if not op.done]
        for op in dev.loose:
            ops.append(op)
            if op.end_us > tail:
                tail = op.end_us
        return ops, tail, clocks

    def _sync_device(self, tls: ThreadState, device: int, call: str) -> None:
        with self._lock:
            ops, tail, clocks = self._device_tails(device)
        self._wait(tls, ops, tail, call)
        if self._hz is not None:
            with self._lock:
                for vc in clocks:
                    self._hz.host_observe(vc)

    def _hostfn(self, fn_ptr: int) -> Any:
        cfn = self._hostfns.get(fn_ptr)
        if cfn is None:
            if len(self._hostfns) > 4096:
                self._hostfns.clear()
            cfn = self._hostfns[fn_ptr] = HOSTFN(fn_ptr)
        return cfn
