/* _pack_c.c: the FMHA backward workspace host pack as a native host function.
 *
 * streamrt_fmha_bwd_pack(void *args) writes Composable Kernel's metadata region (layout.py: the
 * arrays and zero padding up to region_bytes) and the 16-byte result record (result.py) from two
 * int32 seqstart arrays in host memory: the bytes of reference.reference_metadata, by CK's own
 * one-pass loop (FmhaBwdWorkspaceManager::PrepareWorkspace at rocm-libraries 40bda5c9), computed
 * in int64 with CK's int32 hazards flagged. It calls no Python and no HIP/CUDA and allocates
 * nothing, so the driver's callback thread may run it directly (a native host node: no GIL, no
 * runtime worker); the seqstart staging and the outputs may be the same pinned block the
 * pipeline's copies use.
 *
 * args points at ARGS_FIELDS int64 values (native.py builds them):
 *   batch, nhead, hdim_q, kM0, kN0, num_cus, deterministic, max_seqlen_q, max_seqlen_k,
 *   total_q_padded, seqstart_q address, seqstart_k address, metadata address, result address
 *   (0: no record).
 * The parameters are those of a validated WorkspaceParams (workspace_bytes < 2**62 and
 * nhead * ceil(max_seqlen_k / kN0) * (total_q_padded + batch * kM0) < 2**62, so every sum below
 * fits in int64 for valid input; invalid input is never summed). Work: O(batch + num_cus).
 *
 * The module exports PACK_ADDRESS (the function's address) and ARGS_FIELDS.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum {
    A_BATCH, A_NHEAD, A_HDIM_Q, A_KM0, A_KN0, A_NUM_CUS, A_DETERMINISTIC, A_MAX_SEQLEN_Q,
    A_MAX_SEQLEN_K, A_TOTAL_Q_PADDED, A_SEQSTART_Q, A_SEQSTART_K, A_OUT, A_RESULT, ARGS_FIELDS
};

#define META_ALIGN 4096
#define NUM_XCDS 8
#define INT32_LIMIT INT64_C(2147483647)
#define STATUS_NEGATIVE_LENGTH 1u
#define STATUS_TOTAL_Q_EXCEEDED 2u
#define STATUS_SEQLEN_K_EXCEEDED 4u
#define STATUS_SEQLEN_Q_EXCEEDED 8u
#define STATUS_NEGATIVE_SEQSTART 16u
#define CK_INT32_OVERFLOW 1u
#define CK_DIVIDE_BY_ZERO 2u

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; } /* a >= 0, b > 0 */
static int64_t align_up(int64_t n, int64_t a) { return ceil_div(n, a) * a; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* CK's CuStateLogicalToOutput: the cu_state slot of logical CU c. */
static int64_t cu_slot(int64_t c, int64_t n) {
    const int64_t per = ceil_div(n, NUM_XCDS), tall = n % NUM_XCDS ? n % NUM_XCDS : NUM_XCDS, span = tall * per;
    if (c < span) return (c % per) * NUM_XCDS + c / per;
    const int64_t short_len = max64(per - 1, 1), r = c - span;
    return (r % short_len) * NUM_XCDS + tall + r / short_len;
}

/* One 32-byte cu_state record; int32 fields keep the low 32 bits of exact values. */
static void put_cu(uint8_t *rec, int64_t w_lo, int64_t w_hi, int64_t ibatch, int64_t isplit, int64_t head, int64_t c_start) {
    uint32_t *u = (uint32_t *)rec;
    u[0] = (uint32_t)w_lo;
    u[1] = (uint32_t)w_hi;
    u[2] = (uint32_t)ibatch;
    u[3] = (uint32_t)isplit;
    u[4] = (uint32_t)head;
    u[5] = (uint32_t)c_start;
}

static void put_batch(uint8_t *rec, int64_t sq_w, int64_t nc, int64_t ns) {
    uint32_t *u = (uint32_t *)rec;
    u[0] = (uint32_t)sq_w;
    u[1] = (uint32_t)nc;
    u[2] = (uint32_t)ns;
}

static void put_result(const int64_t *a, uint32_t status, uint32_t hazards, int64_t used) {
    uint8_t *r = (uint8_t *)(intptr_t)a[A_RESULT];
    if (r == NULL) return;
    ((uint32_t *)r)[0] = status;
    ((uint32_t *)r)[1] = hazards;
    memcpy(r + 8, &used, 8);
}

static void streamrt_fmha_bwd_pack(void *user_data) {
    const int64_t *a = (const int64_t *)user_data;
    const int64_t B = a[A_BATCH], H = a[A_NHEAD], HD = a[A_HDIM_Q], M0 = a[A_KM0], N0 = a[A_KN0], NCU = a[A_NUM_CUS];
    const int det = a[A_DETERMINISTIC] != 0;
    const int32_t *ssq = (const int32_t *)(intptr_t)a[A_SEQSTART_Q];
    const int32_t *ssk = (const int32_t *)(intptr_t)a[A_SEQSTART_K];
    uint8_t *out = (uint8_t *)(intptr_t)a[A_OUT];

    /* layout.py MetadataLayout */
    const int64_t offsets_off = align_up(4 * B, 16);
    const int64_t cu_off = offsets_off + align_up(8 * (B + 1), 16);
    const int64_t bs_off = cu_off + 32 * NCU;
    const int64_t region = det ? align_up(bs_off + 16 * B, META_ALIGN) : META_ALIGN;
    int32_t *nsplits = (int32_t *)out;
    int64_t *offsets = (int64_t *)(out + offsets_off);
    memset(out, 0, (size_t)region);

    /* Validation (reference.check_seqstart), and the sums of the split over valid batches. */
    uint32_t status = 0, hazards = 0;
    uint64_t Wsum = 0; /* unsigned: wraps (harmlessly) only when some batch is invalid, and is then unused */
    int64_t any_k = 0;
    if (ssq[0] < 0 || ssk[0] < 0) status |= STATUS_NEGATIVE_SEQSTART;
    if ((int64_t)ssq[B] > a[A_TOTAL_Q_PADDED]) status |= STATUS_TOTAL_Q_EXCEEDED;
    for (int64_t b = 0; b < B; ++b) {
        const int64_t sq = (int64_t)ssq[b + 1] - ssq[b], sk = (int64_t)ssk[b + 1] - ssk[b];
        const uint32_t bad = (sq < 0 || sk < 0 ? STATUS_NEGATIVE_LENGTH : 0) | (sk > a[A_MAX_SEQLEN_K] ? STATUS_SEQLEN_K_EXCEEDED : 0) |
                             (sq > a[A_MAX_SEQLEN_Q] ? STATUS_SEQLEN_Q_EXCEEDED : 0);
        status |= bad;
        if (!det || bad) continue;
        const int64_t sq_w = sq == 0 ? M0 : ceil_div(sq, M0) * M0;
        Wsum += (uint64_t)H * (uint64_t)ceil_div(sk, N0) * (uint64_t)sq_w;
        any_k |= sk > 0;
        if ((sq > 0 && sq + M0 > INT32_LIMIT) || sk + N0 > INT32_LIMIT) hazards |= CK_INT32_OVERFLOW;
    }
    if (!det) {
        nsplits[0] = 1;
        put_result(a, status, 0, status ? 0 : 4 * H * (int64_t)ssq[B] * HD);
        return;
    }
    if (status || !any_k) { /* the idle image (CK's all-seqlen_k = 0 short-circuit) */
        for (int64_t b = 0; b < B; ++b) {
            nsplits[b] = 1;
            put_batch(out + bs_off + 16 * b, 0, 0, 1);
        }
        for (int64_t c = 0; c < NCU; ++c) put_cu(out + cu_off + 32 * c, 0, 0, B, 0, 0, 0);
        /* Valid and keyless: with seqstart_k[batch] == 0 CK short-circuits before any per-batch
         * arithmetic; otherwise it runs that arithmetic and divides by target_w = 0. */
        uint32_t h = 0;
        if (!status && ssk[B] != 0) h = hazards | CK_DIVIDE_BY_ZERO;
        if (!status && a[A_MAX_SEQLEN_K] + N0 > INT32_LIMIT) h |= CK_INT32_OVERFLOW;
        put_result(a, status, h, 0);
        return;
    }
    if (a[A_MAX_SEQLEN_K] + N0 > INT32_LIMIT) hazards |= CK_INT32_OVERFLOW;

    /* CK's loop: batches in order, each emitting its CUs; a CU's w_hi is the next one's w_lo. */
    const int64_t W = (int64_t)Wsum, target = ceil_div(W, NCU);
    if (W > INT32_LIMIT || W + NCU > INT32_LIMIT || W + target > INT32_LIMIT) hazards |= CK_INT32_OVERFLOW;
    int64_t cu_lo = 0, pb = 0, prev = -1;
    for (int64_t b = 0; b < B; ++b) {
        const int64_t sq = (int64_t)ssq[b + 1] - ssq[b], sk = (int64_t)ssk[b + 1] - ssk[b];
        const int64_t sq_w = sq == 0 ? M0 : ceil_div(sq, M0) * M0, nc = ceil_div(sk, N0), hw = nc * sq_w;
        const int64_t pb_next = pb + H * hw, cu_hi = min64(NCU, ceil_div(pb_next, target));
        int64_t ns = 1;
        for (int64_t c = cu_lo; c < cu_hi; ++c) { /* hw > 0 here: a batch without keys owns no CU */
            const int64_t x = c * target, head = (x - pb) / hw, wc = x - pb - head * hw;
            const int64_t c_start = ceil_div(wc, sq_w), denom = max64(sq_w, target);
            const int64_t isplit = min64(ceil_div(wc, denom), nc - 1), w_lo = pb + head * hw + c_start * sq_w;
            if (wc > 0 && wc + denom > INT32_LIMIT) hazards |= CK_INT32_OVERFLOW;
            if (c_start < nc) ns = max64(ns, isplit + 1);
            const int64_t slot = cu_slot(c, NCU);
            put_cu(out + cu_off + 32 * slot, w_lo, 0, b, isplit, head, c_start);
            if (prev >= 0) ((uint32_t *)(out + cu_off + 32 * prev))[1] = (uint32_t)w_lo;
            prev = slot;
        }
        cu_lo = cu_hi;
        nsplits[b] = (int32_t)ns;
        put_batch(out + bs_off + 16 * b, sq_w, nc, ns);
        offsets[b + 1] = offsets[b] + H * ns * sq * HD;
        pb = pb_next;
    }
    for (int64_t c = cu_lo; c < NCU; ++c) {
        const int64_t slot = cu_slot(c, NCU);
        put_cu(out + cu_off + 32 * slot, W, W, B, 0, 0, 0);
        if (prev >= 0) ((uint32_t *)(out + cu_off + 32 * prev))[1] = (uint32_t)W;
        prev = slot;
    }
    ((uint32_t *)(out + cu_off + 32 * prev))[1] = (uint32_t)W;
    put_result(a, 0, hazards, 4 * offsets[B]);
}

static struct PyModuleDef pack_module = {
    PyModuleDef_HEAD_INIT, "_pack_c",
    "The FMHA backward workspace host pack as a native void(*)(void*) host function (PACK_ADDRESS).", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__pack_c(void) {
    PyObject *m = PyModule_Create(&pack_module);
    if (m == NULL) return NULL;
    if (PyModule_AddObject(m, "PACK_ADDRESS", PyLong_FromVoidPtr((void *)&streamrt_fmha_bwd_pack)) < 0 ||
        PyModule_AddIntConstant(m, "ARGS_FIELDS", ARGS_FIELDS) < 0) {
        Py_DECREF(m);
        return NULL;
    }
#ifdef Py_GIL_DISABLED
    PyUnstable_Module_SetGIL(m, Py_MOD_GIL_NOT_USED); /* no Python state: safe without the GIL */
#endif
    return m;
}
