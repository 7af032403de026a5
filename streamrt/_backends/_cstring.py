"""C strings the GPU bindings hand back, as ``str``: shared by the cuda and hip backends."""

from __future__ import annotations

__all__ = ["c_string"]


def c_string(value: object) -> str:
    """``value`` (``bytes``, ``str`` or a binding's C-string object) as ``str``, up to the first NUL.

    Bytes are decoded as UTF-8, invalid sequences replaced. Never raises for
    an object whose ``str`` does not raise.
    """
    if isinstance(value, str):
        return value.split("\0", 1)[0]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).split(b"\0", 1)[0].decode("utf-8", "replace")
    return str(value).split("\0", 1)[0]
