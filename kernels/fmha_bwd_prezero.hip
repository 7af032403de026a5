// fmha_bwd_prezero.hip: zero exactly the used prefix of a workspace's dq_acc, its length read on the device.
// streamrt-register: streamrt.recipes.fmha_bwd
//
//   fmha_bwd_dq_acc_prezero(workspace, count_offset, dq_acc_offset, max_count)
//
// Reads count = *(int64*)(workspace + count_offset), the used fp32 element count the metadata
// holds (offsets[batch] of the deterministic group-mode layout), clamps it to [0, max_count],
// and zeroes count floats at workspace + dq_acc_offset; every byte after them is left alone.
// It is Composable Kernel's DqAccPrezeroKernel (fmha_bwd_kernel.hpp at rocm-libraries
// 40bda5c9), which the persistent deterministic kernel needs instead of a memset of the whole
// dq_acc bound: the count is known only on the device, after the metadata was written.
//
// Launch: block (256, 1, 1), any 1-D grid; 16-byte stores in a grid-stride loop, the tail of
// up to 3 floats by block 0. dq_acc_offset must be 16-byte aligned and
// count_offset 8-byte aligned (the spec in streamrt/recipes/fmha_bwd/_kernels.py checks both).
#include "streamrt_kernel.h"

#define SRT_PREZERO_THREADS 256

extern "C" __global__ void fmha_bwd_dq_acc_prezero(srt_u8* __restrict__ workspace, srt_i64 count_offset,
                                                   srt_i64 dq_acc_offset, srt_i64 max_count) {
    const srt_i64 raw = *(const srt_i64*)(workspace + count_offset);
    const srt_i64 count = srt_max_i64(srt_min_i64(raw, max_count), 0);
    srt_u128* acc16 = (srt_u128*)(workspace + dq_acc_offset);
    const srt_i64 n16 = count / 4;  // whole 16-byte words
    const srt_u128 zero = {0, 0};
    const srt_i64 stride = (srt_i64)gridDim.x * SRT_PREZERO_THREADS;
    for (srt_i64 i = (srt_i64)blockIdx.x * SRT_PREZERO_THREADS + threadIdx.x; i < n16; i += stride) acc16[i] = zero;
    if (blockIdx.x == 0 && (srt_i64)threadIdx.x < count % 4) ((srt_u32*)(acc16 + n16))[threadIdx.x] = 0;
}
