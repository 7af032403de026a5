"""Interop with other GPU libraries: streams, memory and events, both ways.

* :mod:`._streams`: ``Stream.__cuda_stream__`` (the CUDA stream protocol) and
  the foreign streams ``rt.wrap_stream`` accepts (torch, CuPy, cuda.core, ints).
* :mod:`._memory`: device and pinned Buffers as DLPack and CUDA-array-interface
  exports, stream-ordered; foreign memory taken in after its producer's stream.
* :mod:`._events`: ``Stream.wait`` on torch, CuPy and cuda.core events and on
  a ``torch.distributed`` ``Work``, with no host synchronization.

The core calls in through a few small hooks (``Stream.__cuda_stream__``,
``Stream.wait``, ``Buffer.__dlpack__`` and friends, ``Runtime.wrap_stream``,
``wrap_foreign``); see docs/interop.md for what users get.
"""

from __future__ import annotations

from ._events import wait_foreign
from ._memory import (
    cuda_array_interface,
    dlpack_device,
    export_dlpack,
    import_cuda_array_interface,
    import_dlpack,
)
from ._streams import foreign_stream_handle, stream_protocol

__all__ = [
    "cuda_array_interface",
    "dlpack_device",
    "export_dlpack",
    "foreign_stream_handle",
    "import_cuda_array_interface",
    "import_dlpack",
    "stream_protocol",
    "wait_foreign",
]

from .._extensions import provide as _provide

for _name, _fn in (
    ("export_dlpack", export_dlpack),
    ("dlpack_device", dlpack_device),
    ("cuda_array_interface", cuda_array_interface),
    ("import_cuda_array_interface", import_cuda_array_interface),
    ("import_dlpack", import_dlpack),
):
    _provide(_name, _fn)  # Buffer's protocols and wrap_foreign
