"""Native launch ops: a launch's backend calls made in one call into C (``_launch_c``), the GIL released once.

A GPU backend offers :class:`NativeOps` as ``backend.native_ops`` (``None`` on
the simulator, while a trace is open, and where ``_launch_c`` was not built:
callers then make the same calls one by one through the backend's methods,
the Python twin of this path). Callers build a :class:`Program` once -- the
backend calls of a launch with their handles and arguments, usually with
:meth:`NativeOps.compile` from bound backend calls -- and run it on every
launch:

* :meth:`NativeOps.run` runs a program; it returns ``None`` when every call
  succeeded, or ``(index, error)`` for the call that stopped it: ``error`` is
  ``None`` where a capture check found the stream capturing (nothing after the
  check ran), else the exception that call's failure maps to (the calls before
  ``index`` were made);
* :meth:`NativeOps.replay` checks that a stream is not capturing, launches an
  executable graph on it and, given an event, records it after the graph, with the
  same result;
* :meth:`NativeOps.copy_record` checks that a stream is not capturing, enqueues a copy
  on it and records an event after it, with the same result;
* :meth:`NativeOps.new_submitter` makes a ``Submitter``: a thread of its own that
  runs programs in submission order without the GIL (:mod:`streamrt._submitter`);
* :meth:`NativeOps.record` records an event, :meth:`NativeOps.wait` makes a stream wait
  for one, :meth:`NativeOps.query` asks whether one has completed and
  :meth:`NativeOps.synchronize` waits for one (they raise like ``backend.event_record``,
  ``backend.stream_wait_event``, ``backend.event_query`` and ``backend.event_synchronize``, and
  release the GIL as they do); :meth:`NativeOps.record_held` records with the GIL kept, for
  the completion engine's tails (no hand-over of the GIL on a launch's path; it blocks every
  thread should the driver block the call behind a full queue).

The entry points are the CUDA driver's (``cuMemsetD8Async``, ``cuMemcpyAsync``,
...; a thread with no current context gets the device's primary context made
current, then the call is retried) or HIP's (``hipMemsetAsync``, ...). Errors
map through the backend's own code tables.

Thread rules: any thread; a program shared between threads is not changed once built
(:meth:`Program.set` is for a program one owner patches between its runs).
"""

from __future__ import annotations

import ctypes
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any
__all__ = ["NativeOps", "Program", "available", "load"]

_c: Any = None  # the C module, where it was built (else the backends' Python calls serve the same contract)
try:
    from . import _launch_c

    _c = _launch_c
except ImportError:
    pass

#: The entry points, in the executor's order: the CUDA driver's and HIP's.
CUDA_ENTRY_POINTS = (
    "cuStreamIsCapturing", "cuMemsetD8Async", "cuMemcpyAsync", "cuLaunchHostFunc", "cuEventRecord", "cuStreamWaitEvent",
    "cuGraphLaunch", "cuLaunchKernel", "cuEventQuery", "cuEventSynchronize",
)
HIP_ENTRY_POINTS = (
    "hipStreamIsCapturing", "hipMemsetAsync", "hipMemcpyAsync", "hipLaunchHostFunc", "hipEventRecord", "hipStreamWaitEvent",
    "hipGraphLaunch", "hipModuleLaunchKernel", "hipEventQuery", "hipEventSynchronize",
)

class Program:
    """Backend calls to run in one go: append them in order, then hand the program to :meth:`NativeOps.run`.

    ``words`` holds the calls' records, ``WORDS`` 64-bit words each (the op, then its arguments):
    argument ``arg`` of call ``call`` is ``words[at(call, arg)]``, which the program's owner may
    change between its runs as :meth:`set` does (a launch plan writes its per-launch values there).
    """

    __slots__ = ("words",)

    def __init__(self) -> None:
        self.words = array("Q")

    def _add(self, op: int, *args: int) -> Program:
        words = [op, *(int(a) & 0xFFFFFFFFFFFFFFFF for a in args)]
        self.words.extend(words + [0] * (_c.WORDS - len(words)))
        return self

    def check_not_capturing(self, stream: int) -> Program:
        return self._add(_c.OP_CHECK, stream)

    def memset(self, dst: int, value: int, nbytes: int, stream: int) -> Program:
        return self._add(_c.OP_MEMSET, dst, value, nbytes, stream)

    def copy(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> Program:
        return self._add(_c.OP_COPY, dst, src, nbytes, kind, stream)

    def host(self, stream: int, fn: int, data: int) -> Program:
        return self._add(_c.OP_HOST, stream, fn, data)

    def record(self, event: int, stream: int) -> Program:
        return self._add(_c.OP_RECORD, event, stream)

    def wait(self, stream: int, event: int) -> Program:
        return self._add(_c.OP_WAIT, stream, event)

    def kernel(
        self, function: int, grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int, stream: int, arg_ptrs: int
    ) -> Program:
        """A kernel launch (``arg_ptrs``: the address of a ``void*[]`` of argument addresses, kept alive by the
        caller). ``ValueError`` where a dimension does not fit the record (grid y, z < 65536; block < 2048 each)."""
        (gx, gy, gz), (bx, by, bz) = grid, block
        if not (0 <= gx < 1 << 32 and 0 <= gy < 1 << 16 and 0 <= gz < 1 << 16 and all(0 <= d < 1 << 11 for d in block)
                and 0 <= shared_mem < 1 << 31):
            raise ValueError(f"launch dimensions {grid} x {block}, {shared_mem} bytes shared, do not fit a program record")
        return self._add(_c.OP_KERNEL, function, gx | gy << 32 | gz << 48, bx | by << 11 | bz << 22 | shared_mem << 33, stream, arg_ptrs)

    def set(self, call: int, arg: int, value: int) -> None:
        """Change argument ``arg`` of call ``call`` (both counted from 0), for a program only its owner runs."""
        self.words[call * _c.WORDS + 1 + arg] = int(value) & 0xFFFFFFFFFFFFFFFF

    @staticmethod
    def at(call: int, arg: int) -> int:
        """The index in :attr:`words` of argument ``arg`` of call ``call``."""
        return call * _c.WORDS + 1 + arg  # type: ignore[no-any-return]

    def after(self, start: int) -> Program:
        """A new program of this one's calls from ``start`` on (``after(1)``: a compiled program without its check)."""
        rest = Program()
        rest.words = self.words[start * _c.WORDS :]
        return rest

    def extend(self, other: Program) -> Program:
        """Append ``other``'s calls (copied) after this program's."""
        self.words.extend(other.words)
        return self

    def __len__(self) -> int:
        return len(self.words) // _c.WORDS


class NativeOps:
    """The executor of one backend. See the module docstring."""

    __slots__ = (
        "_backend", "_copy_record", "_executor", "_make_error", "_run", "_replay", "query", "record", "record_held", "synchronize",
        "wait",
    )

    def __init__(
        self,
        addresses: Sequence[int],
        *,
        hip: bool,
        make_error: Callable[[int, str], BaseException],
        make_current: Callable[[], None] | None = None,
        context_error: int = 0,
        backend: Any = None,
    ) -> None:
        if _c is None:
            raise RuntimeError("streamrt._backends._launch_c is not built")
        self._executor = _c.Executor(tuple(addresses), hip, make_error, make_current, context_error)
        self._backend = backend
        self._make_error = make_error
        self._run = self._executor.run
        self._replay = self._executor.replay
        self._copy_record = self._executor.copy_record
        self.record: Callable[[int, int], None] = self._executor.record
        self.query: Callable[[int], bool] = self._executor.query
        self.record_held: Callable[[int, int], None] = self._executor.record_held
        self.synchronize: Callable[[int], None] = self._executor.synchronize
        self.wait: Callable[[int, int], None] = self._executor.wait

    def serve_events(self, backend: Any) -> None:
        """Make ``backend``'s ``event_record``, ``stream_wait_event``, ``event_query`` and ``event_synchronize``
        this executor's calls (the hottest single calls: the same results and errors, without the binding layer)."""
        backend.event_record = self.record
        backend.stream_wait_event = self.wait
        backend.event_query = self.query
        backend.event_synchronize = self.synchronize

    def compile(self, stream: int, steps: Iterable[tuple[Callable[..., Any] | None, tuple[Any, ...]]]) -> Program | None:
        """A program that checks ``stream`` is not capturing, then makes ``steps``' calls; ``None`` if one can't be.

        ``steps`` are ``(fn, args)`` with ``fn`` a method of the backend that
        made these ops -- ``memset_async``, ``memcpy_async``,
        ``launch_host_func``, ``event_record``, ``stream_wait_event``,
        ``launch_kernel`` -- and
        their arguments: the program's call ``i + 1`` is step ``i``.
        """
        backend = self._backend
        if backend is None:
            return None
        program = Program().check_not_capturing(stream)
        add: dict[Any, Callable[..., Program]] = {
            backend.memset_async: program.memset,
            backend.memcpy_async: program.copy,
            backend.launch_host_func: program.host,
            backend.event_record: program.record,
            backend.stream_wait_event: program.wait,
            backend.launch_kernel: program.kernel,
        }
        for fn, args in steps:
            append = add.get(fn) if fn is not None else None
            if append is None:
                return None
            try:
                append(*args)
            except ValueError:  # a launch whose dimensions do not fit a record: the caller makes the calls itself
                return None
        return program

    def run(self, program: Program) -> tuple[int, BaseException | None] | None:
        """Run ``program``'s calls in order (GIL released); see the module docstring for the result."""
        failed = self._run(program.words)
        return None if failed is None else self._failure(program.words[failed[0] * _c.WORDS], *failed)

    def replay(self, graph_exec: int, stream: int, event: int = 0) -> tuple[int, BaseException | None] | None:
        """Launch ``graph_exec`` on ``stream`` unless the stream is capturing, then record ``event`` (if not 0)
        after it: index 0 is the check, 1 the launch, 2 the record."""
        failed = self._replay(graph_exec, stream, event)
        return None if failed is None else self._failure((_c.OP_CHECK, _c.OP_GRAPH, _c.OP_RECORD)[failed[0]], *failed)

    def copy_record(self, dst: int, src: int, nbytes: int, kind: int, stream: int, event: int) -> tuple[int, BaseException | None] | None:
        """Unless ``stream`` is capturing (index 0), enqueue the copy (1) on it, then record ``event`` (2) after it.

        ``kind`` is a :class:`~streamrt._backends.protocol.MemcpyKind` value (HIP reads it; CUDA infers it).
        """
        failed = self._copy_record(dst, src, nbytes, kind, stream, event)
        return None if failed is None else self._failure((_c.OP_CHECK, _c.OP_COPY, _c.OP_RECORD)[failed[0]], *failed)

    def new_submitter(self) -> Any:
        """A new C ``Submitter`` over this executor (``streamrt._submitter.NativeSubmitter`` runs its thread)."""
        return _c.Submitter(self._executor)

    def failure_in(self, program: Program, index: int, code: int) -> tuple[int, BaseException | None]:
        """``(index, error)`` for call ``index`` of ``program`` that failed with ``code`` (0: its stream was capturing)."""
        return self._failure(program.words[index * _c.WORDS], index, code)

    def _failure(self, op: int, index: int, code: int) -> tuple[int, BaseException | None]:
        if code == 0:
            return index, None
        return index, self._make_error(code, self._executor.call_name(op))


def available() -> bool:
    """``True`` where the executor was built."""
    return _c is not None


def load(
    library: ctypes.CDLL,
    *,
    hip: bool,
    make_error: Callable[[int, str], BaseException],
    make_current: Callable[[], None] | None = None,
    context_error: int = 0,
    resolve: Callable[[str], int | None] | None = None,
    backend: Any = None,
) -> NativeOps | None:
    """The executor over ``library``'s entry points, or ``None`` where it was not built or one is missing.

    ``resolve(name)`` finds an entry point's address first (the CUDA driver's
    ``cuGetProcAddress``); the library's exported symbol is the fallback.
    ``backend``: the backend whose bound calls :meth:`NativeOps.compile` translates.
    """
    if _c is None:
        return None
    addresses: list[int] = []
    for name in HIP_ENTRY_POINTS if hip else CUDA_ENTRY_POINTS:
        address = resolve(name) if resolve is not None else None
        if not address:
            try:
                address = ctypes.cast(getattr(library, name), ctypes.c_void_p).value
            except (AttributeError, ctypes.ArgumentError):  # not exported, or not a C function (a stand-in)
                address = None
        if not address:
            return None
        addresses.append(address)
    return NativeOps(
        addresses, hip=hip, make_error=make_error, make_current=make_current, context_error=context_error, backend=backend
    )
