"""DeferredWakes: a launch wakes the lanes it pushed to once, when it ends, not in its middle."""

from __future__ import annotations

import threading

from _completion_helpers import Harness

from streamrt._completion import Completion, CompletionEngine, DeferredWakes


def _retired_event(c: Completion) -> threading.Event:
    """Set by a done callback (Completion.wait would wake the lane itself)."""
    done = threading.Event()
    c.add_done_callback(lambda _c: done.set())
    return done


def _asleep_lane(harness: Harness) -> tuple[CompletionEngine, int]:
    """An engine without a watchdog, and a stream whose lane has retired work and sleeps again."""
    engine = harness.engine(watchdog_interval=None)
    s = harness.stream()
    engine.completion_for_stream(s).wait(10)
    return engine, s


def test_work_pushed_in_the_scope_is_retired_only_after_it_ends(harness: Harness) -> None:
    engine, s = _asleep_lane(harness)
    with DeferredWakes():
        first = _retired_event(engine.completion_for_stream(s))
        second = _retired_event(engine.completion_for_stream(s))
        assert not first.wait(0.2), "the lane was woken inside the scope"
    assert first.wait(10) and second.wait(10)


def test_nested_scopes_wake_when_the_outermost_ends(harness: Harness) -> None:
    engine, s = _asleep_lane(harness)
    with DeferredWakes():
        with DeferredWakes():
            done = _retired_event(engine.completion_for_stream(s))
        assert not done.wait(0.2), "the inner scope woke the lane"
    assert done.wait(10)


def test_a_blocking_wait_inside_the_scope_wakes_the_lane_itself(harness: Harness) -> None:
    engine, s = _asleep_lane(harness)
    with DeferredWakes():
        c = engine.completion_for_stream(s)
        c.wait(10)
        assert c.is_done


def test_other_threads_are_not_deferred(harness: Harness) -> None:
    engine, s = _asleep_lane(harness)
    box: list[threading.Event] = []
    with DeferredWakes():
        t = threading.Thread(target=lambda: box.append(_retired_event(engine.completion_for_stream(s))))
        t.start()
        t.join()
        assert box[0].wait(10)


def test_the_scope_wakes_its_lanes_when_the_launch_raises(harness: Harness) -> None:
    engine, s = _asleep_lane(harness)
    try:
        with DeferredWakes():
            done = _retired_event(engine.completion_for_stream(s))
            raise KeyError("a launch failed midway")
    except KeyError:
        pass
    assert done.wait(10)
