"""A blocking wait on a runtime thread for work queued behind that thread raises at once instead of hanging.

A Python host function holds its stream until it returns, and a done callback
runs on the lane that retires the stream's work: waiting there for that work
would wait forever. Each case runs in a child interpreter with a timeout.
"""

from __future__ import annotations

import pytest
from support.child import assert_clean, run_child

_HOST_FN = """
import threading, time
import streamrt as srt
rt = srt.open_runtime("sim")
s = rt.create_stream()
other = rt.create_stream()
WAITS = {{
    "stream.synchronize": lambda: s.synchronize(),
    "runtime.synchronize": lambda: rt.synchronize(),
    "wait_idle().result()": lambda: s.wait_idle().result(),
    "event.synchronize": lambda: s.record().synchronize(),
    "other stream's wait_idle().wait()": lambda: other.wait_idle().wait(),
}}
wait = WAITS[{which!r}]
queued = threading.Event()
def host_fn():
    queued.wait(10)  # until other waits for this host function too, however slow the machine
    wait()
t0 = time.monotonic()
done = s.launch_host_func(host_fn)
other.wait(s.record())  # other's work is queued behind the host function
queued.set()
try:
    done.result(20)
except RuntimeError as exc:
    assert "host function" in str(exc) or "runtime thread" in str(exc), exc
else:
    raise AssertionError("the blocking wait inside a host function did not raise")
assert time.monotonic() - t0 < 10
s.memset(rt.device_allocator.allocate(64), 0)   # the stream goes on
s.synchronize()
rt.close()
print("OK")
"""


@pytest.mark.parametrize(
    "which",
    ["stream.synchronize", "runtime.synchronize", "wait_idle().result()", "event.synchronize", "other stream's wait_idle().wait()"],
)
def test_blocking_wait_inside_a_host_function_raises(which: str) -> None:
    assert_clean(run_child(_HOST_FN.format(which=which), timeout=60))


def test_blocking_wait_inside_a_done_callback_raises() -> None:
    code = """
    import streamrt as srt
    rt = srt.open_runtime("sim")
    s = rt.create_stream()
    seen = []
    def callback(_c):
        try:
            s.wait_idle().wait()
        except RuntimeError as exc:
            seen.append(exc)
    import threading, time
    added = threading.Event()
    first = s.launch_host_func(added.wait, 10)   # still running when the callback is added
    first.add_done_callback(callback)
    added.set()
    first.result(10)
    s.synchronize()
    for _ in range(200):
        if seen: break
        time.sleep(0.05)
    assert seen and isinstance(seen[0], RuntimeError), seen
    rt.close()
    print("OK")
    """
    assert_clean(run_child(code, timeout=60))
