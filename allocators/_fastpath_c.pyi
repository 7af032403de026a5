# Types of the C module built from _fastpath_c.c (the contract: _fastpath.py).
from typing import Any, Callable

class FastPath:
    hits: int
    stream_hits: int
    in_use: int
    peak: int
    requested: int
    post_release: bool
    def __init__(
        self,
        buffer_type: type,
        fields: tuple[str, ...],
        fast: dict[int, tuple[int, list[int], Any]],
        streams: dict[Any, tuple[int, dict[int, tuple[int, list[int], Any]]]],
        bindings: dict[Any, Any],
        is_capturing: Callable[[int], bool] | None,
    ) -> None: ...
    def take(self, nbytes: object, /) -> Any: ...
    def take_on(self, nbytes: object, stream: object, /) -> Any: ...
    def hand_out(self, ptr: int, nbytes: int, entry: tuple[int, list[int], Any], stream: Any, /) -> Any: ...
    def give(self, buffer: Any, /) -> int: ...
