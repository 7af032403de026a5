"""Churn: thousands of reuses of blocks released while in flight, with zero premature reuse, checked by data.

Every round writes a unique pattern into a freshly allocated pinned block,
stages it through a freshly allocated device block into its own slot of a
result buffer, and releases both blocks at once (their copies still queued).
A block handed out before its copies ran would be overwritten by a later
round's pattern, and its slot would read back wrong. Streams are held by gates
now and then so that blocks really are in flight when asked for again.
"""

from __future__ import annotations

import numpy as np
from alloc_helpers import Gate, conserved, read_back

import allocators
import streamrt as srt

ROUNDS = 2000
SLOT = 512


def _pattern(i: int, n: int) -> np.ndarray:
    p = np.full(n, (i * 37) & 0xFF, dtype=np.uint8)
    p[:4] = np.frombuffer(np.uint32(i).tobytes(), dtype=np.uint8)  # the round number itself
    return p


def test_thousands_of_in_flight_reuses_never_hand_out_a_pending_block(rt: srt.Runtime, make_allocator) -> None:
    host = make_allocator("host")
    dev = make_allocator("device")
    streams = [rt.create_stream(), rt.create_stream()]
    result = rt.device_allocator.allocate(ROUNDS * SLOT)
    sizes = [n for n in (SLOT, SLOT - 100, SLOT - 300) if allocators.SizeClasses().round(n) == SLOT]
    gates: list[Gate] = []
    try:
        for i in range(ROUNDS):
            s = streams[i % 2]
            if i % 200 == 0:
                gates.append(Gate(streams[(i // 200) % 2]))  # hold a stream for the next 24 rounds
            if i % 200 == 24:
                gates[-1].open()  # GPUs bound the queue behind a blocked host function: keep it short
            n = sizes[i % len(sizes)]
            h = host.allocate(n)
            h.numpy()[:] = _pattern(i, n)  # an immediate host write into a possibly reused block
            d = dev.allocate(n, stream=s)
            s.copy(d, h)
            s.copy(result.view(i * SLOT, n), d)
            h.release()
            d.release()
    finally:
        for g in gates:
            g.open()
    for s in streams:
        s.synchronize()
    out = read_back(rt, streams[0], result).reshape(ROUNDS, SLOT)
    bad = [i for i in range(ROUNDS) if not np.array_equal(out[i, : sizes[i % len(sizes)]], _pattern(i, sizes[i % len(sizes)]))]
    assert not bad, f"{len(bad)} rounds read another round's data (first: {bad[:5]})"
    for a in (host, dev):
        st = a.statistics()
        assert st.hits >= ROUNDS // 2, f"too few reuses to mean anything: {st}"
        assert st.in_use_bytes == 0 and conserved(st)
    result.release()
