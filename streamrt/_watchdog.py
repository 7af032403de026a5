"""The completion engine's watchdog: event queries when a lane's blocking wait may hang.

A completion lane waits for each watched event with the backend's blocking
``event_synchronize``. When the context has failed (a sticky device error),
that wait normally raises and the lane resolves its waiters with the error.
If a driver's wait hangs on the failed context instead, the lane would hang,
and so would everyone waiting on its Completions, host calls included (a host
function the failed stream never reaches has its guard event on the lane).

The watchdog is one daemon thread per engine (``streamrt-watchdog``, started
with the engine's first lane) that falls back to non-blocking queries:

* While any lane has work queued, it wakes every ``interval`` seconds. A lane
  whose oldest entry (its *head*, the event its thread waits for) has been
  the same for at least ``threshold`` seconds gets one ``event_query`` on that
  event. A query that returns (done or not) means the context is alive: a
  long kernel or a long host function is never failed.
* A query that raises :class:`~streamrt.BackendError` fails the lane
  (:meth:`_Lane.fail_stuck`): every entry queued on it is resolved with that
  error, pending Python host calls on its stream are abandoned (``fn`` never
  runs), and the lane's thread, possibly blocked in the driver forever, is
  abandoned. Work pushed onto that lane later fails at once with the same
  error.
* Each check also wakes a lane thread left asleep with work queued (work
  pushed on an event loop's thread defers that wake-up to the loop's next
  iteration, which a loop that stops may never run).
* While nothing is queued it sleeps on a condition variable without a
  timeout: zero wake-ups when idle. The first push after that wakes it
  (producers check one flag; no lock on their path otherwise).

Thread rules: callbacks of failed entries run on the watchdog thread; it
counts as one of the engine's own threads (``CompletionEngine.owns_thread``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from ._errors import BackendError

if TYPE_CHECKING:
    from ._completion import CompletionEngine

__all__ = ["Watchdog"]

_log = logging.getLogger("streamrt")


class Watchdog:
    """Queries the head event of lanes stuck for ``threshold`` seconds, every ``interval`` seconds.

    ``idle`` is ``True`` while the thread sleeps without a timeout (nothing
    queued); a producer that sees it calls :meth:`kick` after queueing work.
    ``wakeups`` counts timed wake-ups (checks), ``failed_lanes`` the lanes it
    failed.
    """

    def __init__(self, engine: CompletionEngine, interval: float, threshold: float) -> None:
        self._engine = engine
        self.interval = interval
        self.threshold = threshold
        # Re-entrant: a garbage-collector finalizer that queues work (a Buffer's release) may
        # call kick() on this thread while it holds the lock.
        self._cond = threading.Condition(threading.RLock())
        self.idle = False
        self._stopping = False
        self.wakeups = 0
        self.failed_lanes = 0
        self._seen: dict[Any, tuple[Any, float]] = {}  # lane -> (head entry, first seen)
        self.thread = threading.Thread(target=self._main, name="streamrt-watchdog", daemon=True)

    def kick(self) -> None:
        """Work was queued while the watchdog slept idle: resume timed checks. Any thread."""
        with self._cond:
            self.idle = False
            self._cond.notify()

    def stop(self) -> None:
        """Make the thread exit (at once if it sleeps; after a check in progress). Any thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def _main(self) -> None:
        engine = self._engine
        try:
            engine._backend.ensure_device(engine._device)
        except BaseException:  # noqa: BLE001 - the lanes fail the same way and resolve their waiters
            _log.debug("completion watchdog: cannot make the device current; not watching", exc_info=True)
            return
        cond = self._cond
        while True:
            with cond:
                if self._stopping:
                    return
                # Announce idle *before* looking: a producer that queued work and then read
                # `idle` as False queued it before this look, so the look sees it.
                self.idle = True
                pending = any(lane.head() is not None for lane in engine._all_lanes())
                if not pending and self.idle:  # not idle: kicked (re-entrantly) during the look
                    self._seen.clear()
                    cond.wait()  # until kick() or stop(): no timed wake-ups while idle
                    self.idle = False
                    continue
                self.idle = False
                cond.wait(self.interval)
                if self._stopping:
                    return
            self.wakeups += 1
            self._check()

    def _check(self) -> None:
        """One round: query the head of every lane whose head has not moved for ``threshold`` s."""
        engine = self._engine
        query = engine._backend.event_query
        now = time.monotonic()
        seen: dict[Any, tuple[Any, float]] = {}
        for lane in engine._all_lanes():
            head = lane.head()
            if head is None:
                continue
            lane.nudge()  # work pushed on a loop that stopped before waking the lane (see _Lane.push)
            previous = self._seen.get(lane)
            since = previous[1] if previous is not None and previous[0] is head else now
            seen[lane] = (head, since)
            if now - since < self.threshold:
                continue
            try:
                query(head.event)
            except BackendError as exc:
                failed = lane.fail_stuck(head, exc)
                if failed is not None:
                    self.failed_lanes += 1
                    seen.pop(lane, None)
                    _log.error(
                        "completion lane %#x: waiting for an event made no progress for %.1f s and "
                        "event_query raised %s; %d waiter(s) resolved with that error, the lane's "
                        "thread is abandoned and later work on the lane fails at once",
                        lane.key,
                        now - since,
                        exc,
                        failed,
                    )
            except Exception:  # noqa: BLE001 - not a device error: leave the lane to its wait
                _log.debug("completion watchdog: event_query failed unexpectedly", exc_info=True)
        self._seen = seen
