"""``rt.close()`` and ``stream.close()`` racing enqueues from other threads.

Required: every call either is accepted and then runs (its Completion resolves
with its value), or raises ``ClosedError``; nothing else is raised, nothing
crashes, nothing is logged as lost, and close finishes. Each case runs in a
child interpreter with a timeout.
"""

from __future__ import annotations

import pytest
from support.child import assert_clean, run_child

_PRELUDE = """
import ctypes, random, threading, time
import streamrt as srt
from streamrt import ClosedError

USLEEP = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(("usleep", ctypes.CDLL(None)))

def make_ops(rt, streams):
    h = rt.host_allocator.allocate(4096)
    d = rt.device_allocator.allocate(4096, stream=streams[0])
    ev = streams[-1].record()
    p = srt.Pipeline("race")
    p.memset(d.view(0, 1024), 1)
    p.copy(dst=h.view(0, 1024), src=d.view(0, 1024))
    p.host(lambda: 7, reads=[h.view(0, 1024)])
    graph = p.capture(rt.create_stream())
    def host(s, n): return s.launch_host_func(lambda: n), n
    def native(s, n): return s.launch_host_func(USLEEP, 0), None
    def memset(s, n): return s.memset(d.view(2048, 512), n % 256), None
    def copy(s, n): return s.copy(d.view(2048, 512), h.view(2048, 512)), None
    def record(s, n): return s.record().close(), None
    def wait(s, n): return s.wait(ev), None
    def wait_idle(s, n): return s.wait_idle(), None
    def pipeline(s, n): return p.launch(s), None
    def graph_launch(s, n): return graph.launch(s), None
    def allocate(s, n):
        b = rt.device_allocator.allocate(256, stream=s)
        s.memset(b, 0)
        b.release()
        return None, None
    return dict(host=host, native=native, memset=memset, copy=copy, record=record, wait=wait,
                wait_idle=wait_idle, pipeline=pipeline, graph=graph_launch, allocate=allocate)
"""

_RUNTIME_CLOSE = _PRELUDE + """
KIND = {kind!r}
for trial in range(4):
    rt = srt.open_runtime("sim")
    streams = [rt.create_stream() for _ in range(4)]
    op = make_ops(rt, streams)[KIND]
    accepted, unexpected = [], []
    stop = threading.Event()

    def enqueue(k):
        n = 0
        try:
            fresh = [rt.create_stream() for _ in range(2)]  # first calls on fresh streams race close too
        except ClosedError:
            fresh = streams[:2]
        while not stop.is_set():
            n += 1
            s = (streams + fresh)[(n + k) % 6]
            try:
                c, expected = op(s, n)
            except ClosedError:
                time.sleep(0.001)  # no busy loop: the simulator's threads need the GIL to finish the work
                continue
            except BaseException as exc:
                unexpected.append(repr(exc))
                return
            if c is not None:
                accepted.append((c, expected))

    threads = [threading.Thread(target=enqueue, args=(k,)) for k in range(3)]
    for t in threads: t.start()
    time.sleep(random.uniform(0.02, 0.2))
    t0 = time.monotonic()
    rt.close()
    took = time.monotonic() - t0
    stop.set()
    for t in threads: t.join(10)
    assert not any(t.is_alive() for t in threads), "an enqueuing thread hung"
    assert not unexpected, unexpected[:3]
    assert took < 10, f"close took {{took:.1f}} s"
    for c, expected in accepted:
        assert c.is_done, "close returned with an accepted call unresolved"
        assert c.result(0) == expected, (c, expected)
print("OK")
"""

KINDS = ["host", "native", "memset", "copy", "record", "wait", "wait_idle", "pipeline", "graph", "allocate"]


@pytest.mark.parametrize("kind", KINDS)
def test_runtime_close_racing_enqueues(kind: str) -> None:
    assert_clean(run_child(_RUNTIME_CLOSE.format(kind=kind), timeout=120))


_STREAM_CLOSE = _PRELUDE + """
KIND = {kind!r}
rt = srt.open_runtime("sim")
keep = [rt.create_stream() for _ in range(2)]
op = make_ops(rt, keep)[KIND]
for trial in range(20):
    s = rt.create_stream()
    accepted, unexpected = [], []
    stop = threading.Event()

    def enqueue():
        n = 0
        while not stop.is_set():
            n += 1
            try:
                c, expected = op(s, n)
            except ClosedError:
                if s.is_closed:
                    return
                continue
            except BaseException as exc:
                unexpected.append(repr(exc))
                return
            if c is not None:
                accepted.append((c, expected))

    t = threading.Thread(target=enqueue)
    t.start()
    time.sleep(random.uniform(0.0, 0.02))
    s.close()
    t.join(10)
    stop.set()
    assert not t.is_alive(), "the enqueuing thread hung"
    assert not unexpected, unexpected[:3]
    for c, expected in accepted:
        assert c.result(10) == expected, (c, expected)
rt.close()
print("OK")
"""


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "allocate"])
def test_stream_close_racing_enqueues(kind: str) -> None:
    assert_clean(run_child(_STREAM_CLOSE.format(kind=kind), timeout=120))
