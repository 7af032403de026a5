#!/usr/bin/env bash
# Run the GPU suite (cuda, and hip through the HIP-on-CUDA forwarding library) and the
# benchmarks on a GPU machine whose Python already has torch, cuda-bindings and pytest.
#
#   tools/gpu_suite.sh OUTDIR [tests|bench|all] [pytest args...]
#
# Wheels for what the machine lacks (hip-python, pytest-asyncio) are installed from .whl/
# when present (../shared/tools/device-wheels.sh .whl downloads them). Logs go to OUTDIR.
# The exit status is pytest's, else that of the first benchmark that failed: read the counts too.
set -uo pipefail
out=${1:?usage: tools/gpu_suite.sh OUTDIR [tests|bench|all] [pytest args...]}
what=${2:-all}
shift 2 2>/dev/null || shift $#
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
nvidia-smi -L | tee "$out/gpu.txt"
python3 -c "import sys, torch, cuda.bindings, pytest; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda.bindings', cuda.bindings.__version__, 'pytest', pytest.__version__)" | tee -a "$out/gpu.txt"

status=0  # pytest's exit status, else the first failing benchmark's
if [[ $what == tests || $what == all ]]; then
  # -m gpu plus the contract tests: every backend-parametrized test runs on sim, cuda and hip.
  timeout "${SUITE_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider -rfE \
      -o faulthandler_timeout="${FAULT_TIMEOUT:-90}" "$@" > "$out/pytest.log" 2>&1
  status=$?
  grep -v "^SKIPPED" "$out/pytest.log" | tail -40
  echo "pytest exit status: $status"
fi
if [[ $what == bench || $what == all ]]; then
  # Each benchmark runs its variants side by side in one process; JSON and logs go to OUTDIR.
  bench() {  # bench NAME TIMEOUT COMMAND...
    local name=$1 limit=$2; shift 2
    echo "== $name"
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    echo "   exit $rc"; tail -n "${BENCH_TAIL:-14}" "$out/$name.log"
    if [[ $rc != 0 && $status == 0 ]]; then status=$rc; fi
  }
  hoc="python3 tools/with_hip_on_cuda.py"
  for b in cuda hip; do
    bench "core_ops_$b" 60 $hoc demos/bench/core_ops.py --backend $b --out "$out/core_ops_$b.json"
    bench "completion_$b" 90 $hoc demos/bench/completion_bench.py --backend $b --out "$out/completion_$b.json"
  done
  bench alloc_cuda 90 python3 demos/bench/alloc_bench.py --backend cuda --out "$out/alloc_cuda.json"
  bench train_step_cuda 150 python3 demos/bench/train_step.py --backend cuda --out "$out/train_step_cuda.json"
  bench device_prepare_cuda 120 python3 demos/bench/device_prepare.py --backend cuda --out "$out/device_prepare_cuda.json"
  ${EXTRA_BENCH:-true}
fi
exit "$status"
