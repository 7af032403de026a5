"""The progress bar: drawn on terminals only, with the elapsed time and an estimate of the time left."""

from __future__ import annotations

import io
import threading
import time

import pytest

from streamrt._cli.progress import Progress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_each_step_shows_the_elapsed_time_and_the_time_left() -> None:
    tty, clock = Tty(), Clock()
    with Progress(4, "demo", stream=tty, clock=clock, refresh=0) as bar:
        for _ in range(4):
            clock.now += 10.0
            bar.advance(note="x")
    frames = tty.getvalue().split("\r")[1:]
    assert [f.rstrip() for f in frames] == [
        "demo [#######---------------------] 1/4 0:10 elapsed, ~0:30 left x",
        "demo [##############--------------] 2/4 0:20 elapsed, ~0:20 left x",
        "demo [#####################-------] 3/4 0:30 elapsed, ~0:10 left x",
        "demo [############################] 4/4 0:40 elapsed x",  # done: the total time, nothing left
    ]
    assert tty.getvalue().endswith("\n")


def test_the_time_left_is_unknown_until_a_step_is_done_and_long_times_show_hours() -> None:
    clock = Clock()
    bar = Progress(3, "p", enabled=False, clock=clock)
    assert bar.render() == "p [----------------------------] 0/3 0:00 elapsed, ? left"
    clock.now = 3725.4  # 1 h 2 min 5 s for one step: two more to go
    bar.advance()
    assert bar.render("n") == "p [#########-------------------] 1/3 1:02:05 elapsed, ~2:04:11 left n"


def test_nothing_is_drawn_on_a_pipe_and_the_switch_forces_it(monkeypatch: pytest.MonkeyPatch) -> None:
    pipe = io.StringIO()
    with Progress(4, "demo", stream=pipe) as bar:
        bar.advance(4)
    assert pipe.getvalue() == ""
    monkeypatch.setenv("STREAMRT_PROGRESS", "1")
    with Progress(1, "demo", stream=pipe, refresh=0) as bar:
        bar.advance()
    assert "1/1" in pipe.getvalue()
    monkeypatch.setenv("STREAMRT_PROGRESS", "0")
    assert not Progress(1, stream=Tty()).enabled


def test_the_bar_redraws_during_a_long_step_and_stops_when_closed() -> None:
    tty, clock = Tty(), Clock()
    bar = Progress(2, "bench", stream=tty, clock=clock, refresh=0.01)
    bar.advance(0, note="slow_one")
    deadline = time.monotonic() + 10.0
    clock.now = 65.0
    while "1:05 elapsed" not in tty.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "bench [----------------------------] 0/2 1:05 elapsed, ? left slow_one" in tty.getvalue()
    bar.close()
    assert not any(t.name == "streamrt-progress" for t in threading.enumerate())
    closed = tty.getvalue()
    time.sleep(0.05)
    assert tty.getvalue() == closed and closed.endswith("\n")


def test_echo_prints_a_line_above_the_bar() -> None:
    tty, out, clock = Tty(), io.StringIO(), Clock()
    with Progress(2, "bench", stream=tty, clock=clock, refresh=0) as bar:
        bar.advance(1, note="a: ok")
        bar.echo("a: ok (1.0 s)", file=out)
        drawn = tty.getvalue()
        last = drawn.rsplit("\r", 1)[-1]
        assert last.startswith("bench [##############--------------] 1/2")  # redrawn after the line
        assert drawn.count("\r") == 4  # first draw, clear (\r spaces \r), redraw
    assert out.getvalue() == "a: ok (1.0 s)\n"
    quiet = io.StringIO()
    with Progress(1, stream=io.StringIO()) as bar:
        bar.echo("line", file=quiet)
    assert quiet.getvalue() == "line\n"
