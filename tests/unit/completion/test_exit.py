"""Interpreter exit with GPU work and Python host calls in flight: no hang, no crash.

Each scenario runs in a fresh interpreter on the sim backend, returns from
its main code with work still queued, and must exit with status 0 well
within the subprocess timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

PRELUDE = """
import asyncio, ctypes, sys, threading, time
from streamrt._backends import load_backend
from streamrt._completion import CompletionEngine
from streamrt._native import SEM_WAIT_ADDRESS, Semaphore

USLEEP = ctypes.cast(ctypes.CDLL(None).usleep, ctypes.c_void_p).value
backend = load_backend("sim")
backend.ensure_device(0)
engine = CompletionEngine(backend, 0)
streams = [backend.stream_create(0) for _ in range(4)]
"""

SCENARIOS = {
    # Work that finishes within the exit timeout: the atexit hook drains it.
    "drains": """
        ran = []
        for s in streams:
            backend.launch_host_func(s, USLEEP, 100_000)
            for i in range(50):
                engine.completion_for_stream(s, keepalive=[bytearray(64)])
            engine.host_call(s, ran.append, (s,))
        c = engine.host_call(streams[0], print, ("host call ran",))
        print("leaving main", flush=True)
    """,
    # Work stuck forever (a gate never opened): the hook gives up after the timeout.
    "stuck": """
        gate = Semaphore(0)
        backend.launch_host_func(streams[0], SEM_WAIT_ADDRESS, gate.address)
        cs = [engine.completion_for_stream(streams[0]) for _ in range(10)]
        engine.host_call(streams[0], print, ("never printed",))
        print("leaving main", flush=True)
    """,
    # An event loop that is still awaiting when the interpreter leaves.
    "asyncio": """
        async def main():
            backend.launch_host_func(streams[1], USLEEP, 200_000)
            tasks = [asyncio.ensure_future(_wait(engine.completion_for_stream(streams[1]))) for _ in range(100)]
            await asyncio.sleep(0.01)
        async def _wait(c):
            await c
        asyncio.run(main())
        print("leaving main", flush=True)
    """,
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_exit_with_work_in_flight_does_not_hang_or_crash(scenario: str) -> None:
    code = PRELUDE + textwrap.dedent(SCENARIOS[scenario])
    env = dict(os.environ, STREAMRT_EXIT_TIMEOUT="0.5", PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "leaving main" in proc.stdout
    assert "Fatal Python error" not in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    if scenario == "drains":
        assert "host call ran" in proc.stdout
    if scenario == "stuck":
        assert "never printed" not in proc.stdout
