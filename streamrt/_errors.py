"""The one error hierarchy of streamrt.

Every backend return code is turned into these in one place per backend
(``_check`` in each backend module). Misuse of the API raises the built-in
``ValueError`` / ``TypeError`` with a message that says what to do instead.
"""

from __future__ import annotations

__all__ = [
    "StreamRTError",
    "BackendError",
    "BackendUnavailableError",
    "OutOfMemoryError",
    "CaptureError",
    "ClosedError",
    "KernelCompileError",
]


class StreamRTError(Exception):
    """Base class of every error streamrt raises on its own account."""


class BackendError(StreamRTError):
    """A backend call failed.

    Attributes:
        backend: ``"hip"``, ``"cuda"`` or ``"sim"``.
        code: the numeric error code the backend returned.
        name: the backend's symbolic name for the code (``"cudaErrorInvalidValue"``).
        call: the name of the backend call that failed.
    """

    def __init__(self, backend: str, code: int, name: str, message: str, call: str = "") -> None:
        self.backend = backend
        self.code = int(code)
        self.name = name
        self.call = call
        where = f" in {call}" if call else ""
        super().__init__(f"{backend} error {self.code} ({name}){where}: {message}")


class BackendUnavailableError(StreamRTError):
    """A backend was asked for by name but its library or device is missing.

    The message names what is missing and how to install it.
    """


class OutOfMemoryError(StreamRTError, MemoryError):
    """An allocation could not be satisfied, even after flushing caches.

    Attributes (``None`` where unknown):
        requested: bytes asked for.
        cached: bytes the allocator held in its cache when it gave up.
        limit: the configured limit in bytes, if any.
        backend, code: set when the backend's own allocator failed.
    """

    def __init__(
        self,
        message: str,
        *,
        requested: int | None = None,
        cached: int | None = None,
        limit: int | None = None,
        in_use: int | None = None,
        backend: str | None = None,
        code: int | None = None,
    ) -> None:
        self.requested = requested
        self.cached = cached
        self.limit = limit
        self.in_use = in_use
        self.backend = backend
        self.code = code
        super().__init__(message)


class CaptureError(StreamRTError):
    """Graph capture failed: an unsupported or synchronizing call, or an invalidated capture.

    The stream is usable again after this is raised; nothing captured leaks.
    """


class ClosedError(StreamRTError):
    """An operation was attempted on a closed runtime, stream, graph or allocator."""


class KernelCompileError(StreamRTError):
    """Runtime compilation of a kernel source failed.

    Attributes:
        log: the compiler's full log.
    """

    def __init__(self, message: str, log: str) -> None:
        self.log = log
        super().__init__(f"{message}\n--- compiler log ---\n{log}")
