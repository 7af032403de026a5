/* _pack_c.c: the FMHA backward workspace host pack as a native host function.
 *
 * streamrt_fmha_bwd_pack(void *args) writes the metadata region of layout.py (header, arrays,
 * zero padding up to region_bytes) from two int32 seqstart arrays in host memory: the bytes
 * of reference.reference_metadata, by the closed forms of reference.pack_metadata, in the
 * order of kernels/fmha_bwd_prepare.hip run by one thread. It calls no Python and no
 * HIP/CUDA and allocates nothing, so the driver's callback thread may run it directly (a
 * native host node: no GIL, no runtime worker); the seqstart staging and the metadata
 * output may be the same pinned block the pipeline's copies use.
 *
 * args points at ARGS_FIELDS int64 values (native.py builds them):
 *   batch, nhead, hdim_q, kM0, kN0, num_cus, deterministic, max_seqlen_q, max_seqlen_k,
 *   total_q_padded, seqstart_q address, seqstart_k address, metadata address.
 * The parameters are those of a validated WorkspaceParams whose workspace_bytes < 2**62 (so every
 * size below fits in int64); the output holds region_bytes.
 * Work: O(batch * nhead + num_cus * log(batch)). Scratch (each batch's first-unit weight
 * and index) lives in the offsets / nsplits arrays of the output until they are written.
 *
 * The module exports PACK_ADDRESS (the function's address) and ARGS_FIELDS.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum {
    A_BATCH, A_NHEAD, A_HDIM_Q, A_KM0, A_KN0, A_NUM_CUS, A_DETERMINISTIC, A_MAX_SEQLEN_Q,
    A_MAX_SEQLEN_K, A_TOTAL_Q_PADDED, A_SEQSTART_Q, A_SEQSTART_K, A_OUT, ARGS_FIELDS
};

#define META_MAGIC 0x4D574246u
#define META_VERSION 1u
#define HEADER_BYTES 128
#define META_ALIGN 4096
#define STATUS_NEGATIVE_LENGTH 1u
#define STATUS_TOTAL_Q_EXCEEDED 2u
#define STATUS_SEQLEN_K_EXCEEDED 4u
#define STATUS_SEQLEN_Q_EXCEEDED 8u

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; } /* a >= 0, b > 0 */
static int64_t align_up(int64_t n, int64_t a) { return ceil_div(n, a) * a; }
static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

typedef struct {
    int64_t sq;    /* seqlen_q (negative for invalid input) */
    int64_t sk;    /* seqlen_k */
    int64_t nc;    /* key blocks, ceil(max(sk, 0) / kN0) */
    int64_t w;     /* unit weight, roundup(max(sq, 1), kM0) */
    int64_t units; /* nhead * nc */
} batch_t;

typedef struct {
    const int32_t *ssq, *ssk;
    int64_t nhead, kM0, kN0;
} shape_t;

static batch_t batch_at(const shape_t *s, int64_t b) {
    batch_t r;
    r.sq = (int64_t)s->ssq[b + 1] - (int64_t)s->ssq[b];
    r.sk = (int64_t)s->ssk[b + 1] - (int64_t)s->ssk[b];
    r.nc = ceil_div(max64(r.sk, 0), s->kN0);
    r.w = ceil_div(max64(r.sq, 1), s->kM0) * s->kM0;
    r.units = (int64_t)((uint64_t)s->nhead * (uint64_t)r.nc); /* wraps only for invalid lengths, never used then */
    return r;
}

/* Workers touching one (batch, head) pair, maximized over the heads, for a batch whose first
 * unit starts at weight S (the kernel's srt_batch_splits; reference.py steps 3-4). */
static int64_t batch_splits(int64_t S, int64_t nc, int64_t w, int64_t q, int64_t nhead) {
    if (nc == 0) return 0;
    if (w >= q) return nc;
    const int64_t L = (nc - 1) * w, base = L / q + 1, s = L % q;
    if (s == 0) return base;
    const int64_t step = (nc * w) % q;
    int64_t r = S % q;
    for (int64_t h = 0; h < nhead; ++h) {
        if (r >= q - s) return base + 1;
        r += step;
        if (r >= q) r -= q;
    }
    return base;
}

/* Units whose starting weight is < x (x >= 0); starts / ustarts: each batch's first unit's
 * weight and index (exclusive prefix sums, non-decreasing). */
static int64_t units_before(int64_t x, const int64_t *starts, const int32_t *ustarts, int64_t batch, const shape_t *s) {
    int64_t lo = 0, hi = batch;
    while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (starts[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return 0;
    const batch_t bk = batch_at(s, lo - 1);
    return (int64_t)ustarts[lo - 1] + min64(bk.units, ceil_div(x - starts[lo - 1], bk.w));
}

static void streamrt_fmha_bwd_pack(void *user_data) {
    const int64_t *a = (const int64_t *)user_data;
    const int64_t B = a[A_BATCH], H = a[A_NHEAD], HD = a[A_HDIM_Q], NCU = a[A_NUM_CUS];
    const int det = a[A_DETERMINISTIC] != 0;
    const shape_t shape = {(const int32_t *)(intptr_t)a[A_SEQSTART_Q], (const int32_t *)(intptr_t)a[A_SEQSTART_K], H,
                           a[A_KM0], a[A_KN0]};
    const shape_t *s = &shape;
    uint8_t *out = (uint8_t *)(intptr_t)a[A_OUT];
    const int64_t nw = det ? NCU : 0;

    const int64_t offsets_off = HEADER_BYTES;
    const int64_t nsplits_off = offsets_off + 8 * (B + 1);
    const int64_t wstart_off = align_up(nsplits_off + 4 * B, 8);
    const int64_t wunits_off = wstart_off + 16 * nw;
    const int64_t metadata_bytes = align_up(wunits_off + 4 * nw, 8);
    const int64_t region_bytes = align_up(metadata_bytes, META_ALIGN);
    const int64_t nsplits_bound = det ? ceil_div(a[A_MAX_SEQLEN_K], a[A_KN0]) : 1;
    const int64_t bound_bytes = 4 * H * nsplits_bound * a[A_TOTAL_Q_PADDED] * HD;
    int64_t *offsets = (int64_t *)(out + offsets_off);
    int32_t *nsplits = (int32_t *)(out + nsplits_off);
    int32_t *wstart = (int32_t *)(out + wstart_off);
    int32_t *wunits = (int32_t *)(out + wunits_off);

    memset(out, 0, (size_t)region_bytes);

    /* Validation, and the total weight W and units U of the deterministic split. Only valid
     * batches are summed (W is used only when every batch is): then sum(units) <= 2**31 by
     * WorkspaceParams' bound and every w <= max_seqlen_q + kM0, so W fits in 63 bits. */
    uint32_t status = 0;
    int64_t W = 0, U = 0;
    for (int64_t b = 0; b < B; ++b) {
        const batch_t bb = batch_at(s, b);
        const uint32_t bad = (bb.sq < 0 || bb.sk < 0 ? STATUS_NEGATIVE_LENGTH : 0) |
                             (bb.sk > a[A_MAX_SEQLEN_K] ? STATUS_SEQLEN_K_EXCEEDED : 0) |
                             (bb.sq > a[A_MAX_SEQLEN_Q] ? STATUS_SEQLEN_Q_EXCEEDED : 0);
        status |= bad;
        if (det && !bad) {
            W += bb.units * bb.w;
            U += bb.units;
        }
    }
    if ((int64_t)s->ssq[B] - (int64_t)s->ssq[0] > a[A_TOTAL_Q_PADDED]) status |= STATUS_TOTAL_Q_EXCEEDED;
    const int ok = status == 0;
    const int split = ok && det && W > 0;
    const int64_t q = split ? ceil_div(W, NCU) : 0;

    /* Workers: worker i takes the units whose starting weight lies in [i*q, (i+1)*q). */
    if (split) {
        int64_t *starts = offsets; /* scratch until the offsets are written below */
        int32_t *ustarts = nsplits;
        int64_t S = 0, G = 0;
        for (int64_t b = 0; b < B; ++b) {
            const batch_t bb = batch_at(s, b);
            starts[b] = S;
            ustarts[b] = (int32_t)G;
            S += bb.units * bb.w;
            G += bb.units;
        }
        for (int64_t i = 0; i < nw; ++i) {
            const int64_t g = units_before(i * q, starts, ustarts, B, s);
            const int64_t n = units_before(i * q + q, starts, ustarts, B, s) - g;
            int32_t *e = wstart + 4 * i;
            e[0] = e[1] = e[2] = e[3] = -1;
            wunits[i] = (int32_t)n;
            if (n == 0) continue;
            int64_t lo = 0, hi = B; /* the batches whose first unit index is <= g */
            while (lo < hi) {
                const int64_t mid = (lo + hi) / 2;
                if ((int64_t)ustarts[mid] <= g) lo = mid + 1;
                else hi = mid;
            }
            const int64_t b = lo - 1;
            const batch_t bb = batch_at(s, b);
            const int64_t k = g - (int64_t)ustarts[b], h = k / bb.nc, j = k % bb.nc;
            e[0] = (int32_t)b;
            e[1] = (int32_t)(bb.w >= q ? j : i - (starts[b] + h * bb.nc * bb.w) / q);
            e[2] = (int32_t)h;
            e[3] = (int32_t)j;
        }
    } else {
        for (int64_t i = 0; i < 4 * nw; ++i) wstart[i] = -1;
    }

    /* nsplits and the offsets (prefix sums of fp32 elements); overwrites the scratch in order. */
    int64_t S = 0, O = 0, nsplits_max = 0;
    offsets[0] = 0;
    for (int64_t b = 0; b < B; ++b) {
        const batch_t bb = batch_at(s, b);
        const int64_t ns = !ok ? 0 : !det ? 1 : split ? batch_splits(S, bb.nc, bb.w, q, H) : 0;
        if (split) S += bb.units * bb.w;
        nsplits[b] = (int32_t)ns;
        nsplits_max = max64(nsplits_max, ns);
        O += H * ns * max64(bb.sq, 0) * HD;
        offsets[b + 1] = O;
    }

    uint32_t *h32 = (uint32_t *)out;
    int64_t *h64 = (int64_t *)out;
    h32[0] = META_MAGIC;
    h32[1] = META_VERSION;
    h32[2] = HEADER_BYTES;
    h32[3] = status;
    h32[4] = (uint32_t)B;
    h32[5] = (uint32_t)H;
    h32[6] = (uint32_t)HD;
    h32[7] = (uint32_t)a[A_KM0];
    h32[8] = (uint32_t)a[A_KN0];
    h32[9] = (uint32_t)nw;
    h32[10] = det ? 1u : 0u;
    h32[11] = (uint32_t)nsplits_max;
    h64[6] = 4 * O;                 /* dq_acc_used_bytes */
    h64[7] = region_bytes;          /* dq_acc_offset_bytes */
    h64[8] = bound_bytes;           /* dq_acc_bound_bytes */
    h64[9] = split ? U : 0;         /* total_units */
    h64[10] = split ? W : 0;        /* total_weight */
    h64[11] = q;                    /* unit_quota */
    h32[24] = (uint32_t)offsets_off;
    h32[25] = (uint32_t)nsplits_off;
    h32[26] = (uint32_t)wstart_off;
    h32[27] = (uint32_t)wunits_off;
    h32[28] = (uint32_t)metadata_bytes;
    h32[29] = (uint32_t)region_bytes;
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
