"""Recipes: complete, tested workloads built on streamrt's public API.

* :mod:`streamrt.recipes.fmha_bwd` — the group-mode (varlen) FMHA backward
  workspace prepare of the AMD AITER / Composable Kernel projects: CK's workspace
  byte for byte, a numpy oracle of its metadata transcribed from CK, the host packs
  (numpy and C), the device kernels, and the stream-async prepare pipeline with the
  old synchronous path beside it.
"""

from __future__ import annotations

__all__ = ["fmha_bwd"]
