"""Completions and the completion engine: GPU work retired without Python on driver threads.

:class:`Completion` is the one awaitable result type of streamrt (events,
``Stream.wait_idle``, host calls; pipelines' ``Run`` subclasses it). It can be
waited on from any thread (:meth:`Completion.wait`, GIL released) or awaited
from any asyncio or uvloop event loop (the loop is never blocked).

:class:`CompletionEngine` (one per runtime) turns stream progress into
resolved Completions:

* **Lanes.** A lane is a runtime-owned thread (one per lane key, normally the
  stream handle, created lazily) that waits GIL-free on blocking-sync events
  with ``event_synchronize``, in the order they were watched (= stream order),
  and then does the Python-side work: it drops keepalives, runs callbacks and
  resolves Completions. After one blocking wait returns it retires every
  following event that ``event_query`` reports done, as one batch (all of
  them after one query when the newest is done: a lane's events are recorded
  on its stream and complete in order), and wakes each asyncio loop once per
  batch (``loop.call_soon_threadsafe``). An idle lane sleeps on a lock: no
  polling.
* **Lazy wake-ups.** A lane wakes for pushed work only while someone waits
  for it (``Completion.wait``, an await past its polling, a done callback, a
  drain), once a backlog builds up, or at the watchdog's next check;
  ``Completion.is_done`` retires complete work on the calling thread (see
  :class:`~._lane._Lane`, "Lazy wake-ups").
* **Polling awaits.** For ``await_poll_us`` after an ``await`` of pending
  work begins, the awaiting task polls the work's lanes itself, once per
  turn of its loop (:meth:`Completion._poll_lanes`, :meth:`_Lane.poll`), and
  retires what is complete, as a lane would; the lane thread naps
  meanwhile. This saves the lane's and the loop's cross-thread wake-ups for
  short work.
* **Host calls.** Python host functions run on worker threads (see
  :mod:`streamrt._hostcall`); driver threads only run libc ``sem_post`` /
  ``sem_wait``.
* **Faults.** If ``event_synchronize`` raises (a sticky device error), the
  lane resolves that waiter with the error, and every later one that fails the
  same way. Each Python host call is followed by a guard event on its lane;
  when that wait fails before the worker ran the call, the call is abandoned
  and its Completion gets the error, so no waiter hangs on a host function the
  failed stream will never reach. If a driver's wait hangs on a failed context
  instead of raising, the engine's watchdog thread (:mod:`streamrt._watchdog`)
  queries the lane's stuck event after a while; when the query raises, every
  waiter of that lane (host calls included) gets that error and the blocked
  lane thread is abandoned.
* **Shutdown.** :meth:`CompletionEngine.close` drains deterministically and
  joins its threads. All threads are daemons and an ``atexit`` hook closes
  every live engine with a timeout, so interpreter exit with work in flight
  neither hangs nor crashes.

Thread rules: ``CompletionEngine`` methods may be called from any thread
except :meth:`~CompletionEngine.drain` and :meth:`~CompletionEngine.close`,
which must not be called from the engine's own threads (they would wait for
themselves; they raise ``RuntimeError``). Callbacks given to the engine run on
lane or worker threads (or the watchdog thread, or the thread of an event
loop whose awaiting task polls the work, or at once on the pushing thread for
work watched on a lane the watchdog failed) and must be short and must not
block on GPU work; ``drain`` and ``close`` from a callback run by a polling
task raise ``RuntimeError`` as on the engine's threads.

Modules: ``_engine`` (:class:`CompletionEngine`: lanes, the event pool, drain
and close), ``_hosts`` (its host-call side, a mixin), ``_lane`` (lane threads
and their entries), ``_future`` (:class:`Completion`, waking event loops),
``_shutdown`` (forced close, the ``atexit`` hook), ``_statistics``
(:class:`CompletionStatistics`).
"""

from ._engine import CompletionEngine
from ._future import DEFAULT_AWAIT_POLL_US, Completion, on_runtime_thread, refuse_blocking_wait
from ._statistics import CompletionStatistics

__all__ = [
    "DEFAULT_AWAIT_POLL_US",
    "Completion",
    "CompletionEngine",
    "CompletionStatistics",
    "on_runtime_thread",
    "refuse_blocking_wait",
]
