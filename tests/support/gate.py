"""A gate that holds a stream until the test opens it (on every backend)."""

from __future__ import annotations

import threading

import streamrt as srt
from streamrt._native import SEM_WAIT_ADDRESS, Semaphore

__all__ = ["Gate"]


class Gate:
    """Holds a stream (libc ``sem_wait`` as a native host function) until opened.

    A watchdog opens it after ``timeout`` seconds and marks it ``forced``: on a GPU
    the queue behind a blocked host function is bounded, so a test that enqueues
    too much behind a gate would otherwise hang instead of failing.
    """

    def __init__(self, rt: srt.Runtime, s: srt.Stream, timeout: float = 30.0) -> None:
        self.sem = Semaphore(0)
        self.forced = False
        self._opened = threading.Event()
        rt.backend.launch_host_func(s.handle, SEM_WAIT_ADDRESS, self.sem.address)
        self._watchdog = threading.Thread(target=self._force_after, args=(timeout,), daemon=True)
        self._watchdog.start()

    def _force_after(self, timeout: float) -> None:
        if not self._opened.wait(timeout):
            self.forced = True
            self.open()

    def open(self) -> None:
        if not self._opened.is_set():
            self._opened.set()
            self.sem.post()
