"""A tiny progress bar for long command-line runs (stdlib only).

:class:`Progress` draws ``label [#####-----] 3/10 note`` on one terminal line,
redrawn at most ten times a second, and erases nothing when it finishes (the
final state stays on screen). When the output is not a terminal (CI logs,
pipes, tests) it draws nothing, so captured output stays clean; set
``STREAMRT_PROGRESS=1`` to force it on, ``0`` to force it off.

Thread rules: one thread advances a bar. Not blocking.
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any

__all__ = ["Progress"]


class Progress:
    """A progress bar over ``total`` steps, written to ``stream`` (default stderr)."""

    def __init__(self, total: int, label: str = "", *, stream: IO[str] | None = None, enabled: bool | None = None, width: int = 28) -> None:
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        self.total = total
        self.label = label
        self.done = 0
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
        self._last_draw = 0.0
        self._last_len = 0
        self._closed = False

    def advance(self, n: int = 1, note: str = "") -> None:
        """Mark ``n`` more steps done; ``note`` is shown after the count."""
        self.done = min(self.total, self.done + n)
        now = time.monotonic()
        if self.done >= self.total or now - self._last_draw >= 0.1:
            self._draw(note)
            self._last_draw = now

    def render(self, note: str = "") -> str:
        """The bar's text for the current state (what :meth:`advance` draws)."""
        frac = self.done / self.total if self.total else 1.0
        filled = int(round(frac * self._width))
        bar = "#" * filled + "-" * (self._width - filled)
        text = f"{self.label} [{bar}] {self.done}/{self.total}"
        return f"{text} {note}" if note else text

    def _draw(self, note: str) -> None:
        if not self.enabled or self._closed:
            return
        text = self.render(note)
        pad = " " * max(0, self._last_len - len(text))
        self._stream.write("\r" + text + pad)
        self._stream.flush()
        self._last_len = len(text)

    def close(self) -> None:
        """End the bar's line. Idempotent."""
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
