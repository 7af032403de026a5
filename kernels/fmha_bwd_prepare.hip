// fmha_bwd_prepare.hip: the group-mode FMHA backward workspace metadata, written on the device.
// streamrt-register: streamrt.recipes.fmha_bwd
//
//   fmha_bwd_prepare(seqstart_q, seqstart_k, workspace, result, batch, nhead, hdim_q, kM0, kN0,
//                    num_cus, deterministic, max_seqlen_q, max_seqlen_k, total_q_padded)
//
// Writes Composable Kernel's metadata region at the start of `workspace` (the bytes of
// streamrt/recipes/fmha_bwd/reference.py's oracle: nsplits, offsets, cu_state in XCD slot order,
// batch_state, zeros elsewhere up to the region's end) from the int32 seqstart arrays in device
// memory, and the 16-byte result record (status, CK hazards, used dq_acc bytes) at `result`
// (NULL: none). It is the newest CK's device-side prepare (FmhaBwdPrepareWorkspaceKernel, one
// thread running FmhaBwdWorkspaceManager::PrepareWorkspace), computed by one block in parallel
// and in 64 bits. It touches nothing past the metadata region: dq_acc is zeroed by the next
// kernel (fmha_bwd_prezero.hip, deterministic) or a memset (non-deterministic), as in CK.
//
// Launch: grid (1, 1, 1), block (256, 1, 1). `workspace` 16-byte aligned, holding the region;
// the kernel's spec (streamrt/recipes/fmha_bwd/_kernels.py) checks that, the parameters and
// the launch shape before a launch.
//
// Deterministic, in phases separated by __syncthreads():
//   0. zero the region;
//   1. each thread validates a contiguous range of batches and sums its work weight; block
//      reductions give the status bits, the total W and whether any batch has keys;
//      invalid input or no keys: the idle image (CK's short-circuit), done;
//   2. an exclusive scan of the threads' weights gives each batch's end pb_next, kept as
//      scratch (shared memory for batch <= SRT_PREP_SMEM_BATCH, else the offsets array);
//      nsplits[b] = 1;
//   3. one thread per CU: its batch by binary search over pb_next, its state written to its
//      XCD slot; nsplits[b] = max(nsplits[b], isplit + 1) by atomicMax; CUs past the work are
//      inactive {W, W, batch, 0, 0, 0};
//   4. each CU's w_hi = the next CU's w_lo; batch_state; the offsets by a scan; the record.
#include "streamrt_kernel.h"

#define SRT_PREP_THREADS 256
#define SRT_PREP_SMEM_BATCH 2048
#define SRT_META_ALIGN 4096
#define SRT_NUM_XCDS 8
#define SRT_I32_LIMIT 2147483647LL

#define SRT_STATUS_NEGATIVE_LENGTH 1u
#define SRT_STATUS_TOTAL_Q_EXCEEDED 2u
#define SRT_STATUS_SEQLEN_K_EXCEEDED 4u
#define SRT_STATUS_SEQLEN_Q_EXCEEDED 8u
#define SRT_STATUS_NEGATIVE_SEQSTART 16u
#define SRT_CK_INT32_OVERFLOW 1u
#define SRT_CK_DIVIDE_BY_ZERO 2u

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

// -- CK's per-batch quantities ----------------------------------------------------------------------

struct SrtBatch {
    srt_i64 sq;    // seqlen_q (negative: invalid input)
    srt_i64 sk;    // seqlen_k
    srt_i64 sq_w;  // CK's sq_work: roundup(sq, kM0), kM0 when sq == 0
    srt_i64 nc;    // key chunks, ceil(sk / kN0)
};

SRT_DEVICE SrtBatch srt_batch(const srt_i32* ssq, const srt_i32* ssk, srt_i64 b, srt_i64 kM0, srt_i64 kN0) {
    SrtBatch r;
    r.sq = (srt_i64)ssq[b + 1] - (srt_i64)ssq[b];
    r.sk = (srt_i64)ssk[b + 1] - (srt_i64)ssk[b];
    r.sq_w = r.sq <= 0 ? kM0 : srt_ceil_div(r.sq, kM0) * kM0;
    r.nc = srt_ceil_div(srt_max_i64(r.sk, 0), kN0);
    return r;
}

// CK's CuStateLogicalToOutput: the cu_state slot of logical CU c.
SRT_DEVICE srt_i64 srt_cu_slot(srt_i64 c, srt_i64 n) {
    const srt_i64 per = srt_ceil_div(n, SRT_NUM_XCDS);
    const srt_i64 tall = n % SRT_NUM_XCDS ? n % SRT_NUM_XCDS : SRT_NUM_XCDS;
    const srt_i64 span = tall * per;
    if (c < span) return (c % per) * SRT_NUM_XCDS + c / per;
    const srt_i64 short_len = srt_max_i64(per - 1, 1);
    const srt_i64 r = c - span;
    return (r % short_len) * SRT_NUM_XCDS + tall + r / short_len;
}

// One cu_state record; the int32 fields keep the low 32 bits of exact values (w_hi: phase 4).
SRT_DEVICE void srt_put_cu(srt_u8* rec, srt_i64 w_lo, srt_i64 ibatch, srt_i64 isplit, srt_i64 head, srt_i64 c_start) {
    srt_u32* u = (srt_u32*)rec;
    u[0] = (srt_u32)w_lo;
    u[2] = (srt_u32)ibatch;
    u[3] = (srt_u32)isplit;
    u[4] = (srt_u32)head;
    u[5] = (srt_u32)c_start;
}

SRT_DEVICE void srt_put_result(srt_u8* result, srt_u32 status, srt_u32 hazards, srt_i64 used) {
    if (result == 0) return;
    ((srt_u32*)result)[0] = status;
    ((srt_u32*)result)[1] = hazards;
    ((srt_i64*)result)[1] = used;
}

extern "C" __global__ void fmha_bwd_prepare(const srt_i32* __restrict__ seqstart_q, const srt_i32* __restrict__ seqstart_k,
                                            srt_u8* __restrict__ workspace, srt_u8* __restrict__ result, srt_i32 batch,
                                            srt_i32 nhead, srt_i32 hdim_q, srt_i32 kM0, srt_i32 kN0, srt_i32 num_cus,
                                            srt_i32 deterministic, srt_i32 max_seqlen_q, srt_i32 max_seqlen_k,
                                            srt_i32 total_q_padded) {
    __shared__ srt_u64 sh[SRT_PREP_THREADS];
    __shared__ srt_i64 sh_ends[SRT_PREP_SMEM_BATCH];

    if (blockDim.x != SRT_PREP_THREADS || blockDim.y != 1 || blockDim.z != 1 || blockIdx.x != 0) return;  // the spec prevents this
    const unsigned t = threadIdx.x;
    const srt_i32* ssq = seqstart_q;
    const srt_i32* ssk = seqstart_k;

    // 64-bit copies of the parameters: every value below is computed in 64 bits.
    const srt_i64 B = batch, H = nhead, HD = hdim_q, M0 = kM0, N0 = kN0, NCU = num_cus;
    const bool det = deterministic != 0;

    // Layout (layout.py MetadataLayout): parameters only.
    const srt_i64 offsets_off = srt_align_up(4 * B, 16);
    const srt_i64 cu_off = offsets_off + srt_align_up(8 * (B + 1), 16);
    const srt_i64 bs_off = cu_off + 32 * NCU;
    const srt_i64 region = det ? srt_align_up(bs_off + 16 * B, SRT_META_ALIGN) : SRT_META_ALIGN;
    srt_i32* nsplits = (srt_i32*)workspace;
    srt_i64* offsets = (srt_i64*)(workspace + offsets_off);
    srt_u8* cu_state = workspace + cu_off;
    srt_u32* batch_state = (srt_u32*)(workspace + bs_off);

    // This thread's contiguous range of batches.
    const srt_i64 per = (B + SRT_PREP_THREADS - 1) / SRT_PREP_THREADS;
    const srt_i64 b0 = srt_min_i64((srt_i64)t * per, B);
    const srt_i64 b1 = srt_min_i64(b0 + per, B);

    // Phase 0: zero the region (padding and gaps stay zero).
    {
        srt_u128* words = (srt_u128*)workspace;
        const srt_u128 zero = {0, 0};
        for (srt_i64 i = t; i < region / 16; i += SRT_PREP_THREADS) words[i] = zero;
    }

    // Phase 1: status bits; the weight sum W (unsigned: it may wrap only when some batch is
    // invalid, and is then unused); keys anywhere; CK's per-batch int32 hazards.
    srt_u64 bits = 0, my_w = 0, my_keys = 0, my_haz = 0;
    for (srt_i64 b = b0; b < b1; ++b) {
        const SrtBatch bb = srt_batch(ssq, ssk, b, M0, N0);
        srt_u64 bad = 0;
        if (bb.sq < 0 || bb.sk < 0) bad |= SRT_STATUS_NEGATIVE_LENGTH;
        if (bb.sk > (srt_i64)max_seqlen_k) bad |= SRT_STATUS_SEQLEN_K_EXCEEDED;
        if (bb.sq > (srt_i64)max_seqlen_q) bad |= SRT_STATUS_SEQLEN_Q_EXCEEDED;
        bits |= bad;
        if (!det || bad) continue;
        my_w += (srt_u64)H * (srt_u64)bb.nc * (srt_u64)bb.sq_w;
        my_keys |= bb.sk > 0;
        if ((bb.sq > 0 && bb.sq + M0 > SRT_I32_LIMIT) || bb.sk + N0 > SRT_I32_LIMIT) my_haz |= SRT_CK_INT32_OVERFLOW;
    }
    if (t == 0) {
        if (ssq[0] < 0 || ssk[0] < 0) bits |= SRT_STATUS_NEGATIVE_SEQSTART;
        if ((srt_i64)ssq[B] > (srt_i64)total_q_padded) bits |= SRT_STATUS_TOTAL_Q_EXCEEDED;
    }
    const srt_u32 status = (srt_u32)srt_block_or(bits, sh);  // its barriers also end phase 0
    const srt_i64 W = (srt_i64)srt_block_sum(my_w, sh);
    const bool any_k = srt_block_or(my_keys, sh) != 0;
    srt_u32 hazards = (srt_u32)srt_block_or(my_haz, sh);
    const bool size_hazard = (srt_i64)max_seqlen_k + N0 > SRT_I32_LIMIT;  // GetWorkspaceDeviceSizeUpperBound

    if (!det) {
        if (t == 0) {
            nsplits[0] = 1;
            srt_put_result(result, status, 0, status ? 0 : 4 * H * (srt_i64)ssq[B] * HD);
        }
        return;
    }
    if (status != 0 || !any_k) {  // the idle image: CK's all-seqlen_k = 0 short-circuit
        for (srt_i64 b = t; b < B; b += SRT_PREP_THREADS) {
            nsplits[b] = 1;
            batch_state[4 * b + 2] = 1;
        }
        for (srt_i64 c = t; c < NCU; c += SRT_PREP_THREADS) srt_put_cu(cu_state + 32 * c, 0, B, 0, 0, 0);
        if (t == 0) {
            // Valid and keyless: CK short-circuits only when seqstart_k[batch] == 0; otherwise it
            // runs the per-batch arithmetic and divides by target_w = 0.
            srt_u32 h = 0;
            if (status == 0 && ssk[B] != 0) h = hazards | SRT_CK_DIVIDE_BY_ZERO;
            if (status == 0 && size_hazard) h |= SRT_CK_INT32_OVERFLOW;
            srt_put_result(result, status, h, 0);
        }
        return;
    }
    const srt_i64 target = srt_ceil_div(W, NCU);
    if (size_hazard || W > SRT_I32_LIMIT || W + NCU > SRT_I32_LIMIT || W + target > SRT_I32_LIMIT) hazards |= SRT_CK_INT32_OVERFLOW;

    // Phase 2: each batch's end pb_next (scratch), nsplits = 1.
    srt_i64* ends = B <= SRT_PREP_SMEM_BATCH ? sh_ends : offsets + 1;
    {
        srt_u64 lw = 0, total;
        for (srt_i64 b = b0; b < b1; ++b) {
            const SrtBatch bb = srt_batch(ssq, ssk, b, M0, N0);
            lw += (srt_u64)(H * bb.nc * bb.sq_w);
        }
        srt_i64 S = (srt_i64)srt_block_exclusive_scan(lw, sh, &total);
        for (srt_i64 b = b0; b < b1; ++b) {
            const SrtBatch bb = srt_batch(ssq, ssk, b, M0, N0);
            S += H * bb.nc * bb.sq_w;
            ends[b] = S;
            nsplits[b] = 1;
        }
    }
    __syncthreads();

    // Phase 3: one thread per logical CU. CU c belongs to the first batch ending after c * target
    // (a batch without keys ends where it starts, so it owns none).
    const srt_i64 cu_end = srt_min_i64(NCU, srt_ceil_div(W, target));
    srt_u64 cu_haz = 0;
    for (srt_i64 c = t; c < NCU; c += SRT_PREP_THREADS) {
        srt_u8* rec = cu_state + 32 * srt_cu_slot(c, NCU);
        if (c >= cu_end) {
            srt_put_cu(rec, W, B, 0, 0, 0);
            continue;
        }
        const srt_i64 x = c * target;
        srt_i64 lo = 0, hi = B - 1;
        while (lo < hi) {
            const srt_i64 mid = (lo + hi) / 2;
            if (ends[mid] > x) hi = mid;
            else lo = mid + 1;
        }
        const srt_i64 b = lo;
        const SrtBatch bb = srt_batch(ssq, ssk, b, M0, N0);
        const srt_i64 hw = bb.nc * bb.sq_w;
        const srt_i64 pb = ends[b] - H * hw;
        const srt_i64 head = (x - pb) / hw;
        const srt_i64 wc = x - pb - head * hw;
        const srt_i64 c_start = srt_ceil_div(wc, bb.sq_w);
        const srt_i64 denom = srt_max_i64(bb.sq_w, target);
        const srt_i64 isplit = srt_min_i64(srt_ceil_div(wc, denom), bb.nc - 1);
        if (wc > 0 && wc + denom > SRT_I32_LIMIT) cu_haz |= SRT_CK_INT32_OVERFLOW;
        if (c_start < bb.nc) atomicMax(&nsplits[b], (srt_i32)(isplit + 1));
        srt_put_cu(rec, pb + head * hw + c_start * bb.sq_w, b, isplit, head, c_start);
    }
    __syncthreads();  // every w_lo and nsplits written; the scratch is read

    // Phase 4: w_hi, batch_state, offsets, the record.
    for (srt_i64 c = t; c < NCU; c += SRT_PREP_THREADS) {
        const srt_u32 next = c + 1 < NCU ? ((const srt_u32*)(cu_state + 32 * srt_cu_slot(c + 1, NCU)))[0] : (srt_u32)W;
        ((srt_u32*)(cu_state + 32 * srt_cu_slot(c, NCU)))[1] = next;
    }
    srt_u64 my_elems = 0;
    for (srt_i64 b = b0; b < b1; ++b) {
        const SrtBatch bb = srt_batch(ssq, ssk, b, M0, N0);
        const srt_i64 ns = nsplits[b];
        batch_state[4 * b + 0] = (srt_u32)bb.sq_w;
        batch_state[4 * b + 1] = (srt_u32)bb.nc;
        batch_state[4 * b + 2] = (srt_u32)ns;
        my_elems += (srt_u64)(H * ns * bb.sq * HD);
    }
    srt_u64 total_elems;
    srt_i64 O = (srt_i64)srt_block_exclusive_scan(my_elems, sh, &total_elems);
    for (srt_i64 b = b0; b < b1; ++b) {
        O += H * (srt_i64)nsplits[b] * ((srt_i64)ssq[b + 1] - (srt_i64)ssq[b]) * HD;
        offsets[b + 1] = O;
    }
    hazards |= (srt_u32)srt_block_or(cu_haz, sh);
    if (t == 0) srt_put_result(result, 0, hazards, 4 * (srt_i64)total_elems);
}
