"""The simulated device's execution engine: executor, callback and signal threads.

Each simulated device has two threads, and a third once a stream waits on a signal:

* the **executor** (``streamrt-sim-exec-N``) runs ready device ops — memsets,
  copies (``ctypes.memmove`` of real bytes), kernel twins, markers — one at a
  time, in the order they became ready;
* the **callback thread** (``streamrt-sim-callback-N``) runs host functions,
  one at a time, like the CUDA/HIP driver's callback thread. It calls native
  code without holding any Python lock, so a host function may block (for
  example in ``sem_wait``) without stopping other streams' device work;
* the **signal watcher** (``streamrt-sim-signal-N``, started by the first
  ``wait_signal`` op) completes each ready ``wait_signal`` op once the host has
  stored a large enough value in its 64-bit word. The host writes it with a
  plain store, which nothing announces, so the watcher reads the words it
  waits on with a backoff of 20 µs doubling to 1 ms (the front end of a GPU
  polls such a word in the same way), and sleeps when no op waits. A waiting
  op holds back only its own stream, as on a GPU.

An op becomes ready when every op it depends on has completed (the previous op
of its stream, the op behind an awaited event, a graph node's predecessors).
Completion is what the API's queries and synchronizations observe, so they
reflect real execution. Both threads sleep on condition variables when idle.

All state here is guarded by one lock, :attr:`Scheduler.lock`, shared with the
backend. The threads reference the scheduler only, never the backend object,
so an unclosed backend can still be garbage collected (its finalizer stops them).

An exception raised by an op (a kernel twin that fails) does not stop the
stream: the op completes and the error is kept for the device's next
synchronizing call, which raises it once (errors are not sticky).
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from ._ops import Op

__all__ = ["Scheduler", "Executor", "signal_reached"]

_SIGNAL_POLL_MIN_S = 20e-6
_SIGNAL_POLL_MAX_S = 1e-3


def signal_reached(op: Op) -> bool:
    """A ``wait_signal`` op's word holds at least its value (read now, no lock needed)."""
    assert op.signal is not None
    address, value = op.signal
    return ctypes.c_uint64.from_address(address).value >= value


class Executor:
    """The executor and callback threads of one device, and their ready queues."""

    def __init__(self, scheduler: Scheduler, device: int) -> None:
        self.scheduler = scheduler
        self.device = device
        self.ready: deque[Op] = deque()
        self.cv = threading.Condition(scheduler.lock)
        self.cb_ready: deque[Op] = deque()
        self.cb_cv = threading.Condition(scheduler.lock)
        self.host_started: dict[int, Op] = {}  # stream handle -> its latest host function that has started
        self.sleeping = [False, False]  # executor, callback thread waiting on their condition
        self.thread = threading.Thread(
            target=self._loop,
            args=(self.ready, self.cv, 0, "executor"),
            name=f"streamrt-sim-exec-{device}",
            daemon=True,
        )
        self.cb_thread = threading.Thread(
            target=self._loop,
            args=(self.cb_ready, self.cb_cv, 1, "callback"),
            name=f"streamrt-sim-callback-{device}",
            daemon=True,
        )
        self.signal_waits: list[Op] = []  # ready wait_signal ops whose value has not been reached
        self.signal_cv = threading.Condition(scheduler.lock)
        self.signal_thread: threading.Thread | None = None

    @property
    def threads(self) -> list[threading.Thread]:
        """The threads started for this device."""
        started = [self.thread, self.cb_thread]
        if self.signal_thread is not None:
            started.append(self.signal_thread)
        return started

    def notify_all(self) -> None:
        """Wake every thread of this device (shutdown). Lock held."""
        self.cv.notify_all()
        self.cb_cv.notify_all()
        self.signal_cv.notify_all()

    def push(self, op: Op) -> None:
        """Queue a ready op on the right thread. Lock held."""
        if op.host:
            self.cb_ready.append(op)
            if self.sleeping[1]:
                self.cb_cv.notify()
        elif op.signal is not None:
            self.signal_waits.append(op)
            if self.signal_thread is None:
                self.signal_thread = threading.Thread(
                    target=self._watch_signals, name=f"streamrt-sim-signal-{self.device}", daemon=True
                )
                self.signal_thread.start()
            else:
                self.signal_cv.notify()
        else:
            self.ready.append(op)
            if self.sleeping[0]:
                self.cv.notify()

    def _loop(self, queue: deque[Op], cv: threading.Condition, slot: int, role: str) -> None:
        sched = self.scheduler
        sched.thread_init(role)
        lock = sched.lock
        sleeping = self.sleeping
        with lock:
            while True:
                while not queue:
                    if sched.stopping:
                        return
                    sleeping[slot] = True
                    cv.wait()
                    sleeping[slot] = False
                if sched.abandoned:
                    return
                op = queue.popleft()
                error: BaseException | None = None
                fn = op.fn
                if fn is not None:
                    if op.host:
                        self.host_started[op.stream] = op
                    lock.release()
                    try:
                        fn(*op.args)
                    except BaseException as exc:
                        error = exc
                    finally:
                        lock.acquire()
                if error is not None:
                    sched.errors[op.device].append((op, error))
                sched.complete(op)

    def _watch_signals(self) -> None:
        sched = self.scheduler
        sched.thread_init("signal")
        waits = self.signal_waits
        delay = _SIGNAL_POLL_MIN_S
        with sched.lock:
            while not sched.abandoned:
                reached = [op for op in waits if signal_reached(op)]
                for op in reached:
                    waits.remove(op)
                    sched.complete(op)
                if not waits:
                    if sched.stopping:
                        return
                    self.signal_cv.wait()
                    delay = _SIGNAL_POLL_MIN_S
                    continue
                if reached:
                    delay = _SIGNAL_POLL_MIN_S
                self.signal_cv.wait(delay)
                delay = min(delay * 2, _SIGNAL_POLL_MAX_S)


class Scheduler:
    """Dependency tracking, completion, waiting and shutdown for all devices.

    Args:
        devices: number of devices (one :class:`Executor` each).
        log_limit: how many completed ops the op log keeps (0 disables it).
        thread_init: called on each engine thread as it starts, with ``"executor"``,
            ``"callback"`` or ``"signal"`` (the backend marks the thread so API calls from it fail).
    """

    def __init__(self, devices: int, log_limit: int, thread_init: Callable[[str], None]) -> None:
        self.lock = threading.Lock()
        self.done_cv = threading.Condition(self.lock)
        self.thread_init = thread_init
        self.stopping = False
        self.abandoned = False
        self.pending = [0] * devices
        self.idle_waiters = 0  # threads waiting for all work to finish (shutdown)
        self.errors: list[list[tuple[Op, BaseException]]] = [[] for _ in range(devices)]
        self.log: deque[tuple[Any, ...]] | None = deque(maxlen=log_limit) if log_limit > 0 else None
        self.executors = [Executor(self, d) for d in range(devices)]
        for ex in self.executors:
            ex.thread.start()
            ex.cb_thread.start()

    # -- lock held -------------------------------------------------------------------------
    def submit(self, op: Op) -> None:
        """Account a new op and queue it if nothing holds it back. Lock held."""
        self.pending[op.device] += 1
        if op.waiting == 0:
            op.queue.push(op)

    def complete(self, op: Op) -> None:
        """Mark ``op`` done, release its payload, wake dependents and waiters. Lock held."""
        op.done = True
        op.fn = None
        op.args = ()
        op.refs = None
        deps = op.dependents
        if deps is not None:
            op.dependents = None
            for dep in deps:
                dep.waiting -= 1
                if dep.waiting == 0:
                    dep.queue.push(dep)
        self.pending[op.device] -= 1
        if self.log is not None:
            self.log.append(op.record_tuple())
        if op.watched or (self.idle_waiters and not any(self.pending)):
            self.done_cv.notify_all()

    # -- waiting (lock not held) -------------------------------------------------------------
    def wait(self, ops: Iterable[Op]) -> bool:
        """Block (GIL released) until every op in ``ops`` is done; ``False`` if work was abandoned."""
        with self.done_cv:
            for op in ops:
                while not op.done:
                    if self.abandoned:
                        return False
                    op.watched = True
                    self.done_cv.wait()
        return True

    def idle(self) -> bool:
        """No op submitted and not completed, on any device. Lock held."""
        return not any(self.pending)

    def shutdown(self, timeout: float) -> tuple[bool, list[threading.Thread]]:
        """Drain, stop and join the threads.

        Waits up to ``timeout`` seconds for every submitted op to complete. If
        that does not happen, ops not yet started are abandoned (they never run;
        waiters are released). Returns ``(drained, threads_still_alive)``; a
        thread is left alive only when it is stuck inside an op (a host function
        that never returns); it is a daemon thread.
        """
        with self.done_cv:
            self.idle_waiters += 1
            try:
                drained = self.done_cv.wait_for(self.idle, timeout)
            finally:
                self.idle_waiters -= 1
            if not drained:
                self.abandoned = True
            self.stopping = True
            for ex in self.executors:
                ex.notify_all()
            self.done_cv.notify_all()
        stuck: list[threading.Thread] = []
        for ex in self.executors:
            for t in ex.threads:
                if t is threading.current_thread():
                    continue
                t.join(None if drained else max(timeout, 0.1))
                if t.is_alive():
                    stuck.append(t)
        return drained, stuck

    def stop_nowait(self) -> None:
        """Abandon queued work and tell the threads to exit, without waiting (finalizer path)."""
        with self.lock:
            self.abandoned = True
            self.stopping = True
            for ex in self.executors:
                ex.notify_all()
            self.done_cv.notify_all()
