"""Memsets and copies move real bytes, in stream order, on every backend."""

from __future__ import annotations

import numpy as np
import pytest

import streamrt as srt


def _host(rt: srt.Runtime, n: int, fill: int | None = None) -> srt.Buffer:
    buf = rt.host_allocator.allocate(n)
    if fill is not None:
        buf.numpy()[:] = fill
    return buf


def test_memset_then_copy_to_host_gives_the_value(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    d = rt.device_allocator.allocate(4096, stream=s)
    h = _host(rt, 4096, fill=0)
    s.memset(d, 0x5A)
    s.copy(h, d)
    s.synchronize()
    assert (h.numpy() == 0x5A).all()


def test_round_trip_through_the_device_in_every_direction(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    n = 1 << 20
    src = _host(rt, n)
    src.numpy()[:] = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    d1 = rt.device_allocator.allocate(n)
    d2 = rt.device_allocator.allocate(n)
    mid = _host(rt, n, fill=0)
    out = _host(rt, n, fill=0)
    s.copy(d1, src)  # H2D
    s.copy(d2, d1)  # D2D
    s.copy(mid, d2)  # D2H
    s.copy(out, mid)  # H2H
    s.synchronize()
    assert np.array_equal(out.numpy(), src.numpy())


def test_partial_sizes_and_views_touch_only_their_range(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    d = rt.device_allocator.allocate(64)
    h = _host(rt, 64, fill=0)
    s.memset(d, 1)
    s.memset(d.view(16, 16), 2)
    s.memset(d, 3, nbytes=4)
    s.copy(h, d)
    s.synchronize()
    expect = np.ones(64, np.uint8)
    expect[16:32] = 2
    expect[:4] = 3
    assert np.array_equal(h.numpy(), expect)


def test_copy_defaults_to_the_source_size(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    big = rt.device_allocator.allocate(128)
    small = _host(rt, 32, fill=7)
    out = _host(rt, 128, fill=0)
    s.memset(big, 0)
    s.copy(big, small)
    s.copy(out, big)
    s.synchronize()
    assert (out.numpy()[:32] == 7).all() and (out.numpy()[32:] == 0).all()


def test_seed_sequence_memset_d2h_host_h2d_runs_in_stream_order(rt: srt.Runtime) -> None:
    """The seed's shape: memset(acc) -> D2H(seqstart) -> host pack -> H2D(metadata)."""
    s = rt.create_stream()
    seqstart = np.array([0, 3, 7, 7, 12], dtype=np.int32)
    d_seq = rt.device_allocator.allocate(seqstart.nbytes)
    staging = _host(rt, seqstart.nbytes)
    staging.numpy(np.int32)[:] = seqstart
    s.copy(d_seq, staging)
    s.synchronize()
    staging.numpy(np.int32)[:] = -1

    acc = rt.device_allocator.allocate(256)
    h_seq = _host(rt, seqstart.nbytes, fill=0)
    meta = _host(rt, 4 * 4, fill=0)
    d_meta = rt.device_allocator.allocate(16)
    out = _host(rt, 16, fill=0)

    def pack() -> int:
        lens = np.diff(h_seq.numpy(np.int32))
        meta.numpy(np.int32)[:] = lens
        return int(lens.sum())

    s.memset(acc, 0)
    s.copy(h_seq, d_seq)
    done = s.launch_host_func(pack)
    s.copy(d_meta, meta)
    s.copy(out, d_meta)
    s.synchronize()
    assert done.result(timeout=10) == 12
    assert out.numpy(np.int32).tolist() == [3, 4, 0, 5]


def test_buffer_numpy_views_alias_pinned_memory(rt: srt.Runtime) -> None:
    h = _host(rt, 16)
    h.numpy(np.float32)[:] = [1, 2, 3, 4]
    assert h.numpy(np.float32).tolist() == [1.0, 2.0, 3.0, 4.0]
    assert h.kind == "host" and h.nbytes == 16 and h.ptr != 0


def test_device_buffer_has_no_host_view(rt: srt.Runtime) -> None:
    d = rt.device_allocator.allocate(16)
    assert d.kind == "device"
    with pytest.raises(TypeError, match="no host view"):
        d.numpy()
