"""Memory across libraries on the simulator: Buffers as DLPack (and no CUDA array interface there), and
foreign device memory ordered after its producer's stream, checked by the hazard checker."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest
from interop_helpers import fake_cuda_capsule, races

import streamrt as srt

KDL_CPU, KDL_CUDA = 1, 2


def test_simulator_buffers_export_as_cpu_memory(hz: srt.Runtime) -> None:
    s = hz.create_stream()
    d = hz.device_allocator.allocate(64, stream=s)
    h = hz.host_allocator.allocate(64)
    s.memset(d, 7)
    s.synchronize()
    assert d.__dlpack_device__() == (KDL_CPU, 0) and h.__dlpack_device__() == (KDL_CPU, 0)
    a = np.from_dlpack(d)
    assert a.dtype == np.uint8 and a.shape == (64,) and (a == 7).all() and a.ctypes.data == d.ptr
    assert not hasattr(d, "__cuda_array_interface__") and not hasattr(h, "__cuda_array_interface__")
    # views export their own range
    v = np.from_dlpack(d.view(8, 16))
    assert v.shape == (16,) and v.ctypes.data == d.ptr + 8


def test_torch_from_dlpack_aliases_the_buffer(hz: srt.Runtime) -> None:
    torch = pytest.importorskip("torch")
    s = hz.create_stream()
    d = hz.device_allocator.allocate(32, stream=s)
    s.memset(d, 1)
    s.synchronize()
    t = torch.from_dlpack(d)
    assert t.dtype == torch.uint8 and t.tolist() == [1] * 32
    t[:4] = 9  # the host writes through torch; streamrt reads the same bytes
    h = hz.host_allocator.allocate(32)
    s.copy(h, d)
    s.synchronize()
    assert h.numpy()[:5].tolist() == [9, 9, 9, 9, 1]


def test_versioned_and_legacy_capsules_and_read_only_buffers(hz: srt.Runtime) -> None:
    d = hz.device_allocator.allocate(16)
    assert "dltensor_versioned" in repr(d.__dlpack__(max_version=(1, 0)))
    assert '"dltensor"' in repr(d.__dlpack__())
    assert '"dltensor"' in repr(d.__dlpack__(max_version=(0, 8)))
    frozen = np.arange(8, dtype=np.uint8)
    frozen.flags.writeable = False
    ro = hz.as_buffer(frozen)
    assert ro.readonly
    with pytest.raises(BufferError, match="readonly"):
        ro.__dlpack__()  # legacy DLPack cannot say read-only
    got = np.from_dlpack(ro)  # numpy asks for a versioned capsule
    assert not got.flags.writeable and got.tolist() == list(range(8))


def test_bad_export_requests_raise_buffer_error(hz: srt.Runtime) -> None:
    d = hz.device_allocator.allocate(16)
    with pytest.raises(BufferError, match="without copying"):
        d.__dlpack__(copy=True)
    with pytest.raises(BufferError, match=r"lives on DLPack device \(1, 0\)"):
        d.__dlpack__(dl_device=(KDL_CUDA, 0))
    with pytest.raises(TypeError, match="stream must be None or an int"):
        d.__dlpack__(stream="default")
    d.release()
    with pytest.raises(ValueError, match="after release"):
        d.__dlpack__()


def test_the_capsule_keeps_the_buffer_alive_until_the_consumer_lets_go(hz: srt.Runtime) -> None:
    buf = hz.as_buffer(np.arange(64, dtype=np.uint8))
    alive = weakref.ref(buf)
    consumer = np.from_dlpack(buf)
    del buf
    gc.collect()
    assert alive() is not None  # the consumer's array holds it through the capsule's deleter
    assert consumer[5] == 5
    del consumer
    gc.collect()
    assert alive() is None
    # a capsule nobody consumes frees it too (its destructor runs the deleter)
    buf = hz.as_buffer(np.zeros(8, dtype=np.uint8))
    alive = weakref.ref(buf)
    capsule = buf.__dlpack__(max_version=(1, 0))
    del buf
    gc.collect()
    assert alive() is not None
    del capsule
    gc.collect()
    assert alive() is None


def test_consumer_stream_waits_for_streamrt_work_through_an_event(hz: srt.Runtime, foreign_stream: int) -> None:
    s = hz.create_stream()
    d = hz.device_allocator.allocate(1 << 16, stream=s)
    h = hz.host_allocator.allocate(1 << 16)
    s.memset(d, 3)
    d.__dlpack__(stream=foreign_stream)  # the consumer hands its stream: it waits on the device
    hz.backend.memcpy_async(h.ptr, d.ptr, d.nbytes, srt.MemcpyKind.DEVICE_TO_HOST, foreign_stream)
    hz.backend.stream_synchronize(foreign_stream)
    assert races(hz) == [] and (h.numpy() == 3).all()
    # the same without ordering (stream=-1: "the consumer orders itself"): a race the checker reports
    s.memset(d, 4)
    d.__dlpack__(stream=-1)
    hz.backend.memcpy_async(h.ptr, d.ptr, d.nbytes, srt.MemcpyKind.DEVICE_TO_HOST, foreign_stream)
    hz.backend.stream_synchronize(foreign_stream)
    assert races(hz)


# -- import: the producer's stream comes first ----------------------------------------------------------


class ProducedArray:
    """Device memory another library produced on ``stream`` (CUDA array interface v3)."""

    def __init__(self, ptr: int, nbytes: int, stream: int | None, version: int = 3) -> None:
        self.__cuda_array_interface__: dict[str, Any] = {
            "data": (ptr, False),
            "shape": (nbytes,),
            "typestr": "|u1",
            "version": version,
            "stream": stream,
        }


def _produce(rt: srt.Runtime, stream: int, nbytes: int = 1 << 16) -> tuple[srt.Buffer, srt.Buffer]:
    """Memory that ``stream`` (another library's) is still writing, and a host buffer to read it into."""
    d = rt.device_allocator.allocate(nbytes)
    rt.backend.memset_async(d.ptr, 6, nbytes, stream)
    return d, rt.host_allocator.allocate(nbytes)


def test_cai_stream_orders_the_consuming_stream_after_the_producer(hz: srt.Runtime, foreign_stream: int) -> None:
    s = hz.create_stream()
    d, h = _produce(hz, foreign_stream)
    wrapped = hz.as_buffer(ProducedArray(d.ptr, d.nbytes, foreign_stream), stream=s)
    s.copy(h, wrapped)
    s.synchronize()
    assert races(hz) == [] and (h.numpy() == 6).all()
    # a stream operation given the object orders itself too
    hz.backend.memset_async(d.ptr, 8, d.nbytes, foreign_stream)
    s.copy(h, ProducedArray(d.ptr, d.nbytes, foreign_stream))
    s.synchronize()
    assert races(hz) == [] and (h.numpy() == 8).all()


def test_without_a_consuming_stream_nothing_is_ordered(hz: srt.Runtime, foreign_stream: int) -> None:
    s = hz.create_stream()
    d, h = _produce(hz, foreign_stream)
    wrapped = hz.as_buffer(ProducedArray(d.ptr, d.nbytes, foreign_stream))  # no stream=: nothing ordered
    s.copy(h, wrapped)
    s.synchronize()
    assert races(hz)


def test_cai_legacy_stream_and_bad_stream_values(hz: srt.Runtime) -> None:
    s = hz.create_stream()
    d, h = _produce(hz, 0)  # the legacy default stream, which CAI calls 1
    s.copy(h, hz.as_buffer(ProducedArray(d.ptr, d.nbytes, 1), stream=s))
    s.synchronize()
    assert races(hz) == []
    with pytest.raises(ValueError, match="stream 0 is not allowed"):
        hz.as_buffer(ProducedArray(d.ptr, d.nbytes, 0), stream=s)
    # version 2 has no stream field semantics: nothing is read from it
    hz.as_buffer(ProducedArray(d.ptr, d.nbytes, 0, version=2), stream=s)
    with pytest.raises(TypeError, match="Stream of this runtime"):
        hz.as_buffer(ProducedArray(d.ptr, d.nbytes, None), stream=s.handle)  # type: ignore[arg-type]


class DLPackProducer:
    """A DLPack producer of CUDA device memory that orders itself before the consumer's stream."""

    def __init__(self, rt: srt.Runtime, mem: srt.Buffer, stream: int, *, readonly: bool = False) -> None:
        self.rt, self.mem, self.stream, self.readonly = rt, mem, stream, readonly
        self.calls: list[dict[str, Any]] = []

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CUDA, 0)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None) -> Any:
        self.calls.append({"stream": stream, "max_version": max_version})
        if stream is not None and stream != -1:
            backend = self.rt.backend
            event = backend.event_create(timing=False)
            backend.event_record(event, self.stream)
            backend.stream_wait_event(stream, event)
            backend.event_destroy(event)
        return fake_cuda_capsule(self.mem, versioned=max_version is not None, readonly=self.readonly)


def test_dlpack_producers_get_the_consuming_stream(hz: srt.Runtime, foreign_stream: int) -> None:
    s = hz.create_stream()
    d, h = _produce(hz, foreign_stream)
    producer = DLPackProducer(hz, d, foreign_stream)
    wrapped = hz.as_buffer(producer, stream=s)
    assert producer.calls == [{"stream": s.handle, "max_version": (1, 0)}]
    assert wrapped.kind == "device" and wrapped.ptr == d.ptr and wrapped.nbytes == d.nbytes
    s.copy(h, wrapped)
    s.synchronize()
    assert races(hz) == [] and (h.numpy() == 6).all()
    # read-only memory (flagged in the versioned capsule) wraps as a read-only Buffer
    ro = hz.as_buffer(DLPackProducer(hz, d, foreign_stream, readonly=True), stream=s)
    assert ro.readonly
    with pytest.raises(ValueError, match="read-only"):
        s.memset(ro, 0)


def test_dlpack_producers_without_a_consuming_stream_are_not_asked_to_order(hz: srt.Runtime, foreign_stream: int) -> None:
    d, _ = _produce(hz, foreign_stream)
    producer = DLPackProducer(hz, d, foreign_stream)
    hz.as_buffer(producer)
    assert producer.calls == [{"stream": None, "max_version": (1, 0)}]
