"""Eager launches of a pipeline past the plan fast path: checks, then a plan, a policy's enqueue, or several devices.

Launch policies:

* ``"stream"`` — every node on the caller's stream in a topological order
  (creation order whenever the edges allow): the seed's behaviour.
* ``"fork"`` — independent branches on pooled side streams, ordered by events;
  the first branch stays on the caller's stream. Side streams first wait for
  the caller's stream (``wait_for="stream"``, the default), for an Event, or
  for nothing (``wait_for=None``: the inputs are known ready). With
  ``join=True`` (default) the caller's stream then waits for all branches;
  with ``join=False`` call :meth:`Run.join` before the consumer instead, so the
  caller's stream runs on meanwhile. ``deferred=True`` (with ``join=False``)
  also puts the first branch on a side stream and has the runtime's
  submission thread make the launch's backend calls: the launch costs the
  caller's thread only its bookkeeping (``ForkLaunchPlan``, "deferred"); a
  single chain then runs on one side stream. Where the launch cannot be
  compiled (a Python host node, an Event to wait for, a trace open, several
  devices or runtimes on several devices), it is made on the caller's thread
  (a single chain: on the caller's stream).

:func:`launch_pipeline` is :meth:`Pipeline.launch` when the pipeline has no
compiled plan for the stream yet, or the launch cannot use one (the
``"fork"`` policy, a traced stream, nodes on other devices). It checks the
arguments and the stream before anything is enqueued, then:

* compiles a :class:`~streamrt._pipeline._plan.LaunchPlan` for the stream
  (``"stream"`` policy, untraced: later launches take the fast path), or a
  :class:`~streamrt._pipeline._fork_plan.ForkLaunchPlan` (``"fork"``, untraced,
  several branches and no Python host node), and launches it;
* or enqueues node by node: every node on the caller's stream
  (:func:`launch_single`), or the branches on the caller's and side streams
  (:func:`launch_fork`);
* or hands a pipeline spanning devices to
  :func:`~streamrt._pipeline._devices.launch_across_devices`.

A launch that fails midway leaves what was enqueued to run
(``Pipeline._fail_partial``). Thread rules: as for ``Pipeline.launch``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._event import Event
from .._stream import Stream, holding
from .._streampool import pool_for
from ._capture import launch_into_capture
from ._deps import ForkPlan
from ._devices import launch_across_devices
from ._fork_plan import ForkLaunchPlan, plannable
from ._nodes import EnqueueContext, enqueue_plan
from ._plan import LaunchPlan
from ._run import Run

if TYPE_CHECKING:
    from ._builder import Pipeline

__all__ = ["POLICIES", "deferrable", "launch_pipeline"]

POLICIES = ("stream", "fork")


def launch_pipeline(p: Pipeline, stream: Stream, policy: str, wait_for: str | Event | None, join: bool, deferred: bool = False) -> Run:
    """:meth:`Pipeline.launch` past the plan fast path (see the module docstring)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: use 'stream' or 'fork' (or capture() for a graph)")
    if not (wait_for is None or wait_for == "stream" or isinstance(wait_for, Event)):
        raise TypeError("wait_for must be 'stream', an Event or None")
    if deferred and (policy != "fork" or join):
        raise ValueError("deferred=True needs policy='fork' and join=False (nothing then waits on the caller's thread)")
    stream = p._check_stream(stream)
    if isinstance(wait_for, Event) and wait_for._runtime is not stream._runtime and wait_for._runtime._base_backend is not stream._runtime._base_backend:
        raise ValueError("wait_for event belongs to another runtime with a different backend instance")
    rt = stream._runtime
    if rt._multi_device:  # host-node events and kernel launches need the stream's device current
        stream._backend.ensure_device(rt._device)
    with stream._lock, p._lock:  # the stream's lock first: see Stream.lock
        if stream._closed:
            stream._check_open()
        order, keep = p._validated()
        if stream._capture is not None or stream._backend.stream_is_capturing(stream._handle):
            return launch_into_capture(p, stream, order, keep)
        where = p._placement(rt)
        if where is not None:
            return launch_across_devices(p, stream, order, keep, where, policy, wait_for, join)
        untraced = rt._backend is rt._base_backend
        aside = deferred and deferrable(p, stream, wait_for)  # a deferred single chain runs on one side stream
        plan = p._fork_plan() if policy == "fork" else None
        if plan is not None and plan.slots == 1 and not aside:
            plan = None  # a single chain: nothing to fork
        if plan is None:
            if policy == "stream" and untraced:
                return _keep_plan(p, stream, LaunchPlan(p, stream, p._nodes, order, keep)).launch()
            return launch_single(p, stream, order, keep, policy)
        if untraced and plannable(p._nodes, plan, wait_for, aside):
            fork = ForkLaunchPlan(p, stream, p._nodes, keep, plan, wait_for, join, aside)  # type: ignore[arg-type]
            return _keep_plan(p, (stream, wait_for, join, deferred), fork).launch()
        return launch_fork(p, stream, order, plan, keep, wait_for, join)


def deferrable(p: Pipeline, stream: Stream, wait_for: str | Event | None) -> bool:
    """Whether ``p.launch(stream, policy="fork", wait_for=wait_for, join=False, deferred=True)`` is deferred
    (made by the submission thread) rather than made on the caller's thread: untraced, one device (a
    runtime beside others on other devices: the submission thread could not pick the device), no Python
    host node, ``wait_for`` not an Event."""
    rt = stream._runtime
    if rt._backend is not rt._base_backend or rt._multi_device:
        return False
    # (compiled for this version: it was)
    return (stream, wait_for, False, True) in p._plans or plannable(p._nodes, p._fork_plan(), wait_for, True)


def _keep_plan(p: Pipeline, key: Any, plan: Any) -> Any:
    """Keep ``plan`` for this version under ``key`` (the stream, or ``(stream, wait_for, join, deferred)`` for "fork");
    closed streams' plans are dropped."""
    plans = {k: q for k, q in p._plans.items() if not q.stream._closed} if len(p._plans) >= 8 else p._plans
    plans[key] = plan
    p._plans = plans
    return plan


def launch_single(p: Pipeline, stream: Stream, order: list[int], keep: tuple[Any, ...], policy: str) -> Run:
    """Every node on ``stream``, node by node, in topological order (no plan: a traced stream)."""
    pool = pool_for(stream._runtime)
    p._serialize_after_previous((stream,))
    ctx = EnqueueContext(capturing=False)
    try:
        enqueue_plan(p._nodes, order, None, [stream], None, ctx, fork_from_caller=None, join=True)
    except BaseException as exc:
        p._fail_partial(stream, keep, ctx, exc)
        raise
    run = Run(p._name, policy, (stream,), tuple(ctx.host), keep, stream._runtime._engine, (stream,))
    p._chain.last = run
    return run


def launch_fork(
    p: Pipeline, stream: Stream, order: list[int], plan: ForkPlan, keep: tuple[Any, ...], wait_for: str | Event | None, join: bool
) -> Run:
    """The ``"fork"`` policy: ``plan``'s branches on ``stream`` and pooled side streams, ordered by events."""
    rt = stream._runtime
    pool = pool_for(rt)
    sides = pool.acquire_streams(plan.slots - 1, stream.priority)
    streams = [stream, *sides]
    ctx = EnqueueContext(capturing=False)
    fork_ev: Event | None = None
    try:
        with holding(sides):
            if wait_for == "stream":
                p._serialize_after_previous((stream,))
                fork_ev = pool.acquire_event()
                stream.record(fork_ev)
                entry: Event | None = fork_ev
            else:
                p._serialize_after_previous(streams)
                entry = wait_for if isinstance(wait_for, Event) else None
            try:
                enqueue_plan(p._nodes, order, plan, streams, pool, ctx, fork_from_caller=entry, join=join)
            except BaseException as exc:
                for s in streams:
                    p._fail_partial(s, keep, ctx, exc if s is stream else None)
                raise
            run = Run(p._name, "fork", tuple(streams), tuple(ctx.host), keep, rt._engine, streams if not join else (stream,))
    finally:
        if fork_ev is not None:
            pool.release_event(fork_ev)
        pool.release_streams(sides, stream.priority)
    p._chain.last = run
    return run
