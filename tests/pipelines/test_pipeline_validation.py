"""Every bad pipeline input is rejected with a clear error before anything is enqueued."""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_helpers import pinned
from support.transfer import download

import streamrt as srt


@pytest.fixture
def s(rt: srt.Runtime) -> srt.Stream:
    return rt.create_stream()


def _canary(rt: srt.Runtime, s: srt.Stream) -> tuple[srt.Pipeline, srt.Buffer]:
    """A pipeline whose first node would set a device buffer to 7 if anything ran."""
    d = rt.device_allocator.allocate(64, stream=s)
    s.memset(d, 0)
    p = srt.Pipeline("canary")
    p.memset(d, 7)
    return p, d


def _nothing_ran(rt: srt.Runtime, s: srt.Stream, d: srt.Buffer) -> bool:
    return bool((download(rt, s, d) == 0).all())


def test_a_cycle_is_rejected_at_launch_naming_the_nodes(rt: srt.Runtime, s: srt.Stream) -> None:
    p, d = _canary(rt, s)
    a = p.host(lambda: None, name="a")
    b = p.host(lambda: None, after=[a], name="b")
    p.add_edge(b, a)
    for policy in ("stream", "fork"):
        with pytest.raises(ValueError, match="cycle: 'a' -> 'b' -> 'a'"):
            p.launch(s, policy=policy)
    with pytest.raises(ValueError, match="cycle"):
        p.capture(s)
    assert _nothing_ran(rt, s, d)


def test_an_empty_pipeline_cannot_be_launched_or_captured(rt: srt.Runtime, s: srt.Stream) -> None:
    p = srt.Pipeline("empty")
    with pytest.raises(ValueError, match="empty"):
        p.launch(s)
    with pytest.raises(ValueError, match="empty"):
        p.capture(s)


@pytest.mark.parametrize("case", ["copy_src_short", "copy_dst_short", "memset_long"])
def test_size_mismatches_are_rejected_when_the_node_is_made(rt: srt.Runtime, case: str) -> None:
    big = rt.device_allocator.allocate(128)
    small = rt.host_allocator.allocate(64)
    p = srt.Pipeline("sizes")
    with pytest.raises(ValueError, match="exceed"):
        if case == "copy_src_short":
            p.copy(dst=big, src=small, nbytes=100)
        elif case == "copy_dst_short":
            p.copy(dst=small, src=big)
        else:
            p.memset(small, 0, nbytes=65)
    assert len(p) == 0


def test_a_host_node_declaring_device_memory_is_rejected(rt: srt.Runtime) -> None:
    d = rt.device_allocator.allocate(64)
    p = srt.Pipeline("host-device")
    with pytest.raises(ValueError, match="declares device memory"):
        p.host(lambda: None, reads=[d])
    with pytest.raises(ValueError, match="declares device memory"):
        p.host(lambda: None, writes=[d.view(0, 8)])
    assert len(p) == 0


def test_copies_naming_pageable_memory_are_rejected(rt: srt.Runtime) -> None:
    p = srt.Pipeline("pageable", runtime=rt)
    a = np.zeros(64, np.uint8)
    b = np.zeros(64, np.uint8)
    d = rt.device_allocator.allocate(64)
    with pytest.raises(ValueError, match="pageable"):
        p.copy(dst=a, src=b)
    with pytest.raises(ValueError, match="rt.host_allocator"):
        p.copy(dst=d, src=b)
    with pytest.raises(ValueError, match="pageable"):
        p.memset(a, 0)


def test_a_host_node_may_declare_pageable_memory(rt: srt.Runtime, s: srt.Stream) -> None:
    arr = np.zeros(16, np.int64)
    p = srt.Pipeline("pageable-host", runtime=rt)
    p.host(np.copyto, arr, 5, writes=[arr])
    p.launch(s).result(10)
    assert (arr == 5).all()


def test_foreign_memory_needs_a_runtime(rt: srt.Runtime) -> None:
    p = srt.Pipeline("no-runtime")
    with pytest.raises(TypeError, match="runtime=rt"):
        p.host(lambda: None, reads=[np.zeros(4)])


def test_nodes_of_another_pipeline_are_rejected(rt: srt.Runtime) -> None:
    p1, p2 = srt.Pipeline("one"), srt.Pipeline("two")
    a = p1.host(lambda: None)
    b = p2.host(lambda: None)
    with pytest.raises(ValueError, match="belongs to pipeline 'one'"):
        p2.host(lambda: None, after=[a])
    with pytest.raises(ValueError, match="belongs to pipeline 'one'"):
        p2.add_edge(a, b)
    with pytest.raises(TypeError, match="Node"):
        p2.host(lambda: None, after=["host0"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="itself"):
        p2.add_edge(b, b)


def test_a_released_buffer_is_rejected_at_node_creation_and_at_launch(rt: srt.Runtime, s: srt.Stream) -> None:
    d = rt.device_allocator.allocate(64, stream=s)
    gone = rt.device_allocator.allocate(64)
    gone.release()
    p = srt.Pipeline("released")
    with pytest.raises(ValueError, match="released"):
        p.memset(gone, 0)
    p.memset(d, 1)
    d.release()
    with pytest.raises(ValueError, match="released"):
        p.launch(s)
    with pytest.raises(ValueError, match="released"):
        p.capture(s)


def test_buffers_and_streams_of_another_runtime_are_rejected(rt: srt.Runtime) -> None:
    with srt.open_runtime("sim") as other:
        mine = rt.device_allocator.allocate(64)
        theirs = other.device_allocator.allocate(64)
        p = srt.Pipeline("two-runtimes")
        p.memset(mine, 0)
        with pytest.raises(ValueError, match="another runtime"):
            p.memset(theirs, 0)
        with pytest.raises(ValueError, match="another runtime"):
            p.launch(other.create_stream())
        with pytest.raises(ValueError, match="another runtime"):
            p.wait(other.create_event())


def test_bad_arguments_are_type_and_value_errors(rt: srt.Runtime, s: srt.Stream) -> None:
    d = rt.device_allocator.allocate(64)
    h = pinned(rt, 64)
    p = srt.Pipeline("args")
    with pytest.raises(ValueError, match="value"):
        p.memset(d, 256)
    with pytest.raises(ValueError, match="value"):
        p.memset(d, True)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        p.memset(d, 0, nbytes=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="overlap"):
        p.copy(dst=d.view(8, 32), src=d.view(0, 32))
    with pytest.raises(TypeError, match="callable"):
        p.host(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="list of buffers"):
        p.host(lambda: None, reads=h)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Event"):
        p.record("event")  # type: ignore[arg-type]
    p.memset(d, 0, name="zero")
    with pytest.raises(ValueError, match="already has a node named 'zero'"):
        p.memset(d, 0, name="zero")
    with pytest.raises(ValueError, match="policy"):
        p.launch(s, policy="parallel")
    with pytest.raises(TypeError, match="wait_for"):
        p.launch(s, policy="fork", wait_for="now")
    with pytest.raises(TypeError, match="Stream"):
        p.launch(s.handle)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        srt.Pipeline("")


def test_a_read_only_destination_is_rejected(rt: srt.Runtime) -> None:
    src = np.zeros(64, np.uint8)
    src.flags.writeable = False
    ro = rt.as_buffer(src)
    p = srt.Pipeline("ro", runtime=rt)
    with pytest.raises(ValueError, match="read-only"):
        p.memset(rt.as_buffer(np.frombuffer(bytes(8), np.uint8)), 0)
    d = rt.device_allocator.allocate(64)
    with pytest.raises(ValueError, match="read-only"):
        p.copy(dst=ro, src=d)


def test_a_closed_stream_is_rejected(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    p, _ = _canary(rt, s)
    s.synchronize()
    s.close()
    with pytest.raises(srt.ClosedError):
        p.launch(s)


def test_event_nodes_cannot_be_captured(rt: srt.Runtime, s: srt.Stream) -> None:
    p, d = _canary(rt, s)
    p.record(rt.create_event())
    with pytest.raises(srt.CaptureError, match="cannot be captured"):
        p.capture(s)
    assert not s.is_closed and _nothing_ran(rt, s, d)
