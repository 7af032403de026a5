#!/usr/bin/env bash
# Build the HIP-on-CUDA forwarding libraries (a test harness, see hip_on_cuda.c).
#
#   tests/hip_on_cuda/build.sh OUTDIR
#
# Produces OUTDIR/lib/libamdhip64.so and OUTDIR/lib/libhiprtc.so (plus the
# versioned names ROCm ships: libamdhip64.so.{6,7}, libhiprtc.so.{6,7}).
# Point hip-python at them with ROCM_PATH=OUTDIR.
#
# Needs only a C compiler (gcc, or $CC): the CUDA runtime and NVRTC are opened
# with dlopen at run time (see the top of hip_on_cuda.c and hiprtc_on_nvrtc.c
# for the search order; HIP_ON_CUDA_CUDART / HIPRTC_ON_NVRTC_LIBRARY override).
# If libcudart.so* / libnvrtc.so* are found now -- in $CUDA_HOME, $CUDA_PATH, the
# directory of nvcc, /usr/local/cuda, /usr/local/cuda-*, /opt/cuda, the
# nvidia-* pip packages of $PYTHON (default python3), or the loader cache --
# their paths are baked in as the last fallback.
#
# HIP_ON_CUDA_WERROR=1 turns warnings into errors.
#
# Exit status: 0 built; 2 usage; 3 no C compiler; anything else: the compile failed.
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
outdir="$1"
mkdir -p "$outdir/lib"
outdir="$(cd "$outdir" && pwd)"
cc="${CC:-gcc}"
python="${PYTHON:-python3}"

if ! command -v "$cc" >/dev/null 2>&1; then
    echo "build.sh: no C compiler: $cc not found (set CC)" >&2
    exit 3
fi

# Candidate CUDA roots, most specific first.
roots=()
[[ -n "${CUDA_HOME:-}" ]] && roots+=("$CUDA_HOME")
[[ -n "${CUDA_PATH:-}" ]] && roots+=("$CUDA_PATH")
if command -v nvcc >/dev/null 2>&1; then
    roots+=("$(dirname "$(dirname "$(command -v nvcc)")")")
fi
roots+=(/usr/local/cuda)
for d in /usr/local/cuda-* /opt/cuda; do
    [[ -d "$d" ]] && roots+=("$d")
done
# nvidia-* pip packages (nvidia/cu13, nvidia/cuda_runtime, nvidia/cuda_nvrtc, ...).
if command -v "$python" >/dev/null 2>&1; then
    while IFS= read -r d; do
        [[ -n "$d" ]] && roots+=("$d")
    done < <("$python" - <<'EOF' 2>/dev/null || true
import importlib.util, os
spec = importlib.util.find_spec("nvidia")
for base in (spec.submodule_search_locations or []) if spec else []:
    for name in sorted(os.listdir(base)):
        path = os.path.join(base, name)
        if os.path.isdir(path):
            print(path)
EOF
)
fi

# First root (in order) that has the file under one of the sub-directories.
find_in_roots() {  # find_in_roots PATTERN SUBDIR...
    local pattern="$1"
    shift
    local root sub f
    for root in "${roots[@]}"; do
        for sub in "$@"; do
            for f in "$root/$sub"/$pattern; do
                if [[ -e "$f" ]]; then
                    echo "$f"
                    return 0
                fi
            done
        done
    done
    return 1
}

libsubs=(lib64 lib targets/x86_64-linux/lib targets/sbsa-linux/lib lib/x86_64-linux-gnu lib/aarch64-linux-gnu)

# A library's path: CUDA roots first, then the loader cache; empty if none.
find_library() {  # find_library STEM  (libSTEM.so, else libSTEM.so.N)
    local stem="$1" found
    found="$(find_in_roots "lib$stem.so" "${libsubs[@]}" || find_in_roots "lib$stem.so.[0-9]*" "${libsubs[@]}" || true)"
    if [[ -z "$found" ]]; then
        found="$(/sbin/ldconfig -p 2>/dev/null | awk -v pat="lib$stem\\\\.so" '$0 ~ pat {print $NF; exit}' || true)"
    fi
    if [[ -n "$found" ]]; then
        echo "$(cd "$(dirname "$found")" && pwd)/$(basename "$found")"
    fi
}
cudart="$(find_library cudart)"
nvrtc="$(find_library nvrtc)"

echo "build.sh: compiler:      $("$cc" --version | head -n1)"
echo "build.sh: libcudart:     ${cudart:-(not found now; looked up at run time)}"
echo "build.sh: libnvrtc:      ${nvrtc:-(not found now; looked up at run time)}"

cflags=(-std=c11 -O2 -g -Wall -Wextra -fPIC -fvisibility=hidden -shared)
if [[ "${HIP_ON_CUDA_WERROR:-0}" == 1 ]]; then
    cflags+=(-Werror)  # the unit test builds this way; the GPU set-up does not, so another compiler's new warning cannot stop it
fi

"$cc" "${cflags[@]}" -DHIP_ON_CUDA_CUDART_DEFAULT="\"${cudart}\"" \
    -o "$outdir/lib/libamdhip64.so" "$here/hip_on_cuda.c" \
    -ldl -lpthread -Wl,-soname,libamdhip64.so -Wl,--no-undefined

"$cc" "${cflags[@]}" -DHIPRTC_ON_NVRTC_DEFAULT="\"${nvrtc}\"" \
    -o "$outdir/lib/libhiprtc.so" "$here/hiprtc_on_nvrtc.c" \
    -ldl -lpthread -Wl,-soname,libhiprtc.so -Wl,--no-undefined

for major in 6 7; do
    ln -sf libamdhip64.so "$outdir/lib/libamdhip64.so.$major"
    ln -sf libhiprtc.so "$outdir/lib/libhiprtc.so.$major"
done
echo "build.sh: built $outdir/lib/libamdhip64.so and $outdir/lib/libhiprtc.so"
echo "build.sh: use ROCM_PATH=$outdir"
