"""The simulator's cost model: :class:`SimProfile`, a frozen record of virtual-time costs.

Every operation the simulated device runs gets a virtual start and end time
(microseconds) computed from these figures when it is *enqueued*, so the times
do not depend on how the host threads happen to be scheduled. The defaults are
figures measured on an H200 (docs/performance.md); figures marked *estimate* were not
measured there and are plausible H200 values.

How the figures combine (all in virtual µs):

* Each API call advances the calling thread's host clock by ``api_call_us``;
  an enqueued op is *issued* when its call returns.
* An op on an idle stream starts ``launch_latency_us`` after it is issued; on
  a busy stream it starts when the previous op ends, and a device op
  (kernel, memset, copy) leaves ``op_gap_us`` before the next op may start.
  An empty kernel therefore repeats every ``kernel_default_us + op_gap_us``
  = 3 µs (the measured empty-kernel gap).
* memset: ``op_fixed_us + nbytes / memset_gbps``; copies:
  ``op_fixed_us + nbytes / <direction>_gbps`` (``pageable_gbps`` when one side
  is pageable host memory). With ``serialize_copy_engines`` host-to-device and
  device-to-host copies each queue on one copy engine per device, in issue order.
* peer copy (``memcpy_peer_async``, between devices): ``op_fixed_us +
  peer_latency_us + nbytes / peer_bandwidth_gbps`` when peer access is enabled
  between the two devices (either direction); without it the copy is staged
  through host memory, at ``min(h2d_gbps, d2h_gbps)``. With
  ``serialize_copy_engines`` the copies of one direction of a link (source →
  destination device) queue behind each other, whatever stream issued them.
  A peer copy between two buffers of one device costs a D2D copy.
* Each device has its own virtual timeline: work on one device never delays
  another, except through an event wait (a stream waiting on an event recorded
  on another device starts its next op no earlier than the event's time) or a
  shared peer link.
* A host function occupies its stream for ``host_func_us`` (the measured
  48 µs gap); the function itself is called ``host_func_start_us`` after the
  stream reaches it, so launch-to-start on an idle stream is
  ``launch_latency_us + host_func_start_us`` = 20 µs.
* A Python host function run by the runtime on its worker thread (the engine
  enqueues ``sem_post`` to wake the worker, then a ``sem_wait`` host function
  that holds the stream until the worker is done) occupies the stream for
  ``host_func_us`` plus ``python_host_call_us`` (waking the worker, taking
  the GIL, posting back).
* With ``charge_host_time``, real host time counts too: each host clock
  advances by the real time its thread spends between backend calls (its
  Python work: packing metadata, torch, ...), at least ``api_call_us`` per
  call; and a Python host function also holds its stream for the function's
  own run time, which the runtime measures on its worker and passes on as a
  live estimate (the mean of recent runs; see
  ``SimBackend.expect_host_work``; a captured host node reads it at every
  replay). Times then depend on the machine running the simulation, so this
  is off by default (times are deterministic) and on in a profile made by
  ``streamrt calibrate`` on a GPU, which models a real host driving it.
* An event record takes ``event_record_us`` of stream time (0).
* A blocking host call (synchronize) returns ``sync_wake_us`` after the
  completion it waited for (never earlier than its own API cost).
* Inside a replayed graph, a node starts ``graph_node_gap_us`` after the end of
  each device-node dependency (graphs launch back-to-back work faster than streams).
* Kernels without a cost model take ``kernel_default_us``.

Concurrency is not contended: kernels and memsets on different streams overlap
perfectly (only the copy engines serialize).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Union

__all__ = ["SimProfile"]

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class SimProfile:
    """Virtual-time costs of the simulated device. Frozen; build variants with :meth:`replace`.

    Attributes:
        name: device model name, shown in ``Capabilities.device_name``.
        total_memory: simulated device memory in bytes (allocations beyond it raise OOM).
        multiprocessor_count: reported SM count.
        api_call_us: host time of one backend call (measured ~1.9 µs).
        launch_latency_us: issue → earliest start of an op on an idle stream.
        op_gap_us: gap after a device op before the next op on the same stream.
        kernel_default_us: duration of a kernel whose twin has no cost model.
        op_fixed_us: fixed part of a memset's or copy's duration.
        host_func_start_us: stream reaches a host function → the function starts.
        host_func_us: stream time one host function occupies (measured 48 µs).
        event_record_us: stream time of an event record.
        sync_wake_us: completion → a blocking host call returns (*estimate*).
        h2d_gbps, d2h_gbps: pinned copy bandwidth, GB/s (measured 55).
        d2d_gbps: device-to-device effective bandwidth, GB/s (2100).
        h2h_gbps: pinned host-to-host copy bandwidth, GB/s (*estimate*).
        memset_gbps: memset bandwidth, GB/s (similar to D2D).
        pageable_gbps: bandwidth of a copy with a pageable side, GB/s (*estimate*).
        graph_node_gap_us: gap between dependent device nodes of a graph (*estimate*).
        peer_bandwidth_gbps: device-to-device bandwidth between two devices with peer
            access, GB/s (*estimate*: NVLink-class, one direction, H200 SXM).
        peer_latency_us: fixed extra start-up cost of a copy between two devices (*estimate*).
        serialize_copy_engines: H2D and D2H copies each queue on one copy engine.
        python_host_call_us: extra stream time of a Python host function run on the
            runtime's worker, beyond two native host functions and the function itself.
        charge_host_time: charge real host time: between backend calls, and in Python host functions.
    """

    name: str = "H200"
    total_memory: int = 141_000_000_000
    multiprocessor_count: int = 132
    api_call_us: float = 2.0
    launch_latency_us: float = 4.0
    op_gap_us: float = 2.0
    kernel_default_us: float = 1.0
    op_fixed_us: float = 1.0
    host_func_start_us: float = 16.0
    host_func_us: float = 48.0
    event_record_us: float = 0.0
    sync_wake_us: float = 3.0
    h2d_gbps: float = 55.0
    d2h_gbps: float = 55.0
    d2d_gbps: float = 2100.0
    h2h_gbps: float = 25.0
    memset_gbps: float = 2100.0
    pageable_gbps: float = 20.0
    graph_node_gap_us: float = 1.0
    serialize_copy_engines: bool = True
    peer_bandwidth_gbps: float = 300.0
    peer_latency_us: float = 5.0
    python_host_call_us: float = 0.0
    charge_host_time: bool = False

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "name":
                if not isinstance(value, str) or not value:
                    raise ValueError("SimProfile.name must be a non-empty str")
            elif f.name in ("serialize_copy_engines", "charge_host_time"):
                if not isinstance(value, bool):
                    raise TypeError(f"SimProfile.{f.name} must be a bool")
            elif f.name in ("total_memory", "multiprocessor_count"):
                if isinstance(value, float) and value.is_integer():  # JSON may spell 141e9
                    value = int(value)
                    object.__setattr__(self, f.name, value)
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise ValueError(f"SimProfile.{f.name} must be a positive int, got {value!r}")
            else:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise ValueError(f"SimProfile.{f.name} must be a finite number, got {value!r}")
                if f.name.endswith("_gbps") and value <= 0:
                    raise ValueError(f"SimProfile.{f.name} must be > 0, got {value!r}")
                if value < 0:
                    raise ValueError(f"SimProfile.{f.name} must be >= 0, got {value!r}")
                object.__setattr__(self, f.name, float(value))

    # -- construction and persistence -----------------------------------------------------
    def replace(self, **changes: Any) -> SimProfile:
        """A copy with ``changes`` applied (validated like the constructor)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The profile as a plain JSON-compatible dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SimProfile:
        """Build from a dict; missing keys keep their defaults, unknown keys raise ``ValueError``."""
        if not isinstance(data, dict):
            raise TypeError(f"a SimProfile is built from a dict, not {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown SimProfile field(s) {unknown}; known fields: {sorted(known)}")
        return cls(**data)

    def to_json(self, path: PathLike | None = None) -> str:
        """The profile as JSON text; also written to ``path`` when given."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        if path is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
        return text

    @classmethod
    def from_json(cls, source: PathLike) -> SimProfile:
        """Load from a JSON file path, or from JSON text when ``source`` is a str starting with ``{``."""
        if isinstance(source, str) and source.lstrip().startswith("{"):
            text = source
        else:
            with open(source, encoding="utf-8") as fh:
                text = fh.read()
        return cls.from_dict(json.loads(text))

    # -- costs (virtual µs) -----------------------------------------------------------------
    def memset_us(self, nbytes: int) -> float:
        """Duration of a memset of ``nbytes``."""
        return self.op_fixed_us + nbytes / (self.memset_gbps * 1e3)

    def copy_us(self, direction: str, nbytes: int, pageable: bool = False) -> float:
        """Duration of a copy of ``nbytes``; ``direction`` is ``"h2d"``, ``"d2h"``, ``"d2d"`` or ``"h2h"``."""
        if pageable:
            gbps = self.pageable_gbps
        else:
            gbps = {"h2d": self.h2d_gbps, "d2h": self.d2h_gbps, "d2d": self.d2d_gbps, "h2h": self.h2h_gbps}[direction]
        return self.op_fixed_us + nbytes / (gbps * 1e3)

    def peer_copy_us(self, nbytes: int, *, peer_access: bool = True) -> float:
        """Duration of a copy of ``nbytes`` between two devices (staged through the host without peer access)."""
        gbps = self.peer_bandwidth_gbps if peer_access else min(self.h2d_gbps, self.d2h_gbps)
        return self.op_fixed_us + self.peer_latency_us + nbytes / (gbps * 1e3)
