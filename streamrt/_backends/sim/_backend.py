"""``SimBackend``: the simulated device behind the backend protocol.

Behaviour, in the protocol's terms:

* **Asynchronous.** Enqueue calls return at once; per-device executor and
  callback threads (see ``_device``) run the work. Queries report real
  completion; synchronize calls block with the GIL released until it happens.
* **Streams** are FIFO. The null stream ``0`` (one per device, resolved by the
  calling thread's current device) is an ordinary stream: it does **not**
  synchronize with other streams, unlike CUDA's legacy default stream.
  Priorities are accepted, clamped to ``(0, -5)`` and otherwise ignored.
* **Events**: ``event_record`` is a marker in its stream; ``stream_wait_event``
  makes later work on a stream wait for the event's latest record (an event
  never recorded: no-op, and queries report it complete). ``event_elapsed_ms``
  is virtual time.
* **Memory** (``_memory``): device and pinned memory are real host mappings;
  memsets and copies move real bytes when they execute. ``free``/``host_free``
  first wait for all work on the allocation's device, like ``cudaFree``. Async
  copies that name pageable host memory run synchronously with respect to the
  calling thread (they return after the copy completed), as on GPUs.
* **Virtual time** (``_profile``): each op gets deterministic start/end times
  at enqueue. Each host thread has its own virtual clock: every API call
  advances it by ``api_call_us``; synchronize calls (and ``free``) advance it
  to the completion they waited for plus ``sync_wake_us``. Queries and pure
  look-ups (``*_query``, ``pointer_kind``, ``capabilities``, ...) cost nothing,
  since how often a program polls depends on real timing.
* **Several devices** (``devices=N``): each device has its own executor and
  callback threads, memory, null stream and virtual timeline
  (:meth:`SimBackend.device_time_us`). A stream may wait on an event recorded
  on another device: its later work waits for the real completion and starts
  no earlier than the event's virtual time. An event is recorded only on
  streams of the device that was current at its creation, and
  ``event_elapsed_ms`` refuses events of two devices (as CUDA and HIP do).
  ``can_access_peer`` is ``True`` for every pair; ``enable_peer_access`` is
  remembered and makes ``memcpy_peer_async`` (real bytes) run at
  ``peer_bandwidth_gbps`` instead of the staged-through-host rate.
* **Signals**: ``signal_alloc`` returns 8 zeroed bytes of pinned memory;
  ``stream_wait_signal`` is a ``wait_signal`` op that holds back its stream
  (only it) until the host has stored a value ``>=`` the one named, seen by
  the device's signal watcher (``_device``). ``signal_free`` refuses a signal
  a stream waits on for a value not stored yet; capture refuses the wait.
* **Capture and graphs** (``_graph``), **kernel twins** (``_kernels``) and
  **hazard checking** (``_hazards``): see those modules.
* **Errors** go through ``_codes.fail``: ``BackendError(backend="sim", code, name)``
  with CUDA's numbers. A failing call enqueues nothing and creates nothing.
  An error raised by a kernel twin while it runs is reported once by the
  device's next ``stream_synchronize`` / ``event_synchronize`` /
  ``device_synchronize``. Backend calls from a host function or a twin (the
  simulator's own threads) raise ``simErrorNotPermitted``.
* **close()** refuses new calls, waits (up to ``close_timeout`` seconds) for all
  enqueued work to complete, then stops and joins the threads and drops all
  memory. If work is still pending at the timeout (a host function that never
  returns), ops not yet started are abandoned — they never run — and a
  ``RuntimeWarning`` names any thread left stuck. Idempotent.

The protocol's calls are grouped by topic, one class each, all built on
``_core.SimCore`` (shared state and internals): devices in ``_devicecalls``;
streams and events in ``_streamcalls``; memory in ``_memcalls``; host
functions and signals in ``_hostcalls``; capture and graphs in
``_graphcalls``; kernels in ``_kernelcalls``; the simulator's own tools in
``_toolcalls``; errors and lifetime here, in :class:`SimBackend`, which
composes them. Adding a group is adding its class to the bases: the groups
define disjoint methods.
"""

from __future__ import annotations

import warnings

from . import _codes as C
from ._codes import fail
from ._devicecalls import DeviceCalls
from ._graphcalls import GraphCalls
from ._hostcalls import HostCalls
from ._kernelcalls import KernelCalls
from ._memcalls import MemoryCalls
from ._streamcalls import StreamCalls
from ._toolcalls import ToolCalls
from ._user_objects import SimUserObjects

__all__ = ["SimBackend"]


class SimBackend(SimUserObjects, DeviceCalls, StreamCalls, HostCalls, MemoryCalls, GraphCalls, KernelCalls, ToolCalls):
    """The simulated device. Create it with ``streamrt._backends.sim.create(...)``.

    Implements every method of :class:`~streamrt._backends.protocol.Backend`
    (see the module docstring for the behaviour) plus the simulator's own tools:
    :meth:`op_log`, :meth:`clear_op_log`, :meth:`host_now_us`, :meth:`device_time_us`,
    :meth:`peer_access_enabled`,
    :meth:`advance_host_clock`, :meth:`hazards`, :meth:`clear_hazards`,
    :meth:`check_host_access` and :attr:`profile`.

    Args:
        profile: the cost model.
        devices: number of simulated devices (each with its own threads and memory).
        check_hazards: ``False``; ``True`` (or ``"record"``) to record hazards;
            ``"raise"`` to raise :class:`~streamrt._backends.sim.HazardError` instead of
            enqueueing the offending op.
        op_log_limit: completed ops kept for :meth:`op_log` (0 turns the log off).
        hazard_history: accesses remembered per allocation for hazard checks.
        close_timeout: seconds :meth:`close` waits for queued work before abandoning it.
    """

    name = "sim"
    native_ops = None  # no native launch executor: the pipeline's Python path drives the simulator

    # == errors and lifetime ========================================================================
    def error_name(self, code: int) -> str:
        return C.error_name(code)

    def error_string(self, code: int) -> str:
        return C.error_string(code)

    def close(self) -> None:
        """Drain (up to ``close_timeout`` s), stop and join the threads, drop every handle. Idempotent.

        Memory never freed stays mapped as long as this backend object lives (see ``MemoryMap.close``).
        """
        tls = self._tls
        if tls.role is not None:
            fail(C.NOT_PERMITTED, f"called from the simulator's {tls.role} thread", "close")
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._finalizer.detach()
        drained, stuck = self._sched.shutdown(self._close_timeout)
        with self._lock:
            self._streams.clear()
            self._events.clear()
            self._graphs.clear()
            self._execs.clear()
            self._modules.clear()
            self._functions.clear()
            self._captures.clear()
            self._mem.close()
        if not drained:
            names = ", ".join(t.name for t in stuck) or "none"
            warnings.warn(
                f"sim backend closed with work still pending after {self._close_timeout} s; ops not started were "
                f"abandoned (threads stuck in a host function: {names})",
                RuntimeWarning,
                stacklevel=2,
            )

    @property
    def closed(self) -> bool:
        return self._closed
