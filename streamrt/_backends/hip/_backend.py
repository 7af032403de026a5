"""``HipBackend``: the backend protocol on HIP, composed of its call groups.

Each call group is a :class:`~._core.HipCore` subclass in a module of its own.
Adding a group is adding its class to :class:`HipBackend`'s bases: the groups
define disjoint methods, so their order does not matter.
"""

from __future__ import annotations

from ._codes import error_name, error_string
from ._graphs import GraphCalls
from ._hostcalls import HostCalls
from ._kernels import KernelCalls
from ._memory import MemoryCalls
from ._streams import StreamCalls
from ._user_objects import HipUserObjects

__all__ = ["HipBackend"]


class HipBackend(StreamCalls, MemoryCalls, HostCalls, GraphCalls, KernelCalls, HipUserObjects):
    """The :class:`~streamrt._backends.protocol.Backend` primitives on HIP. Create with :func:`create`."""

    name = "hip"

    # -- errors and lifetime -----------------------------------------------------------------
    def error_name(self, code: int) -> str:
        return error_name(code)

    def error_string(self, code: int) -> str:
        return error_string(code)

    def close(self) -> None:
        """Drop the handle caches. Idempotent; makes no HIP call (HIP objects belong to their owners)."""
        if self._closed:
            return
        self._closed = True
        for cache in (
            self._pointers,
            self._arg_arrays,
            self._events,
            self._graphs,
            self._graph_execs,
            self._modules,
            self._functions,
            self._host_fns,
            self._module_functions,
        ):
            cache.clear()
        self._streams = {0: self._new_stream(0)}
