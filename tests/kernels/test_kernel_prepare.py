"""The device-side workspace prepare (kernel (a), strategies "device" and "device_graph") writes the
numpy reference's metadata bytes and zeroes exactly the used dq_acc bytes, on every backend; its
simulator twin computes the same bytes as the device."""

from __future__ import annotations

import weakref

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from kernel_cases import EDGE_CASES, Case, random_cases
from kernel_helpers import run_twin
from support.transfer import download, upload

import streamrt as srt
from streamrt._kernel._builtin import prepare_scalars
from streamrt.recipes.fmha_bwd import (
    DevicePrepare,
    parse_metadata,
    prepare_workspace,
    reference_metadata,
    workspace_size,
)

FILL = 0xAB


class Device:
    """seqstart and workspace buffers on a device, reused across cases (grown when needed)."""

    def __init__(self, rt: srt.Runtime) -> None:
        self.rt = rt
        self.s = rt.create_stream()
        self.bufs: dict[str, srt.Buffer] = {}

    def buffer(self, what: str, nbytes: int) -> srt.Buffer:
        buf = self.bufs.get(what)
        if buf is None or buf.nbytes < nbytes:
            if buf is not None:
                buf.release()
            buf = self.bufs[what] = self.rt.device_allocator.allocate(max(nbytes, 64), stream=self.s)
        return buf.view(0, nbytes)

    def load(self, case: Case) -> tuple[srt.Buffer, srt.Buffer, srt.Buffer]:
        params, q, k = case
        dq = upload(self.rt, self.s, q, self.buffer("q", q.nbytes))
        dk = upload(self.rt, self.s, k, self.buffer("k", k.nbytes))
        ws = self.buffer("ws", workspace_size(params))
        self.s.memset(ws, FILL)
        return dq, dk, ws


_devices: weakref.WeakKeyDictionary[srt.Runtime, Device] = weakref.WeakKeyDictionary()


def expected(case: Case) -> tuple[np.ndarray, int]:
    params, q, k = case
    ref = reference_metadata(params, q, k)
    return ref, parse_metadata(ref).dq_acc_used_bytes


def check_workspace(case: Case, ws: np.ndarray) -> None:
    """The metadata region is the reference's; the used dq_acc is zero; the rest is untouched."""
    params = case[0]
    ref, used = expected(case)
    region = params.metadata_region_bytes
    meta = ws[:region]
    if not np.array_equal(meta, ref):
        bad = np.flatnonzero(meta != ref)
        raise AssertionError(f"metadata differs at bytes {bad[:16].tolist()} (of {bad.size}); status {parse_metadata(ref).status}")
    acc = ws[region:]
    assert (acc[:used] == 0).all(), "the used dq_acc bytes were not all zeroed"
    assert (acc[used:] == FILL).all(), "bytes past dq_acc_used_bytes were written"


def run_device(dev: Device, case: Case, strategy: str = "enqueue") -> np.ndarray:
    params = case[0]
    dq, dk, ws = dev.load(case)
    with DevicePrepare(dev.rt, params, dq, dk, ws) as prep:
        if strategy == "enqueue":
            prep.enqueue(dev.s)
        elif strategy == "device":
            prep.launch(dev.s).result(10)
        else:
            prep.replay(dev.s).result(10)
        return download(dev.rt, dev.s, ws)


@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_device_prepare_matches_the_reference_on_edge_cases(rt: srt.Runtime, name: str) -> None:
    case = EDGE_CASES[name]
    check_workspace(case, run_device(Device(rt), case))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=random_cases())
def test_device_prepare_matches_the_reference_on_random_seqlens(rt: srt.Runtime, case: Case) -> None:
    dev = _devices.get(rt)
    if dev is None:
        dev = _devices[rt] = Device(rt)  # one set of buffers for all examples
    check_workspace(case, run_device(dev, case))


@pytest.mark.parametrize("strategy", ["device", "device_graph"])
def test_eager_and_captured_prepares_rerun_on_current_seqstart(rt: srt.Runtime, strategy: str) -> None:
    """One DevicePrepare, seqstart rewritten between launches: each launch (or replay) reads the new values."""
    from kernel_cases import make_case

    dev = Device(rt)
    first = make_case([10, 0, 90], [33, 64, 0], num_cus=8)
    params = first[0]
    second = (params, np.array([0, 5, 5, 100], np.int32), np.array([0, 1, 65, 129], np.int32))
    dq, dk, ws = dev.load(first)
    with DevicePrepare(rt, params, dq, dk, ws) as prep:
        for case in (first, second, first):
            upload(rt, dev.s, case[1], dq)
            upload(rt, dev.s, case[2], dk)
            dev.s.memset(ws, FILL)
            run = prep.launch(dev.s) if strategy == "device" else prep.replay(dev.s)
            run.result(10)
            check_workspace(case, download(rt, dev.s, ws))
        assert (prep.graph is not None) == (strategy == "device_graph")


@pytest.mark.parametrize("strategy", ["device", "device_graph"])
def test_prepare_workspace_runs_the_device_strategies(rt: srt.Runtime, strategy: str) -> None:
    case = EDGE_CASES["some-empty"]
    dev = Device(rt)
    dq, dk, ws = dev.load(case)
    prepare_workspace(rt, dev.s, case[0], dq, dk, ws, strategy).result(10)
    check_workspace(case, download(rt, dev.s, ws))


def test_invalid_input_is_reported_in_the_status_field(rt: srt.Runtime) -> None:
    case = EDGE_CASES["seqlen-k-exceeded"]
    dev = Device(rt)
    dq, dk, ws = dev.load(case)
    with DevicePrepare(rt, case[0], dq, dk, ws) as prep:
        prep.enqueue(dev.s)
        meta = prep.metadata(dev.s)
    assert not meta.ok and meta.dq_acc_used_bytes == 0
    with pytest.raises(Exception, match="longer than max_seqlen_k"):
        meta.raise_for_status()


def test_a_misaligned_or_short_workspace_is_refused_before_launch(rt: srt.Runtime) -> None:
    case = EDGE_CASES["batch-1"]
    params = case[0]
    dev = Device(rt)
    dq, dk, _ws = dev.load(case)
    big = dev.buffer("big", workspace_size(params) + 64)
    with pytest.raises(ValueError, match="16-byte aligned"):
        DevicePrepare(rt, params, dq, dk, big.view(4, workspace_size(params)))
    with pytest.raises(ValueError, match="workspace has"):
        DevicePrepare(rt, params, dq, dk, big.view(0, workspace_size(params) - 16))
    with pytest.raises(ValueError, match="seqstart_q has 4 bytes"):
        DevicePrepare(rt, params, dq.view(0, 4), dk, big)
    with pytest.raises(ValueError, match="seqstart_k overlaps the workspace"):
        DevicePrepare(rt, params, dq, big.view(workspace_size(params) - 16, 8), big.view(0, workspace_size(params)))


@pytest.mark.parametrize("name", ["h200-like", "batch-1024", "more-workers-than-units", "every-status-bit"])
def test_the_prepare_twin_computes_the_device_bytes(rt: srt.Runtime, name: str) -> None:
    """On a GPU backend: the numpy twin, run on host copies of the same inputs, writes the same workspace."""
    case = EDGE_CASES[name]
    params, q, k = case
    on_device = run_device(Device(rt), case)
    host = np.full(workspace_size(params) + 16, FILL, np.uint8)
    off = (-host.ctypes.data) % 16
    ws = host[off : off + workspace_size(params)]
    qq, kk = np.ascontiguousarray(q, np.int32), np.ascontiguousarray(k, np.int32)
    args = [qq.ctypes.data, kk.ctypes.data, ws.ctypes.data, *prepare_scalars(params)]
    run_twin("fmha_bwd_prepare", (2, 1, 1), (256, 1, 1), [qq, kk, ws], args)
    assert np.array_equal(ws, on_device)
