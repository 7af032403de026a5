"""Keepalives tied to a graph that another library owns, released when that graph is destroyed.

Work streamrt records into a capture it did not begin (``torch.cuda.graph``,
CuPy, cuda.core, a raw ``cudaStreamBeginCapture`` / ``hipStreamBeginCapture``)
runs on every replay of a graph streamrt never sees destroyed. What the work
needs (host callables and their arguments, host slots, buffers, capture pools)
is tied to that graph with a *user object* (``cudaUserObjectCreate`` +
``cudaGraphRetainUserObject(..., cudaGraphUserObjectMove)``, the ``hip``
equivalents, the simulator's model):

1. :func:`tie` allocates a native token, creates a user object whose
   destructor is the native ``streamrt_graph_release`` of the optional C
   extension ``streamrt._graph_release_c`` with the token as its data, and
   moves its only reference to the graph; the release callable waits in a
   table under the token's id;
2. once the graph and every executable graph instantiated from it are
   destroyed and their launches have finished, the driver calls the
   destructor on one of its threads: it pushes the token onto a lock-free
   stack and posts a semaphore, running no Python;
3. a runtime thread (``streamrt-graph-release``, started with the first tie,
   gone when nothing is tied) waits on that semaphore with the GIL released,
   pops the tokens and submits each release to its runtime's releaser
   thread (:mod:`streamrt._releaser`), where it runs.

Without the C extension :func:`tie` raises :class:`~streamrt.CaptureError`
before anything is created, so callers refuse the capture with nothing
enqueued. A tie that fails after its user object was made releases the
object: the release then arrives through the same path.

Thread rules: :func:`tie` may be called from any thread. Releases run on the
releaser thread of the runtime given to :func:`tie` (inline on the release
thread once that runtime is closed).
"""

from __future__ import annotations

import importlib
import itertools
import logging
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING

from ._errors import CaptureError

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ["pending_releases", "tie", "unavailable_reason"]

_log = logging.getLogger("streamrt")
_MODULE = "streamrt._graph_release_c"

_lock = threading.Lock()
_pending: dict[int, tuple[Runtime, Callable[[], None]]] = {}
_ids = itertools.count(1)
_thread: threading.Thread | None = None
_native: ModuleType | None = None
_native_error: str | None = None


def _load() -> ModuleType:
    """The C extension; ``CaptureError`` saying why when it cannot be imported."""
    global _native, _native_error
    if _native is not None:
        return _native
    if _native_error is None:
        try:
            _native = importlib.import_module(_MODULE)
            return _native
        except ImportError as exc:
            _native_error = f"the optional C extension {_MODULE} is not available ({exc})"
    raise CaptureError(
        f"streamrt cannot record into a graph capture another library began: {_native_error}; rebuild streamrt "
        "with a C compiler (pip install -e .), or launch the work outside that capture"
    )


def unavailable_reason() -> str | None:
    """``None`` when work can be tied to foreign graphs here, else why not (the C extension is missing)."""
    try:
        _load()
    except CaptureError as exc:
        return str(exc)
    return None


def pending_releases() -> int:
    """Ties whose graph has not released them yet (every runtime of the process)."""
    with _lock:
        return len(_pending)


def tie(runtime: Runtime, graph: int, release: Callable[[], None]) -> None:
    """Run ``release()`` on ``runtime``'s releaser thread once ``graph`` (a graph under capture, or a
    captured one) and every executable graph made from it are gone.

    ``graph`` is a handle of ``runtime``'s backend (``stream_capture_graph``).
    Raises ``CaptureError`` when the C extension is missing (nothing created,
    ``release`` never called), and the backend's error when the user object
    cannot be created (same) or not retained by the graph (its reference is
    then dropped and ``release`` runs soon, through the destructor).
    """
    native = _load()
    backend = runtime._base_backend
    ident = next(_ids)
    token = native.token(ident)
    with _lock:
        _pending[ident] = (runtime, release)
        _ensure_thread_locked()
    try:
        user_object = backend.user_object_create(native.DESTRUCTOR_ADDRESS, token)
    except BaseException:
        with _lock:
            _pending.pop(ident, None)
        native.discard(token)
        raise
    try:
        backend.graph_retain_user_object(graph, user_object)
    except BaseException:
        backend.user_object_release(user_object)  # the destructor hands the token back: release runs
        raise


def _ensure_thread_locked() -> None:
    global _thread
    if _thread is None:
        _thread = threading.Thread(target=_serve, name="streamrt-graph-release", daemon=True)
        _thread.start()


def _serve() -> None:
    """The release thread: wait GIL-free for destroyed graphs' tokens; hand each release to its runtime."""
    global _thread
    native = _load()
    while True:
        ids = native.take(None)
        for ident in ids:
            with _lock:
                entry = _pending.pop(ident, None)
            if entry is None:
                _log.error("a graph released an unknown streamrt token %d", ident)
                continue
            runtime, release = entry
            runtime.releaser.submit(_run, release)
        with _lock:
            if not _pending:
                _thread = None
                return


def _run(release: Callable[[], None]) -> None:
    try:
        release()
    except Exception:  # noqa: BLE001 - nobody awaits a foreign graph's release
        _log.exception("releasing work tied to a destroyed graph failed")
