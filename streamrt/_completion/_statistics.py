"""A snapshot of a completion engine's counters (:meth:`CompletionEngine.statistics`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CompletionStatistics"]


@dataclass(frozen=True)
class CompletionStatistics:
    """A snapshot of one engine.

    Attributes:
        pending: watched events not yet retired (includes host-call guards).
        retired: watched events retired since the engine was created.
        failed: of those, retired with an error (a wait that raised).
        batches: blocking waits that retired at least one event; ``retired /
            batches`` is the mean batch size.
        max_batch: the most events retired after one blocking wait.
        lanes: live lane threads.
        workers: live host-call and host-slot worker threads.
        host_calls: Python host calls submitted since creation (eager).
        host_calls_pending: Python host calls (eager and armed slot runs) not
            yet run or abandoned.
        host_slots: live graph host slots.
        pooled_events: idle events in the event pool.
        events_created: events the pool ever created.
        switch_interval_lowered: the engine currently holds the switch
            interval lowered (a Python host call is in flight).
        loop_closed_warned: a completion arrived for an already closed event
            loop (the one warning was issued).
        closed: the engine is closed.
        watchdog_wakeups: timed wake-ups of the watchdog thread (it has none
            while nothing is queued).
        watchdog_failed_lanes: lanes the watchdog failed (a wait that made no
            progress while ``event_query`` raised).
    """

    pending: int
    retired: int
    failed: int
    batches: int
    max_batch: int
    lanes: int
    workers: int
    host_calls: int
    host_calls_pending: int
    host_slots: int
    pooled_events: int
    events_created: int
    switch_interval_lowered: bool
    loop_closed_warned: bool
    closed: bool
    watchdog_wakeups: int = 0
    watchdog_failed_lanes: int = 0
