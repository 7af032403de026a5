"""Pipelines: explicit DAGs of stream work, launched on streams through compiled plans, or captured into graphs.

Modules: ``_builder`` (:class:`Pipeline`: building, validation, launching),
``_nodes`` (the node kinds and the enqueue of a planned pipeline), ``_deps``
(dependencies from declared access, fork plans), ``_launch`` (launches past
the plan fast path: the policies' enqueue), ``_plan`` (the compiled launch of
a pipeline on one stream), ``_fork_plan`` (the compiled ``"fork"`` launch), ``_run`` (:class:`Run`, one future per
launch), ``_graph`` (:class:`Graph`, captured replays), ``_devices``
(pipelines spanning devices).
"""

from . import _capture  # noqa: F401 - serves Stream.capture and host functions while capturing
from ._builder import Edge, Pipeline
from ._graph import Graph, capture_pipeline
from ._launch import POLICIES, deferrable
from ._nodes import Node
from ._run import Run, RunChain

__all__ = ["POLICIES", "Edge", "Graph", "Node", "Pipeline", "Run", "RunChain", "capture_pipeline", "deferrable"]
