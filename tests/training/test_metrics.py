"""MetricsLogger: every step's value, in step order, a few steps late, without ever blocking the loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import streamrt as srt

torch = pytest.importorskip("torch", reason="torch is not installed (make test installs torch==2.13.0, the CPU build)")
from training_helpers import no_blocking_calls, on_device

import streamrt.torch as st


def test_every_step_is_emitted_in_order_and_late(trt: srt.Runtime) -> None:
    """Steps reach the sink in step order with their values, none before ``lag`` later steps were logged."""
    emitted: list[tuple[int, Any, int]] = []
    now = [0]
    logger = st.MetricsLogger(trt, lag=2, sink=lambda step, value: emitted.append((step, value, now[0])))
    for step in range(40):
        now[0] = step
        logger.log(step, on_device(trt, torch.tensor(step * 0.5)))
    now[0] = 10**6  # flush
    logger.flush()
    assert [e[0] for e in emitted] == list(range(40))
    assert [e[1] for e in emitted] == [s * 0.5 for s in range(40)]
    assert all(at >= step + 2 for step, _v, at in emitted)
    stats = logger.statistics()
    assert (stats.logged, stats.emitted, stats.pending) == (40, 40, 0)
    assert logger.records == [(s, s * 0.5) for s in range(40)]


def test_log_never_blocks(trt: srt.Runtime, gate: Callable[[srt.Stream], Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """With the stream held up nothing lands: log keeps queueing (counting late steps) and never waits;
    flush then emits everything in order."""
    emitted: list[int] = []
    logger = st.MetricsLogger(trt, lag=1, sink=lambda step, _v: emitted.append(step))
    losses = [on_device(trt, torch.tensor(float(i))) for i in range(10)]
    release = gate(st.current_stream(trt))
    with no_blocking_calls(monkeypatch):
        for step, loss in enumerate(losses):
            logger.log(step, loss)
    assert emitted == []
    stats = logger.statistics()
    assert stats.pending == 10 and stats.late >= 1 and stats.blocking_waits == 0
    release.set()
    logger.flush(timeout=30)
    assert emitted == list(range(10))


def test_lag_zero_emits_as_soon_as_landed(trt: srt.Runtime) -> None:
    emitted: list[int] = []
    logger = st.MetricsLogger(trt, lag=0, sink=lambda step, _v: emitted.append(step))
    logger.log(0, on_device(trt, torch.tensor(1.0)))
    fut_done = st.fetch(trt, on_device(trt, torch.tensor(0.0)))  # behind step 0's host function on the fetch stream
    fut_done.result(timeout=30)
    logger.poll()
    assert emitted == [0]
    assert logger.statistics().max_delay == 0


def test_dicts_arrays_and_the_print_sink(trt: srt.Runtime, capsys: pytest.CaptureFixture[str]) -> None:
    """A dict of tensors is one step; one-element tensors become Python scalars, others arrays;
    sink=print prints one line per step."""
    with st.MetricsLogger(trt, lag=0) as logger:
        logger.log(3, {"loss": on_device(trt, torch.tensor(1.5)), "acc": torch.tensor(0.25)})
        logger.log(4, {"loss": 2.0, "acc": on_device(trt, torch.tensor([1.0, 2.0]))})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "step 3: loss 1.5  acc 0.25"
    assert out[1].startswith("step 4: loss 2  acc [1. 2.]")
    step, value = logger.records[1]
    assert step == 4 and isinstance(value["acc"], np.ndarray)


def test_logger_arguments_and_close(trt: srt.Runtime) -> None:
    with pytest.raises(ValueError, match="lag"):
        st.MetricsLogger(trt, lag=-1)
    with pytest.raises(TypeError, match="callable"):
        st.MetricsLogger(trt, sink="stdout")  # type: ignore[arg-type]
    logger = st.MetricsLogger(trt, sink=None)
    logger.log(0, torch.tensor(1.0))
    logger.close()
    assert logger.pending == 0
    with pytest.raises(ValueError, match="closed"):
        logger.log(1, torch.tensor(1.0))


def test_values_pending_when_the_runtime_closes_raise_closed_error() -> None:
    """The logger copies values out on the logging thread: once the runtime (and its pinned staging) is
    gone, what was not copied out raises ClosedError instead of being read from freed memory."""
    rt = srt.open_runtime("sim")
    logger = st.MetricsLogger(rt, lag=3, sink=None)
    for step in range(2):
        logger.log(step, on_device(rt, torch.tensor(1.0)))
    rt.close()
    with pytest.raises(srt.ClosedError):
        logger.flush()
    logger.close()
    assert logger.pending == 0


def _counting_copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the copies out that MetricsLogger enqueues (one D2H and one event record each)."""
    from streamrt.torch import _metrics

    copies = [0]
    enqueue = _metrics.enqueue_copy

    def counted(*args: Any) -> None:
        copies[0] += 1
        enqueue(*args)

    monkeypatch.setattr(_metrics, "enqueue_copy", counted)
    return copies


def test_a_group_copies_the_values_of_several_log_calls_out_at_once(trt: srt.Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """group=8: one copy per 8 log calls, none between; every step still reaches the sink with its own value,
    in order, and none before ``lag`` log calls after its group was sent; flush sends the partial group."""
    copies = _counting_copies(monkeypatch)
    emitted: list[tuple[int, Any, int]] = []
    now = [0]
    logger = st.MetricsLogger(trt, lag=2, group=8, sink=lambda step, value: emitted.append((step, value, now[0])))
    for step in range(20):
        now[0] = step
        logger.log(step, on_device(trt, torch.tensor(step * 0.5)))
        assert copies[0] == (step + 1) // 8
    trt.synchronize()
    logger.poll()  # both sent groups are due and landed; steps 16-19 are still held
    assert [e[0] for e in emitted] == list(range(16))
    now[0] = 10**6
    logger.flush()
    assert copies[0] == 3
    assert [(e[0], e[1]) for e in emitted] == [(s, s * 0.5) for s in range(20)]
    assert all(at >= (step // 8) * 8 + 7 + 2 for step, _v, at in emitted[:16])
    stats = logger.statistics()
    assert (stats.logged, stats.emitted, stats.pending) == (20, 20, 0)


def test_a_group_keeps_step_order_when_other_values_come_between_the_losses(trt: srt.Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group of lone losses travels as one copy; a dict, a number, another shape or dtype in between
    changes neither the values nor their step order, and a group's steps are due together."""
    copies = _counting_copies(monkeypatch)
    logger = st.MetricsLogger(trt, lag=0, group=4, sink=None)

    def loss(v: float, dtype: Any = torch.float32) -> Any:
        return on_device(trt, torch.tensor(v, dtype=dtype))

    values: list[Any] = [loss(0.0), loss(1.0), loss(2.0), loss(3.0)]  # the first group: no loose pairs yet
    values += [loss(4.0), loss(5.0), loss(6.0), loss(7.0)]  # lone losses: one stacked copy
    values += [loss(8.0), {"loss": loss(9.0)}, loss(10.0), 11.5]  # a dict and a number between them
    values += [loss(12.0), on_device(trt, torch.tensor([13.0, 13.5])), loss(14.0), loss(15.0, torch.float64)]
    values += [loss(16.0), loss(17.0)]  # a partial group, sent by flush
    for step, value in enumerate(values):
        logger.log(step, value)
    assert copies[0] == 5  # groups 1-3 one copy each, the fourth two (stacked by shape), float64 alone
    logger.flush()
    expected: list[Any] = [float(s) for s in range(18)]
    expected[9], expected[11], expected[13] = {"loss": 9.0}, 11.5, [13.0, 13.5]
    assert [step for step, _ in logger.records] == list(range(18))
    got = [v.tolist() if isinstance(v, np.ndarray) else v for _, v in logger.records]
    assert got == expected
    stats = logger.statistics()
    assert (stats.logged, stats.emitted, stats.pending) == (18, 18, 0)
    assert copies[0] == 6


def test_a_sink_that_raises_in_a_group_leaves_its_later_steps_pending(trt: srt.Runtime) -> None:
    seen: list[int] = []

    def sink(step: int, _value: Any) -> None:
        seen.append(step)
        if step == 5 and seen.count(5) == 1:
            raise RuntimeError("the sink failed")

    logger = st.MetricsLogger(trt, lag=0, group=4, sink=sink)
    with pytest.raises(RuntimeError, match="the sink failed"):
        for step in range(8):
            logger.log(step, on_device(trt, torch.tensor(float(step))))
        logger.flush()
    assert seen == [0, 1, 2, 3, 4, 5] and logger.pending == 2  # step 5 was emitted; 6 and 7 were not
    logger.flush()
    assert seen == list(range(8)) and [v for _, v in logger.records] == [float(s) for s in range(8)]
    assert logger.pending == 0 and logger.statistics().emitted == 8


def test_a_group_of_dicts_copies_once_per_dtype_and_keeps_shapes(trt: srt.Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    copies = _counting_copies(monkeypatch)
    logger = st.MetricsLogger(trt, lag=0, group=3, sink=None)
    for step in range(3):
        logger.log(
            step,
            {
                "loss": on_device(trt, torch.tensor(1.0 + step)),
                "half": on_device(trt, torch.tensor([0.5, step], dtype=torch.bfloat16)),
                "counts": on_device(trt, torch.arange(step + 1, dtype=torch.int64)),  # its shape changes
                "lr": 0.1,
                "host": torch.tensor(0.25),  # beside a GPU: already on the host, no copy
            },
        )
    assert copies[0] == 3  # float32, bfloat16, int64
    logger.flush()
    for step, value in logger.records:
        assert value["loss"] == 1.0 + step and value["lr"] == pytest.approx(0.1) and value["host"] == 0.25
        assert value["half"].dtype == np.float32 and value["half"].tolist() == [0.5, step]
        assert np.atleast_1d(value["counts"]).tolist() == list(range(step + 1))  # one element: a scalar


def test_a_value_that_cannot_be_copied_out_logs_nothing_in_a_group(trt: srt.Runtime) -> None:
    logger = st.MetricsLogger(trt, group=4, sink=None)
    logger.log(0, on_device(trt, torch.tensor(1.0)))
    bad = torch.zeros(2, dtype=torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="no numpy counterpart"):  # a tensor like the last one but its dtype: checked
        logger.log(1, bad)
    with pytest.raises(TypeError, match="no numpy counterpart"):
        logger.log(1, {"loss": on_device(trt, torch.tensor(2.0)), "bad": bad})
    with pytest.raises(TypeError, match="not a future"):
        logger.log(1, trt.create_stream().wait_idle())
    assert logger.statistics().logged == 1 and logger.pending == 1
    logger.log(1, on_device(trt, torch.tensor(2.0)))
    logger.flush()
    assert logger.records == [(0, 1.0), (1, 2.0)]
    with pytest.raises(ValueError, match="group"):
        st.MetricsLogger(trt, group=0)


def test_a_group_never_blocks_and_close_drops_what_it_holds(
    trt: srt.Runtime, gate: Callable[[srt.Stream], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    emitted: list[int] = []
    logger = st.MetricsLogger(trt, lag=0, group=4, sink=lambda step, _v: emitted.append(step))
    losses = [on_device(trt, torch.tensor(float(i))) for i in range(10)]
    # The group's torch.stack loaded before the hold: CUDA loads a kernel at its first launch (lazy
    # loading), which may wait for the whole device, so a first stack behind the gate waits for it.
    torch.stack(losses[:4])
    release = gate(st.current_stream(trt))
    with no_blocking_calls(monkeypatch):
        for step, loss in enumerate(losses):
            logger.log(step, loss)
    assert emitted == [] and logger.pending == 10
    release.set()
    trt.synchronize()
    logger.poll()
    assert emitted == list(range(8))  # the two groups sent; steps 8 and 9 are still held
    logger.close()
    assert logger.pending == 0
    with pytest.raises(ValueError, match="closed"):
        logger.log(10, losses[0])


def test_a_group_held_when_the_runtime_closes_raises_closed_error() -> None:
    rt = srt.open_runtime("sim")
    logger = st.MetricsLogger(rt, lag=0, group=4, sink=None)
    for step in range(2):
        logger.log(step, on_device(rt, torch.tensor(1.0)))
    rt.close()
    with pytest.raises(srt.ClosedError):
        logger.flush()
    with pytest.raises(srt.ClosedError):
        logger.log(2, torch.tensor(1.0))
    logger.close()
    assert logger.pending == 0
