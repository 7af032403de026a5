"""Dependency inference from declared access (one test per hazard kind), explicit edges, and the fork plan."""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_helpers import pinned
from support.transfer import download, upload

import streamrt as srt
from streamrt._pipeline._deps import plan_fork, topological_order


def test_read_after_write_orders_the_reader_after_the_writer(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    d = upload(rt, s, np.arange(64, dtype=np.uint8))
    h = pinned(rt, 64, fill=0)
    seen: list[np.ndarray] = []
    p = srt.Pipeline("raw")
    w = p.copy(dst=h, src=d)  # writes h
    r = p.host(lambda: seen.append(h.numpy().copy()), reads=[h])  # reads h
    assert p.predecessors(r) == {w: frozenset({"RAW"})}
    p.launch(s, policy="fork").result(10)
    assert np.array_equal(seen[0], np.arange(64))


def test_write_after_read_orders_the_writer_after_the_reader(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    d = upload(rt, s, np.full(64, 9, np.uint8))
    h = pinned(rt, 64, fill=1)
    seen: list[np.ndarray] = []
    p = srt.Pipeline("war")
    r = p.host(lambda: seen.append(h.numpy().copy()), reads=[h])
    w = p.copy(dst=h, src=d)  # overwrites what the host node reads
    assert p.predecessors(w) == {r: frozenset({"WAR"})}
    p.launch(s, policy="fork").result(10)
    s.synchronize()
    assert (seen[0] == 1).all() and (h.numpy() == 9).all()


def test_write_after_write_keeps_the_later_write(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    d = rt.device_allocator.allocate(256, stream=s)
    p = srt.Pipeline("waw")
    first = p.memset(d, 1)
    second = p.memset(d.view(64, 64), 2)
    assert p.predecessors(second) == {first: frozenset({"WAW"})}
    p.launch(s, policy="fork").result(10)
    expect = np.ones(256, np.uint8)
    expect[64:128] = 2
    assert np.array_equal(download(rt, s, d), expect)


def test_disjoint_views_of_one_buffer_are_independent(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    d = rt.device_allocator.allocate(256, stream=s)
    p = srt.Pipeline("views")
    a = p.memset(d.view(0, 128), 1)
    b = p.memset(d.view(128, 128), 2)
    c = p.memset(d, 3, nbytes=64)  # overlaps a only
    assert p.predecessors(b) == {}
    assert p.predecessors(c) == {a: frozenset({"WAW"})}
    assert [e.reasons for e in p.edges] == [frozenset({"WAW"})]
    p.launch(s, policy="fork").result(10)
    out = download(rt, s, d)
    assert (out[:64] == 3).all() and (out[64:128] == 1).all() and (out[128:] == 2).all()


def test_two_readers_do_not_depend_on_each_other(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    d = rt.device_allocator.allocate(64, stream=s)
    h1, h2 = pinned(rt, 64), pinned(rt, 64)
    p = srt.Pipeline("rar")
    p.copy(dst=h1, src=d)
    b = p.copy(dst=h2, src=d)
    assert p.predecessors(b) == {}


def test_a_copy_both_reads_and_writes(rt: srt.Runtime) -> None:
    d1 = rt.device_allocator.allocate(64)
    d2 = rt.device_allocator.allocate(64)
    p = srt.Pipeline("chain")
    a = p.copy(dst=d2, src=d1)
    b = p.copy(dst=d1, src=d2)  # reads what a wrote (RAW) and writes what a read (WAR)
    assert p.predecessors(b) == {a: frozenset({"RAW", "WAR"})}


def test_after_adds_explicit_edges_and_add_edge_can_reorder(rt: srt.Runtime) -> None:
    s = rt.create_stream()
    h = pinned(rt, 8)
    order: list[str] = []
    p = srt.Pipeline("explicit")
    a = p.host(order.append, "a")
    b = p.host(order.append, "b", after=[a])
    c = p.host(order.append, "c")
    assert p.predecessors(b) == {a: frozenset({"after"})}
    p.add_edge(c, a)  # c before a, although created later
    assert [n.name for n in p.topological_order()] == [c.name, a.name, b.name]
    p.launch(s).result(10)
    assert order == ["c", "a", "b"]
    del h


def test_host_nodes_without_declared_access_are_unordered_under_fork(rt: srt.Runtime) -> None:
    p = srt.Pipeline("free")
    p.host(lambda: None)
    p.host(lambda: None)
    assert p.edges == []


# -- topological order and fork plans (no device) --------------------------------------------------------


def test_topological_order_prefers_creation_order() -> None:
    assert topological_order([set(), set(), {0}, {1}]) == [0, 1, 2, 3]
    assert topological_order([{2}, set(), set()]) == [1, 2, 0]


def test_seed_shape_forks_the_round_trip_and_joins_it() -> None:
    # 0 memset | 1 d2h -> 2 pack -> 3 h2d (3 also WAW-independent of 0)
    preds = [set(), set(), {1}, {2}]
    plan = plan_fork(topological_order(preds), preds)
    assert plan.slots == 2
    assert [(v, slot) for v, slot, _ in plan.steps] == [(0, 0), (1, 1), (2, 1), (3, 1)]
    assert all(not waits for _, _, waits in plan.steps)
    assert plan.joins == [1] and plan.tails == [0, 3]


def test_diamond_waits_once_and_drops_implied_edges() -> None:
    # 0 -> 1, 0 -> 2, {1, 2} -> 3, and 0 -> 3 implied
    preds = [set(), {0}, {0}, {0, 1, 2}]
    plan = plan_fork(topological_order(preds), preds)
    assert plan.slots == 2
    steps = {v: (slot, waits) for v, slot, waits in plan.steps}
    assert steps[1] == (0, ()) and steps[2][0] == 1 and steps[2][1] == (0,)
    assert steps[3] == (0, (2,))
    assert plan.signals == {0, 2} and plan.joins == []


def test_a_chain_needs_one_stream() -> None:
    preds = [set(), {0}, {1}]
    plan = plan_fork(topological_order(preds), preds)
    assert plan.slots == 1 and plan.signals == set()


@pytest.mark.parametrize("width", [1, 3, 8])
def test_independent_nodes_get_a_stream_each(width: int) -> None:
    preds: list[set[int]] = [set() for _ in range(width)]
    plan = plan_fork(topological_order(preds), preds)
    assert plan.slots == width and plan.joins == list(range(1, width))


def test_fork_launch_leaves_no_cross_stream_race_in_the_simulator() -> None:
    # The simulator's hazard checker tracks happens-before with vector clocks: every
    # cross-stream edge the plan needs must be an event.
    with srt.open_runtime("sim", check_hazards=True) as rt:
        s = rt.create_stream()
        a = rt.device_allocator.allocate(4096, stream=s)
        b = rt.device_allocator.allocate(4096, stream=s)
        c = rt.device_allocator.allocate(4096, stream=s)
        s.synchronize()
        p = srt.Pipeline("diamond")
        p.memset(a, 1)
        p.copy(dst=b, src=a)
        p.copy(dst=c, src=a)
        p.memset(b.view(0, 16), 3)
        p.copy(dst=a, src=c)
        for _ in range(3):
            p.launch(s, policy="fork").result(10)
        p.launch(s, policy="fork", join=False).result(10)
        assert rt.backend.hazards() == ()  # type: ignore[attr-defined]
