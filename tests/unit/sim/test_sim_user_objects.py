"""The simulator's user objects: a graph and its execs share one reference; the destructor runs on the callback thread."""

from __future__ import annotations

import ctypes
import threading

import pytest

import streamrt as srt
from streamrt._backends.sim import create
from streamrt._errors import BackendError, CaptureError

_names: list[str] = []
_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda data: _names.append(f"{threading.current_thread().name}:{data}"))
_ADDRESS = ctypes.cast(_DESTRUCTOR, ctypes.c_void_p).value or 0


@pytest.fixture
def sb():  # type: ignore[no-untyped-def]
    backend = create()
    _names.clear()
    yield backend
    backend.close()


def _captured(sb, stream: int, obj: int) -> int:  # type: ignore[no-untyped-def]
    ptr = sb.host_malloc(64)
    sb.stream_begin_capture(stream, srt.CaptureMode.THREAD_LOCAL)
    graph = sb.stream_capture_graph(stream)
    assert graph and sb.stream_capture_graph(stream) == graph
    sb.graph_retain_user_object(graph, obj)
    sb.memset_async(ptr, 1, 64, stream)
    assert sb.stream_end_capture(stream) == graph  # the handle it had while capturing
    return graph


def test_the_destructor_runs_once_the_graph_and_its_execs_are_gone_on_the_callback_thread(sb) -> None:  # type: ignore[no-untyped-def]
    s = sb.stream_create(0)
    assert sb.stream_capture_graph(s) == 0
    graph = _captured(sb, s, sb.user_object_create(_ADDRESS, 7))
    execs = [sb.graph_instantiate(graph), sb.graph_instantiate(graph)]
    sb.graph_destroy(graph)
    sb.graph_launch(execs[0], s)
    sb.graph_exec_destroy(execs[0])
    sb.stream_synchronize(s)
    assert _names == []  # the second exec still holds it
    sb.graph_exec_destroy(execs[1])
    sb.device_synchronize()
    assert _names == ["streamrt-sim-callback-0:7"]


def test_a_reference_the_caller_still_owns_is_released_directly(sb) -> None:  # type: ignore[no-untyped-def]
    obj = sb.user_object_create(_ADDRESS, 3)
    sb.user_object_release(obj)
    sb.device_synchronize()
    assert _names == ["streamrt-sim-callback-0:3"]
    with pytest.raises(BackendError, match="not a live sim user object"):
        sb.user_object_release(obj)


def test_a_failed_capture_drops_the_references_its_graph_held(sb) -> None:  # type: ignore[no-untyped-def]
    s = sb.stream_create(0)
    sb.stream_begin_capture(s, srt.CaptureMode.GLOBAL)
    sb.graph_retain_user_object(sb.stream_capture_graph(s), sb.user_object_create(_ADDRESS, 5))
    with pytest.raises(BackendError):
        sb.malloc(64)  # invalidates the global capture
    with pytest.raises(CaptureError, match="invalidated"):
        sb.stream_capture_graph(s)
    with pytest.raises(CaptureError):
        sb.stream_end_capture(s)
    sb.device_synchronize()
    assert _names == ["streamrt-sim-callback-0:5"]


def test_bad_handles_are_refused(sb) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BackendError, match="NULL"):
        sb.user_object_create(0, 1)
    obj = sb.user_object_create(_ADDRESS, 1)
    with pytest.raises(BackendError, match="not a live sim graph"):
        sb.graph_retain_user_object(12345, obj)
    sb.user_object_release(obj)
