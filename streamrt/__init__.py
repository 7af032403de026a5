"""streamrt: an asyncio-aware stream scheduling runtime for HIP and CUDA GPUs, with a simulated device.

The public API is this flat namespace; the modules behind it are private.
"""

from __future__ import annotations

from ._allocator import Allocator, AllocatorStatistics, RawAllocator, release_after_device, release_after_streams
from ._backends.protocol import Capabilities, CaptureMode, MemcpyKind
from ._buffer import Buffer, Deallocate
from ._completion import Completion
from ._errors import (
    BackendError,
    BackendUnavailableError,
    CaptureError,
    ClosedError,
    KernelCompileError,
    OutOfMemoryError,
    StreamRTError,
)
from ._event import Event
from ._event_pool import EventPool
from ._pipeline import Graph
from ._kernel import Kernel, KernelCache, KernelLibrary, KernelModule, KernelSpec, load_kernel, register_kernel_spec
from ._pipeline import Edge, Pipeline
from ._pipeline import Node
from ._pipeline import Run
from ._runtime import Runtime, open_runtime
from ._scheduler import Scheduler, SchedulerStatistics
from ._stream import Stream
from ._trace import BlockingRecord, Trace, TraceRecord
from ._trace import label as trace_label
from ._trace_report import TraceReport
from . import _interop, _trace_export, torch  # noqa: F401 - they serve hooks of the layers below (_extensions)
from ._version import __version__

__all__ = [
    "Allocator",
    "AllocatorStatistics",
    "BackendError",
    "BlockingRecord",
    "BackendUnavailableError",
    "Buffer",
    "Capabilities",
    "CaptureError",
    "CaptureMode",
    "ClosedError",
    "Completion",
    "Deallocate",
    "Edge",
    "Event",
    "EventPool",
    "Graph",
    "Kernel",
    "KernelCache",
    "KernelCompileError",
    "KernelLibrary",
    "KernelModule",
    "KernelSpec",
    "MemcpyKind",
    "Node",
    "OutOfMemoryError",
    "Pipeline",
    "RawAllocator",
    "Run",
    "Runtime",
    "Scheduler",
    "SchedulerStatistics",
    "Stream",
    "StreamRTError",
    "Trace",
    "TraceRecord",
    "TraceReport",
    "load_kernel",
    "open_runtime",
    "register_kernel_spec",
    "release_after_device",
    "release_after_streams",
    "trace_label",
]
