"""Copies between devices: which foreign buffers a stream accepts, peer access, and keepalives.

A buffer belongs to one runtime, which is one device. A stream accepts a buffer
of another runtime only in :meth:`Stream.copy`, and only when that runtime is
on another device of the *same backend object* and the buffer is device
memory: the copy is then a peer copy (``memcpy_peer_async``).

* **Peer access** is enabled once per pair of devices and backend object, in
  both directions where :meth:`~streamrt._backends.protocol.Backend.can_access_peer`
  allows, the first time a copy crosses that pair. Where it does not (or
  enabling fails, e.g. too many peers), the copy is still legal: CUDA and HIP
  then stage it through host memory, more slowly.
* **Keepalives.** A buffer's release waits for the streams that used it, and
  its allocator records its fences with events of its own device, which CUDA
  and HIP can only record on streams of that device. So a buffer of device B
  used by a copy on a stream of device A is not marked with that stream: its
  runtime's *peer stream* (one per runtime, created on first use) waits for the
  copy through an event, and the buffer is marked with the peer stream. Each
  such copy costs one extra event record and stream wait.

Thread rules: as for :class:`~streamrt.Stream`; enabling peer access is
serialized per process.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any

from ._buffer import DEVICE, Buffer
from ._errors import ClosedError, StreamRTError

if TYPE_CHECKING:
    from ._stream import Stream

__all__ = ["check_peer_buffer", "ensure_peer_access", "peer_copy"]

_log = logging.getLogger("streamrt")

_lock = threading.Lock()
# backend object -> {(device a, device b) with a < b: whether peer access is enabled in some direction}
_pairs: weakref.WeakKeyDictionary[Any, dict[tuple[int, int], bool]] = weakref.WeakKeyDictionary()


def check_peer_buffer(stream: Stream, buf: Buffer, what: str) -> None:
    """Raise unless ``buf`` (of a runtime other than ``stream``'s) may take part in a peer copy on ``stream``."""
    other = buf._runtime
    mine = stream._runtime
    if other is None or other._base_backend is not mine._base_backend:
        raise ValueError(
            f"{what} belongs to another runtime ({other!r}) with a different backend instance than the stream's "
            f"({mine!r}): no stream of one backend instance can use the other's memory; copy through host memory"
        )
    if other._closed:
        raise ClosedError(f"{what} belongs to {other!r}, which is closed")
    if other._device == mine._device:
        raise ValueError(
            f"{what} belongs to another runtime on the same device ({other!r}); use buffers of the stream's runtime "
            f"({mine!r})"
        )
    if buf._kind != DEVICE:
        raise ValueError(
            f"{what} is {buf._kind} memory of another runtime or device ({other!r}): across devices stream.copy "
            "takes device buffers only (a peer copy); use host buffers of the stream's runtime"
        )


def ensure_peer_access(backend: Any, a: int, b: int, home: int) -> bool:
    """Enable peer access between devices ``a`` and ``b`` (both ways where possible), once per backend object.

    Returns whether some direction is enabled (the copy is direct) rather than
    staged. Leaves ``home`` current on the calling thread. Blocking, on the
    first call for a pair only.
    """
    key = (a, b) if a < b else (b, a)
    table = _pairs.get(backend)
    if table is not None:
        known = table.get(key)
        if known is not None:
            return known
    with _lock:
        table = _pairs.setdefault(backend, {})
        known = table.get(key)
        if known is not None:
            return known
        direct = False
        try:
            for x, y in ((a, b), (b, a)):
                if not backend.can_access_peer(x, y):
                    continue
                backend.ensure_device(x)
                try:
                    backend.enable_peer_access(y)
                except StreamRTError as exc:  # e.g. too many peers: the driver stages the copy instead
                    _log.debug("peer access %d -> %d not enabled: %s", x, y, exc)
                else:
                    direct = True
        finally:
            backend.ensure_device(home)
        table[key] = direct
        return direct


def peer_copy(
    stream: Stream,
    dst: Buffer,
    src: Buffer,
    nbytes: int,
) -> None:
    """Enqueue a copy of ``nbytes`` device bytes between two devices on ``stream`` (validated by the caller).

    The peer streams of the other runtimes are created before anything is
    enqueued, so a failure leaves nothing half-done.
    """
    rt = stream._runtime
    backend = stream._backend
    dd = dst._runtime._device  # type: ignore[union-attr]
    sd = src._runtime._device  # type: ignore[union-attr]
    if dd != sd:
        ensure_peer_access(rt._base_backend, sd, dd, rt._device)
    others: dict[int, tuple[Any, list[Buffer]]] = {}
    for buf in (dst, src):
        owner = buf._runtime
        if owner is not rt:
            entry = others.get(id(owner))
            if entry is None:
                others[id(owner)] = (owner._peer_stream(), [buf])  # type: ignore[union-attr]
            else:
                entry[1].append(buf)
    with stream._lock:  # the peer streams' locks are taken inside it, never the other way round
        if stream._closed:
            stream._check_open()
        backend.memcpy_peer_async(dst._ptr, dd, src._ptr, sd, nbytes, stream._handle)
        for buf in (dst, src):
            if buf._runtime is rt:
                buf.note_stream(stream)
        for peer_stream, bufs in others.values():
            peer_stream.wait_stream(stream)
            for buf in bufs:
                buf.note_stream(peer_stream)
