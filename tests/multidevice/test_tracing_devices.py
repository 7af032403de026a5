"""Tracing a runtime of a simulator shared by several devices: a trace holds the ops of its runtime's
device only, waits for that device at the end, sees peer copies as copies, and keeps a kernel node's
label and its kernel's name side by side (also in the Chrome export)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from md_helpers import pattern
from support.transfer import download, upload

import streamrt as srt
from streamrt._trace import start_trace, stop_trace
from streamrt._trace_export import chrome_trace

N = 1024  # words
ODD = 3000  # a memset size nothing else in these tests uses


@pytest.fixture(autouse=True)
def _kernel_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled kernels go to a temporary directory, never to ~/.cache."""
    monkeypatch.setenv("STREAMRT_KERNEL_CACHE", str(tmp_path_factory.mktemp("kernel-cache")))


def own_labels(rt: srt.Runtime) -> set[str]:
    """The stream labels a trace of ``rt`` may use: its streams' names (unnamed ones are numbered)."""
    return {s.name for s in list(rt._streams)} | {f"stream {i}" for i in range(1, 64)}


def device_ops_since(backend: Any, seq: int, device: int) -> list[Any]:
    return [r for r in backend.op_log() if r.seq > seq and r.device == device]


def test_a_trace_lists_only_the_ops_of_its_runtime_device(pair) -> None:
    rt0, rt1 = pair
    backend = rt1.backend
    s0 = rt0.create_stream(name="zero-main")
    s1 = rt1.create_stream(name="one-main")
    a0 = upload(rt0, s0, pattern(1 << 16, 1))
    b1 = rt1.device_allocator.allocate(1 << 16, stream=s1)
    start = backend.op_log()[-1].seq
    with rt1.trace() as t1:
        for _ in range(3):
            s0.memset(a0.view(0, ODD), 7)  # device 0, not traced: must stay out of device 1's trace
        s1.wait(s0.record())
        s1.copy(b1, a0)  # a peer copy: runtime 0's peer stream (device 0) waits for it
        s1.memset(b1.view(0, 512), 1)
        s0.synchronize()
        s1.synchronize()
    records = t1.trace.records
    assert records
    # the simulator ran device-0 ops meanwhile, and the trace shows none of them
    assert sum(r.kind == "memset" and r.nbytes == ODD for r in device_ops_since(backend, start, 0)) == 3
    assert not [r for r in records if r.nbytes == ODD]
    assert {r.stream for r in records} <= own_labels(rt1), {r.stream for r in records}
    assert all(not r.stream.startswith("stream 0x") for r in records)
    # every op of device 1 in that window is in the trace, traced or not
    on_device_1 = [r for r in device_ops_since(backend, start, 1) if r.kind != "graph_launch"]
    assert len([r for r in records if r.on_device or r.traced]) >= len(on_device_1) > 0
    # s0.record() is runtime 0's; the record after the peer copy (for runtime 0's peer stream) is on s1
    assert [r.kind for r in records if r.traced] == ["wait_event", "device_to_device", "record", "memset"]
    assert t1.trace.meta["device"] == 1 and not t1.trace.notes


def test_two_runtimes_traced_at_once_each_see_their_own_device(pair) -> None:
    rt0, rt1 = pair
    s0, s1 = rt0.create_stream(name="zero-main"), rt1.create_stream(name="one-main")
    d0 = rt0.device_allocator.allocate(4096, stream=s0)
    d1 = rt1.device_allocator.allocate(8192, stream=s1)
    with rt0.trace() as t0, rt1.trace() as t1:
        s0.memset(d0, 1)
        s1.memset(d1, 2)
        s1.memset(d1, 3)
        s0.synchronize()
        s1.synchronize()
    memsets0 = [r for r in t0.trace.records if r.kind == "memset"]
    memsets1 = [r for r in t1.trace.records if r.kind == "memset"]
    assert [(r.stream, r.nbytes) for r in memsets0] == [("zero-main", 4096)]
    assert [(r.stream, r.nbytes) for r in memsets1] == [("one-main", 8192), ("one-main", 8192)]
    assert all(r.on_device for r in memsets0 + memsets1)


def test_the_end_of_a_trace_waits_for_its_runtime_device_whatever_is_current(pair) -> None:
    """Leaving the region synchronizes runtime 1's device, not the thread's current one: the slow host
    function and the memset behind it are complete and timed when the trace is built."""
    rt0, rt1 = pair
    backend = rt1.backend
    s1 = rt1.create_stream(name="one-main")
    d1 = rt1.device_allocator.allocate(4096, stream=s1)
    s1.synchronize()
    with rt1.trace() as t:
        s1.launch_host_func(time.sleep, 0.3)
        s1.memset(d1, 5)
        backend.set_device(0)  # e.g. the thread went on to work with runtime 0
    traced = [r for r in t.trace.records if r.traced]
    assert [r.kind for r in traced] == ["host_python", "memset"]
    assert all(r.on_device for r in traced), traced
    assert not t.trace.notes
    assert rt0.device == 0


def test_peer_copies_are_copies_in_sim_traces_traced_or_not(pair) -> None:
    rt0, rt1 = pair
    backend = rt1.backend
    s0, s1 = rt0.create_stream(), rt1.create_stream(name="one-main")
    a0 = upload(rt0, s0, pattern(1 << 16, 2))
    b1 = rt1.device_allocator.allocate(1 << 16, stream=s1)
    c1 = rt1.device_allocator.allocate(1 << 16, stream=s1)
    s1.synchronize()
    with rt1.trace() as t:
        s1.copy(b1, a0)  # through streamrt: traced
        backend.memcpy_peer_async(c1.ptr, 1, a0.ptr, 0, 1 << 15, s1.handle)  # behind streamrt's back: untraced
        s1.synchronize()
    copies = [r for r in t.trace.records if r.kind == "device_to_device"]
    assert [(r.traced, r.nbytes, r.category) for r in copies] == [(True, 1 << 16, "copy"), (False, 1 << 15, "copy")]
    assert all(r.on_device and r.device_us and r.device_us > 0 for r in copies)
    assert not [r for r in t.trace.records if r.kind == "copy_peer" or r.category == "other"]
    assert np.array_equal(download(rt1, s1, c1)[: 1 << 15], pattern(1 << 16, 2)[: 1 << 15])


def test_hazards_of_other_devices_stay_out_of_a_trace(machine) -> None:
    rt0, rt1 = machine(2, check_hazards=True)
    a, b = rt0.create_stream(), rt0.create_stream()
    d0 = rt0.device_allocator.allocate(4096, stream=a)
    a.synchronize()
    s1 = rt1.create_stream()
    with rt1.trace() as t1, rt0.trace() as t0:
        a.memset(d0, 1)
        b.memset(d0, 2)  # a race between two streams of device 0
        a.synchronize()
        b.synchronize()
        s1.launch_host_func(lambda: None).result(5)
    assert [h["kind"] for h in t0.trace.hazards] == ["race"] and len(t0.trace.hazards[0]["seqs"]) == 2
    assert t1.trace.hazards == ()


def test_an_event_clock_trace_of_device_1_works_while_device_0_is_current(pair) -> None:
    """With timing events (the GPU method), the tracer's events and calibration stream are made on the
    runtime's device: recording them on runtime 1's streams is legal."""
    rt0, rt1 = pair
    backend = rt1.backend
    s1 = rt1.create_stream(name="one-main")
    d1 = rt1.device_allocator.allocate(1 << 16, stream=s1)
    s1.synchronize()
    backend.set_device(0)
    start_trace(rt1, clock="events")
    backend.set_device(0)
    s1.memset(d1, 1)
    backend.set_device(0)
    s1.memset(d1, 2)
    trace = stop_trace(rt1)
    assert trace.clock == "events"
    memsets = [r for r in trace.records if r.kind == "memset"]
    assert len(memsets) == 2 and all(r.on_device for r in memsets)
    assert (download(rt1, s1, d1) == 2).all()


def test_a_kernel_node_keeps_its_label_and_its_kernel_name(pair) -> None:
    _rt0, rt1 = pair
    s1 = rt1.create_stream(name="one-main")
    buf = rt1.device_allocator.allocate(4 * N, stream=s1)
    fill = rt1.kernels.get("fill_u32")
    p = srt.Pipeline("prep")
    p.kernel(fill, 4, 256, [buf, N, 4, 1], name="fill-words")
    s1.synchronize()
    with rt1.trace() as t:
        s1.memset(buf, 0)
        p.launch(s1).result(10)
        s1.launch_kernel(fill, 4, 256, [buf, N, 4, 1])  # no label: the kernel's name is the node too
        s1.synchronize()
    kernels = [r for r in t.trace.records if r.kind == "kernel"]
    assert [(r.pipeline, r.node, r.op_name, r.name) for r in kernels] == [
        ("prep", "fill-words", "fill_u32", "fill-words"),
        (None, "fill_u32", "fill_u32", "fill_u32"),
    ]
    memset = next(r for r in t.trace.records if r.kind == "memset")
    assert memset.op_name is None and memset.name == "memset"
    doc = chrome_trace(t.trace)
    device_events = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    assert [(e["name"], e["args"].get("node"), e["args"].get("op_name")) for e in device_events] == [
        ("fill-words", "fill-words", "fill_u32"),
        ("fill_u32", "fill_u32", "fill_u32"),
    ]
    assert not [e for e in doc["traceEvents"] if e.get("cat") not in ("kernel", None) and "op_name" in e.get("args", {})]


def test_replayed_graph_kernel_nodes_keep_their_node_names_and_kernel_names(pair) -> None:
    _rt0, rt1 = pair
    s1 = rt1.create_stream(name="one-main")
    buf = rt1.device_allocator.allocate(4 * N, stream=s1)
    fill = rt1.kernels.get("fill_u32")
    p = srt.Pipeline("replay")
    p.kernel(fill, 4, 256, [buf, N, 6, 0], name="fill-again")
    s1.synchronize()
    graph = p.capture(s1)
    try:
        with rt1.trace() as t:
            graph.launch(s1).result(10)
        nodes = [r for r in t.trace.records if r.graph_node >= 0]
        assert [(r.kind, r.node, r.op_name, r.traced) for r in nodes] == [("kernel", "fill-again", "fill_u32", False)]
    finally:
        graph.close()
    assert (download(rt1, s1, buf).view(np.uint32) == 6).all()
