"""The simulated device backend (``sim``): a real, asynchronous backend in host RAM.

``create(profile=None, devices=1, check_hazards=False, ...)`` returns a
:class:`SimBackend` implementing the backend protocol. Work runs on the
simulator's own executor and callback threads; copies and memsets move real
bytes; host functions run on the callback thread; capture and graph replay
work; kernels run through numpy twins (:func:`register_twin`); every op gets
deterministic virtual start/end times from a :class:`SimProfile` cost model
(H200 defaults), readable through :meth:`SimBackend.op_log` and
``event_elapsed_ms``. See ``_backend`` for the behaviour in detail, and
``_profile``, ``_graph``, ``_kernels``, ``_hazards`` for each topic.
"""

from __future__ import annotations

import math
import os
from typing import Union

from ._backend import SimBackend
from ._codes import ERRORS
from ._hazards import Hazard, HazardError
from ._kernels import (
    SIGNATURE_TYPES,
    SimMemoryFault,
    Twin,
    TwinContext,
    register_twin,
    registered_twins,
    unregister_twin,
)
from ._ops import OpRecord
from ._profile import SimProfile

__all__ = [
    "create",
    "probe",
    "share_key",
    "SimBackend",
    "SimProfile",
    "OpRecord",
    "Hazard",
    "HazardError",
    "Twin",
    "TwinContext",
    "SimMemoryFault",
    "register_twin",
    "unregister_twin",
    "registered_twins",
    "SIGNATURE_TYPES",
    "ERRORS",
]

ProfileSpec = Union[None, SimProfile, str, "os.PathLike[str]"]


def probe() -> str | None:
    """The simulator needs nothing beyond numpy: always usable (``None``)."""
    return None


def _load_profile(profile: ProfileSpec) -> SimProfile:
    if profile is None:
        return SimProfile()
    if isinstance(profile, SimProfile):
        return profile
    if isinstance(profile, (str, os.PathLike)):
        return SimProfile.from_json(profile)
    raise TypeError(f"profile must be None, a SimProfile or a JSON file path, not {type(profile).__name__}")


def share_key(profile: ProfileSpec = None, devices: int = 1, check_hazards: bool | str = False, **options: object) -> object:
    """The key under which runtimes of one process share one simulator, or ``None`` for a private one.

    A simulator of several devices (``devices >= 2``) is one simulated machine:
    ``open_runtime("sim", device=i, devices=N)`` for each ``i`` gives runtimes
    of one backend object (threads, memory, timelines, op log), so their
    streams can wait on each other's events and copy between devices. Runtimes
    opened with equal options share it (a profile given as a JSON path is
    compared by content). A one-device simulator stays private to its runtime,
    as before. Invalid options give ``None`` (``create`` then reports them).
    """
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 2:
        return None
    try:
        prof = _load_profile(profile)
        key = (prof, devices, "record" if check_hazards is True else check_hazards, tuple(sorted(options.items())))
        hash(key)
    except Exception:  # noqa: BLE001 - create() raises the proper error for bad options
        return None
    return key


def create(
    profile: ProfileSpec = None,
    devices: int = 1,
    check_hazards: bool | str = False,
    *,
    op_log_limit: int = 100_000,
    hazard_history: int = 256,
    close_timeout: float = 10.0,
) -> SimBackend:
    """Create a simulated device backend.

    Args:
        profile: ``None`` (H200 defaults), a :class:`SimProfile`, or the path of a
            JSON profile (:meth:`SimProfile.to_json` writes one).
        devices: number of simulated devices (>= 1).
        check_hazards: ``False``; ``True`` or ``"record"`` to record hazards
            (:meth:`SimBackend.hazards`); ``"raise"`` to raise :class:`HazardError`
            from the offending call, which then enqueues nothing.
        op_log_limit: completed ops kept for :meth:`SimBackend.op_log` (0: no log).
        hazard_history: accesses remembered per allocation for hazard checks.
        close_timeout: seconds :meth:`SimBackend.close` waits for queued work.

    Raises ``TypeError``/``ValueError`` for bad options.
    """
    prof = _load_profile(profile)
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"devices must be an int >= 1, got {devices!r}")
    if check_hazards not in (False, True, "record", "raise"):
        raise ValueError(f"check_hazards must be False, True, 'record' or 'raise', got {check_hazards!r}")
    for opt, value in (("op_log_limit", op_log_limit), ("hazard_history", hazard_history)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{opt} must be an int >= 0, got {value!r}")
    if hazard_history < 1:
        raise ValueError("hazard_history must be >= 1")
    if (
        isinstance(close_timeout, bool)
        or not isinstance(close_timeout, (int, float))
        or not math.isfinite(close_timeout)
        or close_timeout < 0
    ):
        raise ValueError(f"close_timeout must be a number >= 0, got {close_timeout!r}")
    return SimBackend(
        prof,
        devices=devices,
        check_hazards=check_hazards,
        op_log_limit=op_log_limit,
        hazard_history=hazard_history,
        close_timeout=float(close_timeout),
    )
