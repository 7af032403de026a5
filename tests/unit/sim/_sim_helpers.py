"""Helpers for the simulator's unit tests (imported by the test modules and conftest)."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

_libc = ctypes.CDLL(None, use_errno=True)
_libc.sem_init.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint]
_libc.sem_post.argtypes = [ctypes.c_void_p]
_libc.sem_wait.argtypes = [ctypes.c_void_p]
_libc.sem_destroy.argtypes = [ctypes.c_void_p]
SEM_WAIT = ctypes.cast(_libc.sem_wait, ctypes.c_void_p).value
SEM_POST = ctypes.cast(_libc.sem_post, ctypes.c_void_p).value
HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Gate:
    """Holds a stream: a native ``sem_wait`` host function that blocks (GIL-free) until :meth:`open`."""

    def __init__(self) -> None:
        self._sem = ctypes.create_string_buffer(64)
        assert _libc.sem_init(ctypes.addressof(self._sem), 0, 0) == 0
        self.address = ctypes.addressof(self._sem)

    def block(self, backend: Any, stream: int) -> None:
        backend.launch_host_func(stream, SEM_WAIT, self.address)

    def open(self) -> None:
        _libc.sem_post(self.address)


class PyHostFn:
    """A Python function behind a native ``void(*)(void*)`` pointer; remembers calls and threads."""

    def __init__(self, fn: Any = None) -> None:
        import threading

        self.calls: list[tuple[int, str]] = []
        self._threading = threading

        def body(user_data: int | None) -> None:
            self.calls.append((user_data or 0, self._threading.current_thread().name))
            if fn is not None:
                fn(user_data or 0)

        self._cfn = HOST_FN(body)  # kept alive as long as this object
        self.ptr = ctypes.cast(self._cfn, ctypes.c_void_p).value


def view(ptr: int, nbytes: int, dtype: Any = np.uint8) -> np.ndarray:
    """A numpy view of raw host-addressable memory (sim device or pinned memory)."""
    buf = (ctypes.c_uint8 * nbytes).from_address(ptr)
    return np.frombuffer(buf, dtype=dtype)
