# Types of the C module built from _fastpath_c.c (the contract: _fastpath.py).
from typing import Any

class FastPath:
    hits: int
    in_use: int
    peak: int
    requested: int
    post_release: bool
    def __init__(self, buffer_type: type, fast: dict[int, tuple[int, list[int]]]) -> None: ...
    def take(self, nbytes: object, /) -> Any: ...
    def give(self, buffer: Any, /) -> int: ...
