"""Stream.launch_kernel and kernel pipeline nodes: every argument is checked before anything is enqueued;
kernel nodes take part in dependency inference, both launch policies, capture and graph updates."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.transfer import download

import streamrt as srt
from streamrt._kernel import checksum_words, fill_words

N = 1024  # words


class Env:
    def __init__(self, rt: srt.Runtime) -> None:
        self.rt = rt
        self.s = rt.create_stream()
        self.buf = rt.device_allocator.allocate(4 * N, stream=self.s)
        self.s.memset(self.buf, 0x5A)
        self.fill = rt.kernels.get("fill_u32")
        self.checksum = rt.kernels.get("checksum_u32")

    def words(self, buf: srt.Buffer | None = None) -> np.ndarray:
        return download(self.rt, self.s, self.buf if buf is None else buf, np.uint32)

    def untouched(self) -> bool:
        return bool((self.words() == 0x5A5A5A5A).all())


@pytest.fixture
def env(rt: srt.Runtime) -> Env:
    return Env(rt)


def test_a_launch_runs_with_positional_or_named_arguments_and_notes_the_stream(env: Env) -> None:
    env.s.launch_kernel(env.fill, (N // 256,), (256, 1, 1), [env.buf, N, 7, 2])
    assert np.array_equal(env.words(), fill_words(N, 7, 2))
    env.s.launch_kernel(env.fill, 4, 256, {"out": env.buf, "count": np.uint64(N), "value": np.int64(1), "step": 0})
    assert (env.words() == 1).all()
    assert env.s in env.buf.streams


BAD_COUNT = [[], ["buf"], ["buf", N, 1], ["buf", N, 1, 0, 9]]


@pytest.mark.parametrize("args", BAD_COUNT, ids=["none", "one", "three", "five"])
def test_a_wrong_argument_count_is_a_type_error(env: Env, args: list[Any]) -> None:
    args = [env.buf if a == "buf" else a for a in args]
    with pytest.raises(TypeError, match="takes 4 argument"):
        env.s.launch_kernel(env.fill, 4, 256, args)
    assert env.untouched()


@pytest.mark.parametrize(
    "args",
    [
        ["buf", 1.5, 1, 0],  # float for an integer
        ["buf", N, "1", 0],  # str for an integer
        ["buf", N, True, 0],  # bool for an integer
        [1.0, N, 1, 0],  # float for a pointer
        ["ptr", N, 1, 0],  # str for a pointer
        [[1, 2, 3], N, 1, 0],  # an object exposing no memory
    ],
    ids=["float-int", "str-int", "bool-int", "float-ptr", "str-ptr", "list-ptr"],
)
def test_a_wrong_argument_type_is_a_type_error(env: Env, args: list[Any]) -> None:
    args = [env.buf if a == "buf" else a for a in args]
    with pytest.raises(TypeError):
        env.s.launch_kernel(env.fill, 4, 256, args)
    assert env.untouched()


def test_arguments_by_name_must_name_every_parameter(env: Env) -> None:
    with pytest.raises(TypeError, match="missing \\['step'\\]"):
        env.s.launch_kernel(env.fill, 4, 256, {"out": env.buf, "count": N, "value": 1})
    with pytest.raises(TypeError, match="args must be a list"):
        env.s.launch_kernel(env.fill, 4, 256, env.buf)


def test_a_buffer_too_small_for_the_declared_access_is_a_value_error(env: Env) -> None:
    with pytest.raises(ValueError, match=f"out has {4 * N} bytes, but the kernel touches {4 * (N + 1)}"):
        env.s.launch_kernel(env.fill, 4, 256, [env.buf, N + 1, 1, 0])
    with pytest.raises(ValueError, match="data has 40 bytes"):
        env.s.launch_kernel(env.checksum, 1, 256, [env.buf.view(0, 40), 11, env.buf.view(64, 8)])
    with pytest.raises(ValueError, match="result has 4 bytes"):
        env.s.launch_kernel(env.checksum, 1, 256, [env.buf.view(0, 40), 10, env.buf.view(64, 4)])
    assert env.untouched()


def test_values_out_of_range_null_and_misaligned_pointers_are_value_errors(env: Env) -> None:
    for args, match in [
        ([env.buf, -1, 1, 0], "does not fit"),
        ([env.buf, N, 2**32, 0], "does not fit"),
        ([None, N, 1, 0], "NULL"),
        ([0, N, 1, 0], "NULL"),
        ([env.buf.view(2, 64), 4, 1, 0], "aligned"),
    ]:
        with pytest.raises(ValueError, match=match):
            env.s.launch_kernel(env.fill, 4, 256, args)
    assert env.untouched()


def test_memory_a_kernel_cannot_use_is_refused(env: Env) -> None:
    with pytest.raises(ValueError, match="pageable"):
        env.s.launch_kernel(env.fill, 1, 256, [np.zeros(N, np.uint32), N, 1, 0])

    class ReadOnlyDevice:  # foreign device memory marked read-only
        def __init__(self, buf: srt.Buffer) -> None:
            self.__cuda_array_interface__ = {"data": (buf.ptr, True), "shape": (N,), "typestr": "<u4", "version": 3}

    with pytest.raises(ValueError, match="read-only"):
        env.s.launch_kernel(env.fill, 1, 256, [ReadOnlyDevice(env.buf), N, 1, 0])
    released = env.rt.device_allocator.allocate(4 * N, stream=env.s)
    released.release()
    with pytest.raises(ValueError, match="released"):
        env.s.launch_kernel(env.fill, 1, 256, [released, N, 1, 0])
    assert env.untouched()


def test_buffers_and_kernels_of_another_runtime_are_refused(env: Env) -> None:
    with srt.open_runtime(env.rt.backend_name) as other:
        s2 = other.create_stream()
        foreign = other.device_allocator.allocate(4 * N, stream=s2)
        with pytest.raises(ValueError, match="another runtime"):
            env.s.launch_kernel(env.fill, 1, 256, [foreign, N, 1, 0])
        with pytest.raises(ValueError, match="another runtime"):
            s2.launch_kernel(env.fill, 1, 256, [foreign, N, 1, 0])
        foreign.release()
    assert env.untouched()


@pytest.mark.parametrize(
    ("grid", "block", "error"),
    [
        (0, 256, ValueError),
        (4, 2048, ValueError),
        (4, (32, 32, 2), ValueError),
        ((1, 2, 3, 4), 256, ValueError),
        (4.0, 256, TypeError),
        (True, 256, TypeError),
        ((4, 2), 256, ValueError),  # fill_u32's spec: x dimensions only
    ],
)
def test_bad_launch_shapes_are_refused(env: Env, grid: Any, block: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        env.s.launch_kernel(env.fill, grid, block, [env.buf, N, 1, 0])
    with pytest.raises((TypeError, ValueError)):
        env.s.launch_kernel(env.fill, 4, 256, [env.buf, N, 1, 0], shared_mem=-1)
    with pytest.raises(TypeError, match="takes a Kernel"):
        env.s.launch_kernel("fill_u32", 4, 256, [env.buf, N, 1, 0])  # type: ignore[arg-type]
    assert env.untouched()


def test_a_launch_is_traced_as_a_kernel_op_named_after_the_kernel(env: Env) -> None:
    with env.rt.trace() as t:
        env.s.launch_kernel(env.fill, 4, 256, [env.buf, N, 1, 0])
    kernels = t.trace.ops(kind="kernel")
    assert [r.node for r in kernels] == ["fill_u32"]


# -- pipelines ---------------------------------------------------------------------------------------


def _checksum_pipeline(env: Env, value: int, result: srt.Buffer) -> srt.Pipeline:
    p = srt.Pipeline("fill-then-checksum")
    p.kernel(env.fill, 4, 256, [env.buf, N, value, 1], name="fill")
    p.memset(result, 0, name="zero")
    p.kernel(env.checksum, 2, 256, [env.buf, N, result], name="sum")
    return p


def test_kernel_nodes_infer_their_dependencies_from_the_kernel_spec(env: Env) -> None:
    result = env.rt.device_allocator.allocate(8, stream=env.s)
    p = _checksum_pipeline(env, 3, result)
    edges = {(e.before.name, e.after.name): e.reasons for e in p.edges}
    # sum reads buf (fill wrote it) and reads and writes result (zero wrote it).
    assert edges == {("fill", "sum"): frozenset({"RAW"}), ("zero", "sum"): frozenset({"RAW", "WAW"})}
    fill = p.nodes[0]
    assert fill.kind == "kernel" and fill.writes == (env.buf,) and fill.reads == ()


@pytest.mark.parametrize("policy", ["stream", "fork"])
def test_kernel_nodes_launch_under_both_policies(env: Env, policy: str) -> None:
    result = env.rt.device_allocator.allocate(8, stream=env.s)
    run = _checksum_pipeline(env, 11, result).launch(env.s, policy=policy)
    run.result(10)
    got = int(download(env.rt, env.s, result, np.uint64)[0])
    assert got == checksum_words(fill_words(N, 11, 1))


def test_kernel_nodes_are_captured_and_replayed_and_rebound(env: Env) -> None:
    result = env.rt.device_allocator.allocate(8, stream=env.s)
    p = _checksum_pipeline(env, 5, result)
    g = p.capture(env.s)
    try:
        for _ in range(2):
            env.s.memset(env.buf, 0)
            g.launch(env.s).result(10)
            assert int(download(env.rt, env.s, result, np.uint64)[0]) == checksum_words(fill_words(N, 5, 1))
        other = env.rt.device_allocator.allocate(4 * N, stream=env.s)
        g.update({env.buf: other})
        g.launch(env.s).result(10)
        assert np.array_equal(env.words(other), fill_words(N, 5, 1))
    finally:
        g.close()


def test_kernel_node_arguments_are_checked_when_the_node_is_made(env: Env) -> None:
    p = srt.Pipeline("bad")
    with pytest.raises(ValueError, match="kernel node 'k'.*out has"):
        p.kernel(env.fill, 4, 256, [env.buf, N + 1, 1, 0], name="k")
    with pytest.raises(TypeError, match="kernel node 'k'"):
        p.kernel(env.fill, 4, 256, [env.buf, N], name="k")
    assert len(p) == 0


def test_explicit_reads_and_writes_replace_the_inferred_ones(env: Env) -> None:
    p = srt.Pipeline("explicit")
    other = env.rt.device_allocator.allocate(64, stream=env.s)
    node = p.kernel(env.fill, 4, 256, [env.buf.ptr, N, 1, 0], writes=[env.buf], reads=[other])  # raw address
    assert node.writes == (env.buf,) and node.reads == (other,)
    p.launch(env.s).result(10)
    assert (env.words() == 1).all()
