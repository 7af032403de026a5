"""The native launch executor (``_launch_c``) against fake entry points: order, arguments, failures.

The entry points are ctypes callbacks that log their calls, so nothing here
needs a GPU; the GPU suite runs the same executor on the real driver (launch
plans and graph replays). Skipped where ``_launch_c`` was not built.
"""

from __future__ import annotations

import ctypes
import os
from types import SimpleNamespace
from typing import Any

import pytest

from streamrt._backends import _native_ops
from streamrt._backends._native_ops import NativeOps, Program
from streamrt._errors import BackendError

built = pytest.mark.skipif(not _native_ops.available(), reason="streamrt._backends._launch_c is not built")

_i, _p, _u64, _sz, _u = ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_uint
CONTEXT_ERROR = 201


class FakeDriver:
    """Ten entry points that log ``(name, *args)``; ``codes[name]`` lists the results of successive calls."""

    def __init__(self, *, hip: bool) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.codes: dict[str, list[int]] = {}
        self.capturing = 0
        as_int = lambda v: v or 0  # noqa: E731 - ctypes passes NULL pointers as None

        def entry(name: str, restype_args: tuple[Any, ...], body: Any) -> Any:
            def fn(*args: Any) -> int:
                self.log.append((name, *body(*args)))
                pending = self.codes.get(name)
                return pending.pop(0) if pending else 0

            return ctypes.CFUNCTYPE(_i, *restype_args)(fn)

        def capturing(stream: Any, status: Any) -> tuple[int]:
            status[0] = self.capturing
            return (as_int(stream),)

        self.fns = [
            entry("is_capturing", (_p, ctypes.POINTER(_i)), capturing),
            entry("memset", (_p, _i, _sz, _p) if hip else (_u64, ctypes.c_ubyte, _sz, _p),
                  lambda d, v, n, s: (as_int(d), v, n, as_int(s))),
            entry("copy", (_p, _p, _sz, _i, _p), lambda d, s_, n, k, s: (as_int(d), as_int(s_), n, k, as_int(s)))
            if hip
            else entry("copy", (_u64, _u64, _sz, _p), lambda d, s_, n, s: (d, s_, n, as_int(s))),
            entry("host", (_p, _p, _p), lambda s, f, d: (as_int(s), as_int(f), as_int(d))),
            entry("record", (_p, _p), lambda e, s: (as_int(e), as_int(s))),
            entry("wait", (_p, _p, _u), lambda s, e, f: (as_int(s), as_int(e), f)),
            entry("graph", (_p, _p), lambda g, s: (as_int(g), as_int(s))),
            entry("kernel", (_p, _u, _u, _u, _u, _u, _u, _u, _p, _p, _p),
                  lambda f, gx, gy, gz, bx, by, bz, sm, s, a, e: (as_int(f), (gx, gy, gz), (bx, by, bz), sm, as_int(s), as_int(a), e)),
            entry("query", (_p,), lambda e: (as_int(e),)),
            entry("sync", (_p,), lambda e: (as_int(e),)),
        ]

    def addresses(self) -> list[int]:
        return [ctypes.cast(f, _p).value for f in self.fns]  # type: ignore[misc]


def make_error(code: int, call: str) -> BackendError:
    return BackendError("fake", code, f"E{code}", "failed", call)


def ops_over(driver: FakeDriver, *, hip: bool = False, make_current: Any = None, backend: Any = None) -> NativeOps:
    return NativeOps(
        driver.addresses(), hip=hip, make_error=make_error, make_current=make_current,
        context_error=0 if hip else CONTEXT_ERROR, backend=backend,
    )


def a_program() -> Program:
    return (
        Program()
        .check_not_capturing(0x50)
        .memset(0xD000, 7, 64, 0x50)
        .copy(0xB000, 0xD000, 64, 2, 0x50)
        .host(0x50, 0xF00, 0xDA7A)
        .record(0xE1, 0x50)
        .wait(0x51, 0xE1)
    )


@built
@pytest.mark.parametrize("hip", [False, True])
def test_a_program_makes_its_calls_in_order_with_their_arguments(hip: bool) -> None:
    driver = FakeDriver(hip=hip)
    assert ops_over(driver, hip=hip).run(a_program()) is None
    copy = ("copy", 0xB000, 0xD000, 64, 2, 0x50) if hip else ("copy", 0xB000, 0xD000, 64, 0x50)
    assert driver.log == [
        ("is_capturing", 0x50),
        ("memset", 0xD000, 7, 64, 0x50),
        copy,
        ("host", 0x50, 0xF00, 0xDA7A),
        ("record", 0xE1, 0x50),
        ("wait", 0x51, 0xE1, 0),
    ]
    assert len(a_program()) == 6


@built
@pytest.mark.parametrize("hip", [False, True])
def test_a_kernel_launch_passes_its_dimensions_shared_memory_and_arguments(hip: bool) -> None:
    driver = FakeDriver(hip=hip)
    program = Program().kernel(0xF00, ((1 << 31) + 5, 65535, 3), (1024, 2, 64), 49152, 0x50, 0xA000)
    assert ops_over(driver, hip=hip).run(program) is None
    assert driver.log == [("kernel", 0xF00, ((1 << 31) + 5, 65535, 3), (1024, 2, 64), 49152, 0x50, 0xA000, None)]
    assert ops_over(driver, hip=hip)._executor.call_name(_native_ops._c.OP_KERNEL) == ("hipModuleLaunchKernel" if hip else "cuLaunchKernel")


@built
def test_set_changes_one_argument_of_one_call_between_runs() -> None:
    """A program its owner patches (a Prefetcher's copy: a new destination and size per batch)."""
    driver = FakeDriver(hip=False)
    ops = ops_over(driver)
    program = Program().copy(0, 0xA000, 0, 1, 0x50).record(0xE1, 0x50)
    for dst, n in ((0xD000, 64), (0xD400, 128)):
        program.set(0, 0, dst)
        program.set(0, 2, n)
        assert ops.run(program) is None
    assert driver.log == [
        ("copy", 0xD000, 0xA000, 64, 0x50), ("record", 0xE1, 0x50),
        ("copy", 0xD400, 0xA000, 128, 0x50), ("record", 0xE1, 0x50),
    ]


@built
def test_after_is_the_rest_of_a_program_and_leaves_it_whole() -> None:
    """A fork plan runs its capture check, then the waits for a pending run, then ``after(1)``: the steps."""
    driver = FakeDriver(hip=False)
    ops = ops_over(driver)
    program = Program().check_not_capturing(0x50).memset(0xD000, 0, 64, 0x50).record(0xE1, 0x50)
    rest = program.after(1)
    assert len(rest) == 2 and len(program) == 3
    assert ops.run(rest) is None
    assert driver.log == [("memset", 0xD000, 0, 64, 0x50), ("record", 0xE1, 0x50)]
    driver.log.clear()
    assert ops.run(program) is None
    assert [c[0] for c in driver.log] == ["is_capturing", "memset", "record"]


@built
def test_a_capturing_stream_stops_the_program_before_anything_is_enqueued() -> None:
    driver = FakeDriver(hip=False)
    driver.capturing = 1
    assert ops_over(driver).run(a_program()) == (0, None)
    assert driver.log == [("is_capturing", 0x50)]


@built
@pytest.mark.parametrize(("failing", "index", "call"), [("copy", 2, "cuMemcpyAsync"), ("record", 4, "cuEventRecord")])
def test_a_failing_call_stops_the_program_and_names_itself(failing: str, index: int, call: str) -> None:
    driver = FakeDriver(hip=False)
    driver.codes[failing] = [400]
    failed = ops_over(driver).run(a_program())
    assert failed is not None
    assert failed[0] == index
    error = failed[1]
    assert isinstance(error, BackendError) and (error.code, error.call) == (400, call)
    assert [entry[0] for entry in driver.log][-1] == failing
    assert len(driver.log) == index + 1  # the calls before it were made, none after


@built
def test_hip_names_its_entry_points() -> None:
    driver = FakeDriver(hip=True)
    driver.codes["memset"] = [1]
    failed = ops_over(driver, hip=True).run(a_program())
    assert failed is not None and failed[1] is not None and failed[1].call == "hipMemsetAsync"  # type: ignore[attr-defined]


@built
def test_a_thread_with_no_context_gets_one_and_the_call_is_retried_once() -> None:
    driver = FakeDriver(hip=False)
    made: list[int] = []
    driver.codes["memset"] = [CONTEXT_ERROR, 0]
    ops = ops_over(driver, make_current=lambda: made.append(1))
    assert ops.run(a_program()) is None
    assert made == [1]
    assert [entry[0] for entry in driver.log][:3] == ["is_capturing", "memset", "memset"]
    driver.log.clear()
    driver.codes["memset"] = [CONTEXT_ERROR, CONTEXT_ERROR]  # still no context after make_current: reported
    failed = ops.run(a_program())
    assert failed is not None and failed[0] == 1 and failed[1].code == CONTEXT_ERROR  # type: ignore[union-attr]


@built
def test_an_error_in_make_current_propagates_and_stops_the_program() -> None:
    driver = FakeDriver(hip=False)
    driver.codes["is_capturing"] = [CONTEXT_ERROR]

    def broken() -> None:
        raise RuntimeError("no device")

    with pytest.raises(RuntimeError, match="no device"):
        ops_over(driver, make_current=broken).run(a_program())
    assert driver.log == [("is_capturing", 0x50)]


@built
def test_replay_checks_the_stream_then_launches_the_graph() -> None:
    driver = FakeDriver(hip=False)
    ops = ops_over(driver)
    assert ops.replay(0x6000, 0x50) is None
    assert driver.log == [("is_capturing", 0x50), ("graph", 0x6000, 0x50)]
    driver.log.clear()
    driver.capturing = 1
    assert ops.replay(0x6000, 0x50) == (0, None)
    assert driver.log == [("is_capturing", 0x50)]
    driver.capturing = 0
    driver.codes["graph"] = [900]
    failed = ops.replay(0x6000, 0x50)
    assert failed is not None and failed[0] == 1 and failed[1].call == "cuGraphLaunch"  # type: ignore[union-attr]


@built
def test_replay_with_an_event_records_it_after_the_graph_or_says_which_call_failed() -> None:
    driver = FakeDriver(hip=False)
    ops = ops_over(driver)
    assert ops.replay(0x6000, 0x50, 0xE1) is None
    assert driver.log == [("is_capturing", 0x50), ("graph", 0x6000, 0x50), ("record", 0xE1, 0x50)]
    driver.log.clear()
    assert ops._replay(0x6000, 0x50, 0) is None  # event 0: no record
    assert driver.log == [("is_capturing", 0x50), ("graph", 0x6000, 0x50)]
    driver.log.clear()
    driver.capturing = 1
    assert ops.replay(0x6000, 0x50, 0xE1) == (0, None)
    assert driver.log == [("is_capturing", 0x50)]
    driver.capturing = 0
    driver.codes["graph"] = [900]
    failed = ops.replay(0x6000, 0x50, 0xE1)
    assert failed is not None and failed[0] == 1 and driver.log[-1] == ("graph", 0x6000, 0x50)  # no record after it
    driver.codes["record"] = [709]
    failed = ops.replay(0x6000, 0x50, 0xE2)
    assert failed is not None and failed[0] == 2 and failed[1].call == "cuEventRecord"  # type: ignore[union-attr]
    assert driver.log[-2:] == [("graph", 0x6000, 0x50), ("record", 0xE2, 0x50)]  # the graph was launched


@built
def test_record_raises_the_mapped_error() -> None:
    driver = FakeDriver(hip=False)
    ops = ops_over(driver)
    ops.record(0xE1, 0x50)
    driver.codes["record"] = [709, 710]
    with pytest.raises(BackendError) as info:
        ops.record(0xE2, 0x50)
    assert (info.value.code, info.value.call) == (709, "cuEventRecord")
    with pytest.raises(BackendError) as info:
        ops.record_held(0xE3, 0x50)  # the same call, the GIL kept
    assert (info.value.code, info.value.call) == (710, "cuEventRecord")
    ops.record_held(0xE4, 0x50)
    assert driver.log == [("record", 0xE1, 0x50), ("record", 0xE2, 0x50), ("record", 0xE3, 0x50), ("record", 0xE4, 0x50)]


@built
@pytest.mark.parametrize("hip", [False, True])
def test_copy_record_checks_copies_then_records_or_stops_where_it_failed(hip: bool) -> None:
    """A fetch's calls in one go: nothing is enqueued on a capturing stream; a failed record names itself."""
    driver = FakeDriver(hip=hip)
    ops = ops_over(driver, hip=hip)
    assert ops.copy_record(0xB000, 0xD000, 4, 2, 0x50, 0xE1) is None
    copy = ("copy", 0xB000, 0xD000, 4, 2, 0x50) if hip else ("copy", 0xB000, 0xD000, 4, 0x50)
    assert driver.log == [("is_capturing", 0x50), copy, ("record", 0xE1, 0x50)]
    driver.log.clear()
    driver.capturing = 1
    assert ops.copy_record(0xB000, 0xD000, 4, 2, 0x50, 0xE1) == (0, None)
    assert driver.log == [("is_capturing", 0x50)]
    driver.capturing = 0
    driver.codes["record"] = [709]
    failed = ops.copy_record(0xB000, 0xD000, 4, 2, 0x50, 0xE1)
    assert failed is not None and failed[0] == 2
    assert failed[1].call == ("hipEventRecord" if hip else "cuEventRecord")  # type: ignore[union-attr]


@built
def test_query_reads_completed_not_ready_and_errors() -> None:
    driver = FakeDriver(hip=False)
    ops = ops_over(driver)
    driver.codes["query"] = [0, 600, 400]
    assert ops.query(0xE1) is True
    assert ops.query(0xE1) is False
    with pytest.raises(BackendError) as info:
        ops.query(0xE1)
    assert (info.value.code, info.value.call) == (400, "cuEventQuery")
    driver.codes["query"] = [CONTEXT_ERROR, 0]  # a thread with no current context: made current, asked again
    made = []
    assert ops_over(driver, make_current=lambda: made.append(1)).query(0xE2) is True
    assert made == [1] and driver.log[-2:] == [("query", 0xE2), ("query", 0xE2)]


@built
@pytest.mark.parametrize("hip", [False, True])
def test_synchronize_waits_through_the_entry_point_and_raises_its_error(hip: bool) -> None:
    driver = FakeDriver(hip=hip)
    ops = ops_over(driver, hip=hip)
    driver.codes["sync"] = [0, 700]
    assert ops.synchronize(0xE1) is None
    with pytest.raises(BackendError) as info:
        ops.synchronize(0xE2)
    assert (info.value.code, info.value.call) == (700, "hipEventSynchronize" if hip else "cuEventSynchronize")
    assert driver.log == [("sync", 0xE1), ("sync", 0xE2)]
    if not hip:  # a thread with no current context: made current, then waited again
        made: list[int] = []
        driver.codes["sync"] = [CONTEXT_ERROR, 0]
        assert ops_over(driver, make_current=lambda: made.append(1)).synchronize(0xE3) is None
        assert made == [1] and driver.log[-2:] == [("sync", 0xE3), ("sync", 0xE3)]


@built
def test_compile_translates_the_backends_own_calls_and_nothing_else() -> None:
    driver = FakeDriver(hip=False)

    class Backend:
        def memset_async(self, *a: Any) -> None: ...
        def memcpy_async(self, *a: Any) -> None: ...
        def launch_host_func(self, *a: Any) -> None: ...
        def event_record(self, *a: Any) -> None: ...
        def stream_wait_event(self, *a: Any) -> None: ...
        def launch_kernel(self, *a: Any) -> None: ...

    backend = Backend()
    ops = ops_over(driver, backend=backend)
    steps = [
        (backend.memset_async, (0xD000, 7, 64, 0x50)),
        (backend.memcpy_async, (0xB000, 0xD000, 64, 2, 0x50)),
        (backend.launch_host_func, (0x50, 0xF00, 0xDA7A)),
        (backend.event_record, (0xE1, 0x50)),
        (backend.stream_wait_event, (0x51, 0xE1)),
    ]
    program = ops.compile(0x50, steps)
    assert program is not None and program.words == a_program().words
    assert ops.compile(0x50, [*steps, (print, ())]) is None  # another call: the Python path serves it
    big = (backend.launch_kernel, (0xF, (1, 1 << 16, 1), (32, 1, 1), 0, 0x50, 0xA))
    assert ops.compile(0x50, [*steps, big]) is None  # a launch a record cannot hold
    assert ops.compile(0x50, [(None, (print, ()))]) is None  # a Python host node
    assert ops.compile(0x50, [(Backend().memset_async, (0xD000, 7, 64, 0x50))]) is None  # another backend's


@built
def test_bad_programs_and_arguments_are_refused() -> None:
    driver = FakeDriver(hip=False)
    ops = ops_over(driver)
    with pytest.raises(ValueError, match="6-word records"):
        ops._run(b"\0" * 8)
    with pytest.raises(ValueError, match="unknown op"):
        ops._run(bytes(48 * [0xFF]))
    with pytest.raises(ValueError, match="10 entry points"):
        NativeOps([1, 2], hip=False, make_error=make_error)
    with pytest.raises(ValueError, match="NULL"):
        NativeOps([0] * 10, hip=False, make_error=make_error)
    with pytest.raises(ValueError, match="do not fit"):
        Program().kernel(0xF, (1, 1 << 16, 1), (32, 1, 1), 0, 0x50, 0xA)
    assert driver.log == []


@built
def test_load_needs_every_entry_point() -> None:
    driver = FakeDriver(hip=False)
    fns = dict(zip(_native_ops.CUDA_ENTRY_POINTS, driver.fns))
    library: Any = SimpleNamespace(**fns)
    assert _native_ops.load(library, hip=False, make_error=make_error) is not None
    resolved = _native_ops.load(SimpleNamespace(), hip=False, make_error=make_error, resolve=lambda n: ctypes.cast(fns[n], _p).value)
    assert resolved is not None and resolved.replay(0x6000, 0x50) is None
    del fns["cuGraphLaunch"]
    assert _native_ops.load(SimpleNamespace(**fns), hip=False, make_error=make_error) is None
    assert _native_ops.load(SimpleNamespace(cuGraphLaunch=object(), **fns), hip=False, make_error=make_error) is None



def test_the_executor_is_built_where_the_install_requires_it() -> None:
    """CI sets STREAMRT_REQUIRE_NATIVE=1: a failed build must not pass unnoticed as the binding-call path."""
    if os.environ.get("STREAMRT_REQUIRE_NATIVE") != "1":
        pytest.skip("STREAMRT_REQUIRE_NATIVE is not set")
    assert _native_ops.available(), "streamrt._backends._launch_c did not build: see the pip install output"


@built
def test_serve_events_makes_a_backends_event_calls_the_executors() -> None:
    driver = FakeDriver(hip=False)
    ops = ops_over(driver)
    backend = SimpleNamespace()
    ops.serve_events(backend)
    backend.event_record(0xE1, 0x50)
    backend.stream_wait_event(0x60, 0xE1)
    assert backend.event_query(0xE1) is True
    backend.event_synchronize(0xE1)
    assert driver.log == [("record", 0xE1, 0x50), ("wait", 0x60, 0xE1, 0), ("query", 0xE1), ("sync", 0xE1)]


@built
@pytest.mark.parametrize("hip", [False, True])
def test_wait_raises_the_mapped_error_and_retries_once_without_a_context(hip: bool) -> None:
    driver = FakeDriver(hip=hip)
    made_current: list[int] = []
    ops = ops_over(driver, hip=hip, make_current=lambda: made_current.append(1))
    driver.codes["wait"] = [709]
    with pytest.raises(BackendError) as info:
        ops.wait(0x60, 0xE1)
    assert (info.value.code, info.value.call) == (709, "hipStreamWaitEvent" if hip else "cuStreamWaitEvent")
    if not hip:  # CUDA: a thread with no current context gets one, and the call is made again
        driver.codes["wait"] = [CONTEXT_ERROR]
        ops.wait(0x61, 0xE2)
        assert made_current == [1] and driver.log[-2:] == [("wait", 0x61, 0xE2, 0), ("wait", 0x61, 0xE2, 0)]
    with pytest.raises(TypeError):
        ops.wait(0x60)  # type: ignore[call-arg]
