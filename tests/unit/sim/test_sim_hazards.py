"""Hazard checking: races between streams, host accesses to in-flight memory, use after free."""

from __future__ import annotations

import numpy as np
import pytest
from _sim_helpers import Gate, PyHostFn

from streamrt._backends import sim
from streamrt._backends.protocol import CaptureMode, MemcpyKind
from streamrt._backends.sim import HazardError, SimBackend
from streamrt._errors import BackendError

H2D, D2H = MemcpyKind.HOST_TO_DEVICE, MemcpyKind.DEVICE_TO_HOST


def test_two_streams_writing_overlapping_bytes_without_an_event_race(hz: SimBackend) -> None:
    s1, s2 = hz.stream_create(), hz.stream_create()
    d = hz.malloc(1024)
    hz.memset_async(d, 1, 512, s1)
    hz.memset_async(d + 256, 2, 512, s2)
    hz.device_synchronize()
    (h,) = hz.hazards()
    assert h.kind == "race"
    assert (h.address, h.nbytes) == (d + 256, 256)
    assert len(h.ops) == 2 and "memset#2" in h.ops[0] and "memset#1" in h.ops[1]
    assert "no event" in h.message


def test_a_read_after_a_write_on_another_stream_races_but_two_reads_do_not(hz: SimBackend) -> None:
    s1, s2, s3 = hz.stream_create(), hz.stream_create(), hz.stream_create()
    d = hz.malloc(64)
    h1, h2 = hz.host_malloc(64), hz.host_malloc(64)
    hz.device_synchronize()
    hz.memcpy_async(h1, d, 64, D2H, s1)  # read
    hz.memcpy_async(h2, d, 64, D2H, s2)  # read: no hazard
    assert hz.hazards() == ()
    hz.memset_async(d, 0, 64, s3)  # write while both reads may still run
    hz.device_synchronize()
    assert [h.kind for h in hz.hazards()] == ["race", "race"]


def test_an_event_between_the_streams_orders_them(hz: SimBackend) -> None:
    s1, s2 = hz.stream_create(), hz.stream_create()
    d = hz.malloc(1024)
    ev = hz.event_create(timing=False)
    hz.memset_async(d, 1, 1024, s1)
    hz.event_record(ev, s1)
    hz.stream_wait_event(s2, ev)
    hz.memset_async(d, 2, 1024, s2)
    # and transitively: s3 waits on s2 only
    s3 = hz.stream_create()
    ev2 = hz.event_create(timing=False)
    hz.event_record(ev2, s2)
    hz.stream_wait_event(s3, ev2)
    hz.memset_async(d, 3, 1024, s3)
    hz.device_synchronize()
    assert hz.hazards() == ()


def test_an_event_recorded_before_the_access_does_not_order_it(hz: SimBackend) -> None:
    s1, s2 = hz.stream_create(), hz.stream_create()
    d = hz.malloc(64)
    ev = hz.event_create(timing=False)
    hz.event_record(ev, s1)
    hz.memset_async(d, 1, 64, s1)  # after the record
    hz.stream_wait_event(s2, ev)
    hz.memset_async(d, 2, 64, s2)
    hz.device_synchronize()
    assert [h.kind for h in hz.hazards()] == ["race"]


def test_host_synchronization_orders_later_work(hz: SimBackend) -> None:
    s1, s2 = hz.stream_create(), hz.stream_create()
    d = hz.malloc(64)
    hz.memset_async(d, 1, 64, s1)
    hz.stream_synchronize(s1)
    hz.memset_async(d, 2, 64, s2)  # enqueued after the host saw s1 finish
    ev = hz.event_create(timing=False)
    hz.event_record(ev, s2)
    hz.event_synchronize(ev)
    hz.memset_async(d, 3, 64, s1)
    hz.device_synchronize()
    assert hz.hazards() == ()


def test_host_access_to_memory_in_flight(hz: SimBackend, gate: Gate) -> None:
    s = hz.stream_create()
    d, h = hz.malloc(256), hz.host_malloc(256)
    gate.block(hz, s)
    hz.memcpy_async(d, h, 256, H2D, s)  # reads h
    assert hz.check_host_access(h, 256, write=False) == ()  # reading while the copy reads is fine
    (found,) = hz.check_host_access(h + 128, 16, write=True)  # writing is not
    assert found.kind == "host_access" and (found.address, found.nbytes) == (h + 128, 16)
    assert "synchronize" in found.message
    hz.memcpy_async(h, d, 256, D2H, s)  # writes h
    assert [x.kind for x in hz.check_host_access(h, 8, write=False)] == ["host_access"]
    gate.open()
    hz.stream_synchronize(s)
    assert hz.check_host_access(h, 256, write=True) == ()  # synchronized: safe
    assert [x.kind for x in hz.hazards()] == ["host_access", "host_access"]


def test_host_access_is_safe_after_a_query_reports_completion(hz: SimBackend) -> None:
    s = hz.stream_create()
    d, h = hz.malloc(64), hz.host_malloc(64)
    hz.memcpy_async(h, d, 64, D2H, s)
    ev = hz.event_create(timing=False)
    hz.event_record(ev, s)
    while not hz.event_query(ev):
        pass
    assert hz.check_host_access(h, 64, write=True) == ()


def test_an_access_on_behalf_of_a_host_function_is_ordered_after_its_stream(hz: SimBackend) -> None:
    s1, s2 = hz.stream_create(), hz.stream_create()
    h = hz.host_malloc(64)
    d = hz.malloc(64)
    fn = PyHostFn()
    with pytest.raises(BackendError, match="no host function"):
        hz.check_host_access(h, 8, write=True, stream=s1)
    hz.memcpy_async(d, h, 64, H2D, s2)  # reads h, unordered with s1 (however fast it really runs)
    hz.memcpy_async(h, d, 64, D2H, s1)  # writes h, before the host function in s1
    hz.launch_host_func(s1, fn.ptr, 0)
    hz.stream_synchronize(s1)
    # a runtime worker reporting what the host function wrote: ordered after the D2H on s1,
    # but not after s2's pending read
    (found,) = hz.check_host_access(h, 64, write=True, stream=s1)
    assert found.kind == "race" and "host_func#" in found.ops[0] and "copy#" not in found.ops[0]
    assert "copy" in found.ops[1] and f"{s2:#x}" in found.ops[1]
    hz.device_synchronize()
    hz.clear_hazards()
    hz.memcpy_async(d, h, 64, H2D, s2)  # after the host synchronized: fine
    hz.stream_synchronize(s2)
    assert hz.hazards() == ()


def test_calls_from_a_host_function_raise_not_permitted_except_the_checking_tools() -> None:
    # check_host_access is a simulator tool, callable from a runtime worker on behalf of a host function;
    # from the callback thread itself it is refused like every backend call
    b = sim.create(check_hazards=True)
    try:
        s = b.stream_create()
        h = b.host_malloc(8)
        errors: list[BaseException] = []

        def body(ud: int) -> None:
            try:
                b.check_host_access(h, 8, True, stream=s)
            except BackendError as exc:
                errors.append(exc)

        fn = PyHostFn(body)
        b.launch_host_func(s, fn.ptr, 0)
        b.stream_synchronize(s)
        assert len(errors) == 1 and errors[0].code == 800  # type: ignore[attr-defined]
    finally:
        b.close()


def test_use_after_free_is_reported_and_refused(hz: SimBackend) -> None:
    s1, s2 = hz.stream_create(), hz.stream_create()
    d = hz.malloc(64)
    hz.free(d)
    with pytest.raises(BackendError, match="freed"):
        hz.memset_async(d, 0, 64, s1)
    h = hz.host_malloc(64)
    hz.host_free(h)
    (uaf,) = hz.check_host_access(h, 8, write=True)
    assert uaf.kind == "use_after_free"
    # a stream-ordered free racing with an access on another stream
    a = hz.malloc_async(64, s1)
    hz.stream_synchronize(s1)
    hz.memset_async(a, 1, 64, s2)
    hz.free_async(a, s1)  # nothing orders it after s2's memset
    hz.device_synchronize()
    kinds = [x.kind for x in hz.hazards()]
    assert kinds == ["use_after_free", "use_after_free", "use_after_free"]
    assert "frees" in hz.hazards()[-1].message


def test_a_stream_ordered_free_after_an_event_is_clean(hz: SimBackend) -> None:
    s1, s2 = hz.stream_create(), hz.stream_create()
    a = hz.malloc_async(64, s1)
    ev = hz.event_create(timing=False)
    hz.event_record(ev, s1)
    hz.stream_wait_event(s2, ev)
    hz.memset_async(a, 1, 64, s2)
    hz.event_record(ev, s2)
    hz.stream_wait_event(s1, ev)
    hz.free_async(a, s1)
    hz.device_synchronize()
    assert hz.hazards() == ()


def test_graph_replays_are_checked_against_other_streams(hz: SimBackend) -> None:
    s1, s2 = hz.stream_create(), hz.stream_create()
    d = hz.malloc(64)
    hz.stream_begin_capture(s1, CaptureMode.GLOBAL)
    hz.memset_async(d, 1, 64, s1)
    exe = hz.graph_instantiate(hz.stream_end_capture(s1))
    hz.graph_launch(exe, s1)
    hz.memset_async(d, 2, 64, s2)
    hz.device_synchronize()
    assert [x.kind for x in hz.hazards()] == ["race"]
    assert "graph_launch" in hz.hazards()[0].message


def test_raise_mode_raises_and_enqueues_nothing() -> None:
    b = sim.create(check_hazards="raise")
    try:
        s1, s2 = b.stream_create(), b.stream_create()
        h = b.host_malloc(64)
        b.memset_async(h, 1, 64, s1)
        with pytest.raises(HazardError) as exc:
            b.memset_async(h, 2, 64, s2)
        assert exc.value.code == 10000 and exc.value.name == "simErrorHazard"
        assert [x.kind for x in exc.value.hazards] == ["race"]
        b.device_synchronize()
        assert np.all(np.frombuffer((np.ctypeslib.as_ctypes_type(np.uint8) * 64).from_address(h), np.uint8) == 1)
        assert [r.kind for r in b.op_log()] == ["memset"]
        b.memset_async(h, 2, 64, s2)  # after the synchronize it is fine
    finally:
        b.close()


def test_hazard_checking_is_off_by_default(sb: SimBackend) -> None:
    s1, s2 = sb.stream_create(), sb.stream_create()
    d = sb.malloc(64)
    sb.memset_async(d, 1, 64, s1)
    sb.memset_async(d, 2, 64, s2)
    sb.device_synchronize()
    assert sb.hazards() == ()
    assert sb.check_host_access(d, 64, write=True) == ()


def test_clear_hazards(hz: SimBackend) -> None:
    s1, s2 = hz.stream_create(), hz.stream_create()
    d = hz.malloc(64)
    hz.memset_async(d, 1, 64, s1)
    hz.memset_async(d, 2, 64, s2)
    assert len(hz.hazards()) == 1
    hz.clear_hazards()
    assert hz.hazards() == ()
    hz.device_synchronize()
