"""Run a Python script with hip-python pointed at the HIP-on-CUDA forwarding libraries.

    python3 tools/with_hip_on_cuda.py demos/bench/core_ops.py --backend hip
    python3 tools/with_hip_on_cuda.py -m streamrt demo --backend hip

On an NVIDIA machine with hip-python and no ROCm this builds tests/hip_on_cuda
(once) and sets ROCM_PATH before hip-python's first call; elsewhere it just
runs the script.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(root / "tests"))
from support.hip_on_cuda import prepare_if_needed  # noqa: E402

reason = prepare_if_needed()
if reason is not None:
    print(f"HIP-on-CUDA not prepared: {reason}", file=sys.stderr)
if sys.argv[1] == "-m":  # python3 tools/with_hip_on_cuda.py -m streamrt demo --backend hip
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    sys.path[0] = str(root)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
else:
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = str(Path(script).resolve().parent)
    runpy.run_path(script, run_name="__main__")
