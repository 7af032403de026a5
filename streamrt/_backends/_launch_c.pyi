# Types of the C module built from _launch_c.c (the Python side: _native_ops.py).
from collections.abc import Callable

OP_CHECK: int
OP_MEMSET: int
OP_COPY: int
OP_HOST: int
OP_RECORD: int
OP_WAIT: int
OP_GRAPH: int
OP_KERNEL: int
FN_QUERY: int
FN_SYNC: int
WORDS: int

class Executor:
    def __init__(
        self,
        addresses: tuple[int, ...],
        hip: bool,
        make_error: Callable[[int, str], BaseException],
        make_current: Callable[[], None] | None,
        context_error: int,
    ) -> None: ...
    def run(self, program: object, /) -> tuple[int, int] | None: ...
    def replay(self, graph_exec: int, stream: int, event: int = ..., /) -> tuple[int, int] | None: ...
    def copy_record(self, dst: int, src: int, nbytes: int, kind: int, stream: int, event: int, /) -> tuple[int, int] | None: ...
    def record(self, event: int, stream: int, /) -> None: ...
    def record_held(self, event: int, stream: int, /) -> None: ...
    def query(self, event: int, /) -> bool: ...
    def synchronize(self, event: int, /) -> None: ...
    def call_name(self, op: int, /) -> str: ...
