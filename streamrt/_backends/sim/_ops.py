"""Operations of the simulated device, and the records users read back.

An :class:`Op` is one unit of device work (or a zero-length marker such as an
event record) with its virtual times fixed at enqueue, its real-execution
payload (``fn(*args)``), and its dependency links. Ops complete in an order
that respects their dependencies; :class:`OpRecord` is the frozen view of a
completed op returned by ``SimBackend.op_log()``.

Op kinds: ``memset``, ``copy_h2d``, ``copy_d2h``, ``copy_d2d``, ``copy_h2h``,
``copy_peer`` (between two devices; ``device`` is the device that ran it),
``kernel``, ``host_func``, ``event_record``, ``wait_event``, ``wait_signal`` (the
stream waits for a host-written 64-bit word), ``malloc_async``,
``free_async``, ``graph_launch`` (the marker that ends a graph replay on its
stream; the replayed nodes are ops of their own kinds with ``graph_exec`` set),
``graph_free`` (graph-owned memory released after its last replay finished;
on no stream, ``stream`` 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Op", "OpRecord", "WORK_KINDS"]

#: kinds that occupy a stream as work (as opposed to zero-length markers)
WORK_KINDS = frozenset(
    {"memset", "copy_h2d", "copy_d2h", "copy_d2d", "copy_h2h", "copy_peer", "kernel", "host_func"}
)


@dataclass(frozen=True)
class OpRecord:
    """One executed op, as the simulator timed it.

    Attributes:
        seq: enqueue sequence number (unique per backend, increasing).
        kind: see the module docstring.
        device: the device that ran it.
        stream: the stream handle it was enqueued on (the launch stream for graph nodes).
        nbytes: bytes moved or set (0 where it does not apply).
        enqueue_us: the enqueuing thread's host virtual time when the call returned.
        start_us, end_us: virtual start and end on the device.
        thread: name of the host thread that enqueued it.
        name: kernel name for kernels, ``""`` otherwise.
        graph_exec: the graph exec handle for replayed nodes, else 0.
        node: the node index within the graph for replayed nodes, else -1.
    """

    seq: int
    kind: str
    device: int
    stream: int
    nbytes: int
    enqueue_us: float
    start_us: float
    end_us: float
    thread: str
    name: str = ""
    graph_exec: int = 0
    node: int = -1

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


class Op:
    """A scheduled operation. Mutated only under the backend lock (except ``fn``'s effects)."""

    __slots__ = (
        "seq",
        "kind",
        "device",
        "stream",
        "nbytes",
        "enqueue_us",
        "start_us",
        "end_us",
        "thread",
        "name",
        "graph_exec",
        "node",
        "fn",
        "args",
        "refs",
        "host",
        "waiting",
        "dependents",
        "done",
        "queue",
        "hz",
        "watched",
        "signal",
    )

    def __init__(
        self,
        seq: int,
        kind: str,
        device: int,
        stream: int,
        nbytes: int,
        enqueue_us: float,
        start_us: float,
        end_us: float,
        thread: str,
        fn: Callable[..., Any] | None,
        args: tuple[Any, ...],
        refs: Any,
        queue: Any,
        host: bool = False,
        name: str = "",
        graph_exec: int = 0,
        node: int = -1,
    ) -> None:
        self.seq = seq
        self.kind = kind
        self.device = device
        self.stream = stream
        self.nbytes = nbytes
        self.enqueue_us = enqueue_us
        self.start_us = start_us
        self.end_us = end_us
        self.thread = thread
        self.name = name
        self.graph_exec = graph_exec
        self.node = node
        self.fn = fn
        self.args = args
        self.refs = refs  # allocations and other objects kept alive until the op has run
        self.host = host  # runs on the callback thread
        self.waiting = 0  # dependencies not yet completed
        self.dependents: list[Op] | None = None
        self.done = False
        self.queue = queue  # the executor of the device that runs it
        self.hz: Any = None  # hazard clock info of a host function: (stream key, clock, epoch)
        self.watched = False  # a thread waits for this op: completion must notify
        self.signal: tuple[int, int] | None = None  # wait_signal: (address, value) it waits for

    def depend_on(self, other: Op | None) -> None:
        """Make this op wait for ``other`` (no-op when ``other`` is ``None`` or done). Lock held."""
        if other is None or other.done:
            return
        if other.dependents is None:
            other.dependents = [self]
        else:
            other.dependents.append(self)
        self.waiting += 1

    def record_tuple(self) -> tuple[Any, ...]:
        """The :class:`OpRecord` fields as a plain tuple (cheap to keep: the GC untracks it)."""
        return (
            self.seq,
            self.kind,
            self.device,
            self.stream,
            self.nbytes,
            self.enqueue_us,
            self.start_us,
            self.end_us,
            self.thread,
            self.name,
            self.graph_exec,
            self.node,
        )

    def __repr__(self) -> str:
        return f"<sim {self.kind}#{self.seq} stream={self.stream:#x} [{self.start_us:.3f}, {self.end_us:.3f}] done={self.done}>"
