"""The device-side workspace prepare (strategies "device" and "device_graph") writes CK's metadata image,
reports the oracle's result out of band and zeroes what CK zeroes, on every backend; the prezero kernel
zeroes exactly the count it reads; the simulator twins compute the same bytes as the device."""

from __future__ import annotations

import subprocess
import sys
import weakref

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from kernel_cases import EDGE_CASES, LIMIT_CASES, Case, make_case, random_cases
from kernel_helpers import run_twin
from support.transfer import download, upload

import streamrt as srt
from streamrt.recipes.fmha_bwd import (
    DevicePrepare,
    PrepareResult,
    prepare_workspace,
    reference_metadata,
    reference_result,
    workspace_size,
)
from streamrt.recipes.fmha_bwd._kernels import PREPARE_THREADS, prepare_scalars

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

    def load(self, case: Case, nbytes: int | None = None) -> tuple[srt.Buffer, srt.Buffer, srt.Buffer]:
        params, q, k = case
        dq = upload(self.rt, self.s, q, self.buffer("q", q.nbytes))
        dk = upload(self.rt, self.s, k, self.buffer("k", k.nbytes))
        ws = self.buffer("ws", workspace_size(params) if nbytes is None else nbytes)
        self.s.memset(ws, FILL)
        return dq, dk, ws


_devices: weakref.WeakKeyDictionary[srt.Runtime, Device] = weakref.WeakKeyDictionary()


def check_workspace(case: Case, ws: np.ndarray) -> None:
    """The metadata region is the oracle's; dq_acc is zero where CK zeroes it and untouched after."""
    params, q, k = case
    ref = reference_metadata(params, q, k)
    region = params.metadata_region_bytes
    meta = ws[:region]
    if not np.array_equal(meta, ref):
        bad = np.flatnonzero(meta != ref)
        raise AssertionError(f"metadata differs at bytes {bad[:16].tolist()} (of {bad.size})")
    zero = reference_result(params, q, k).dq_acc_used_bytes if params.deterministic else params.dq_acc_bound_bytes
    acc = ws[region:]
    assert (acc[:zero] == 0).all(), "dq_acc was not zeroed where CK zeroes it"
    assert (acc[zero:] == FILL).all(), "bytes past the used dq_acc were written"


def run_device(dev: Device, case: Case, strategy: str = "enqueue") -> tuple[np.ndarray, PrepareResult]:
    params = case[0]
    dq, dk, ws = dev.load(case)
    with DevicePrepare(dev.rt, params, dq, dk, ws) as prep:
        if strategy == "enqueue":
            prep.enqueue(dev.s)
        elif strategy == "device":
            prep.launch(dev.s).result(10)
        else:
            prep.replay(dev.s).result(10)
        return download(dev.rt, dev.s, ws), prep.result(dev.s)


@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_device_prepare_matches_the_oracle_on_edge_cases(rt: srt.Runtime, name: str) -> None:
    case = EDGE_CASES[name]
    ws, result = run_device(Device(rt), case)
    check_workspace(case, ws)
    assert result == reference_result(*case)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=random_cases())
def test_device_prepare_matches_the_oracle_on_random_seqlens(rt: srt.Runtime, case: Case) -> None:
    dev = _devices.get(rt)
    if dev is None:
        dev = _devices[rt] = Device(rt)  # one set of buffers for all examples
    ws, result = run_device(dev, case)
    check_workspace(case, ws)
    assert result == reference_result(*case)


@pytest.mark.parametrize("name", list(LIMIT_CASES))
def test_the_metadata_kernel_near_the_32_bit_limits(rt: srt.Runtime, name: str) -> None:
    """Lengths near 2**31: the kernel alone, on a metadata-sized buffer, writes the oracle's image and flags CK's hazard."""
    params, q, k = case = LIMIT_CASES[name]
    dev = Device(rt)
    dq, dk, meta = dev.load(case, params.metadata_region_bytes)
    result = dev.buffer("result", 16)
    dev.s.launch_kernel(rt.kernels.get("fmha_bwd_prepare"), 1, PREPARE_THREADS, [dq, dk, meta, result, *prepare_scalars(params)])
    assert np.array_equal(download(rt, dev.s, meta), reference_metadata(*case))
    got = PrepareResult.from_record(download(rt, dev.s, result))
    assert got == reference_result(*case) and got.ck_int32_overflow


@pytest.mark.parametrize("strategy", ["device", "device_graph"])
def test_eager_and_captured_prepares_rerun_on_current_seqstart(rt: srt.Runtime, strategy: str) -> None:
    """One DevicePrepare, seqstart rewritten between launches: each launch (or replay) reads the new values."""
    dev = Device(rt)
    first = make_case([10, 0, 90], [33, 64, 0], num_cus=8)
    params = first[0]
    second = (params, np.array([0, 5, 5, 100], np.int32), np.array([0, 1, 65, 129], np.int32))
    third = (params, np.array([0, 5, 5, 100], np.int32), np.array([3, 3, 3, 3], np.int32))  # no keys
    dq, dk, ws = dev.load(first)
    with DevicePrepare(rt, params, dq, dk, ws) as prep:
        for case in (first, second, third, first):
            upload(rt, dev.s, case[1], dq)
            upload(rt, dev.s, case[2], dk)
            dev.s.memset(ws, FILL)
            run = prep.launch(dev.s) if strategy == "device" else prep.replay(dev.s)
            run.result(10)
            check_workspace(case, download(rt, dev.s, ws))
            assert prep.result(dev.s) == reference_result(*case)
        assert (prep.graph is not None) == (strategy == "device_graph")


@pytest.mark.parametrize("strategy", ["device", "device_graph"])
def test_prepare_workspace_runs_the_device_strategies(rt: srt.Runtime, strategy: str) -> None:
    case = EDGE_CASES["some-empty"]
    dev = Device(rt)
    dq, dk, ws = dev.load(case)
    prepare_workspace(rt, dev.s, case[0], dq, dk, ws, strategy).result(10)
    check_workspace(case, download(rt, dev.s, ws))


def test_invalid_input_is_reported_in_the_result_not_the_workspace(rt: srt.Runtime) -> None:
    case = EDGE_CASES["seqlen-k-exceeded"]
    dev = Device(rt)
    dq, dk, ws = dev.load(case)
    with DevicePrepare(rt, case[0], dq, dk, ws) as prep:
        prep.enqueue(dev.s)
        result = prep.result(dev.s)
        meta = prep.metadata(dev.s)
    assert not result.ok and result.dq_acc_used_bytes == 0
    assert meta.dq_acc_used_bytes == 0 and (meta.cu_state["ibatch"] == case[0].batch).all()  # the idle image
    with pytest.raises(Exception, match="longer than max_seqlen_k"):
        result.raise_for_status()


def test_a_device_prepare_is_two_nodes_as_in_ck(sim_rt: srt.Runtime) -> None:
    for name, nodes in (("batch-1", ["prepare", "prezero"]), ("batch-1-nondet", ["zero_dq_acc", "prepare"])):
        case = EDGE_CASES[name]
        with DevicePrepare(sim_rt, case[0], *Device(sim_rt).load(case)) as prep:
            assert [n.name for n in prep.pipeline.nodes] == nodes
            assert prep.grids[0] == (1, 1, 1) and len(prep.grids) == (2 if nodes[1] == "prezero" else 1)


def test_a_misaligned_short_or_overlapping_buffer_is_refused_before_launch(rt: srt.Runtime) -> None:
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


@pytest.mark.parametrize("count", [0, 1, 3, 4, 5, 1000, 4099, 1 << 16])
def test_the_prezero_zeroes_exactly_the_count_it_reads(rt: srt.Runtime, count: int) -> None:
    """CK's DqAccPrezeroKernel: the count comes from device memory, clamped to max_count; nothing past it is written."""
    dev = Device(rt)
    max_count = 40000
    ws = dev.buffer("ws", 4096 + 4 * max_count + 64)
    dev.s.memset(ws, FILL)
    upload(rt, dev.s, np.array([count], np.int64), ws.view(1024, 8))
    grid = 1 if count < 1000 else 3
    dev.s.launch_kernel(rt.kernels.get("fmha_bwd_dq_acc_prezero"), grid, 256, [ws, 1024, 4096, max_count])
    raw = download(rt, dev.s, ws)
    zeroed = 4 * min(count, max_count)
    assert (raw[4096 : 4096 + zeroed] == 0).all()
    assert (raw[4096 + zeroed :] == FILL).all() and (raw[:1024] == FILL).all()


def test_the_prezero_spec_refuses_bad_offsets(sim_rt: srt.Runtime) -> None:
    ws = sim_rt.device_allocator.allocate(8192)
    s = sim_rt.create_stream()
    kernel = sim_rt.kernels.get("fmha_bwd_dq_acc_prezero")
    for args, match in (([ws, 4, 4096, 10], "8-byte aligned"), ([ws, 4096, 4096, 10], "before dq_acc"), ([ws, 0, 4104, 10], "16-byte")):
        with pytest.raises(ValueError, match=match):
            s.launch_kernel(kernel, 1, 256, args)
    with pytest.raises(ValueError):
        s.launch_kernel(kernel, 1, 256, [ws, 0, 4096, 2000])  # 4096 + 8000 bytes > the buffer


@pytest.mark.parametrize("name", ["h200-like", "xcd-order-304", "batch-1024", "batch-2100-global-scratch", "every-status-bit"])
def test_the_prepare_twin_computes_the_device_bytes(rt: srt.Runtime, name: str) -> None:
    """On a GPU backend: the numpy twin, run on host copies of the same inputs, writes the same metadata and record."""
    case = EDGE_CASES[name]
    params, q, k = case
    on_device, result = run_device(Device(rt), case)
    host = np.full(params.metadata_region_bytes + 16, FILL, np.uint8)
    off = (-host.ctypes.data) % 16
    meta = host[off : off + params.metadata_region_bytes]
    record = np.zeros(2, np.uint64)
    qq, kk = np.ascontiguousarray(q, np.int32), np.ascontiguousarray(k, np.int32)
    args = [qq.ctypes.data, kk.ctypes.data, meta.ctypes.data, record.ctypes.data, *prepare_scalars(params)]
    run_twin("fmha_bwd_prepare", (1, 1, 1), (256, 1, 1), [qq, kk, meta, record], args)
    assert np.array_equal(meta, on_device[: params.metadata_region_bytes])
    assert PrepareResult.from_record(record.view(np.uint8)) == result


def test_the_recipe_registers_its_kernels_when_their_sources_are_loaded() -> None:
    """The kernel layer imports no recipe; loading a recipe's source imports the package it names, which registers
    the spec and the twin (a fresh interpreter, so no other test imported the recipe first)."""
    code = (
        "import sys, streamrt as srt, streamrt._kernel\n"
        "assert 'streamrt.recipes.fmha_bwd' not in sys.modules\n"
        "with srt.open_runtime('sim') as rt:\n"
        "    k = rt.kernels.get('fmha_bwd_dq_acc_prezero')\n"
        "    assert 'streamrt.recipes.fmha_bwd' in sys.modules and k.spec is not None\n"
        "    assert rt.kernels.get('fmha_bwd_prepare').spec.check is not None\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
