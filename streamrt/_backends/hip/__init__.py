"""The HIP backend, over hip-python (``pip install 'streamrt[hip]'``).

hip-python is imported lazily, on the first :func:`probe` or :func:`create`:
importing this package costs nothing when HIP is absent. hip-python itself
opens ``libamdhip64.so`` / ``libhiprtc.so`` on the first call into them, from
``$ROCM_PATH/lib`` (or ``$ROCM_HOME/lib``, ``/opt/rocm/lib``) or the loader path.

Conventions of hip-python 10 that shape this package:

* every call returns a tuple whose first item is a ``hipError_t`` (an
  ``IntEnum``; ``hipSuccess`` is 0 and so falsy);
* handle and pointer arguments accept ``int``, but converting an ``int`` costs
  about a microsecond per argument, while an instance of the binding's own
  ``Pointer`` subclasses is passed straight through. The backend therefore
  keeps one wrapper object per handle it has seen (the object it got back on
  creation, or one made on first use), in bounded caches keyed by the int
  handle; the wrappers own nothing, so dropping them is always safe;
* enum-typed arguments (memcpy kind, capture mode) must be the binding's enum
  members: they are looked up in tuples made once.

Every HIP entry point the backend calls is bound once, by name, from
``_symbols._HIP_CALLS`` / ``_HIPRTC_CALLS``; :data:`REQUIRED_HIP_SYMBOLS` and
:data:`REQUIRED_HIPRTC_SYMBOLS` are the C symbols behind them (what a HIP
library, such as the HIP-on-CUDA test harness, must export). Every return code
goes through ``_codes._check``.

Thread rules: the backend object may be used from any thread. hip-python
releases the GIL around every HIP call, so blocking calls (``*_synchronize``)
never hold it. The current device is per thread, as in HIP.

Modules, one concept each: ``_symbols`` (the entry points), ``_loading``
(hip-python, imported once), ``_codes`` (return codes -> errors), ``_probe``
(:func:`probe`), ``_core`` (state, handle caches, devices), the call groups
``_streams``, ``_memory``, ``_hostcalls``, ``_graphs``, ``_kernels``, and
``_backend`` composing them.
"""

from __future__ import annotations

from typing import Any

from .. import unavailable
from ._backend import HipBackend
from ._codes import error_name, error_string
from ._probe import INSTALL_HINT, _diagnose, probe
from ._symbols import REQUIRED_HIP_SYMBOLS, REQUIRED_HIPRTC_SYMBOLS

__all__ = [
    "HipBackend",
    "INSTALL_HINT",
    "REQUIRED_HIP_SYMBOLS",
    "REQUIRED_HIPRTC_SYMBOLS",
    "create",
    "error_name",
    "error_string",
    "probe",
    "share_key",
]


def share_key(**options: Any) -> object:
    """Runtimes of one process share one HIP backend object (the runtime is process-wide).

    The backend takes no options: any option gives ``None`` and ``create`` rejects it.
    """
    return None if options else ()


def create(**options: Any) -> HipBackend:
    """The HIP backend. Raises ``BackendUnavailableError`` naming what is missing and how to get it."""
    if options:
        raise TypeError(f"the hip backend takes no options; got {', '.join(sorted(options))}")
    problem = _diagnose()
    if problem is not None:
        raise unavailable("hip", problem[0], problem[1])
    return HipBackend()
