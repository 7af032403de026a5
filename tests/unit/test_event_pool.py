"""The runtime's one event pool: the completion engine, forks and the allocators' fences share it."""

from __future__ import annotations

import pytest

import streamrt as srt


def test_take_give_limit_and_close() -> None:
    with srt.open_runtime("sim") as rt:
        pool = srt.EventPool(rt.backend, rt.device, limit=1)
        a, b = pool.take(), pool.take()
        assert a != b and pool.created == 2
        pool.give(a)
        pool.give(b)  # over the limit: destroyed
        assert pool.idle == [a]
        assert pool.take() == a and pool.created == 2
        pool.reserve(3)
        assert len(pool.idle) == 3 and pool.created == 5
        pool.close()
        assert pool.idle == []
        pool.give(a)  # after close: destroyed at once
        assert pool.idle == []
        with pytest.raises(ValueError):
            srt.EventPool(rt.backend, rt.device, limit=-1)


def test_engine_forks_and_fences_share_the_runtime_pool() -> None:
    with srt.open_runtime("sim") as rt:
        pool = rt.event_pool
        s = rt.create_stream()
        a = rt.device_allocator.allocate(4096, stream=s)
        b = rt.device_allocator.allocate(4096, stream=s)
        p = srt.Pipeline("fork")
        p.memset(a, 0)
        p.memset(b, 1)  # independent: a fork launch puts it on a side stream
        for _ in range(3):
            p.launch(s, policy="fork").result(10)
        s.synchronize()
        settled = pool.created
        assert settled > 0 and rt._engine.statistics().events_created == settled
        for _ in range(20):  # warm: every event a launch takes comes back to the pool
            p.launch(s, policy="fork").result(10)
        assert pool.created <= settled + 2
        # a fence (a block released while another stream used it) takes and gives back pool events
        other = rt.create_stream()
        c = rt.device_allocator.allocate(4096, stream=s)
        other.memset(c, 2)
        c.release()
        s.synchronize()
        other.synchronize()
        before = pool.created
        d = rt.device_allocator.allocate(4096, stream=s)  # the fence is polled, its event given back
        d.release()
        assert pool.created <= before + 1
    assert pool.closed and pool.idle == []
