"""User objects and capture info of the sim backend, modelled on CUDA's.

A user object holds a reference count and a native destructor ``void
fn(void*)`` with its user data. :meth:`user_object_create` gives the caller
one reference; :meth:`graph_retain_user_object` moves it into a graph (one
under capture, named by :meth:`stream_capture_graph`, or a captured one).
The graph and every exec instantiated from it share that reference, as they
share graph memory (``_graph.GraphMemory``): it is dropped once all of them
are destroyed and every launch of theirs has finished. When the count
reaches zero the destructor runs on the device's callback thread (the
simulator's driver thread), never on the thread that dropped the reference,
as with ``CU_USER_OBJECT_NO_DESTRUCTOR_SYNC``. A capture that fails drops the
references its graph held. Destructors still pending when the backend closes
never run (as at CUDA context teardown).
"""

from __future__ import annotations

from typing import Any

from ..._errors import CaptureError
from . import _codes as C
from ._codes import fail, make_error
from ._core import USER_OBJECT_BASE, SimCore, check_count
from ._ops import Op

__all__ = ["SimUserObjects", "UserObject"]


class UserObject:
    """One simulated user object: its references, destructor and user data."""

    __slots__ = ("data", "destructor", "device", "handle", "refs")

    def __init__(self, handle: int, destructor: Any, data: int, device: int) -> None:
        self.handle = handle
        self.destructor = destructor
        self.data = data
        self.device = device
        self.refs = 1


class SimUserObjects(SimCore):
    """stream_capture_graph / user_object_create / graph_retain_user_object / user_object_release."""

    def stream_capture_graph(self, stream: int) -> int:
        """The handle of the graph ``stream`` captures into (origin or joined stream), ``0`` when not capturing."""
        call = "stream_capture_graph"
        tls = self._enter(call)
        with self._lock:
            cap = self._stream(stream, tls, call).capture
            if cap is None:
                return 0
            if cap.invalid is not None:
                cause = make_error(C.CAPTURE_INVALIDATED, f"the capture was invalidated: {cap.invalid[1]}", call)
                raise CaptureError(str(cause)) from cause
            return cap.graph

    def user_object_create(self, destructor: int, user_data: int) -> int:
        call = "user_object_create"
        tls = self._enter(call)
        fn = check_count(destructor, "destructor", call)
        if fn == 0:
            fail(C.INVALID_VALUE, "the destructor is NULL", call)
        data = check_count(user_data, "user_data", call)
        with self._lock:
            handle = self._new_handle(USER_OBJECT_BASE)
            self._user_objects[handle] = UserObject(handle, self._hostfn(fn), data, tls.device)
            self._charge(tls)
            return handle

    def graph_retain_user_object(self, graph: int, user_object: int) -> None:
        """Move the caller's reference into ``graph``: a graph under capture or a captured one."""
        call = "graph_retain_user_object"
        tls = self._enter(call)
        with self._lock:
            obj: UserObject = self._lookup(self._user_objects, user_object, "user object", call)
            g = self._graphs.get(graph)
            if g is not None:
                memory = g.memory
            else:
                cap = next((c for c in self._captures if c.graph == graph), None)
                if cap is None:
                    fail(C.INVALID_HANDLE, f"{graph!r} is not a live sim graph (nor one under capture)", call)
                memory = cap.memory
            memory.user_objects.append(obj)
            self._charge(tls)

    def user_object_release(self, user_object: int) -> None:
        call = "user_object_release"
        tls = self._enter(call)
        with self._lock:
            obj = self._lookup(self._user_objects, user_object, "user object", call)
            self._release_user_objects([obj], [])
            self._charge(tls)

    def _release_user_objects(self, objects: list[Any], after: list[Op]) -> None:
        """Drop one reference of each of ``objects``; destroy those left with none once ``after``
        (launches still running) has finished, on the callback thread. Lock held."""
        for obj in objects:
            obj.refs -= 1
            if obj.refs > 0:
                continue
            del self._user_objects[obj.handle]
            dev = self._devices[obj.device]
            end = max([dev.time_us, *(op.end_us for op in after)])
            op = Op(
                self._next_seq(), "user_object_destroy", dev.index, 0, 0, end, end, end, "",
                obj.destructor, (obj.data,), None, dev.executor, True,
            )
            for w in after:
                op.depend_on(w)
            dev.loose.append(op)
            self._sched.submit(op)
