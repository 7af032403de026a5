"""Objects used after ``rt.close()``: buffers stay readable, everything that would enqueue raises ClosedError.

A Python program must never crash through streamrt's API: each case runs in a
child interpreter, so a segfault fails the test with its stack.
"""

from __future__ import annotations

import pytest
from support.child import assert_clean, run_child


def test_pinned_buffer_read_after_close() -> None:
    code = """
    import numpy as np, streamrt as srt
    rt = srt.open_runtime("sim")
    h = rt.host_allocator.allocate(1 << 20)
    early = h.numpy()          # an array taken before close
    early[:] = 3
    rt.close()
    assert int(h.numpy().sum()) == 3 << 20
    assert int(early.sum()) == 3 << 20
    early[:] = 1               # still writable: the memory lives as long as the buffer
    h.release()                # an explicit release after close frees it
    print("OK")
    """
    assert_clean(run_child(code))


def test_array_keeps_its_buffer_alive_after_close() -> None:
    code = """
    import gc, streamrt as srt
    rt = srt.open_runtime("sim")
    arr = rt.host_allocator.allocate(1 << 16).numpy()   # the Buffer itself is dropped at once
    gc.collect()
    rt.close()
    arr[:] = 5
    assert int(arr.sum()) == 5 << 16
    print("OK")
    """
    assert_clean(run_child(code))


_AFTER_CLOSE = """
import streamrt as srt
from streamrt import ClosedError
rt = srt.open_runtime("sim")
s = rt.create_stream()
h = rt.host_allocator.allocate(1024)
d = rt.device_allocator.allocate(1024, stream=s)
ev = s.record()
p = srt.Pipeline("after")
p.copy(dst=h, src=d)
g = p.capture(rt.create_stream())
{setup}
rt.close()
failures = []
for name, call in [{calls}]:
    try:
        call()
    except ClosedError:
        continue
    except BaseException as exc:
        failures.append((name, repr(exc)))
    else:
        failures.append((name, "no error"))
assert not failures, failures
print("OK")
"""

_CASES = {
    "stream": ("", "('memset', lambda: s.memset(d, 0)), ('copy', lambda: s.copy(h, d)), ('host', lambda: s.launch_host_func(print)),"
                   "('record', lambda: s.record()), ('wait', lambda: s.wait(ev)), ('synchronize', s.synchronize),"
                   "('wait_idle', s.wait_idle), ('is_idle', lambda: s.is_idle)"),
    "event": ("", "('event record', lambda: s.record(ev)), ('event sync', ev.synchronize), ('event done', lambda: ev.is_done),"
                  "('event await', ev.completion)"),
    "graph": ("", "('graph launch', lambda: g.launch(s)), ('pipeline launch', lambda: p.launch(s))"),
    "allocator": ("", "('host allocate', lambda: rt.host_allocator.allocate(16)), ('device allocate', lambda: rt.device_allocator.allocate(16)),"
                      "('create_stream', rt.create_stream), ('create_event', rt.create_event), ('synchronize', rt.synchronize)"),
    "prefetcher": ("import torch\nfrom streamrt.torch import Prefetcher\npf = Prefetcher(iter([torch.ones(4)] * 8), rt, depth=2)\nnext(pf)",
                   "('next', lambda: next(pf))"),
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_use_after_close_raises_closed_error(case: str) -> None:
    setup, calls = _CASES[case]
    if case == "prefetcher":
        pytest.importorskip("torch")
    assert_clean(run_child(_AFTER_CLOSE.format(setup=setup, calls=calls)))
