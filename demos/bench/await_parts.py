"""The parts of an await's latency: where the time goes between a launch and a resumed coroutine.

A script, not a test. Run on a GPU backend::

    python demos/bench/await_parts.py --backend cuda [--n 2000] [--out parts.json]

Each row times one part alone, on an idle device, one at a time (median and
p99 µs, variants interleaved over 3 rounds):

* ``sync, blocking event``: a 4-byte memset, an event record and
  ``event_synchronize`` on a blocking-sync event, on the calling thread (the
  driver puts the thread to sleep and wakes it by interrupt).
* ``sync, spin event``: the same with an event without the blocking-sync flag
  (the driver spins, under the context's default schedule).
* ``query loop``: the same, the thread polling ``event_query``.
* ``thread wake``: one thread releases a lock another thread is blocked on.
* ``lane: blocking sync`` / ``lane: query up to N us``: what a lane does, a
  thread woken by a lock that then waits for the memset's event, measured to
  the lane's return from the wait.
* ``loop wake [loop]``: a thread's ``call_soon_threadsafe`` to a resumed
  coroutine, from a released lock (includes ``thread wake``).
* ``await [loop]``: streamrt's ``await stream.wait_idle()`` end to end after
  the same raw memset (completion_bench launches through ``stream.memset``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from completion_bench import _run, _summary  # the same loops and summaries as the await rows there

import streamrt as srt

_ns = time.perf_counter_ns


class _Helper:
    """A thread that runs ``job`` each time it is woken; the job returns the time to report."""

    def __init__(self, job: Callable[[], int]) -> None:
        self._job = job
        self._go = threading.Lock()
        self._go.acquire()
        self._done = threading.Lock()
        self._done.acquire()
        self.t1 = 0
        self._stop = False
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        while True:
            self._go.acquire()
            if self._stop:
                return
            self.t1 = self._job()
            self._done.release()

    def wake(self) -> None:
        self._go.release()

    def wait(self) -> int:
        self._done.acquire()
        return self.t1

    def stop(self) -> None:
        self._stop = True
        self._go.release()
        self._thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    n = args.n // 3
    rows: dict[str, list[float]] = {}

    with srt.open_runtime(args.backend) as rt:
        b = rt.backend
        s = rt.create_stream()
        d = rt.device_allocator.allocate(64)
        sh = s.handle
        blocking = b.event_create(timing=False, blocking_sync=True)
        spin = b.event_create(timing=False, blocking_sync=False)

        def launch(event: int) -> None:
            b.memset_async(d.ptr, 0, 4, sh)
            b.event_record(event, sh)

        def same_thread(event: int, wait: Callable[[int], None]) -> float:
            t0 = _ns()
            launch(event)
            wait(event)
            return (_ns() - t0) / 1e3

        def query_loop(event: int) -> None:
            while not b.event_query(event):
                pass

        def bounded_query(event: int, limit_ns: int) -> None:
            stop = _ns() + limit_ns
            while not b.event_query(event):
                if _ns() > stop:
                    b.event_synchronize(event)
                    return

        def lane(wait: Callable[[], None]) -> _Helper:
            def job() -> int:
                wait()
                return _ns()

            return _Helper(job)

        wake_only = _Helper(_ns)
        lane_block = lane(lambda: b.event_synchronize(blocking))
        lane_q50 = lane(lambda: bounded_query(blocking, 50_000))
        lane_q20 = lane(lambda: bounded_query(blocking, 20_000))

        def through_helper(h: _Helper, event: int | None) -> float:
            t0 = _ns()
            if event is not None:
                launch(event)
            h.wake()
            return (h.wait() - t0) / 1e3

        async def loop_rows(tag: str) -> None:
            loop = asyncio.get_running_loop()
            box: list[asyncio.Future[None]] = []

            def post() -> int:
                loop.call_soon_threadsafe(box[0].set_result, None)
                return 0

            poster = _Helper(post)
            for _ in range(n):
                fut = loop.create_future()
                box[:] = [fut]
                t0 = _ns()
                poster.wake()
                await fut
                rows.setdefault(f"loop wake [{tag}]", []).append((_ns() - t0) / 1e3)
                poster.wait()
                t0 = _ns()
                b.memset_async(d.ptr, 0, 4, sh)
                await s.wait_idle()
                rows.setdefault(f"await [{tag}]", []).append((_ns() - t0) / 1e3)
                await asyncio.sleep(0)
            poster.stop()

        same: dict[str, Callable[[], float]] = {
            "sync, blocking event": lambda: same_thread(blocking, b.event_synchronize),
            "sync, spin event": lambda: same_thread(spin, b.event_synchronize),
            "query loop": lambda: same_thread(spin, query_loop),
            "thread wake": lambda: through_helper(wake_only, None),
            "lane: blocking sync": lambda: through_helper(lane_block, blocking),
            "lane: query up to 20 us": lambda: through_helper(lane_q20, blocking),
            "lane: query up to 50 us": lambda: through_helper(lane_q50, blocking),
        }
        for name, fn in same.items():  # warm-up
            fn()
        for _ in range(3):
            for name, fn in same.items():
                for _ in range(n):
                    rows.setdefault(name, []).append(fn())
                    time.sleep(20e-6)
            for tag in ("asyncio", "uvloop") if importlib.util.find_spec("uvloop") else ("asyncio",):
                _run(tag, loop_rows(tag))
        for h in (wake_only, lane_block, lane_q50, lane_q20):
            h.stop()
        s.synchronize()
        b.event_destroy(blocking)
        b.event_destroy(spin)
        d.release()
        result: dict[str, Any] = {
            "python": sys.version.split()[0],
            "backend": rt.backend_name,
            "parts": {k: _summary(v) for k, v in rows.items()},
        }
    print(json.dumps(result, indent=2))
    width = max(len(k) for k in result["parts"])
    for k, v in result["parts"].items():
        print(f"{k:<{width}}  {v['median_us']:8.1f} {v['p99_us']:8.1f}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
