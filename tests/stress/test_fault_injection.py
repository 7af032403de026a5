"""A backend call that fails at any point of a launch: the caller gets the error, nothing leaks, nothing hangs.

A wrapper over the simulator fails the n-th backend call made during one warm
launch, for every n in turn, for an eager launch and a graph replay. The
failed launch either raises the injected ``BackendError`` (what it enqueued
still completes and stays alive until then), or returns a Run that carries
it. Afterwards the stream still works, nothing is pending, every buffer goes
back to its allocator and the runtime closes.
"""

from __future__ import annotations

import pytest
from support.child import assert_clean, run_child

_CODE = """
import gc, threading, weakref
import numpy as np
import streamrt as srt
from streamrt import BackendError
from streamrt._backends import load_backend
from streamrt._runtime import Runtime

MODE = {mode!r}

class Failing:
    def __init__(self, inner):
        self._inner = inner
        self.counting = False
        self.calls = []
        self.fail_at = None
    def __getattr__(self, name):
        call = getattr(self._inner, name)
        if not callable(call) or name.startswith("_") or name in ("capabilities", "device_count", "close"):
            return call
        def wrapped(*args, **kwargs):
            if self.counting and threading.current_thread() is threading.main_thread():
                self.calls.append(name)
                if self.fail_at is not None and len(self.calls) - 1 == self.fail_at:
                    raise BackendError("sim", 1, "simErrorInjected", "injected", name)
            return call(*args, **kwargs)
        return wrapped

def build(rt, s):
    n = 4096
    acc = rt.device_allocator.allocate(n, stream=s)
    src = rt.device_allocator.allocate(n, stream=s)
    h_in = rt.host_allocator.allocate(n)
    h_out = rt.host_allocator.allocate(n)
    out = rt.device_allocator.allocate(n, stream=s)
    s.memset(src, 7)
    def double(a, b):
        b.numpy()[:] = a.numpy() * 2
    p = srt.Pipeline("fault")
    p.memset(acc, 0)
    p.copy(dst=h_in, src=src)
    p.host(double, h_in, h_out, reads=[h_in], writes=[h_out])
    p.copy(dst=out, src=h_out)
    return p, (acc, src, h_in, h_out, out), double

def one_case(fail_at):
    inner = load_backend("sim")
    inner.set_device(0)
    wrapper = Failing(inner)
    rt = Runtime(wrapper, 0)
    s = rt.create_stream()
    p, buffers, fn = build(rt, s)
    graph = p.capture(rt.create_stream()) if MODE == "graph" else None
    launch = (lambda: graph.launch(s)) if graph is not None else (lambda: p.launch(s))
    launch().result(10)            # warm
    wrapper.counting, wrapper.fail_at = True, fail_at
    wrapper.calls.clear()
    error = None
    try:
        run = launch()
    except BackendError as exc:
        error = repr(exc)  # not the exception: its traceback would keep the launch's frame alive
    else:
        try:
            run.result(10)
        except BackendError as exc:
            error = repr(exc)
        del run
    wrapper.counting = False
    calls = list(wrapper.calls)
    s.synchronize()
    launch().result(10)            # the stream and the pipeline still work
    rt._engine.drain(10)
    stats = rt._engine.statistics()
    assert stats.pending == 0 and stats.host_calls_pending == 0, stats
    if graph is not None:
        graph.close()
    fn_ref = weakref.ref(fn)
    for b in buffers:
        b.release()
    del p, fn, launch, graph
    rt.synchronize()
    rt._engine.drain(10)
    gc.collect()
    for a in (rt.host_allocator, rt.device_allocator):
        assert a.statistics().in_use_bytes == 0, a.statistics()
    rt.close()
    assert fn_ref() is None, "the host function was kept alive after close"
    return calls, error

calls, error = one_case(None)
assert error is None
print(len(calls), "backend calls per launch:", calls)
for i in range(len(calls)):
    _, error = one_case(i)
    assert error is not None and "injected" in str(error), (i, calls[i], error)
    print(i, calls[i], error)
print("OK")
"""


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_each_backend_call_of_a_launch_failing_in_turn(mode: str) -> None:
    assert_clean(run_child(_CODE.format(mode=mode), timeout=300))
