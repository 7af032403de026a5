"""Several event loops and threads sharing streams: every accepted call runs once and resolves with its value.

Each case runs in a child interpreter with a timeout (tests/support/child.py),
so a hang or a crash fails the test instead of stalling the suite.
"""

from __future__ import annotations

import os

import pytest
from support.child import assert_clean, run_child

#: Python host calls in the two-loop case; a loss of 1 in 10^5 shows up in at least 500k calls.
TWO_LOOP_CALLS = int(os.environ.get("STREAMRT_STRESS_CALLS", "500000"))

_TWO_LOOPS = """
import asyncio, threading
import streamrt as srt

TOTAL, LOOPS, STREAMS, BATCH = {total}, {loops}, 8, 64
rt = srt.open_runtime("sim", await_poll_us={poll})
streams = [rt.create_stream() for _ in range(STREAMS)]
ran = [0] * LOOPS
bad = []

def loop_main(k):
    async def one(i):
        value = await streams[i % STREAMS].launch_host_func(lambda x: x * 2 + k, i)
        if value != i * 2 + k:
            bad.append((k, i, value))
    async def main():
        for start in range(0, TOTAL // LOOPS, BATCH):
            results = await asyncio.gather(*(one(start + i) for i in range(BATCH)), return_exceptions=True)
            bad.extend(r for r in results if isinstance(r, BaseException))
            ran[k] += BATCH
    asyncio.run(main())

threads = [threading.Thread(target=loop_main, args=(k,)) for k in range(LOOPS)]
for t in threads: t.start()
for t in threads: t.join()
rt.close()
assert not bad, (len(bad), bad[:3])
print(sum(ran), "calls")
print("OK")
"""


@pytest.mark.slow
@pytest.mark.parametrize("poll", [50.0, 0.0], ids=["polling-awaits", "lane-awaits"])
def test_two_loops_sharing_streams_lose_no_host_call(poll: float) -> None:
    calls = TWO_LOOP_CALLS if poll else TWO_LOOP_CALLS // 5
    result = run_child(_TWO_LOOPS.format(total=calls, loops=2, poll=poll), timeout=1500)
    assert_clean(result)


def test_four_loops_and_a_plain_thread_share_streams() -> None:
    code = _TWO_LOOPS.format(total=8192, loops=4, poll=50.0).replace(
        "threads = [",
        "def plain():\n"
        "    for i in range(2000):\n"
        "        c = streams[i % STREAMS].launch_host_func(lambda x: -x, i)\n"
        "        if c.result(30) != -i: bad.append(('plain', i))\n"
        "threads = [threading.Thread(target=plain)] + [",
    )
    assert_clean(run_child(code, timeout=300))
