

/* workbench --values kernels: one pass per chunk, every element examined. */
#include <stdint.h>
#include <string.h>
#include <stdlib.h>

typedef struct {
    int64_t n, nan, pinf, ninf, zeros, have_k;
    double mn, mx, k, s1, s2;
} wb_acc;

#define L 16
#define BLK 4096
#define TINY 0x1p-40  /* max |x - k| outside [TINY, HUGE]: float sums of squares would under- or */
#define HUGE 0x1p56   /* overflow, so the sums are redone in double */
#define REDO(up, lo, k) (((up) - (k) < TINY && (k) - (lo) < TINY) || (up) - (k) > HUGE || (k) - (lo) > HUGE)

static void one(float v, wb_acc *a) {  /* a single element, scalar */
    uint32_t b; memcpy(&b, &v, 4);
    uint32_t e = b & 0x7FFFFFFFu;
    a->n++;
    if (e > 0x7F800000u) { a->nan++; return; }
    if (b == 0x7F800000u) { a->pinf++; return; }
    if (b == 0xFF800000u) { a->ninf++; return; }
    if (!a->have_k) { a->k = v; a->have_k = 1; }
    a->zeros += e == 0;
    if (v < a->mn) a->mn = v;
    if (v > a->mx) a->mx = v;
    double d = (double)v - a->k;
    a->s1 += d; a->s2 += d * d;
}

/* statistics of n float32 values: NaN / +Inf / -Inf counted by kind and left out of
   min / max / sums; sums are of (x - k), k the first finite value seen (no cancellation) */
static void fstats(const float *x, int64_t n, wb_acc *a) {
    int64_t i = 0;
    while (i < n && !a->have_k) one(x[i++], a);
    if (i >= n) return;
    const float k = (float)a->k;
    const double kd = a->k;
    float mn[L], mx[L];
    double s1[L], s2[L];
    int32_t cn[L], cp[L], cm[L], cz[L];  /* callers pass n < 2^31 */
    for (int j = 0; j < L; j++) { mn[j] = k; mx[j] = k; s1[j] = 0; s2[j] = 0; cn[j] = cp[j] = cm[j] = cz[j] = 0; }
    int64_t body = i + (n - i) / L * L, start = i;
    while (i < body) {
        float f1[L], f2[L];  /* float partial sums over at most 64 elements per lane, then double */
        for (int j = 0; j < L; j++) { f1[j] = 0; f2[j] = 0; }
        int64_t stop = i + 64 * L < body ? i + 64 * L : body;
        for (; i < stop; i += L) {
            for (int j = 0; j < L; j++) {
                float v = x[i + j];
                uint32_t b; memcpy(&b, &v, 4);
                uint32_t e = b & 0x7FFFFFFFu;
                int fin = e < 0x7F800000u;
                cn[j] += e > 0x7F800000u;
                cp[j] += b == 0x7F800000u;
                cm[j] += b == 0xFF800000u;
                cz[j] += e == 0;
                float f = fin ? v : k;
                mn[j] = f < mn[j] ? f : mn[j];
                mx[j] = f > mx[j] ? f : mx[j];
                float d = f - k;
                f1[j] += d;
                f2[j] += d * d;
            }
        }
        for (int j = 0; j < L; j++) { s1[j] += f1[j]; s2[j] += f2[j]; }
    }
    a->n += body - start;
    float lo = k, up = k;
    double t1 = 0, t2 = 0;
    for (int j = 0; j < L; j++) {
        a->nan += cn[j]; a->pinf += cp[j]; a->ninf += cm[j]; a->zeros += cz[j];
        if (mn[j] < lo) lo = mn[j];
        if (mx[j] > up) up = mx[j];
        t1 += s1[j]; t2 += s2[j];
    }
    if (REDO((double)up, (double)lo, kd)) {  /* float squares would under- or overflow: redo in double */
        t1 = t2 = 0;
        for (int64_t j = start; j < body; j++) {
            uint32_t b; memcpy(&b, &x[j], 4);
            if ((b & 0x7FFFFFFFu) < 0x7F800000u) { double d = (double)x[j] - kd; t1 += d; t2 += d * d; }
        }
    }
    if (lo < a->mn) a->mn = lo;
    if (up > a->mx) a->mx = up;
    a->s1 += t1; a->s2 += t2;
    for (; i < n; i++) one(x[i], a);
}

void wb_f32(const float *x, int64_t n, wb_acc *a) {
    for (int64_t i = 0; i < n; i += 1 << 30) fstats(x + i, n - i < (1 << 30) ? n - i : (1 << 30), a);
}

void wb_bf16(const uint16_t *u, int64_t n, wb_acc *a) {
    float t[BLK];
    for (int64_t i = 0; i < n; i += BLK) {
        int64_t m = n - i < BLK ? n - i : BLK;
        for (int64_t j = 0; j < m; j++) { uint32_t b = (uint32_t)u[i + j] << 16; memcpy(&t[j], &b, 4); }
        fstats(t, m, a);
    }
}

static inline float bf16_round(float x) {  /* round to nearest even bfloat16 (NaN stays NaN) */
    uint32_t b; memcpy(&b, &x, 4);
    uint32_t r = ((b & 0x7FFFFFFFu) > 0x7F800000u) ? (b | 0x00400000u) : b + 0x7FFFu + ((b >> 16) & 1u);
    r &= 0xFFFF0000u;
    float y; memcpy(&y, &r, 4);
    return y;
}

#ifdef WB_NO_F16  /* compilers without _Float16: float16 scales are refused (wb_affine returns -1) */
static inline float f16_round(float x) { return x; }
static inline float half_to_float(uint16_t h) { (void)h; return 0.0f; }
#else
static inline float f16_round(float x) { return (float)(_Float16)x; }
static inline float half_to_float(uint16_t h) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
#endif

static inline float load_s(const void *p, int64_t i, int sdt) {
    if (sdt == 1) { uint32_t b = (uint32_t)((const uint16_t *)p)[i] << 16; float f; memcpy(&f, &b, 4); return f; }
    if (sdt == 2) return half_to_float(((const uint16_t *)p)[i]);
    return ((const float *)p)[i];
}

static inline float deq(float s, float q, float b, int sdt) {
    if (sdt == 1) return bf16_round(bf16_round(s * q) + b);
    if (sdt == 2) return f16_round(f16_round(s * q) + b);
    return s * q + b;
}

/* one group, element by element: levels table, values appended to t (flushed when full) */
static void group_scalar(const uint32_t *p, float s, float b, int sdt, int bits, int64_t gs, float *t,
                         int64_t *fill, wb_acc *a) {
    const int per = 32 / bits;
    const uint32_t mask = (1u << bits) - 1u;
    const int64_t gw = gs * bits / 32;
    float lv[256];  /* every level's value in this group */
    for (uint32_t q = 0; q <= mask; q++) lv[q] = deq(s, (float)q, b, sdt);
    if (*fill + gs > BLK) { fstats(t, *fill, a); *fill = 0; }
    float *o = t + *fill;
    for (int64_t k = 0; k < gw; k++) {
        uint32_t x = p[k];
        for (int e = 0; e < per; e++) o[k * per + e] = lv[(x >> (e * bits)) & mask];
    }
    *fill += gs;
}

#ifdef __AVX512F__
#include <immintrin.h>
static inline __m512 bf16_round16(__m512 x) {
    __m512i b = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)),
                                 _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1)));
    __mmask16 nan = _mm512_cmp_epi32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7FFFFFFF)),
                                          _mm512_set1_epi32(0x7F800000), _MM_CMPINT_NLE);
    r = _mm512_mask_or_epi32(r, nan, b, _mm512_set1_epi32(0x00400000));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u)));
}

static inline __m512 bf16_round16_finite(__m512 x) {  /* no NaN possible in x */
    __m512i b = _mm512_castps_si512(x);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)),
                                 _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1)));
    return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u)));
}

static inline __m512 f16_round16(__m512 x) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

/* the 16 levels' values of one 4-bit group, as deq computes them */
static inline __m512 levels16(float s, float b, int sdt) {
    const __m512 q = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512 sv = _mm512_set1_ps(s), bv = _mm512_set1_ps(b);
    if (sdt == 1 && __builtin_isfinite(s) && __builtin_isfinite(b))  /* then s * q + b is never NaN */
        return bf16_round16_finite(_mm512_add_ps(bf16_round16_finite(_mm512_mul_ps(sv, q)), bv));
    if (sdt == 1) return bf16_round16(_mm512_add_ps(bf16_round16(_mm512_mul_ps(sv, q)), bv));
    if (sdt == 2) return f16_round16(_mm512_add_ps(f16_round16(_mm512_mul_ps(sv, q)), bv));
    return _mm512_add_ps(_mm512_mul_ps(sv, q), bv);
}

/* 4-bit, group size 64 or a multiple of 128: 16 words (128 values) at a time, each value looked up
   in its group's 16-level table with one permute; groups whose table holds a NaN / Inf level go
   element by element instead.  Returns the number of groups done (a prefix). */
static int64_t affine4_avx512(const uint32_t *w, const void *sc, const void *bi, int sdt, int64_t G, int64_t gs,
                              wb_acc *a, float *t, int64_t *fill) {
    if (gs != 64 && gs % 128) return 0;
    const int64_t gw = gs / 8;  /* words per group */
    const int64_t gpb = gs == 64 ? 2 : 1;  /* groups per 16-word block */
    const int64_t bpg = gs == 64 ? 1 : gs / 128;  /* blocks per group */
    const __m512i m15 = _mm512_set1_epi32(15);
    const __m512i hi = gs == 64 ? _mm512_set_epi32(16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0)
                                : _mm512_setzero_si512();
    __m512 mn = _mm512_set1_ps(__builtin_inff()), mx = _mm512_set1_ps(-__builtin_inff());
    __m512d d1a = _mm512_setzero_pd(), d1b = _mm512_setzero_pd(), d2a = _mm512_setzero_pd(), d2b = _mm512_setzero_pd();
    int64_t zeros = 0, nfast = 0;
    __m512i cz = _mm512_setzero_si512(), cz2 = cz;  /* per-lane zero counts, folded into zeros every group */
    __m512 mn2 = mn, mx2 = mx;
    const __m512i one = _mm512_set1_epi32(1);
    double k = 0;
    int64_t g = 0;
    for (; g + gpb <= G; g += gpb) {
        const __m512 ta = levels16(load_s(sc, g, sdt), load_s(bi, g, sdt), sdt);
        const __m512 tb = gpb == 2 ? levels16(load_s(sc, g + 1, sdt), load_s(bi, g + 1, sdt), sdt) : ta;
        const __m512 inf = _mm512_set1_ps(__builtin_inff());
        if ((__mmask16)(_mm512_cmp_ps_mask(_mm512_abs_ps(ta), inf, _CMP_LT_OQ) &
                        _mm512_cmp_ps_mask(_mm512_abs_ps(tb), inf, _CMP_LT_OQ)) != 0xFFFF) {
            /* a NaN / Inf level: count element by element */
            for (int64_t j = 0; j < gpb; j++)
                group_scalar(w + (g + j) * gw, load_s(sc, g + j, sdt), load_s(bi, g + j, sdt), sdt, 4, gs, t, fill, a);
            continue;
        }
        const __m512 z = _mm512_setzero_ps();
        for (int64_t bl = 0; bl < bpg; bl++) {
            const __m512i x = _mm512_loadu_si512((const void *)(w + g * gw + bl * 16));
            __m512 f1 = _mm512_setzero_ps(), f2 = _mm512_setzero_ps(), g1 = f1, g2 = f2;
            for (int e = 0; e < 8; e += 2) {  /* two independent accumulator chains */
                /* (x >> 4e) & 15 | hi in one ternary-logic op */
                __m512i ia = _mm512_ternarylogic_epi32(_mm512_srli_epi32(x, 4 * e), m15, hi, 0xea);
                __m512i ib = _mm512_ternarylogic_epi32(_mm512_srli_epi32(x, 4 * e + 4), m15, hi, 0xea);
                __m512 v = _mm512_permutex2var_ps(ta, ia, tb), u = _mm512_permutex2var_ps(ta, ib, tb);
                mn = _mm512_min_ps(mn, v);
                mx = _mm512_max_ps(mx, v);
                mn2 = _mm512_min_ps(mn2, u);
                mx2 = _mm512_max_ps(mx2, u);
                cz = _mm512_mask_add_epi32(cz, _mm512_cmp_ps_mask(v, z, _CMP_EQ_OQ), cz, one);
                cz2 = _mm512_mask_add_epi32(cz2, _mm512_cmp_ps_mask(u, z, _CMP_EQ_OQ), cz2, one);
                f1 = _mm512_add_ps(f1, v);  /* sums unshifted; cancellation is checked below */
                f2 = _mm512_fmadd_ps(v, v, f2);
                g1 = _mm512_add_ps(g1, u);
                g2 = _mm512_fmadd_ps(u, u, g2);
            }
            f1 = _mm512_add_ps(f1, g1);
            f2 = _mm512_add_ps(f2, g2);
            d1a = _mm512_add_pd(d1a, _mm512_cvtps_pd(_mm512_castps512_ps256(f1)));
            d1b = _mm512_add_pd(d1b, _mm512_cvtps_pd(_mm512_extractf32x8_ps(f1, 1)));
            d2a = _mm512_add_pd(d2a, _mm512_cvtps_pd(_mm512_castps512_ps256(f2)));
            d2b = _mm512_add_pd(d2b, _mm512_cvtps_pd(_mm512_extractf32x8_ps(f2, 1)));
        }
        nfast += gpb * gs;
        if ((g & 0xFFFF) == 0) {
            zeros += _mm512_reduce_add_epi32(_mm512_add_epi32(cz, cz2));
            cz = cz2 = _mm512_setzero_si512();
        }
    }
    zeros += _mm512_reduce_add_epi32(_mm512_add_epi32(cz, cz2));
    mn = _mm512_min_ps(mn, mn2);
    mx = _mm512_max_ps(mx, mx2);
    if (nfast) {
        double s1 = _mm512_reduce_add_pd(_mm512_add_pd(d1a, d1b)), s2 = _mm512_reduce_add_pd(_mm512_add_pd(d2a, d2b));
        float lo = _mm512_reduce_min_ps(mn), up = _mm512_reduce_max_ps(mx);
        /* float squares would under- or overflow, or the mean dwarfs the spread (cancellation in
           s2 - s1^2 / n): redo the sums in double, shifted by the mid-range */
        if (REDO((double)up, (double)lo, 0.0) || !(s2 - s1 * s1 / (double)nfast >= 1e-3 * s2)) {
            k = 0.5 * ((double)lo + (double)up);
            float lv[16];
            s1 = s2 = 0;
            for (int64_t h = 0; h < g; h++) {
                _mm512_storeu_ps(lv, levels16(load_s(sc, h, sdt), load_s(bi, h, sdt), sdt));
                int fin = 1;
                for (int q = 0; q < 16; q++) fin &= __builtin_isfinite(lv[q]);
                if (!fin) continue;  /* done element by element above */
                for (int64_t i = 0; i < gw; i++)
                    for (int e = 0; e < 8; e++) {
                        double d = (double)lv[(w[h * gw + i] >> (4 * e)) & 15u] - k;
                        s1 += d; s2 += d * d;
                    }
            }
        }
        /* re-base the shifted sums onto the accumulator's k */
        if (!a->have_k) { a->k = k; a->have_k = 1; }
        double c = k - a->k;  /* sum (v - ak) = sum (v - k) + n c */
        a->s2 += s2 + 2 * c * s1 + (double)nfast * c * c;
        a->s1 += s1 + (double)nfast * c;
        a->n += nfast;
        a->zeros += zeros;
        if (lo < a->mn) a->mn = lo;
        if (up > a->mx) a->mx = up;
    }
    return g;
}
#endif

/* affine dequantization as mx.dequantize computes it: (scale * q), then + bias, each result
   rounded to the scales' dtype (sdt: 0 float32, 1 bfloat16, 2 float16); bits 2, 4 or 8,
   values packed from the low bits of each uint32; groups laid out one after another.
   Returns -1 for a layout it does not handle. */
int wb_affine(const uint32_t *w, const void *sc, const void *bi, int sdt, int64_t rows, int64_t words,
              int bits, int64_t gs, wb_acc *a) {
    if (bits != 2 && bits != 4 && bits != 8) return -1;
#ifdef WB_NO_F16
    if (sdt == 2) return -1;
#endif
    const int per = 32 / bits;
    const int64_t vals = words * per;
    if (gs <= 0 || vals % gs || gs > BLK || (gs * bits) % 32) return -1;
    const int64_t G = rows * (vals / gs), gw = gs * bits / 32;
    float t[BLK];
    int64_t fill = 0, g = 0;
#ifdef __AVX512F__
    if (bits == 4 && !getenv("WB_SCALAR")) g = affine4_avx512(w, sc, bi, sdt, G, gs, a, t, &fill);
#endif
    for (; g < G; g++) group_scalar(w + g * gw, load_s(sc, g, sdt), load_s(bi, g, sdt), sdt, bits, gs, t, &fill, a);
    if (fill) fstats(t, fill, a);
    return 0;
}
