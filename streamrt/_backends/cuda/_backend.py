"""``CudaBackend``: the backend protocol on CUDA, composed of its call groups.

Each call group is a :class:`~._core.CudaCore` subclass in a module of its own.
Adding a group is adding its class to :class:`CudaBackend`'s bases: the groups
define disjoint methods, so their order does not matter.
"""

from __future__ import annotations

from .._cstring import c_string
from ._graphs import GraphCalls
from ._hostcalls import HostCalls
from ._kernels import KernelCalls
from ._memory import MemoryCalls
from ._streams import StreamCalls
from ._user_objects import CudaUserObjects

__all__ = ["CudaBackend"]


class CudaBackend(StreamCalls, MemoryCalls, HostCalls, GraphCalls, KernelCalls, CudaUserObjects):
    """The :class:`~streamrt._backends.protocol.Backend` primitives on CUDA.

    Requires cuda-bindings >= 12.9.1 (or 13.x): from that version every binding
    call releases the GIL around the C call, so the blocking calls here
    (``stream_synchronize``, ``event_synchronize``, ``device_synchronize``,
    ``malloc``/``free``/``host_malloc``/``host_free`` — which may synchronize —,
    ``graph_instantiate``, ``module_load_data``, ``compile_source``) never hold
    the GIL while they wait. ``launch_host_func`` goes through ctypes, which
    releases the GIL as well.

    Thread rules:

    * Every method may be called from any thread, as the CUDA runtime allows.
      The handle caches are dicts mutated only with single atomic operations.
    * The current device is per thread. ``ensure_device`` remembers, per thread,
      the device this backend last made current there and skips the call when it
      matches; code that changes the device behind its back on the same thread
      (``torch.cuda.set_device``) must be followed by ``set_device``.
    * No method may be called from a host function (a driver callback thread):
      CUDA forbids API calls there.
    * ``launch_host_func`` hands the native function pointer to the driver as is:
      no Python and no GIL on the driver thread, and a captured host node calls
      ``fn(user_data)`` on every replay. Keeping ``user_data`` and the function
      alive is the caller's job.

    ``close`` releases nothing on the device (streams, events and memory belong to
    their creators) and is idempotent.
    """

    name = "cuda"

    # -- errors and lifetime --------------------------------------------------------------------------------

    def error_name(self, code: int) -> str:
        return c_string(self._rt.cudaGetErrorName(int(code))[1])

    def error_string(self, code: int) -> str:
        return c_string(self._rt.cudaGetErrorString(int(code))[1])

    def close(self) -> None:
        """Drop the handle caches. Frees nothing on the device; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._events.clear()
        self._graphs.clear()
        self._graph_execs.clear()
        self._functions.clear()
        self._modules.clear()
