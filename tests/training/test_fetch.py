"""fetch: a numpy copy of a tensor through pinned staging, resolved when the copy lands, never synchronizing."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import streamrt as srt

torch = pytest.importorskip("torch", reason="torch is not installed (make test installs torch==2.13.0, the CPU build)")
from training_helpers import no_blocking_calls, on_device, wait_until

import streamrt.torch as st

CASES = [
    (torch.float32, (3, 5)),
    (torch.float64, (7,)),
    (torch.float16, (2, 2, 2)),
    (torch.bfloat16, (9,)),
    (torch.int64, ()),
    (torch.int32, (4, 1)),
    (torch.int8, (5,)),
    (torch.uint8, (300,)),
    (torch.bool, (6,)),
    (torch.float32, (0, 3)),
]


def _sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    n = int(np.prod(shape)) if shape else 1
    base = torch.arange(n, dtype=torch.float64).reshape(shape) * 1.5 - 3
    if dtype == torch.bool:
        return base.reshape(-1).remainder(2).eq(0).reshape(shape)
    if dtype in (torch.uint8,):
        return torch.arange(n).remainder(256).to(dtype).reshape(shape)
    return base.to(dtype)


@pytest.mark.parametrize(("dtype", "shape"), CASES, ids=[f"{d}-{s}".replace("torch.", "") for d, s in CASES])
def test_fetch_returns_the_values(trt: srt.Runtime, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    """The future resolves with an array of the tensor's shape and values (bfloat16 widened to float32, exactly)."""
    host = _sample(dtype, shape)
    fut = st.fetch(trt, on_device(trt, host))
    got = fut.result(timeout=30)
    want = host.float().numpy() if dtype == torch.bfloat16 else host.numpy()
    assert got.dtype == want.dtype == fut.dtype
    assert got.shape == want.shape == fut.shape
    assert np.array_equal(got, want)


def test_fetch_plain_cpu_and_non_contiguous_tensors(trt: srt.Runtime) -> None:
    """Ordinary CPU tensors and non-contiguous tensors are fetched too; the result is a copy."""
    cpu = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    got = st.fetch(trt, cpu).result(timeout=30)
    cpu += 100
    assert np.array_equal(got, np.arange(12, dtype=np.float32).reshape(3, 4))
    dev = on_device(trt, torch.arange(12, dtype=torch.float32).reshape(3, 4))
    assert np.array_equal(st.fetch(trt, dev.t()).result(timeout=30), np.arange(12, dtype=np.float32).reshape(3, 4).T)
    assert st.fetch(trt, torch.tensor(2.5)).item() == 2.5


def test_in_place_updates_come_back_in_order(trt: srt.Runtime) -> None:
    """A tensor updated in place after each fetch: every future holds the value at its fetch, and the
    futures resolve in the order they were made (the copy sits in the tensor's stream order)."""
    acc = on_device(trt, torch.zeros(8))
    resolved: list[int] = []
    futures = []
    for i in range(64):
        acc.fill_(float(i))
        fut = st.fetch(trt, acc)
        fut.add_done_callback(lambda _f, i=i: resolved.append(i))
        futures.append(fut)
    acc.fill_(-1.0)
    for i, fut in enumerate(futures):
        assert np.array_equal(fut.result(timeout=30), np.full(8, float(i), dtype=np.float32))
    assert resolved == list(range(64))


def test_fetch_never_blocks_and_resolves_when_the_copy_lands(trt: srt.Runtime, gate: Callable[[srt.Stream], object], monkeypatch: pytest.MonkeyPatch) -> None:
    """With the tensor's stream held up, fetch returns at once without any blocking call; the future
    resolves only once the stream has run the copy."""
    x = on_device(trt, torch.arange(16, dtype=torch.float32))
    release = gate(st.current_stream(trt))
    with no_blocking_calls(monkeypatch):
        fut = st.fetch(trt, x)
        time.sleep(0.05)
        assert not fut.is_done
    release.set()  # type: ignore[attr-defined]
    assert np.array_equal(fut.result(timeout=30), np.arange(16, dtype=np.float32))


@pytest.mark.asyncio
async def test_await_fetch(trt: srt.Runtime) -> None:
    got = await st.fetch(trt, on_device(trt, torch.full((3,), 4.0)))
    assert np.array_equal(got, np.full(3, 4.0, dtype=np.float32))


def test_staging_is_held_until_the_copy_lands(trt: srt.Runtime, gate: Callable[[srt.Stream], object]) -> None:
    """The pinned staging stays in use (not reusable) until the copy has landed and been copied out;
    then the allocator has it back, and nothing of it is left in flight."""
    alloc = trt.host_allocator
    x = on_device(trt, torch.ones(1 << 18))  # 1 MiB
    before = alloc.statistics()
    release = gate(st.current_stream(trt))
    fut = st.fetch(trt, x)
    assert alloc.statistics().in_use_bytes == before.in_use_bytes + (1 << 20)
    assert not fut.is_done
    release.set()  # type: ignore[attr-defined]
    assert fut.result(timeout=30).sum() == 1 << 18
    assert wait_until(lambda: alloc.statistics().in_use_bytes == before.in_use_bytes)
    assert wait_until(lambda: alloc.statistics().in_flight_bytes == before.in_flight_bytes)


def test_fetch_on_another_stream(trt: srt.Runtime) -> None:
    """stream= puts the copy on another stream, which first waits for torch's stream."""
    x = on_device(trt, torch.arange(10, dtype=torch.int64))
    other = trt.create_stream()
    assert np.array_equal(st.fetch(trt, x, other).result(timeout=30), np.arange(10))


def test_fetch_a_buffer(trt: srt.Runtime) -> None:
    s = trt.create_stream()
    buf = trt.device_allocator.allocate(64, stream=s)
    s.memset(buf, 1)
    got = st.fetch(trt, buf, s, dtype=np.uint32).result(timeout=30)
    assert got.shape == (16,) and (got == 0x01010101).all()
    with pytest.raises(TypeError, match="stream="):
        st.fetch(trt, buf)
    buf.release()


def test_fetch_rejects_bad_arguments(trt: srt.Runtime) -> None:
    with pytest.raises(TypeError, match="torch tensor or a streamrt Buffer"):
        st.fetch(trt, [1.0, 2.0])
    with pytest.raises(TypeError, match="dtype="):
        st.fetch(trt, torch.zeros(2), dtype=np.float32)
    with srt.open_runtime("sim") as other, pytest.raises(ValueError, match="another runtime"):
        st.fetch(trt, torch.zeros(2), other.create_stream())


class _CopyRecordOps:
    """A stand-in for a GPU backend's native ops on the simulator: ``copy_record`` makes the three calls
    through the simulator and fails where told (``fail_at``: 0 the capture check says capturing, 1 the
    copy fails, 2 the record fails after the copy)."""

    def __init__(self, backend: object) -> None:
        self.backend = backend
        self.calls = 0
        self.fail_at: int | None = None

    def copy_record(self, dst: int, src: int, nbytes: int, kind: int, stream: int, event: int) -> tuple[int, BaseException | None] | None:
        self.calls += 1
        b: object = self.backend
        if self.fail_at == 0 or b.stream_is_capturing(stream):  # type: ignore[attr-defined]
            return 0, None
        if self.fail_at == 1:
            return 1, srt.BackendError("sim", 1, "E1", "copy failed", "memcpy_async")
        b.memcpy_async(dst, src, nbytes, srt.MemcpyKind(kind), stream)  # type: ignore[attr-defined]
        if self.fail_at == 2:
            return 2, srt.BackendError("sim", 2, "E2", "record failed", "event_record")
        b.event_record(event, stream)  # type: ignore[attr-defined]
        return None


@pytest.mark.parametrize("helper", ["fetch", "log"])
def test_the_native_copy_and_record_path_and_its_failures(helper: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the backend has native ops, a fetch (and a logged value) is one ``copy_record`` call; a failure
    raises, watches nothing, and gives the staging back: at once if nothing was enqueued, else after the copy."""
    with srt.open_runtime("sim") as rt:
        ops = _CopyRecordOps(rt.backend)
        monkeypatch.setattr(rt.backend, "native_ops", ops)
        x = on_device(rt, torch.arange(6, dtype=torch.float32))
        logger = st.MetricsLogger(rt, lag=0, sink=None)
        alloc = rt.host_allocator
        before = alloc.statistics()

        def call() -> np.ndarray:
            if helper == "fetch":
                return st.fetch(rt, x).result(timeout=30)
            logger.log(len(logger.records), x)
            logger.flush(30)
            return logger.records[-1][1]

        assert np.array_equal(call(), np.arange(6, dtype=np.float32)) and ops.calls == 1
        for fail_at, error in ((0, srt.CaptureError), (1, srt.BackendError), (2, srt.BackendError)):
            ops.fail_at = fail_at
            with pytest.raises(error):
                call()
            rt.synchronize()
            assert wait_until(lambda: alloc.statistics().in_use_bytes == before.in_use_bytes)
            assert wait_until(lambda: alloc.statistics().in_flight_bytes == before.in_flight_bytes)
        ops.fail_at = None
        assert np.array_equal(call(), np.arange(6, dtype=np.float32)) and ops.calls == 5
        assert logger.pending == 0
        logger.close()


def test_a_pending_fetch_is_polled_with_one_query_and_no_lane_machinery(
    trt: srt.Runtime, gate: Callable[[srt.Stream], object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the copy has not landed, ``is_done`` is one event query of the copy's own event: no
    other streamrt Python call (a loop polls it every step); once it has, it retires and reports it."""
    x = on_device(trt, torch.arange(4, dtype=torch.float32))
    release = gate(st.current_stream(trt))
    try:
        fut = st.fetch(trt, x)
        backend = trt._base_backend
        queried: list[int] = []
        real_query = backend.event_query
        calls: list[str] = []
        me = threading.get_ident()

        def query(event: int) -> bool:
            if threading.get_ident() == me:  # (a runtime thread may query meanwhile)
                queried.append(event)
            return bool(real_query(event))

        def profile(frame: Any, event: str, _arg: Any) -> None:
            name = frame.f_code.co_filename
            if event == "call" and "/streamrt/" in name and "/streamrt/_backends/" not in name and "/tests/" not in name:
                calls.append(frame.f_code.co_qualname)

        monkeypatch.setattr(backend, "event_query", query)
        sys.setprofile(profile)
        try:
            done = fut.is_done
        finally:
            sys.setprofile(None)
        monkeypatch.undo()
        assert not done and calls == ["FetchFuture.is_done"] and queried == [fut._watched._handle]  # type: ignore[union-attr]
    finally:
        release.set()  # type: ignore[attr-defined]
    assert wait_until(lambda: fut.is_done)
    assert np.array_equal(fut.result(timeout=30), np.arange(4, dtype=np.float32))
