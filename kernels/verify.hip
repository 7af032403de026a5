// verify.hip: fill and checksum kernels for verifying buffers (streamrt issue 6, kernel (c)).
//
//   fill_u32(out, count, value, step)       out[i] = value + step * i            (mod 2**32)
//   checksum_u32(data, count, result)       *result += sum_i mix(data[i], i)      (mod 2**64)
//
// mix(x, i) = splitmix64(x + i * 0x9E3779B97F4A7C15): the sum is independent of the
// order the device adds in (so it is deterministic), yet it changes when words move.
// checksum_u32 adds into *result (atomically, once per block): zero it first
// (streamrt._kernel.checksum_u32 does). Any grid and block size; grid-stride loops.
#include "streamrt_kernel.h"

#define SRT_CHECKSUM_MAX_THREADS 1024

extern "C" __global__ void fill_u32(srt_u32* __restrict__ out, srt_u64 count, srt_u32 value, srt_u32 step) {
    const srt_u64 stride = (srt_u64)gridDim.x * blockDim.x;
    for (srt_u64 i = (srt_u64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        out[i] = value + step * (srt_u32)i;
    }
}

SRT_DEVICE srt_u64 srt_checksum_mix(srt_u32 word, srt_u64 index) {
    srt_u64 z = (srt_u64)word + index * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

extern "C" __global__ void checksum_u32(const srt_u32* __restrict__ data, srt_u64 count, srt_u64* __restrict__ result) {
    __shared__ srt_u64 partial[SRT_CHECKSUM_MAX_THREADS];
    const srt_u64 stride = (srt_u64)gridDim.x * blockDim.x;
    srt_u64 sum = 0;
    for (srt_u64 i = (srt_u64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        sum += srt_checksum_mix(data[i], i);
    }
    const unsigned t = threadIdx.x;
    partial[t] = sum;
    __syncthreads();
    // Tree reduction over any block size: fold the upper part onto the lower one.
    for (unsigned n = blockDim.x; n > 1;) {
        const unsigned half = (n + 1) / 2;
        if (t < n - half) partial[t] += partial[t + half];
        __syncthreads();
        n = half;
    }
    if (t == 0 && partial[0] != 0) atomicAdd(result, partial[0]);
}
