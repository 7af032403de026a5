// fmha_bwd_prepare.hip: the group-mode FMHA backward workspace prepare on the device, in one launch
// (streamrt issue 6, kernel (a); DESIGN.md section 8).
//
//   fmha_bwd_prepare(seqstart_q, seqstart_k, workspace, batch, nhead, hdim_q, kM0, kN0,
//                    num_cus, deterministic, max_seqlen_q, max_seqlen_k, total_q_padded)
//
// Writes the metadata region of `workspace` (the exact bytes of
// streamrt/recipes/fmha_bwd/layout.py: header, arrays, zero padding up to region_bytes)
// and zeroes only the used prefix of the dq_acc region (dq_acc_used_bytes), from the
// int32 seqstart arrays in device memory. It mirrors reference.py's algorithm
// (pack_metadata's closed forms), so the bytes equal reference_metadata's.
//
// Launch: block (256, 1, 1); grid (1 + Z, 1, 1). Block 0 computes the metadata; blocks
// 1..Z zero the used dq_acc bytes (with Z = 0, block 0 zeroes them too). No block waits
// for another: every block derives dq_acc_used_bytes itself from seqstart (one pass over
// batch + 1 ints, O(batch + nhead) work), so the launch needs no grid-wide barrier.
// `workspace` must be 16-byte aligned and hold workspace_size(params) bytes; the kernel's
// spec (streamrt/_kernel/_builtin.py) checks that, the parameters and the block shape
// before a launch, and streamrt.recipes.fmha_bwd.DevicePrepare picks the grid.
//
// In phases separated by __syncthreads() (block 0 only, unless marked):
//   0. zero the metadata region;
//   1. (every block) validate the lengths (status bits) and sum the unit weights W;
//   2. deterministic: exclusive scans of each batch's weight and unit count, kept as
//      scratch (shared memory for batch <= SRT_PREP_SMEM_BATCH, otherwise the offsets /
//      nsplits arrays of the metadata itself, rewritten in phase 4);
//   3. deterministic: worker i takes the units whose starting weight lies in [i*q, (i+1)*q),
//      q = ceil(W / num_cus): its first unit and unit count by binary search;
//   4. (every block) nsplits per batch and the offsets prefix sums;
//   5. the header;
//   6. (blocks 1..Z, or block 0 alone) zero dq_acc_used_bytes with 16-byte stores.
// The kernel reads the seqstart arrays a few times (cheaper than keeping them: they are L2-hot).
#include "streamrt_kernel.h"

#define SRT_PREP_THREADS 256
#define SRT_PREP_SMEM_BATCH 2048

#define SRT_META_MAGIC 0x4D574246u
#define SRT_META_VERSION 1u
#define SRT_META_HEADER_BYTES 128
#define SRT_META_ALIGN 4096

#define SRT_STATUS_NEGATIVE_LENGTH 1u
#define SRT_STATUS_TOTAL_Q_EXCEEDED 2u
#define SRT_STATUS_SEQLEN_K_EXCEEDED 4u
#define SRT_STATUS_SEQLEN_Q_EXCEEDED 8u

SRT_DEVICE srt_i64 srt_align_up(srt_i64 n, srt_i64 a) { return (n + a - 1) / a * a; }

// -- block-wide reductions and scans (blockDim.x == SRT_PREP_THREADS) ----------------------------

SRT_DEVICE srt_u64 srt_block_sum(srt_u64 v, srt_u64* sh) {
    const unsigned t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (unsigned s = SRT_PREP_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] += sh[t + s];
        __syncthreads();
    }
    const srt_u64 r = sh[0];
    __syncthreads();
    return r;
}

SRT_DEVICE srt_u64 srt_block_or(srt_u64 v, srt_u64* sh) {
    const unsigned t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (unsigned s = SRT_PREP_THREADS / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] |= sh[t + s];
        __syncthreads();
    }
    const srt_u64 r = sh[0];
    __syncthreads();
    return r;
}

SRT_DEVICE srt_u64 srt_block_max(srt_u64 v, srt_u64* sh) {
    const unsigned t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (unsigned s = SRT_PREP_THREADS / 2; s > 0; s >>= 1) {
        if (t < s && sh[t + s] > sh[t]) sh[t] = sh[t + s];
        __syncthreads();
    }
    const srt_u64 r = sh[0];
    __syncthreads();
    return r;
}

// Exclusive prefix sum of v over the block's threads; *total gets the sum of all.
SRT_DEVICE srt_u64 srt_block_exclusive_scan(srt_u64 v, srt_u64* sh, srt_u64* total) {
    const unsigned t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (unsigned off = 1; off < SRT_PREP_THREADS; off <<= 1) {
        const srt_u64 add = t >= off ? sh[t - off] : 0;
        __syncthreads();
        sh[t] += add;
        __syncthreads();
    }
    const srt_u64 inclusive = sh[t];
    *total = sh[SRT_PREP_THREADS - 1];
    __syncthreads();
    return inclusive - v;
}

// -- the per-batch quantities of reference.py ------------------------------------------------------

struct SrtBatch {
    srt_i64 sq;     // seqlen_q (may be negative: invalid input)
    srt_i64 sk;     // seqlen_k
    srt_i64 nc;     // key blocks, ceil(max(sk, 0) / kN0)
    srt_i64 w;      // unit weight, roundup(max(sq, 1), kM0)
    srt_i64 units;  // nhead * nc
};

SRT_DEVICE SrtBatch srt_batch(const srt_i32* ssq, const srt_i32* ssk, srt_i64 b, srt_i64 nhead, srt_i64 kM0, srt_i64 kN0) {
    SrtBatch r;
    r.sq = (srt_i64)ssq[b + 1] - (srt_i64)ssq[b];
    r.sk = (srt_i64)ssk[b + 1] - (srt_i64)ssk[b];
    r.nc = srt_ceil_div(srt_max_i64(r.sk, 0), kN0);
    r.w = srt_ceil_div(srt_max_i64(r.sq, 1), kM0) * kM0;
    r.units = nhead * r.nc;
    return r;
}

// Workers touching one (batch, head) pair, maximized over the heads (reference.py steps 3-4),
// for a batch whose first unit starts at weight S. With a = S + h*nc*w, L = (nc-1)*w:
// touching = floor((a+L)/q) - floor(a/q) + 1 = floor(L/q) + 1 + [a%q + L%q >= q], and a%q
// advances by (nc*w)%q per head, so the loop needs no division.
SRT_DEVICE srt_i64 srt_batch_splits(srt_i64 S, srt_i64 nc, srt_i64 w, srt_i64 q, srt_i64 nhead) {
    if (nc == 0) return 0;
    if (w >= q) return nc;  // every unit on its own worker
    const srt_i64 L = (nc - 1) * w;
    const srt_i64 base = L / q + 1;
    const srt_i64 s = L % q;
    if (s == 0) return base;
    const srt_i64 step = (nc * w) % q;
    srt_i64 r = S % q;
    for (srt_i64 h = 0; h < nhead; ++h) {
        if (r >= q - s) return base + 1;
        r += step;
        if (r >= q) r -= q;
    }
    return base;
}

// Number of units whose starting weight is < x (x >= 0); starts/ustarts are the exclusive
// prefix sums of the batches' weights and unit counts (non-decreasing).
SRT_DEVICE srt_i64 srt_units_before(srt_i64 x, const srt_i64* starts, const srt_i32* ustarts, srt_i64 batch,
                                    const srt_i32* ssq, const srt_i32* ssk, srt_i64 nhead, srt_i64 kM0, srt_i64 kN0) {
    srt_i64 lo = 0, hi = batch;  // count the batches whose first unit starts below x
    while (lo < hi) {
        const srt_i64 mid = (lo + hi) / 2;
        if (starts[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return 0;
    const srt_i64 k = lo - 1;
    const SrtBatch bk = srt_batch(ssq, ssk, k, nhead, kM0, kN0);
    return (srt_i64)ustarts[k] + srt_min_i64(bk.units, srt_ceil_div(x - starts[k], bk.w));
}

extern "C" __global__ void fmha_bwd_prepare(const srt_i32* __restrict__ seqstart_q, const srt_i32* __restrict__ seqstart_k,
                                            srt_u8* __restrict__ workspace, srt_i32 batch, srt_i32 nhead, srt_i32 hdim_q,
                                            srt_i32 kM0, srt_i32 kN0, srt_i32 num_cus, srt_i32 deterministic,
                                            srt_i32 max_seqlen_q, srt_i32 max_seqlen_k, srt_i32 total_q_padded) {
    __shared__ srt_u64 sh[SRT_PREP_THREADS];
    __shared__ srt_i64 sh_starts[SRT_PREP_SMEM_BATCH];
    __shared__ srt_i32 sh_ustarts[SRT_PREP_SMEM_BATCH];

    if (blockDim.x != SRT_PREP_THREADS || blockDim.y != 1 || blockDim.z != 1) return;  // the launcher prevents this
    const unsigned t = threadIdx.x;
    const bool meta_block = blockIdx.x == 0;
    const srt_i32* ssq = seqstart_q;
    const srt_i32* ssk = seqstart_k;

    // 64-bit copies of the parameters: every size below is computed in 64 bits.
    const srt_i64 B = batch, H = nhead, HD = hdim_q, M0 = kM0, N0 = kN0, NCU = num_cus;
    const bool det = deterministic != 0;
    const srt_i64 nw = det ? NCU : 0;

    // Layout (layout.py MetadataLayout) and the dq_acc bound: parameters only.
    const srt_i64 offsets_off = SRT_META_HEADER_BYTES;
    const srt_i64 nsplits_off = offsets_off + 8 * (B + 1);
    const srt_i64 wstart_off = srt_align_up(nsplits_off + 4 * B, 8);
    const srt_i64 wunits_off = wstart_off + 16 * nw;
    const srt_i64 metadata_bytes = srt_align_up(wunits_off + 4 * nw, 8);
    const srt_i64 region_bytes = srt_align_up(metadata_bytes, SRT_META_ALIGN);
    const srt_i64 nsplits_bound = det ? srt_ceil_div((srt_i64)max_seqlen_k, N0) : 1;
    const srt_i64 bound_bytes = 4 * H * nsplits_bound * (srt_i64)total_q_padded * HD;

    srt_i64* offsets = (srt_i64*)(workspace + offsets_off);
    srt_i32* nsplits = (srt_i32*)(workspace + nsplits_off);
    srt_i32* wstart = (srt_i32*)(workspace + wstart_off);
    srt_i32* wunits = (srt_i32*)(workspace + wunits_off);

    // This thread's contiguous range of batches.
    const srt_i64 per = (B + SRT_PREP_THREADS - 1) / SRT_PREP_THREADS;
    const srt_i64 b0 = srt_min_i64((srt_i64)t * per, B);
    const srt_i64 b1 = srt_min_i64(b0 + per, B);

    // Phase 0: zero the metadata region (padding and gaps stay zero).
    if (meta_block) {
        srt_u128* region = (srt_u128*)workspace;
        const srt_u128 zero = {0, 0};
        for (srt_i64 i = t; i < region_bytes / 16; i += SRT_PREP_THREADS) region[i] = zero;
    }

    // Phase 1: status bits and the total weight / units.
    srt_u64 bits = 0, my_weight = 0, my_units = 0;
    for (srt_i64 b = b0; b < b1; ++b) {
        const SrtBatch bb = srt_batch(ssq, ssk, b, H, M0, N0);
        if (bb.sq < 0 || bb.sk < 0) bits |= SRT_STATUS_NEGATIVE_LENGTH;
        if (bb.sk > (srt_i64)max_seqlen_k) bits |= SRT_STATUS_SEQLEN_K_EXCEEDED;
        if (bb.sq > (srt_i64)max_seqlen_q) bits |= SRT_STATUS_SEQLEN_Q_EXCEEDED;
        my_weight += (srt_u64)bb.units * (srt_u64)bb.w;
        my_units += (srt_u64)bb.units;
    }
    if (t == 0 && (srt_i64)ssq[B] - (srt_i64)ssq[0] > (srt_i64)total_q_padded) bits |= SRT_STATUS_TOTAL_Q_EXCEEDED;
    const srt_u32 status = (srt_u32)srt_block_or(bits, sh);
    const bool ok = status == 0;
    const srt_i64 W = (srt_i64)srt_block_sum(my_weight, sh);
    const srt_i64 U = (srt_i64)srt_block_sum(my_units, sh);
    const bool split = ok && det && W > 0;
    const srt_i64 q = split ? srt_ceil_div(W, NCU) : 0;

    // Phase 2: scratch scans of the batches' first-unit weights and indices.
    const bool smem_scratch = B <= SRT_PREP_SMEM_BATCH;
    srt_i64* starts = smem_scratch ? sh_starts : offsets;
    srt_i32* ustarts = smem_scratch ? sh_ustarts : nsplits;
    if (meta_block && split) {
        srt_u64 lw = 0, lu = 0;
        for (srt_i64 b = b0; b < b1; ++b) {
            const SrtBatch bb = srt_batch(ssq, ssk, b, H, M0, N0);
            lw += (srt_u64)(bb.units * bb.w);
            lu += (srt_u64)bb.units;
        }
        srt_u64 total;
        srt_i64 S = (srt_i64)srt_block_exclusive_scan(lw, sh, &total);
        srt_i64 G = (srt_i64)srt_block_exclusive_scan(lu, sh, &total);
        for (srt_i64 b = b0; b < b1; ++b) {
            const SrtBatch bb = srt_batch(ssq, ssk, b, H, M0, N0);
            starts[b] = S;
            ustarts[b] = (srt_i32)G;
            S += bb.units * bb.w;
            G += bb.units;
        }
        __syncthreads();
    }

    // Phase 3: the workers.
    if (meta_block && det) {
        for (srt_i64 i = t; i < nw; i += SRT_PREP_THREADS) {
            srt_i32 e0 = -1, e1 = -1, e2 = -1, e3 = -1, count = 0;
            if (split) {
                const srt_i64 lo = i * q;
                const srt_i64 g = srt_units_before(lo, starts, ustarts, B, ssq, ssk, H, M0, N0);
                const srt_i64 n = srt_units_before(lo + q, starts, ustarts, B, ssq, ssk, H, M0, N0) - g;
                if (n > 0) {
                    srt_i64 a = 0, z = B;  // count the batches whose first unit index is <= g
                    while (a < z) {
                        const srt_i64 mid = (a + z) / 2;
                        if ((srt_i64)ustarts[mid] <= g) a = mid + 1;
                        else z = mid;
                    }
                    const srt_i64 b = a - 1;
                    const SrtBatch bb = srt_batch(ssq, ssk, b, H, M0, N0);
                    const srt_i64 k = g - (srt_i64)ustarts[b];
                    const srt_i64 h = k / bb.nc;
                    const srt_i64 j = k % bb.nc;
                    const srt_i64 sp = bb.w >= q ? j : i - (starts[b] + h * bb.nc * bb.w) / q;
                    e0 = (srt_i32)b;
                    e1 = (srt_i32)sp;
                    e2 = (srt_i32)h;
                    e3 = (srt_i32)j;
                    count = (srt_i32)n;
                }
            }
            wstart[4 * i + 0] = e0;
            wstart[4 * i + 1] = e1;
            wstart[4 * i + 2] = e2;
            wstart[4 * i + 3] = e3;
            wunits[i] = count;
        }
    }
    if (meta_block) __syncthreads();  // the scratch is read; phase 4 rewrites it

    // Phase 4: nsplits and the offsets prefix sums (every block needs the total).
    srt_i64 S = 0;
    if (split) {
        srt_u64 lw = 0, total;
        for (srt_i64 b = b0; b < b1; ++b) {
            const SrtBatch bb = srt_batch(ssq, ssk, b, H, M0, N0);
            lw += (srt_u64)(bb.units * bb.w);
        }
        S = (srt_i64)srt_block_exclusive_scan(lw, sh, &total);
    }
    srt_u64 my_elems = 0, my_max = 0;
    for (srt_i64 b = b0; b < b1; ++b) {
        const SrtBatch bb = srt_batch(ssq, ssk, b, H, M0, N0);
        srt_i64 ns = 0;
        if (ok) ns = !det ? 1 : (split ? srt_batch_splits(S, bb.nc, bb.w, q, H) : 0);
        S += bb.units * bb.w;
        if (meta_block) nsplits[b] = (srt_i32)ns;
        my_elems += (srt_u64)(H * ns * srt_max_i64(bb.sq, 0) * HD);
        if ((srt_u64)ns > my_max) my_max = (srt_u64)ns;
    }
    srt_u64 total_elems;
    srt_i64 O = (srt_i64)srt_block_exclusive_scan(my_elems, sh, &total_elems);
    const srt_i64 nsplits_max = (srt_i64)srt_block_max(my_max, sh);
    const srt_i64 used_bytes = 4 * (srt_i64)total_elems;
    if (meta_block) {
        for (srt_i64 b = b0; b < b1; ++b) {
            const srt_i64 sq = (srt_i64)ssq[b + 1] - (srt_i64)ssq[b];
            O += H * (srt_i64)nsplits[b] * srt_max_i64(sq, 0) * HD;
            offsets[b + 1] = O;
        }
        if (t == 0) offsets[0] = 0;
    }

    // Phase 5: the header.
    if (meta_block && t == 0) {
        srt_u32* h32 = (srt_u32*)workspace;
        srt_i64* h64 = (srt_i64*)workspace;
        h32[0] = SRT_META_MAGIC;
        h32[1] = SRT_META_VERSION;
        h32[2] = SRT_META_HEADER_BYTES;
        h32[3] = status;
        h32[4] = (srt_u32)batch;
        h32[5] = (srt_u32)nhead;
        h32[6] = (srt_u32)hdim_q;
        h32[7] = (srt_u32)kM0;
        h32[8] = (srt_u32)kN0;
        h32[9] = (srt_u32)nw;
        h32[10] = det ? 1u : 0u;
        h32[11] = (srt_u32)nsplits_max;
        h64[6] = used_bytes;      // byte 48
        h64[7] = region_bytes;    // 56
        h64[8] = bound_bytes;     // 64
        h64[9] = ok && det ? U : 0;   // 72 total_units
        h64[10] = ok && det ? W : 0;  // 80 total_weight
        h64[11] = q;                  // 88 unit_quota
        h32[24] = (srt_u32)offsets_off;
        h32[25] = (srt_u32)nsplits_off;
        h32[26] = (srt_u32)wstart_off;
        h32[27] = (srt_u32)wunits_off;
        h32[28] = (srt_u32)metadata_bytes;
        h32[29] = (srt_u32)region_bytes;
        h32[30] = 0;
        h32[31] = 0;
    }

    // Phase 6: zero the used dq_acc bytes (blocks 1.., or block 0 alone).
    if (gridDim.x == 1 || !meta_block) {
        const srt_i64 zero_blocks = gridDim.x > 1 ? (srt_i64)gridDim.x - 1 : 1;
        const srt_i64 zb = gridDim.x > 1 ? (srt_i64)blockIdx.x - 1 : 0;
        srt_u8* acc = workspace + region_bytes;
        srt_u128* acc16 = (srt_u128*)acc;
        const srt_u128 zero = {0, 0};
        const srt_i64 n16 = used_bytes / 16;
        for (srt_i64 i = zb * SRT_PREP_THREADS + t; i < n16; i += zero_blocks * SRT_PREP_THREADS) acc16[i] = zero;
        const srt_i64 tail_words = (used_bytes % 16) / 4;
        if (zb == 0 && (srt_i64)t < tail_words) ((srt_u32*)(acc + 16 * n16))[t] = 0;
    }
}
