"""libc semaphores through ctypes: the GIL-free bridge between driver threads and runtime threads.

A driver (or simulator) callback thread must never run Python on the
completion path (it would contend for the GIL). What it runs instead is a *native* host function:
libc ``sem_post`` or ``sem_wait`` called with the address of a ``sem_t`` as
``user_data``. On the other side, a runtime-owned thread blocks in
:meth:`Semaphore.wait`, a ctypes call into libc ``sem_wait`` that releases the
GIL for as long as it blocks.

This module provides:

* :data:`SEM_POST_ADDRESS` / :data:`SEM_WAIT_ADDRESS`: the raw function
  pointers (``int``) of libc ``sem_post`` and ``sem_wait``, usable as the
  ``fn_ptr`` of :meth:`Backend.launch_host_func`. Both have the signature
  ``int fn(sem_t*)``; called as ``void fn(void*)`` the return value is ignored,
  which is ABI-compatible on every platform we support.
* :data:`HOLD_ADDRESS`: the host function that holds a stream on a semaphore.
  libc ``sem_wait`` returns early when a signal handler runs on the waiting
  thread (``EINTR``, whatever ``SA_RESTART`` says), which would let the stream
  go on; the C extension ``streamrt._graph_release_c`` has a wait that waits
  again instead. Without the extension it is libc ``sem_wait``.
* :class:`Semaphore`: one unnamed, process-private POSIX semaphore.
* :func:`tighten_timer_slack`: for runtime threads that wait for the GIL.

Memory. A ``sem_t`` lives in memory obtained from libc ``calloc`` (32 bytes on
Linux x86-64 and aarch64; :data:`SEM_T_SIZE`), not in a Python object, so a
driver thread that touches it late (at interpreter teardown, or after its
stream failed) never writes into memory the interpreter has freed. A semaphore
whose address may still be referenced by enqueued or captured host functions
that will never run is *leaked* on purpose (:meth:`Semaphore.leak`): freeing it
could let a driver thread write into reused memory later.

Platform: Linux (glibc or musl). Unnamed semaphores do not exist on macOS;
:func:`native_unavailable_reason` says why the module cannot be used.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import sys
import threading
import time

__all__ = [
    "HOLD_ADDRESS",
    "SEM_POST_ADDRESS",
    "SEM_T_SIZE",
    "SEM_WAIT_ADDRESS",
    "Semaphore",
    "native_unavailable_reason",
    "tighten_timer_slack",
]

#: ``sizeof(sem_t)`` on Linux x86-64 and aarch64 (glibc and musl). We allocate
#: 64 bytes to leave slack for any ABI that uses more, aligned by ``calloc``.
SEM_T_SIZE = 32
_SEM_ALLOC = 64

_CLOCK_MONOTONIC = 1  # Linux value


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load_libc() -> tuple[ctypes.CDLL | None, ctypes.PyDLL | None, str | None]:
    if not sys.platform.startswith("linux"):
        return None, None, f"libc unnamed semaphores are only supported on Linux, not {sys.platform!r}"
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        # CDLL calls release the GIL (for the blocking waits); PyDLL calls keep it,
        # which is cheaper for the calls that never block (post, trywait, getvalue):
        # no release/re-acquire, so a busy main thread cannot delay the caller after them.
        return ctypes.CDLL(name, use_errno=True), ctypes.PyDLL(name, use_errno=True), None
    except OSError as exc:  # pragma: no cover - every Linux has a libc
        return None, None, f"cannot load libc ({name}): {exc}"


_libc, _libc_gil, _UNAVAILABLE = _load_libc()


def native_unavailable_reason() -> str | None:
    """``None`` when libc semaphores work here, else a one-line reason."""
    return _UNAVAILABLE


if _libc is not None and _libc_gil is not None:
    _sem_init = _libc.sem_init
    _sem_init.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint]
    _sem_init.restype = ctypes.c_int
    _sem_destroy = _libc.sem_destroy
    _sem_destroy.argtypes = [ctypes.c_void_p]
    _sem_destroy.restype = ctypes.c_int
    _sem_post = _libc_gil.sem_post
    _sem_post.argtypes = [ctypes.c_void_p]
    _sem_post.restype = ctypes.c_int
    _sem_wait = _libc.sem_wait
    _sem_wait.argtypes = [ctypes.c_void_p]
    _sem_wait.restype = ctypes.c_int
    _sem_trywait = _libc_gil.sem_trywait
    _sem_trywait.argtypes = [ctypes.c_void_p]
    _sem_trywait.restype = ctypes.c_int
    _sem_getvalue = _libc_gil.sem_getvalue
    _sem_getvalue.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    _sem_getvalue.restype = ctypes.c_int
    _sem_timedwait = _libc.sem_timedwait
    _sem_timedwait.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Timespec)]
    _sem_timedwait.restype = ctypes.c_int
    # sem_clockwait (glibc >= 2.30) waits against CLOCK_MONOTONIC, immune to wall-clock jumps.
    _sem_clockwait = getattr(_libc, "sem_clockwait", None)
    if _sem_clockwait is not None:
        _sem_clockwait.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(_Timespec)]
        _sem_clockwait.restype = ctypes.c_int
    _calloc = _libc.calloc
    _calloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    _calloc.restype = ctypes.c_void_p
    _free = _libc.free
    _free.argtypes = [ctypes.c_void_p]
    _free.restype = None
    _prctl = _libc_gil.prctl
    _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    _prctl.restype = ctypes.c_int

    #: Address of libc ``sem_post``; enqueue it as a host function with a semaphore address.
    SEM_POST_ADDRESS: int = int(ctypes.cast(_sem_post, ctypes.c_void_p).value or 0)
    #: Address of libc ``sem_wait``; the driver thread blocks in it GIL-free.
    SEM_WAIT_ADDRESS: int = int(ctypes.cast(_sem_wait, ctypes.c_void_p).value or 0)
else:  # pragma: no cover - exercised only off Linux
    SEM_POST_ADDRESS = 0
    SEM_WAIT_ADDRESS = 0


def _hold_address() -> int:
    try:
        from ._graph_release_c import HOLD_ADDRESS as address
    except ImportError:  # built without its C extensions: a signal on the driver's thread ends a hold early
        return SEM_WAIT_ADDRESS
    return address


#: Address of a ``void hold(sem_t*)`` that waits on the semaphore through signals (see the module docstring).
HOLD_ADDRESS: int = _hold_address()

_PR_SET_TIMERSLACK = 29  # linux/prctl.h
#: Timer slack of runtime threads that wait for the GIL, in ns (Linux's default is 50 µs).
TIMER_SLACK_NS = 1000


def tighten_timer_slack(ns: int = TIMER_SLACK_NS) -> bool:
    """Set the calling thread's timer slack to ``ns`` (Linux ``prctl(PR_SET_TIMERSLACK)``).

    A thread waiting for the GIL waits on a condition variable with a timeout
    of one switch interval before it asks the running thread to let go; Linux
    may let such a timed wait run late by the thread's timer slack, 50 µs by
    default, so the 10 µs interval streamrt sets while Python host calls are
    in flight could become a 60 µs wait. Called by the runtime's own worker and lane threads
    only: it affects the calling thread and nothing else. ``False`` where it
    is not available (not Linux) or refused.
    """
    if _libc_gil is None or not sys.platform.startswith("linux"):
        return False
    return bool(_prctl(_PR_SET_TIMERSLACK, ns, 0, 0, 0) == 0)


# Semaphores deliberately never freed (see Semaphore.leak); kept only for statistics.
_leaked_lock = threading.Lock()
_leaked_count = 0


def leaked_semaphores() -> int:
    """How many semaphores were leaked on purpose in this process."""
    return _leaked_count


def _oserror(call: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{call} failed: {os.strerror(err)}")


class Semaphore:
    """One process-private POSIX semaphore in libc-allocated memory.

    ``address`` is the ``sem_t*`` to pass as ``user_data`` with
    :data:`SEM_POST_ADDRESS` / :data:`SEM_WAIT_ADDRESS`.

    Thread rules: every method may be called from any thread. :meth:`wait`
    blocks the calling thread with the GIL released (a ctypes call); a signal
    delivered meanwhile (``EINTR``) returns control to Python briefly, so
    Ctrl+C handlers still run on the main thread, and the wait resumes.

    Lifetime: :meth:`destroy` frees it and must only be called when no thread
    and no enqueued or captured host function can touch it anymore;
    :meth:`leak` gives it up without freeing when that cannot be known.
    """

    __slots__ = ("__weakref__", "_address")

    def __init__(self, value: int = 0) -> None:
        if _libc is None:  # pragma: no cover - off Linux
            raise OSError(errno.ENOSYS, _UNAVAILABLE or "libc semaphores unavailable")
        if value < 0:
            raise ValueError(f"initial semaphore value must be >= 0, got {value}")
        addr = _calloc(1, _SEM_ALLOC)
        if not addr:
            raise MemoryError("calloc failed for a semaphore")
        if _sem_init(addr, 0, value) != 0:
            exc = _oserror("sem_init")
            _free(addr)
            raise exc
        self._address: int = int(addr)

    @property
    def address(self) -> int:
        """The ``sem_t*`` as an int. Raises ``ValueError`` once destroyed or leaked."""
        if not self._address:
            raise ValueError("semaphore was destroyed")
        return self._address

    @property
    def is_alive(self) -> bool:
        """``False`` after :meth:`destroy` or :meth:`leak`."""
        return bool(self._address)

    def post(self) -> None:
        """Increment the semaphore, waking one waiter. Never blocks; keeps the GIL (no handoff)."""
        if _sem_post(self.address) != 0:
            raise _oserror("sem_post")

    def try_wait(self) -> bool:
        """Decrement without blocking; ``True`` if it could."""
        while True:
            if _sem_trywait(self.address) == 0:
                return True
            err = ctypes.get_errno()
            if err == errno.EAGAIN:
                return False
            if err != errno.EINTR:
                raise _oserror("sem_trywait")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the semaphore can be decremented (GIL released while blocked).

        Returns ``True`` once decremented, ``False`` if ``timeout`` seconds
        passed first. ``timeout=None`` waits forever; ``0`` only tries.
        """
        addr = self.address
        if timeout is None:
            while True:
                if _sem_wait(addr) == 0:
                    return True
                if ctypes.get_errno() != errno.EINTR:
                    raise _oserror("sem_wait")
        if timeout <= 0:
            return self.try_wait()
        if _sem_clockwait is not None:
            deadline = time.monotonic() + timeout
            clock = _CLOCK_MONOTONIC
        else:  # pragma: no cover - glibc < 2.30
            deadline = time.time() + timeout
            clock = -1
        sec = int(deadline)
        ts = _Timespec(sec, int((deadline - sec) * 1e9))
        while True:
            if _sem_clockwait is not None:
                rc = _sem_clockwait(addr, clock, ctypes.byref(ts))
            else:  # pragma: no cover
                rc = _sem_timedwait(addr, ctypes.byref(ts))
            if rc == 0:
                return True
            err = ctypes.get_errno()
            if err == errno.ETIMEDOUT:
                return False
            if err != errno.EINTR:
                raise _oserror("sem_clockwait" if clock >= 0 else "sem_timedwait")

    @property
    def value(self) -> int:
        """The current count (a snapshot; other threads may change it at once)."""
        out = ctypes.c_int(0)
        if _sem_getvalue(self.address, ctypes.byref(out)) != 0:
            raise _oserror("sem_getvalue")
        return max(0, out.value)

    def destroy(self) -> None:
        """``sem_destroy`` and free the memory. Idempotent.

        Only call it when nothing can reach the address anymore: no thread
        blocked in it, no enqueued or captured host function naming it.
        """
        addr, self._address = self._address, 0
        if addr:
            _sem_destroy(addr)
            _free(addr)

    def leak(self) -> None:
        """Give the semaphore up without freeing its memory. Idempotent.

        Used when a driver thread might still post or wait on it later (its
        stream failed with host functions naming it enqueued, or shutdown
        timed out): 64 bytes leaked is better than a write into freed memory.
        """
        global _leaked_count
        if self._address:
            self._address = 0
            with _leaked_lock:
                _leaked_count += 1

    def __repr__(self) -> str:
        if not self._address:
            return "<Semaphore (destroyed)>"
        return f"<Semaphore at 0x{self._address:x} value={self.value}>"
