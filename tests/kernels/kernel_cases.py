"""Seqlen cases for the device prepare: edge cases, lengths near the 32-bit limits and a hypothesis strategy,
shared by the device and host-emulation tests. Each case is ``(params, seqstart_q, seqstart_k)``."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st
from kernel_helpers import seqstart

from streamrt.recipes.fmha_bwd import WorkspaceParams

Case = tuple[WorkspaceParams, np.ndarray, np.ndarray]


def make_case(
    sq: Any,
    sk: Any,
    *,
    deterministic: bool = True,
    nhead: int = 4,
    hdim_q: int = 8,
    kM0: int = 32,
    kN0: int = 32,
    num_cus: int = 16,
    q_first: int = 0,
    k_first: int = 0,
    q_slack: int = 0,
    k_slack: int = 0,
    total_slack: int = 0,
) -> Case:
    """A case whose bounds fit the lengths (plus the slacks; a negative slack makes the input invalid).

    ``q_first``/``k_first``: ``seqstart[0]``; ``total_q_padded`` bounds ``seqstart_q[batch]`` (CK's rule).
    """
    q, k = seqstart(sq, q_first), seqstart(sk, k_first)
    sqa, ska = np.diff(q.astype(np.int64)), np.diff(k.astype(np.int64))
    params = WorkspaceParams(
        batch=len(sq),
        nhead=nhead,
        hdim_q=hdim_q,
        kM0=kM0,
        kN0=kN0,
        num_cus=num_cus,
        deterministic=deterministic,
        max_seqlen_q=max(int(sqa.max()) + q_slack, 0),
        max_seqlen_k=max(int(ska.max()) + k_slack, 0),
        total_q_padded=max(int(q[-1]) + total_slack, 0),
    )
    return params, q, k


def _edge_cases() -> dict[str, Case]:
    rng = np.random.default_rng(6)
    cases: dict[str, Case] = {
        "all-empty": make_case([0, 0, 0], [0, 0, 0]),
        "all-empty-nondet": make_case([0, 0, 0], [0, 0, 0], deterministic=False),
        "seqlen-k-zero": make_case([17, 40, 3], [0, 0, 0]),
        "seqlen-k-zero-offset": make_case([17, 40, 3], [0, 0, 0], k_first=9),  # CK divides by zero here
        "some-seqlen-k-zero": make_case([17, 40, 3, 8], [0, 70, 0, 5]),
        "some-empty": make_case([0, 50, 0, 7, 0], [30, 0, 0, 90, 1]),
        "seqstart-offset": make_case([10, 33, 5], [64, 1, 20], q_first=100, k_first=7),
        "seqstart-offset-nondet": make_case([10, 33, 5], [64, 1, 20], q_first=100, deterministic=False),
        "batch-1": make_case([100], [260]),
        "batch-1-nondet": make_case([100], [260], deterministic=False),
        "batch-1-one-cu": make_case([1], [1], num_cus=1),
        "more-cus-than-chunks": make_case([5, 9], [20, 3], nhead=1, num_cus=200),
        "idle-cus": make_case([300, 5], [500, 40], kM0=128, kN0=16, num_cus=300, nhead=2),
        "one-cu": make_case([64, 64, 64], [64, 128, 256], num_cus=1),
        "xcd-order-304": make_case(rng.integers(1, 512, 8), rng.integers(1, 512, 8), nhead=8, hdim_q=64, kM0=64, kN0=128, num_cus=304),
        "h200-like": make_case(rng.integers(1, 512, 8), rng.integers(1, 512, 8), nhead=8, hdim_q=64, kM0=64, kN0=128, num_cus=132),
        "batch-1024": make_case(rng.integers(0, 64, 1024), rng.integers(0, 64, 1024), nhead=2, hdim_q=4, num_cus=132),
        "batch-1024-nondet": make_case(rng.integers(0, 64, 1024), rng.integers(0, 64, 1024), nhead=2, hdim_q=4, deterministic=False),
        "batch-2100-global-scratch": make_case(rng.integers(0, 9, 2100), rng.integers(0, 9, 2100), nhead=1, hdim_q=1, num_cus=64),
        "padded-total": make_case([10, 20], [30, 40], total_slack=1000),
        # invalid inputs: the idle image, nothing zeroed in deterministic mode
        "seqlen-q-exceeded": make_case([10, 20], [30, 40], q_slack=-1),
        "seqlen-k-exceeded": make_case([10, 20], [30, 40], k_slack=-1),
        "total-q-exceeded": make_case([10, 20], [30, 40], total_slack=-1),
        "total-q-exceeded-nondet": make_case([10, 20], [30, 40], total_slack=-1, deterministic=False),
    }
    p, q, k = make_case([10, 20, 5], [30, 40, 7])
    cases["negative-length"] = (p, q[[0, 2, 1, 3]].copy(), k)  # seqstart_q decreases
    p, q, k = make_case([10, 20, 5], [30, 40, 7], q_slack=-1, k_slack=-1, total_slack=-1)
    q = q[[0, 2, 1, 3]].copy()
    q[0] = -1
    cases["every-status-bit"] = (p, q, k)
    return cases


EDGE_CASES = _edge_cases()

#: Lengths near the 32-bit limits: their dq_acc bound is far too large to allocate, so these run the
#: metadata kernel alone (it touches only the metadata region). Each sets ck_hazards somewhere.
LIMIT_CASES: dict[str, Case] = {
    "w-reaches-2**31": make_case([8192] * 128, [8192] * 128, nhead=32, hdim_q=128, kM0=64, kN0=128, num_cus=304),
    "sq-near-2**31": make_case([2**31 - 2, 1], [100, 2**31 - 200], nhead=1, hdim_q=1, kM0=64, kN0=128, num_cus=304),
    "chunk-start-past-2**31": make_case([3 * 2**29], [1], nhead=1, hdim_q=1, kM0=1, kN0=1, num_cus=4),
    "max-seqlen-k-near-2**31": make_case([5, 6], [7, 8], k_slack=2**31 - 9),
}

_tile = st.sampled_from([16, 32, 64, 128])


@st.composite
def random_cases(draw: st.DrawFn, max_batch: int = 40) -> Case:
    batch = draw(st.integers(1, max_batch))
    length = st.one_of(st.just(0), st.integers(0, 300))
    sq = draw(st.lists(length, min_size=batch, max_size=batch))
    sk = draw(st.lists(length, min_size=batch, max_size=batch))
    slack = st.sampled_from([0, 0, 0, 5, -1])
    return make_case(
        sq,
        sk,
        deterministic=draw(st.booleans()),
        nhead=draw(st.integers(1, 8)),
        hdim_q=draw(st.integers(1, 32)),
        kM0=draw(_tile),
        kN0=draw(_tile),
        num_cus=draw(st.integers(1, 320)),
        q_first=draw(st.sampled_from([0, 0, 3, 40])),
        k_first=draw(st.sampled_from([0, 0, 11])),
        q_slack=draw(slack),
        k_slack=draw(slack),
        total_slack=draw(slack),
    )
