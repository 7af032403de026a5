"""Hypothesis-driven invariants over random programs of allocate / use on streams / release / gate / open.

After every step: no block is handed out while work that used it is pending
(work behind a closed gate) on any stream but the one it is handed out for (a
device block only: pinned blocks have no pending work at all), live blocks
never overlap, every byte is accounted for, and the waste bound holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from alloc_helpers import Gate, conserved
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import allocators
import streamrt as srt

# Pairs of sizes that share a size class, so that released blocks are asked for again.
SIZES = (100, 4000, 4096, 1_000_000, 1 << 20, (1 << 20) + 1)

# One step: maybe hold a stream behind a gate, allocate (maybe naming a stream), maybe use
# the new buffer on a stream, maybe release a live buffer, maybe open a gate.
steps = st.lists(
    st.tuples(
        st.sampled_from([None, 0, 1]),  # gate this stream first
        st.integers(0, len(SIZES) - 1),  # request size
        st.sampled_from([None, 0, 1]),  # allocate(n, stream=...)
        st.sampled_from([None, 0, 1]),  # then use it on this stream
        st.sampled_from([None, -1, 0, 1, 2]),  # then release this live buffer (-1: the newest)
        st.sampled_from([None, None, 0, 1]),  # then open this stream's gate
    ),
    max_size=30,
)


@dataclass
class Live:
    buf: srt.Buffer
    block: int
    streams: set[int] = field(default_factory=set)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=steps, kind=st.sampled_from(["host", "device"]), max_cached=st.sampled_from([None, 0, 2 << 20]))
def test_random_programs_keep_the_invariants(rt: srt.Runtime, program: list[tuple], kind: str, max_cached: int | None) -> None:
    cls = allocators.CachingPinnedAllocator if kind == "host" else allocators.CachingDeviceAllocator
    a = cls(rt, max_cached_bytes=max_cached)
    streams = [rt.create_stream(), rt.create_stream()]
    gates: list[Gate | None] = [None, None]
    all_gates: list[Gate] = []
    live: list[Live] = []
    busy: dict[int, list[tuple[int, Gate]]] = {}  # block address -> (stream, closed gate) its pending work waited behind at release
    # On a GPU a real free (cudaFreeHost, cudaFree) on the releaser thread waits for the whole device,
    # so for the gate, and holds a driver lock meanwhile: the main thread's next malloc then blocks
    # before it can open the gate. Real host functions never wait for the main thread; these gates do,
    # so on a GPU they give up soon (and count as open from then on).
    hold = 30.0 if rt.capabilities.is_simulated else 0.5
    try:
        for gate_first, size, alloc_on, use_on, release, open_gate in program:
            if gate_first is not None and (gates[gate_first] is None or gates[gate_first].is_open):
                gates[gate_first] = Gate(streams[gate_first], hold)
                all_gates.append(gates[gate_first])
            n = SIZES[size]
            buf = a.allocate(n, stream=None if alloc_on is None else streams[alloc_on])
            block = a.block_size(n)
            assert block >= max(n, 1) and block % 512 == 0
            if n > 2048:
                assert block < 1.25 * n
            # Work on the stream a device block is handed out for runs after that stream's earlier work.
            ordered = alloc_on if kind == "device" else None
            pending = [g for si, g in busy.get(buf.ptr, []) if not g.is_open and si != ordered]
            assert not pending, f"block {buf.ptr:#x} handed out while work behind a closed gate on another stream uses it"
            for other in live:
                assert buf.ptr + block <= other.buf.ptr or other.buf.ptr + other.block <= buf.ptr, "overlapping blocks"
            item = Live(buf, block, set() if alloc_on is None else {alloc_on})
            live.append(item)
            if use_on is not None:
                streams[use_on].memset(buf, size)
                item.streams.add(use_on)
            if release is not None and live:
                gone = live.pop(release % len(live))
                busy[gone.buf.ptr] = [(si, g) for si in gone.streams if (g := gates[si]) is not None and not g.is_open]
                gone.buf.release()
            if open_gate is not None and gates[open_gate] is not None:
                gates[open_gate].open()
            stats = a.statistics()
            assert conserved(stats)
            assert stats.in_use_bytes == sum(x.block for x in live)
            assert stats.requested_bytes == sum(x.buf.nbytes for x in live)
            assert stats.allocations == stats.hits + stats.misses
            if max_cached is not None:
                assert stats.cached_bytes <= max_cached
    finally:
        for g in all_gates:
            g.open()
        for x in live:
            x.buf.release()
        rt.synchronize()
        for g in all_gates:
            g.completion.exception(5)  # a gate that gave up raised TimeoutError: expected on a GPU, not an error
        a.close()
        for s in streams:
            s.close()
    rt.releaser.drain()
    end = a.statistics()
    assert end.held_bytes == 0 and end.in_use_bytes == 0 and conserved(end)


def test_the_program_checker_detects_premature_reuse(rt: srt.Runtime) -> None:
    """A deliberately broken allocator (fences ignored) is caught by the same check as above."""

    class Careless(allocators.CachingPinnedAllocator):
        def _release_slow(self, ptr: int, nbytes: int, streams: object, entry: Any) -> None:
            super()._release_slow(ptr, nbytes, None, entry)  # forget the streams: the block is reused at once

    a = Careless(rt)
    s = rt.create_stream()
    g = Gate(s)
    try:
        b = a.allocate(4096)
        s.memset(b, 1)
        ptr = b.ptr
        b.release()
        again = a.allocate(4096)
        with pytest.raises(AssertionError):
            assert again.ptr != ptr or g.is_open, "handed out while pending"
        again.release()
    finally:
        g.open()
        rt.synchronize()
        a.close()
