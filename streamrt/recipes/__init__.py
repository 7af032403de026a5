"""Recipes: complete, tested workloads built on streamrt's public API.

* :mod:`streamrt.recipes.fmha_bwd` — the group-mode (varlen) FMHA backward
  workspace prepare of the AMD AITER / Composable Kernel projects (DESIGN §8):
  the workspace layout, a numpy reference of its metadata, and the
  stream-async prepare pipeline with the old synchronous path beside it.
"""

from __future__ import annotations

__all__ = ["fmha_bwd"]
