"""A tiny progress bar for long command-line runs (stdlib only).

:class:`Progress` draws ``label [#####-----] 3/10 0:12 elapsed, ~0:18 left note``
on one terminal line. It redraws when a step is done (at most ten times a
second) and once a second in between, so the elapsed time runs on during a
long step; when it finishes it erases nothing (the final state stays on
screen, with the total time). The time left is the elapsed time per step done
times the steps still to do (``?`` until a step is done); times read ``m:ss``,
or ``h:mm:ss`` from an hour on.

When the output is not a terminal (CI logs, pipes, tests) it draws nothing,
so captured output stays clean; set ``STREAMRT_PROGRESS=1`` to force it on,
``0`` to force it off.

Thread rules: one thread advances a bar; a drawn bar's own daemon thread
redraws it until :meth:`Progress.close`. Not blocking.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import IO, Any, Callable

__all__ = ["Progress"]


def _clock_text(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on (whole seconds, rounded)."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """A progress bar over ``total`` steps, written to ``stream`` (default stderr).

    ``clock`` gives the time in seconds (default ``time.monotonic``); ``refresh`` is the
    interval of the redraws between steps (0: redraw on :meth:`advance` only).
    """

    def __init__(
        self,
        total: int,
        label: str = "",
        *,
        stream: IO[str] | None = None,
        enabled: bool | None = None,
        width: int = 28,
        clock: Callable[[], float] = time.monotonic,
        refresh: float = 1.0,
    ) -> None:
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.total = total
        self.label = label
        self.done = 0
        self._clock = clock
        self._start = clock()
        self._stream = stream if stream is not None else sys.stderr
        if enabled is None:
            forced = os.environ.get("STREAMRT_PROGRESS")
            if forced in ("0", "1"):
                enabled = forced == "1"
            else:
                isatty = getattr(self._stream, "isatty", None)
                enabled = bool(isatty and isatty())
        self.enabled = enabled
        self._width = width
        self._note = ""
        self._last_draw = float("-inf")
        self._last_len = 0
        self._closed = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        if enabled and refresh > 0:
            self._ticker = threading.Thread(target=self._tick, args=(refresh,), name="streamrt-progress", daemon=True)
            self._ticker.start()

    def advance(self, n: int = 1, note: str = "") -> None:
        """Mark ``n`` more steps done; ``note`` is shown after the times until the next call."""
        self.done = min(self.total, self.done + n)
        self._note = note
        if self.done >= self.total or self._clock() - self._last_draw >= 0.1:
            self._draw()

    def render(self, note: str = "") -> str:
        """The bar's text for the current state with ``note`` (what is drawn)."""
        frac = self.done / self.total if self.total else 1.0
        filled = int(round(frac * self._width))
        bar = "#" * filled + "-" * (self._width - filled)
        elapsed = max(0.0, self._clock() - self._start)
        if self.done >= self.total:
            timing = f"{_clock_text(elapsed)} elapsed"
        else:
            left = "?" if self.done == 0 else "~" + _clock_text(elapsed / self.done * (self.total - self.done))
            timing = f"{_clock_text(elapsed)} elapsed, {left} left"
        text = f"{self.label} [{bar}] {self.done}/{self.total} {timing}"
        return f"{text} {note}" if note else text

    def _draw(self) -> None:
        with self._lock:
            if not self.enabled or self._closed:
                return
            text = self.render(self._note)
            pad = " " * max(0, self._last_len - len(text))
            self._stream.write("\r" + text + pad)
            self._stream.flush()
            self._last_len = len(text)
            self._last_draw = self._clock()

    def echo(self, line: str, file: IO[str] | None = None) -> None:
        """Print ``line`` to ``file`` (default stdout) above the bar: the bar's line is cleared, then redrawn."""
        file = file or sys.stdout
        with self._lock:
            drawn = self.enabled and not self._closed and self._last_len
            if drawn:
                self._stream.write("\r" + " " * self._last_len + "\r")
                self._stream.flush()
                self._last_len = 0
            print(line, file=file, flush=True)
        if drawn:
            self._draw()

    def _tick(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self._draw()

    def close(self) -> None:
        """Stop the redraws and end the bar's line. Idempotent."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            if self._closed:
                return
            if self.enabled and self._last_len:
                self._stream.write("\n")
                self._stream.flush()
            self._closed = True

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
