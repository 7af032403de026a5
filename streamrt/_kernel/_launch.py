"""Launching kernels: ``Stream.launch_kernel`` and the pipeline's kernel node.

:func:`launch_kernel` is the body of ``Stream.launch_kernel(kernel, grid, block,
args, shared_mem=0)``: it checks the stream, the launch shape and every
argument (:meth:`Kernel.bind`, the kernel spec's ``check``) before anything is
enqueued, packs the arguments into a ``void*[]`` kept alive until the backend
call has returned (the drivers copy the values at launch), enqueues through the
backend (traced as a ``"kernel"`` op when tracing), and notes the stream on
every Buffer argument so their release waits for the kernel. On a runtime whose
backend has several devices it first makes the stream's device current on the
calling thread (HIP and CUDA launch on the current device, and the kernel's
module belongs to it); it is not restored. With one device nothing is added.

:class:`KernelNode` is a pipeline node made by :func:`add_kernel_node`
(``Pipeline.kernel``): its arguments are checked when the node is made, its
reads and writes default to what the kernel's spec declares (each Buffer
argument, read and/or written per its access mode), and it enqueues like the
other nodes (eagerly, on a fork side stream, or into a capture).

Thread rules: as for the stream and the pipeline.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .._buffer import Buffer
from .._pipeline._nodes import EnqueueContext, Node, PlanStep, substitute
from ._binding import BoundArgs, Kernel, check_shared_mem, launch_dims

if TYPE_CHECKING:
    from .._pipeline import Pipeline
    from .._stream import Stream

__all__ = ["KernelNode", "add_kernel_node", "launch_kernel", "launch_prepared", "prepare_launch"]


def prepare_launch(
    kernel: Any, grid: Any, block: Any, args: Sequence[Any] | Mapping[str, Any], shared_mem: Any
) -> tuple[tuple[int, int, int], tuple[int, int, int], int, BoundArgs]:
    """Check a launch completely; ``(grid, block, shared_mem, bound args)``. Enqueues nothing.

    ``TypeError`` for a wrong kind of value or argument count, ``ValueError`` for
    a value out of range, a buffer too small, or a launch the kernel's spec refuses.
    """
    if not isinstance(kernel, Kernel):
        raise TypeError(f"launch_kernel takes a Kernel (rt.kernels.get(name)), not {type(kernel).__name__}")
    g = launch_dims(grid, "grid")
    b = launch_dims(block, "block")
    smem = check_shared_mem(shared_mem)
    limit = kernel.runtime.capabilities.max_shared_memory_per_block
    if smem > limit:
        raise ValueError(f"shared_mem={smem} bytes exceeds the {limit} bytes a block may use on this device")
    bound = kernel.bind(args)
    spec = kernel.spec
    if spec is not None and spec.check is not None:
        spec.check(bound.args, g, b, smem)
    return g, b, smem, bound


def launch_kernel(
    stream: Stream, kernel: Kernel, grid: Any, block: Any, args: Sequence[Any] | Mapping[str, Any] = (), shared_mem: int = 0
) -> None:
    """Enqueue ``kernel<<<grid, block, shared_mem, stream>>>(*args)``. Non-blocking. See the module docstring."""
    stream._check_open()
    g, b, smem, bound = prepare_launch(kernel, grid, block, args, shared_mem)
    launch_prepared(stream, g, b, smem, bound)


def launch_prepared(stream: Stream, grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int, bound: BoundArgs) -> None:
    """Enqueue a launch :func:`prepare_launch` checked (possibly long before: its Buffers are
    re-checked for release; the rest cannot have changed). For hot loops that launch the same
    kernel with the same arguments."""
    stream._check_open()
    kernel = bound.kernel
    if kernel.runtime is not stream._runtime:
        raise ValueError(f"kernel {kernel.name!r} was loaded by another runtime than the stream's")
    kernel.module._library._check_open()
    for p, buf, _mode, _n in bound.buffers:
        if buf.is_released:
            raise ValueError(f"{kernel.name}: {p.name} was released")
    g, b, smem = grid, block, shared_mem
    packed = bound.pack()  # referenced by `bound` until this returns; the backend copies the values at launch
    address = packed.address
    backend = stream._backend
    rt = stream._runtime
    if rt._multi_device:  # the module was loaded on the runtime's device: launch with that device current
        backend.ensure_device(rt._device)
    function = kernel.function
    handle = stream._handle
    with stream._lock:
        if stream._closed:
            stream._check_open()
        backend.launch_kernel(function, g, b, smem, handle, address)  # a trace names it by its kernel
        if stream._capture is not None:  # `with stream.capture()`: the graph keeps the kernel and its buffers
            stream._capture.used(kernel, *(buf for _p, buf, _mode, _n in bound.buffers))
    for _p, buf, _mode, _n in bound.buffers:
        buf.note_stream(stream)


class KernelNode(Node):
    """A kernel launch in a pipeline. Attributes: ``kernel``, ``grid``, ``block``, ``args``, ``shared_mem``."""

    kind = "kernel"
    __slots__ = ("kernel", "grid", "block", "args", "shared_mem", "_bound")

    def __init__(
        self,
        pipeline: Any,
        index: int,
        name: str,
        kernel: Kernel,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: tuple[Any, ...],
        shared_mem: int,
        bound: BoundArgs,
        reads: tuple[tuple[Buffer, int], ...],
        writes: tuple[tuple[Buffer, int], ...],
    ) -> None:
        super().__init__(pipeline, index, name, reads, writes)
        self.kernel = kernel
        self.grid = grid
        self.block = block
        self.args = args
        self.shared_mem = shared_mem
        self._bound = bound

    def buffers(self) -> tuple[Buffer, ...]:
        declared = super().buffers()
        seen = {id(b) for b in declared}
        return declared + tuple(buf for _p, buf, _m, _n in self._bound.buffers if id(buf) not in seen)

    def keepalive(self) -> tuple[Any, ...]:
        return (*self.buffers(), self.kernel, self.args, self._bound)

    def _enqueue(self, stream: Stream, ctx: EnqueueContext) -> None:
        packed = self._bound.pack()
        rt = stream._runtime
        if rt._multi_device:  # also when captured, or launched from a thread with another device current
            stream._backend.ensure_device(rt._device)
        stream._backend.launch_kernel(self.kernel.function, self.grid, self.block, self.shared_mem, stream._handle, packed.address)
        for b in self.buffers():
            b.note_stream(stream)

    def _plan_step(self, stream: Stream, keep: list[Any]) -> PlanStep | None:
        packed = self._bound.pack()  # once per plan: the arguments are fixed
        keep.append(packed)
        return (stream._backend.launch_kernel, (self.kernel.function, self.grid, self.block, self.shared_mem, stream._handle, packed.address))

    def _rebound(self, mapping: dict[int, Buffer]) -> Node:
        args = substitute(self.args, mapping)
        _g, _b, _s, bound = prepare_launch(self.kernel, self.grid, self.block, args, self.shared_mem)
        return KernelNode(
            self._pipeline,
            self._index,
            self._name,
            self.kernel,
            self.grid,
            self.block,
            args,
            self.shared_mem,
            bound,
            tuple((substitute(b, mapping), n) for b, n in self._reads),
            tuple((substitute(b, mapping), n) for b, n in self._writes),
        )


def add_kernel_node(
    pipeline: Pipeline,
    kernel: Kernel,
    grid: Any,
    block: Any,
    args: Sequence[Any] | Mapping[str, Any],
    *,
    shared_mem: int = 0,
    reads: Iterable[Any] | None = None,
    writes: Iterable[Any] | None = None,
    after: Iterable[Node] = (),
    name: str | None = None,
) -> Node:
    """The body of ``Pipeline.kernel``: check the launch now and add a :class:`KernelNode`.

    ``reads``/``writes``: the memory the kernel touches, for dependency inference.
    When both are ``None`` they come from the kernel's spec: every Buffer
    argument is read, written or both per its access mode, over the bytes the
    spec says the kernel touches (the whole Buffer without a size rule).
    Declare them explicitly for raw-address arguments.
    """
    node_name = pipeline._new_name(name, "kernel")
    try:
        g, b, smem, bound = prepare_launch(kernel, grid, block, args, shared_mem)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"kernel node {node_name!r}: {exc}") from None
    for _p, buf, _m, _n in bound.buffers:
        pipeline._buffer(buf, f"kernel node {node_name!r} argument")  # one runtime per pipeline
    if reads is None and writes is None:
        r = tuple(bound.reads())
        w = tuple(bound.writes())
    else:
        r = pipeline._access(() if reads is None else reads, node_name, "reads")
        w = pipeline._access(() if writes is None else writes, node_name, "writes")
    deps = pipeline._after(after, node_name)
    arg_values = dict(args) if isinstance(args, Mapping) else tuple(args)
    stored = tuple(arg_values[p.name] for p in kernel.params) if isinstance(arg_values, dict) else arg_values
    node = KernelNode(pipeline, len(pipeline._nodes), node_name, kernel, g, b, stored, smem, bound, r, w)
    return pipeline._add(node, deps)
