/* Image kernels and the fused per-item pipeline; see image.h. */
#include "image.h"

#include "augment.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FL_BITS  14 /* fixed-point fraction bits of the filter weights */
#define FL_ONE   (1 << FL_BITS)
#define FL_HALF  (1 << (FL_BITS - 1))
#define FL_ALIGN 64
#define FL_CHUNK 32 /* values of a row summed at once */
#define FL_BLOCK 16 /* rows resampled per block of the two passes (see store_pixels) */
#define FL_PAD   1  /* spare bytes after each row of a block (see store_pixels) */

/* The hot loops get an AVX2 clone, picked at load time on CPUs that have it. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define FL_HOT __attribute__((target_clones("avx2", "default")))
#define FL_X86_AVX2
#include <immintrin.h>
static int fl_has_avx2; /* the CPU has AVX2, and fl_set_simd did not turn it off */
__attribute__((constructor)) static void fl_detect_avx2(void) {
    __builtin_cpu_init(); /* constructors may run before the compiler's own detection */
    fl_has_avx2 = __builtin_cpu_supports("avx2");
}
#else
#define FL_HOT
#endif

static size_t align_up(size_t n) { return (n + FL_ALIGN - 1) & ~(size_t)(FL_ALIGN - 1); }
static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

static int image_ok(const fl_image *im) {
    return im && im->data && im->h > 0 && im->w > 0 && im->c >= 1 && im->c <= 4 &&
        im->stride >= (ptrdiff_t)im->w * im->c;
}

/* ---- resampling --------------------------------------------------------------------
 * Output pixel i of an axis resampled from [b0, b1) (source pixels, fractional) to n_virt
 * pixels sits at b0 + (i + 0.5) * scale. Its weights are a triangle of half-width
 * max(scale, 1) (PIL's antialiased BILINEAR), clamped to the source pixels [lo, hi),
 * normalized, and quantized so that they sum to exactly FL_ONE (flat stays flat). */

typedef struct {
    int n, k;
    int32_t *start, *count;
    int16_t *coef;
} axis_tab;

static int axis_taps(double extent, int n_virt) {
    double support = extent / n_virt;
    if (support < 1.0) support = 1.0;
    return (int)ceil(support) * 2 + 1;
}

static double triangle(double x) {
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

static void axis_fill(axis_tab *t, double b0, double b1, int lo, int hi, int n_virt, int o0) {
    double scale = (b1 - b0) / n_virt;
    double support = scale > 1.0 ? scale : 1.0, inv = 1.0 / support;
    for (int i = 0; i < t->n; i++) {
        double center = b0 + (o0 + i + 0.5) * scale;
        int first = imax((int)floor(center - support + 0.5), lo);
        int last = imin((int)floor(center + support + 0.5), hi);
        int cnt = imin(last - first, t->k);
        int16_t *q = t->coef + (size_t)i * t->k;
        double sum = 0.0;
        for (int j = 0; j < cnt; j++) sum += triangle((first + j - center + 0.5) * inv);
        if (cnt <= 0 || sum <= 0.0) { /* degenerate support: nearest pixel */
            t->start[i] = imin(imax((int)floor(center), lo), hi - 1);
            t->count[i] = 1;
            q[0] = FL_ONE;
            continue;
        }
        int total = 0, big = 0;
        for (int j = 0; j < cnt; j++) {
            q[j] = (int16_t)floor(triangle((first + j - center + 0.5) * inv) / sum * FL_ONE + 0.5);
            total += q[j];
            if (q[j] > q[big]) big = j;
        }
        q[big] = (int16_t)(q[big] + FL_ONE - total);
        t->start[i] = first;
        t->count[i] = cnt;
    }
}

/* out[i] = (rounding + sum_j q[j] * rows[first + j][i]) >> FL_BITS for i < len: whole
 * rows at a time, a chunk of each in registers. The weights are non-negative and sum to
 * FL_ONE, so each result is a byte. Both passes are this sum; each stores its result
 * transposed. `done` values were summed already (by the AVX2 kernel below). */
FL_HOT static void weighted_rows_from(const uint8_t *top, size_t stride, int cnt,
                                      const int16_t *restrict q, size_t done, size_t len,
                                      uint8_t *restrict out) {
    size_t i = done;
    for (; i + FL_CHUNK <= len; i += FL_CHUNK) {
        int32_t acc[FL_CHUNK];
        for (int k = 0; k < FL_CHUNK; k++) acc[k] = FL_HALF;
        for (int j = 0; j < cnt; j++) {
            const uint8_t *restrict s = top + (size_t)j * stride + i;
            const int32_t w = q[j];
            for (int k = 0; k < FL_CHUNK; k++) acc[k] += w * s[k];
        }
        for (int k = 0; k < FL_CHUNK; k++) out[i + k] = (uint8_t)(acc[k] >> FL_BITS);
    }
    for (; i < len; i++) {
        int32_t acc = FL_HALF;
        for (int j = 0; j < cnt; j++) acc += q[j] * top[(size_t)j * stride + i];
        out[i] = (uint8_t)(acc >> FL_BITS);
    }
}

#ifdef FL_X86_AVX2
/* The same sums 16 values at a time, two rows per multiply: the bytes of rows j and j + 1
 * interleaved as 16-bit pairs, times the pair of weights (q[j], q[j + 1]), summed into 32
 * bits by one madd, exactly as the scalar sum. Returns how many values it did. */
__attribute__((target("avx2"))) static size_t weighted_rows_avx2(const uint8_t *top, size_t stride,
                                                                 int cnt, const int16_t *q,
                                                                 size_t len, uint8_t *out) {
    const __m256i half = _mm256_set1_epi32(FL_HALF), zero = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 16 <= len; i += 16) {
        __m256i lo = half, hi = half;
        for (int j = 0; j < cnt; j += 2) {
            const uint8_t *s = top + (size_t)j * stride + i;
            __m256i a = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)s));
            __m256i b = zero;
            uint32_t w1 = 0;
            if (j + 1 < cnt) {
                b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(s + stride)));
                w1 = (uint16_t)q[j + 1];
            }
            __m256i w = _mm256_set1_epi32((int)((uint16_t)q[j] | (w1 << 16)));
            lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), w));
            hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), w));
        }
        /* Each 128-bit lane holds values 0-3 (lo) and 4-7 (hi) of its 8: packing lane by
         * lane puts them back in order. */
        __m256i words =
            _mm256_packs_epi32(_mm256_srai_epi32(lo, FL_BITS), _mm256_srai_epi32(hi, FL_BITS));
        __m256i bytes = _mm256_permute4x64_epi64(_mm256_packus_epi16(words, words), 0x08);
        _mm_storeu_si128((__m128i *)(out + i), _mm256_castsi256_si128(bytes));
    }
    return i;
}
#endif

static void weighted_rows(const uint8_t *rows, size_t stride, int first, int cnt,
                          const int16_t *restrict q, size_t len, uint8_t *restrict out) {
    const uint8_t *top = rows + (size_t)first * stride;
    size_t done = 0;
#ifdef FL_X86_AVX2
    if (fl_has_avx2) done = weighted_rows_avx2(top, stride, cnt, q, len, out);
#endif
    weighted_rows_from(top, stride, cnt, q, done, len, out);
}

int fl_set_simd(int on) {
#ifdef FL_X86_AVX2
    int was = fl_has_avx2;
    fl_has_avx2 = on && __builtin_cpu_supports("avx2");
    return was;
#else
    (void)on;
    return 0;
#endif
}

/* Rows b < nb of bytes (`len` apart, each n pixels of C channels, with FL_PAD bytes of
 * room after each row's last pixel) stored transposed: pixel p of row b goes to
 * d + p * step + col(b) * C, col(b) = b, or nb - 1 - b when mirrored. A block of rows at
 * once writes nb pixels side by side, so each cache line of the transposed image is
 * touched once per block rather than once per row. A pixel of 3 channels moves as a word
 * of 4 bytes, written in the order of its column so that each word's last byte is
 * rewritten by the next; the last column's pixel moves as 3 bytes. */
static inline void store_pixels(const uint8_t *restrict rows, size_t len, int nb, int n,
                                const int C, uint8_t *restrict d, size_t step, int mirror) {
    for (int p = 0; p < n; p++, d += step) {
        const uint8_t *s = rows + (size_t)p * C;
        for (int k = 0; k < nb; k++) {
            int b = mirror ? nb - 1 - k : k;
            const uint8_t *from = s + (size_t)b * len;
            uint8_t *to = d + (size_t)k * C;
            if (C == 3 && k < nb - 1) {
                uint32_t word;
                memcpy(&word, from, 4);
                memcpy(to, &word, 4);
            } else {
                memcpy(to, from, (size_t)C);
            }
        }
    }
}

static void store_transposed(const uint8_t *rows, size_t len, int nb, int n, int c, uint8_t *d,
                             size_t step, int mirror) {
    if (c == 3 && nb == FL_BLOCK) { /* the common case, unrolled */
        if (mirror)
            store_pixels(rows, len, FL_BLOCK, n, 3, d, step, 1);
        else
            store_pixels(rows, len, FL_BLOCK, n, 3, d, step, 0);
        return;
    }
    switch (c) {
    case 1: store_pixels(rows, len, nb, n, 1, d, step, mirror); break;
    case 2: store_pixels(rows, len, nb, n, 2, d, step, mirror); break;
    case 3: store_pixels(rows, len, nb, n, 3, d, step, mirror); break;
    default: store_pixels(rows, len, nb, n, 4, d, step, mirror); break;
    }
}

/* A resampling job: box [x0,x1)x[y0,y1) of src (clamped to pixels [rx0,rx1)x[ry0,ry1))
 * to a virtual vh x vw image, of which the window at (wy, wx) of dst's size is written. */
typedef struct {
    double x0, y0, x1, y1;
    int rx0, ry0, rx1, ry1;
    int vh, vw, wy, wx;
} resample_job;

typedef struct {
    size_t xs, xc, ys, yc, tmp, rows, total;
} resample_layout;

static resample_layout layout_for(int oh, int ow, int kx, int ky, int cols, int c) {
    resample_layout L;
    size_t off = 0;
    L.xs = off;
    off += align_up(sizeof(int32_t) * 2 * (size_t)ow);
    L.xc = off;
    off += align_up(sizeof(int16_t) * (size_t)ow * kx);
    L.ys = off;
    off += align_up(sizeof(int32_t) * 2 * (size_t)oh);
    L.yc = off;
    off += align_up(sizeof(int16_t) * (size_t)oh * ky);
    L.tmp = off;
    off += align_up((size_t)cols * oh * c);
    L.rows = off; /* FL_BLOCK rows of bytes, each with FL_PAD spare bytes */
    off += align_up(((size_t)imax(cols, oh) * c + FL_PAD) * FL_BLOCK);
    L.total = off + FL_ALIGN; /* room to align the scratch pointer itself */
    return L;
}

static uint8_t *aligned(void *p) {
    uintptr_t u = (uintptr_t)p;
    return (uint8_t *)((u + FL_ALIGN - 1) & ~(uintptr_t)(FL_ALIGN - 1));
}

static size_t resample_bytes(const resample_job *j, int oh, int ow, int c) {
    int kx = axis_taps(j->x1 - j->x0, j->vw), ky = axis_taps(j->y1 - j->y0, j->vh);
    return layout_for(oh, ow, kx, ky, j->rx1 - j->rx0, c).total;
}

static int resample(const fl_image *src, const resample_job *j, fl_image *dst, int mirror,
                    void *scratch, size_t scratch_bytes) {
    int oh = dst->h, ow = dst->w, c = src->c;
    int kx = axis_taps(j->x1 - j->x0, j->vw), ky = axis_taps(j->y1 - j->y0, j->vh);
    resample_layout L = layout_for(oh, ow, kx, ky, j->rx1 - j->rx0, c);
    if (!scratch || scratch_bytes < L.total) return FL_ESCRATCH;
    uint8_t *base = aligned(scratch);
    axis_tab tx = {ow, kx, (int32_t *)(base + L.xs), (int32_t *)(base + L.xs) + ow,
                   (int16_t *)(base + L.xc)};
    axis_tab ty = {oh, ky, (int32_t *)(base + L.ys), (int32_t *)(base + L.ys) + oh,
                   (int16_t *)(base + L.yc)};
    axis_fill(&tx, j->x0, j->x1, j->rx0, j->rx1, j->vw, j->wx);
    axis_fill(&ty, j->y0, j->y1, j->ry0, j->ry1, j->vh, j->wy);
    /* Vertical pass over the source columns that some output column reads, stored
     * transposed (column-major) so that the horizontal pass also sums whole rows. */
    int col_lo = tx.start[0], col_hi = tx.start[ow - 1] + tx.count[ow - 1];
    int cols = col_hi - col_lo;
    size_t tstride = (size_t)oh * c;
    uint8_t *tmp = base + L.tmp;
    uint8_t *rows = base + L.rows;
    size_t vlen = (size_t)cols * c;
    for (int i = 0; i < oh; i += FL_BLOCK) {
        int nb = imin(FL_BLOCK, oh - i);
        for (int b = 0; b < nb; b++)
            weighted_rows(src->data + (size_t)col_lo * c, (size_t)src->stride, ty.start[i + b],
                          ty.count[i + b], ty.coef + (size_t)(i + b) * ky, vlen,
                          rows + b * (vlen + FL_PAD));
        store_transposed(rows, vlen + FL_PAD, nb, cols, c, tmp + (size_t)i * c, tstride, 0);
    }
    /* Output column i goes to column ow - 1 - i when mirrored: the flip costs nothing. */
    for (int i = 0; i < ow; i += FL_BLOCK) {
        int nb = imin(FL_BLOCK, ow - i);
        for (int b = 0; b < nb; b++)
            weighted_rows(tmp, tstride, tx.start[i + b] - col_lo, tx.count[i + b],
                          tx.coef + (size_t)(i + b) * kx, tstride, rows + b * (tstride + FL_PAD));
        int first = mirror ? ow - i - nb : i;
        store_transposed(rows, tstride + FL_PAD, nb, oh, c, dst->data + (size_t)first * c,
                         (size_t)dst->stride, mirror);
    }
    return FL_OK;
}

static resample_job whole_image_job(int h, int w, int dh, int dw) {
    resample_job j = {0.0, 0.0, (double)w, (double)h, 0, 0, w, h, dh, dw, 0, 0};
    return j;
}

size_t fl_resize_scratch_bytes(int sh, int sw, int dh, int dw, int c) {
    if (sh <= 0 || sw <= 0 || dh <= 0 || dw <= 0 || c < 1 || c > 4) return 0;
    resample_job j = whole_image_job(sh, sw, dh, dw);
    return resample_bytes(&j, dh, dw, c);
}

int fl_resize(const fl_image *src, fl_image *dst, void *scratch, size_t scratch_bytes) {
    if (!image_ok(src) || !image_ok(dst) || src->c != dst->c) return FL_EINVAL;
    resample_job j = whole_image_job(src->h, src->w, dst->h, dst->w);
    return resample(src, &j, dst, 0, scratch, scratch_bytes);
}

/* ---- area shrink --------------------------------------------------------------------- */

/* In units of 1/m of an input line, output line j of m covers [j*n, (j+1)*n) of n input
 * lines: every edge is an integer. Its sum, times m, is m times the lines from lo[j] (the
 * one its window starts in) up to lo[j+1] (the one the next window starts in), less
 * head[j]/m of line lo[j] (the part before the window), plus head[j+1]/m of line lo[j+1]
 * (the part of the next window's first line inside it): a line past the last is read as
 * the last, with a weight of 0. Whole lines sum in T, the weights in int64. */
static void area_edges(int n, int m, int32_t *lo, int64_t *head) {
    for (int j = 0; j <= m; j++) {
        int64_t a = (int64_t)j * n;
        lo[j] = (int32_t)(a / m);
        head[j] = a % m;
    }
}

/* The first pass: each output row's weighted sum of source rows (`len` uint8 values,
 * `step` apart) times m, as `len` values of T, `len` apart in `out`. T is int32 where
 * every partial sum fits in it (below 3 * 255 * n: see fl_resize_area), int64 beyond. */
#define AREA_ROWS(T)                                                                               \
    static void area_rows_##T(const uint8_t *in, ptrdiff_t step, int n, int m, int64_t len,        \
                              const int32_t *lo, const int64_t *head, T *out) {                    \
        for (int j = 0; j < m; j++) {                                                              \
            T *o = out + (int64_t)j * len;                                                         \
            for (int64_t k = 0; k < len; k++) o[k] = 0;                                            \
            for (int r = lo[j]; r < lo[j + 1]; r++) {                                              \
                const uint8_t *line = in + (ptrdiff_t)r * step;                                    \
                for (int64_t k = 0; k < len; k++) o[k] += line[k];                                 \
            }                                                                                      \
            const uint8_t *first = in + (ptrdiff_t)(lo[j] < n ? lo[j] : n - 1) * step;             \
            const uint8_t *next = in + (ptrdiff_t)(lo[j + 1] < n ? lo[j + 1] : n - 1) * step;      \
            T mm = (T)m, head0 = (T)head[j], tail = (T)head[j + 1];                                \
            for (int64_t k = 0; k < len; k++)                                                      \
                o[k] = o[k] * mm + tail * (T)next[k] - head0 * (T)first[k];                        \
        }                                                                                          \
    }
AREA_ROWS(int32_t)
AREA_ROWS(int64_t)
#undef AREA_ROWS

/* round(v / area), halves up, for 0 <= v <= 255 * area: a double's quotient is within one
 * of it (area < 2^52), and the integer products settle which. */
static inline uint8_t area_mean(int64_t v, int64_t area, double inv) {
    int64_t num = 2 * v + area, den = 2 * area;
    int64_t q = (int64_t)((double)num * inv);
    if (q * den > num)
        q--;
    else if ((q + 1) * den <= num)
        q++;
    return (uint8_t)q;
}

/* The second pass over one row of the first's sums (sw pixels of `stride` values of T):
 * channels [0, c) of dw pixels, each the weighted sum of the columns its window covers,
 * divided by `area`. Inlined with constants per channel count, so the loops unroll. */
#define AREA_COLS(T)                                                                               \
    static inline void area_cols_##T(const T *row, int sw, int dw, const int c, const int stride,  \
                                     const int32_t *lo, const int64_t *head, int64_t area,         \
                                     double inv, uint8_t *out) {                                   \
        for (int j = 0; j < dw; j++) {                                                             \
            int64_t s[4] = {0, 0, 0, 0};                                                           \
            for (int x = lo[j]; x < lo[j + 1]; x++)                                                \
                for (int ch = 0; ch < c; ch++) s[ch] += row[(ptrdiff_t)x * stride + ch];           \
            const T *first = row + (ptrdiff_t)(lo[j] < sw ? lo[j] : sw - 1) * stride;              \
            const T *next = row + (ptrdiff_t)(lo[j + 1] < sw ? lo[j + 1] : sw - 1) * stride;       \
            for (int ch = 0; ch < c; ch++) {                                                       \
                int64_t v = s[ch] * dw + head[j + 1] * next[ch] - head[j] * first[ch];             \
                out[(ptrdiff_t)j * stride + ch] = area_mean(v, area, inv);                         \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    static void area_pass_##T(const T *rows, fl_image *dst, int sw, const int32_t *lo,             \
                              const int64_t *head, int64_t area) {                                 \
        double inv = 1.0 / (2.0 * (double)area);                                                   \
        int dh = dst->h, dw = dst->w, c = dst->c;                                                  \
        for (int y = 0; y < dh; y++) {                                                             \
            const T *row = rows + (size_t)y * sw * c;                                              \
            uint8_t *out = dst->data + (ptrdiff_t)y * dst->stride;                                 \
            switch (c) {                                                                           \
            case 1: area_cols_##T(row, sw, dw, 1, 1, lo, head, area, inv, out); break;             \
            case 3: area_cols_##T(row, sw, dw, 3, 3, lo, head, area, inv, out); break;             \
            case 4: area_cols_##T(row, sw, dw, 4, 4, lo, head, area, inv, out); break;             \
            default: /* a channel at a time */                                                     \
                for (int ch = 0; ch < c; ch++)                                                     \
                    area_cols_##T(row + ch, sw, dw, 1, c, lo, head, area, inv, out + ch);          \
            }                                                                                      \
        }                                                                                          \
    }
AREA_COLS(int32_t)
AREA_COLS(int64_t)
#undef AREA_COLS

/* A first-pass value is at most 255 * (n + 2m) <= 765 * sh before its head is taken off:
 * int32 holds it for any image below 2.8 million rows, int64 beyond. */
static int area_sums_in_int32(int sh) { return 765 * (int64_t)sh <= INT32_MAX; }

/* The edges of both passes (their int64 heads, then their int32 starts), in whole int64s. */
static size_t area_edge_words(int dh, int dw) { return ((size_t)dh + dw + 2) * 3 / 2 + 1; }

size_t fl_resize_area_scratch_bytes(int sh, int sw, int dh, int dw, int c) {
    if (sh < 1 || sw < 1 || dh < 1 || dw < 1 || c < 1 || dh > sh || dw > sw) return 0;
    if ((int64_t)sh * sw > ((int64_t)1 << 52)) return 0;
    /* the edges, then the first pass's sums (dh x sw x c) */
    size_t sum = area_sums_in_int32(sh) ? sizeof(int32_t) : sizeof(int64_t);
    return sizeof(int64_t) * area_edge_words(dh, dw) + sum * (size_t)dh * sw * c;
}

int fl_resize_area(const fl_image *src, fl_image *dst, void *scratch, size_t scratch_bytes) {
    if (!image_ok(src) || !image_ok(dst) || src->c != dst->c) return FL_EINVAL;
    int sh = src->h, sw = src->w, dh = dst->h, dw = dst->w, c = src->c;
    size_t need = fl_resize_area_scratch_bytes(sh, sw, dh, dw, c);
    if (need == 0) return FL_EINVAL;
    if (scratch_bytes < need) return FL_ESCRATCH;
    int64_t *row_head = scratch, *col_head = row_head + dh + 1;
    int32_t *row_lo = (int32_t *)(col_head + dw + 1), *col_lo = row_lo + dh + 1;
    void *sums = (int64_t *)scratch + area_edge_words(dh, dw);
    area_edges(sh, dh, row_lo, row_head);
    area_edges(sw, dw, col_lo, col_head);
    int64_t len = (int64_t)sw * c, area = (int64_t)sh * sw;
    if (area_sums_in_int32(sh)) {
        area_rows_int32_t(src->data, src->stride, sh, dh, len, row_lo, row_head, sums);
        area_pass_int32_t(sums, dst, sw, col_lo, col_head, area);
    } else {
        area_rows_int64_t(src->data, src->stride, sh, dh, len, row_lo, row_head, sums);
        area_pass_int64_t(sums, dst, sw, col_lo, col_head, area);
    }
    return FL_OK;
}

/* ---- pixel kernels ----------------------------------------------------------------- */

/* One row mirrored in place; inlined with a constant `c` per channel count below, so the
 * pixel swap compiles to a few moves instead of a loop over channels. */
static inline void flip_row(uint8_t *row, int w, const int c) {
    for (int a = 0, b = w - 1; a < b; a++, b--)
        for (int ch = 0; ch < c; ch++) {
            uint8_t t = row[a * c + ch];
            row[a * c + ch] = row[b * c + ch];
            row[b * c + ch] = t;
        }
}

void fl_flip_horizontal(fl_image *img) {
    for (int y = 0; y < img->h; y++) {
        uint8_t *row = img->data + y * img->stride;
        switch (img->c) {
        case 1: flip_row(row, img->w, 1); break;
        case 3: flip_row(row, img->w, 3); break;
        case 4: flip_row(row, img->w, 4); break;
        default: flip_row(row, img->w, img->c); break;
        }
    }
}

/* A table per channel, computed in double, gives each float32 output correctly rounded. */
void fl_normalize_u8(const fl_image *src, float *dst, const float *mean, const float *std,
                     int chw) {
    float lut[4][256];
    int c = src->c, h = src->h, w = src->w;
    for (int ch = 0; ch < c; ch++)
        for (int v = 0; v < 256; v++)
            lut[ch][v] = (float)((v / 255.0 - (double)mean[ch]) / (double)std[ch]);
    if (!chw) {
        for (int y = 0; y < h; y++) {
            const uint8_t *row = src->data + y * src->stride;
            float *o = dst + (size_t)y * w * c;
            for (int x = 0; x < w; x++)
                for (int ch = 0; ch < c; ch++) o[x * c + ch] = lut[ch][row[x * c + ch]];
        }
        return;
    }
    /* Channels first: one plane at a time, so that the writes are sequential. */
    for (int ch = 0; ch < c; ch++) {
        const float *t = lut[ch];
        float *o = dst + (size_t)ch * h * w;
        for (int y = 0; y < h; y++, o += w) {
            const uint8_t *row = src->data + y * src->stride + ch;
            for (int x = 0; x < w; x++) o[x] = t[row[x * c]];
        }
    }
}

static void to_chw_u8(const fl_image *src, uint8_t *dst) {
    size_t plane = (size_t)src->h * src->w;
    for (int y = 0; y < src->h; y++) {
        const uint8_t *row = src->data + y * src->stride;
        for (int x = 0; x < src->w; x++)
            for (int ch = 0; ch < src->c; ch++)
                dst[ch * plane + (size_t)y * src->w + x] = row[x * src->c + ch];
    }
}

int fl_convert_channels(const fl_image *src, fl_image *dst) {
    if (!image_ok(src) || !image_ok(dst) || src->h != dst->h || src->w != dst->w || src->c == 2 ||
        dst->c == 2)
        return FL_EINVAL;
    int sc = src->c, dc = dst->c;
    for (int y = 0; y < src->h; y++) {
        const uint8_t *s = src->data + y * src->stride;
        uint8_t *d = dst->data + y * dst->stride;
        for (int x = 0; x < src->w; x++, s += sc, d += dc) {
            uint8_t r = s[0], g = sc >= 3 ? s[1] : s[0], b = sc >= 3 ? s[2] : s[0];
            if (dc == 1) {
                d[0] = sc == 1 ? r : (uint8_t)((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16);
            } else {
                d[0] = r;
                d[1] = g;
                d[2] = b;
                if (dc == 4) d[3] = sc == 4 ? s[3] : 255;
            }
        }
    }
    return FL_OK;
}

/* ---- crop parameters --------------------------------------------------------------- */

int fl_rrc_params(fl_rng *rng, int h, int w, double scale_lo, double scale_hi, double ratio_lo,
                  double ratio_hi, int *y, int *x, int *ch, int *cw) {
    if (h <= 0 || w <= 0 || !(scale_lo > 0.0) || scale_lo > scale_hi || !(ratio_lo > 0.0) ||
        ratio_lo > ratio_hi)
        return FL_EINVAL;
    double area = (double)h * w, log_lo = log(ratio_lo), log_hi = log(ratio_hi);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * (scale_lo + (scale_hi - scale_lo) * fl_rng_uniform(rng));
        double aspect = exp(log_lo + (log_hi - log_lo) * fl_rng_uniform(rng));
        /* Compared before the conversion: an extreme ratio gives sides beyond any int. */
        double fw = rint(sqrt(target * aspect)), fh = rint(sqrt(target / aspect));
        if (fw > 0 && fw <= w && fh > 0 && fh <= h) {
            int th = (int)fh, tw = (int)fw;
            *y = (int)fl_rng_below(rng, (uint64_t)(h - th + 1));
            *x = (int)fl_rng_below(rng, (uint64_t)(w - tw + 1));
            *ch = th;
            *cw = tw;
            return FL_OK;
        }
    }
    /* torchvision's fallback: the whole image, cut to the nearest allowed aspect ratio.
     * A crop is at least 1 x 1 (an extreme ratio would round a side to 0 pixels). */
    double in_ratio = (double)w / h;
    int th = h, tw = w;
    if (in_ratio < ratio_lo)
        th = imax(1, (int)rint(w / ratio_lo));
    else if (in_ratio > ratio_hi)
        tw = imax(1, (int)rint(h * ratio_hi));
    *y = (h - th) / 2;
    *x = (w - tw) / 2;
    *ch = th;
    *cw = tw;
    return FL_OK;
}

static int center_offset(int size, int target) {
    if (target > size) return -((target - size) / 2);
    return (int)rint((size - target) / 2.0);
}

void fl_center_crop_params(int h, int w, int th, int tw, int *y, int *x) {
    *y = center_offset(h, th);
    *x = center_offset(w, tw);
}

int fl_random_crop_params(fl_rng *rng, int h, int w, int th, int tw, int padding, int *y, int *x) {
    if (th <= 0 || tw <= 0 || padding < 0 || h < 0 || w < 0) return FL_EINVAL;
    /* In 64 bits: a padding near INT_MAX must not overflow before it is compared. */
    int64_t ph = (int64_t)h + 2 * (int64_t)padding, pw = (int64_t)w + 2 * (int64_t)padding;
    if (ph < th || pw < tw) return FL_ETOOSMALL;
    if (ph > INT_MAX || pw > INT_MAX) return FL_ELIMIT;
    *y = (int)fl_rng_below(rng, (uint64_t)(ph - th + 1)) - padding;
    *x = (int)fl_rng_below(rng, (uint64_t)(pw - tw + 1)) - padding;
    return FL_OK;
}

/* ---- pipeline ---------------------------------------------------------------------- */

/* Where one item's pixels come from, decided from the source size and the key alone. */
typedef struct {
    int resize;     /* resampling happens */
    int crop_first; /* the crop rect is in source pixels and is resampled */
    int pad_first;  /* ... and reaches outside the source: materialize it first */
    int vh, vw;     /* virtual image: after the resize (source size when none) */
    fl_rect rect;   /* crop_first: in source pixels; else: window on the virtual image */
    int flip;
    uint64_t seed, epoch, index; /* the key, for the draws of the colour ops and erasing */
} geometry;

static void resize_target(const fl_pipeline *p, int h, int w, int *th, int *tw) {
    if (p->resize_kind == FL_RESIZE_EXACT) {
        *th = p->resize_h;
        *tw = p->resize_w;
    } else if (p->resize_kind == FL_RESIZE_SHORTER) {
        /* Clamped so that an absurd aspect ratio cannot overflow an int; such an output
         * is rejected by any caller with a fixed output size. */
        int s = p->resize_h;
        double longer = (double)s * (w <= h ? h : w) / (w <= h ? w : h);
        int l = longer > (double)FL_MAX_SIDE ? FL_MAX_SIDE : (int)longer;
        if (w <= h) {
            *tw = s;
            *th = l;
        } else {
            *th = s;
            *tw = l;
        }
    } else {
        *th = h;
        *tw = w;
    }
}

static int crop_rect(const fl_pipeline *p, int h, int w, fl_rng *rng, fl_rect *r) {
    r->h = p->crop_h;
    r->w = p->crop_w;
    switch (p->crop_kind) {
    case FL_CROP_CENTER: fl_center_crop_params(h, w, r->h, r->w, &r->y, &r->x); return FL_OK;
    case FL_CROP_RANDOM:
        return fl_random_crop_params(rng, h, w, r->h, r->w, p->crop_padding, &r->y, &r->x);
    case FL_CROP_RANDOM_RESIZED:
        return fl_rrc_params(rng, h, w, p->scale_lo, p->scale_hi, p->ratio_lo, p->ratio_hi, &r->y,
                             &r->x, &r->h, &r->w);
    default:
        r->y = r->x = 0;
        r->h = h;
        r->w = w;
        return FL_OK;
    }
}

static int pipeline_ok(const fl_pipeline *p) {
    if (!p || p->channels < 0 || p->channels > 4 || p->channels == 2) return 0;
    if (p->crop_kind < FL_CROP_NONE || p->crop_kind > FL_CROP_RANDOM_RESIZED) return 0;
    if (p->crop_kind != FL_CROP_NONE && (p->crop_h <= 0 || p->crop_w <= 0)) return 0;
    if (p->resize_kind < FL_RESIZE_NONE || p->resize_kind > FL_RESIZE_EXACT) return 0;
    if (p->resize_kind != FL_RESIZE_NONE && p->resize_h <= 0) return 0;
    if (p->resize_kind == FL_RESIZE_EXACT && p->resize_w <= 0) return 0;
    if (p->crop_kind == FL_CROP_RANDOM_RESIZED && p->resize_kind != FL_RESIZE_NONE) return 0;
    if (!fl_pixel_ops_ok(p->pixel_ops, p->n_pixel_ops)) return 0;
    if (p->erase && !fl_erasing_ok(&p->erasing)) return 0;
    return p->out_dtype == (p->normalize ? FL_DTYPE_FLOAT32 : FL_DTYPE_UINT8);
}

static int plan_geometry(const fl_pipeline *p, int h, int w, uint64_t seed, uint64_t epoch,
                         uint64_t index, geometry *g) {
    if (!pipeline_ok(p) || h <= 0 || w <= 0) return FL_EINVAL;
    fl_rng rng = fl_rng_for(seed, epoch, index, (uint64_t)p->crop_op);
    int err;
    memset(g, 0, sizeof *g);
    g->seed = seed;
    g->epoch = epoch;
    g->index = index;
    if (p->crop_kind == FL_CROP_RANDOM_RESIZED) {
        g->resize = g->crop_first = 1;
        g->vh = p->crop_h;
        g->vw = p->crop_w;
        err = crop_rect(p, h, w, &rng, &g->rect);
    } else if (p->crop_after_resize || p->resize_kind == FL_RESIZE_NONE) {
        g->resize = p->resize_kind != FL_RESIZE_NONE;
        resize_target(p, h, w, &g->vh, &g->vw);
        err = crop_rect(p, g->vh, g->vw, &rng, &g->rect);
    } else { /* crop, then resize the crop */
        g->resize = g->crop_first = 1;
        err = crop_rect(p, h, w, &rng, &g->rect);
        resize_target(p, g->rect.h, g->rect.w, &g->vh, &g->vw);
        g->pad_first = g->rect.y < 0 || g->rect.x < 0 || g->rect.y + g->rect.h > h ||
            g->rect.x + g->rect.w > w;
    }
    if (err) return err;
    if (g->crop_first) { /* the output is the whole virtual image */
        if (g->vh <= 0 || g->vw <= 0) return FL_EINVAL;
    }
    if (p->flip_p > 0.0) {
        fl_rng fr = fl_rng_for(seed, epoch, index, (uint64_t)p->flip_op);
        g->flip = fl_rng_uniform(&fr) < p->flip_p;
    }
    return FL_OK;
}

static void geometry_output(const geometry *g, int *oh, int *ow) {
    *oh = g->crop_first ? g->vh : g->rect.h;
    *ow = g->crop_first ? g->vw : g->rect.w;
}

int fl_pipeline_output_shape(const fl_pipeline *p, int h, int w, int c, int *oh, int *ow, int *oc) {
    geometry g;
    /* The shape never depends on the draws, so any key will do. */
    int err = plan_geometry(p, h, w, 0, 0, 0, &g);
    if (err == FL_ETOOSMALL) return err;
    if (err || c < 1 || c > 4) return FL_EINVAL;
    geometry_output(&g, oh, ow);
    *oc = p->channels ? p->channels : c;
    return FL_OK;
}

int fl_pipeline_prepare(const fl_pipeline *p, int h, int w, uint64_t seed, uint64_t epoch,
                        uint64_t index, fl_rect *crop, int *scale_denom) {
    geometry g;
    int err = plan_geometry(p, h, w, seed, epoch, index, &g);
    if (err) return err;
    int bh = h, bw = w; /* the source extent that is resampled to vh x vw */
    if (g.crop_first) {
        *crop = g.rect;
        bh = g.rect.h;
        bw = g.rect.w;
    } else { /* a window on the resized image, mapped back to source pixels */
        int y0 = (int)floor((double)g.rect.y * h / g.vh);
        int x0 = (int)floor((double)g.rect.x * w / g.vw);
        int y1 = (int)ceil((double)(g.rect.y + g.rect.h) * h / g.vh);
        int x1 = (int)ceil((double)(g.rect.x + g.rect.w) * w / g.vw);
        crop->y = y0;
        crop->x = x0;
        crop->h = y1 - y0;
        crop->w = x1 - x0;
    }
    *scale_denom = 1;
    if (g.resize && !g.pad_first)
        for (int d = 8; d >= 2; d /= 2)
            if (bh >= (int64_t)g.vh * d && bw >= (int64_t)g.vw * d) {
                *scale_denom = d;
                break;
            }
    return FL_OK;
}

/* Scratch regions of one run, each FL_ALIGN-aligned from the aligned scratch base. */
typedef struct {
    size_t conv, pad, tmp, resample, total;
} run_layout;

static run_layout run_layout_for(size_t conv, size_t pad, size_t tmp, size_t resample) {
    run_layout L;
    L.conv = 0;
    L.pad = L.conv + align_up(conv);
    L.tmp = L.pad + align_up(pad);
    L.resample = L.tmp + align_up(tmp);
    L.total = L.resample + resample + FL_ALIGN;
    return L;
}

/* The scratch of one run on a decoded image of `decoded_c` channels; every bound holds
 * for any draw (random crops stay within the padded source and the crop size), and for
 * any decode scale. A channel conversion buffer only when the channels differ. */
static run_layout pipeline_layout(const fl_pipeline *p, const geometry *g, int h, int w,
                                  int decoded_c) {
    int oh, ow, c = p->channels ? p->channels : 4;
    geometry_output(g, &oh, &ow);
    int eh = imax(h, p->crop_h) + 2 * p->crop_padding;
    int ew = imax(w, p->crop_w) + 2 * p->crop_padding;
    size_t conv = p->channels && p->channels != decoded_c ? (size_t)h * w * p->channels : 0;
    size_t pad = g->crop_first && p->crop_kind != FL_CROP_RANDOM_RESIZED ? (size_t)eh * ew * c : 0;
    size_t rs =
        g->resize ? layout_for(oh, ow, axis_taps(ew, g->vw), axis_taps(eh, g->vh), ew, c).total : 0;
    /* The colour ops run after the resample is done with its scratch: they share it. */
    size_t px = fl_pixel_ops_scratch_bytes(p->pixel_ops, p->n_pixel_ops, ow, c);
    return run_layout_for(conv, pad, (size_t)oh * ow * c, rs > px ? rs : px);
}

size_t fl_pipeline_scratch_bytes(const fl_pipeline *p, int h, int w, int c) {
    geometry g;
    if (plan_geometry(p, h, w, 0, 0, 0, &g)) return 0;
    return pipeline_layout(p, &g, h, w, c).total;
}

/* n pixels of s written mirrored into d; inlined with a constant `c` below. */
static inline void mirror_pixels(uint8_t *restrict d, const uint8_t *restrict s, int n,
                                 const int c) {
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++) d[(size_t)(n - 1 - i) * c + ch] = s[(size_t)i * c + ch];
}

static void mirror_copy(uint8_t *d, const uint8_t *s, int n, int c) {
    switch (c) {
    case 1: mirror_pixels(d, s, n, 1); break;
    case 3: mirror_pixels(d, s, n, 3); break;
    case 4: mirror_pixels(d, s, n, 4); break;
    default: mirror_pixels(d, s, n, c); break;
    }
}

/* Copies the part of src under the window (y, x, dst size) into dst, mirrored left-right
 * when `flip`; the rest is zero. Each output byte is written once. */
static void copy_window(const fl_image *src, int y, int x, fl_image *dst, int flip) {
    int y0 = imax(y, 0), y1 = imin(y + dst->h, src->h);
    int x0 = imax(x, 0), x1 = imin(x + dst->w, src->w);
    size_t c = (size_t)src->c, row = (size_t)dst->w * c;
    size_t inside = x1 > x0 ? (size_t)(x1 - x0) * c : 0;
    size_t before = x1 > x0 ? (size_t)(x0 - x) * c : 0, after = row - before - inside;
    if (flip) { /* mirrored, the zeros after the window come first */
        size_t t = before;
        before = after;
        after = t;
    }
    for (int r = 0; r < dst->h; r++) {
        uint8_t *d = dst->data + r * dst->stride;
        if (y + r < y0 || y + r >= y1 || !inside) {
            memset(d, 0, row);
            continue;
        }
        const uint8_t *s = src->data + (y + r) * src->stride + (size_t)x0 * c;
        memset(d, 0, before);
        if (flip)
            mirror_copy(d + before, s, x1 - x0, (int)c);
        else
            memcpy(d + before, s, inside);
        memset(d + before + inside, 0, after);
    }
}

/* Resamples the virtual image's window of g into dst (dst size = window size), mirrored
 * left-right when g->flip. */
static int render(const geometry *g, const fl_image *src, int src_h, int src_w, int d,
                  fl_image *dst, uint8_t *pad_buf, void *scratch, size_t bytes) {
    fl_image s = *src;
    resample_job j;
    int wy = 0, wx = 0;
    if (!g->resize) { /* a crop alone: a copy, mirrored in the same pass */
        copy_window(src, g->rect.y, g->rect.x, dst, g->flip);
        return FL_OK;
    }
    if (g->pad_first) {
        fl_image padded = {pad_buf, g->rect.h, g->rect.w, src->c, (ptrdiff_t)g->rect.w * src->c};
        copy_window(src, g->rect.y, g->rect.x, &padded, 0);
        s = padded;
        j = whole_image_job(s.h, s.w, g->vh, g->vw);
    } else {
        double y0 = 0, x0 = 0, y1 = src_h, x1 = src_w;
        if (g->crop_first) {
            y0 = g->rect.y;
            x0 = g->rect.x;
            y1 = y0 + g->rect.h;
            x1 = x0 + g->rect.w;
        } else {
            wy = g->rect.y;
            wx = g->rect.x;
        }
        j.y0 = y0 / d;
        j.x0 = x0 / d;
        j.y1 = y1 / d;
        j.x1 = x1 / d;
        j.ry0 = (int)floor(j.y0);
        j.rx0 = (int)floor(j.x0);
        j.ry1 = imin((int)ceil(j.y1), src->h);
        j.rx1 = imin((int)ceil(j.x1), src->w);
        j.vh = g->vh;
        j.vw = g->vw;
    }
    /* A window reaching outside the virtual image: zeros there, resample the rest. */
    int y0 = imax(wy, 0), y1 = imin(wy + dst->h, g->vh);
    int x0 = imax(wx, 0), x1 = imin(wx + dst->w, g->vw);
    if (y0 != wy || x0 != wx || y1 != wy + dst->h || x1 != wx + dst->w)
        for (int r = 0; r < dst->h; r++)
            memset(dst->data + r * dst->stride, 0, (size_t)dst->w * dst->c);
    if (y1 <= y0 || x1 <= x0) return FL_OK;
    j.wy = y0;
    j.wx = x0;
    /* Flipped, the resampled part lands mirrored, at the mirrored place in dst. */
    int left = x0 - wx;
    if (g->flip) left = dst->w - left - (x1 - x0);
    fl_image sub = {dst->data + (y0 - wy) * dst->stride + (size_t)left * dst->c, y1 - y0, x1 - x0,
                    dst->c, dst->stride};
    return resample(&s, &j, &sub, g->flip, scratch, bytes);
}

/* The rest of a run once the geometry is drawn and the scratch is known to suffice. */
static int run_planned(const fl_pipeline *p, const geometry *g, const run_layout *L,
                       const fl_image *decoded, int src_h, int src_w, int d, void *out,
                       void *scratch, size_t scratch_bytes) {
    int c = p->channels ? p->channels : decoded->c, oh, ow, err;
    geometry_output(g, &oh, &ow);
    uint8_t *base = aligned(scratch);
    size_t rest = scratch_bytes - (size_t)(base - (uint8_t *)scratch) - L->resample;

    fl_image src = *decoded;
    if (src.c != c) {
        fl_image conv_img = {base + L->conv, src.h, src.w, c, (ptrdiff_t)src.w * c};
        if ((err = fl_convert_channels(&src, &conv_img))) return err;
        src = conv_img;
    }
    int direct = !p->normalize && !p->chw; /* uint8 HWC goes straight into out */
    fl_image img = {direct ? (uint8_t *)out : base + L->tmp, oh, ow, c, (ptrdiff_t)ow * c};
    err = render(g, &src, src_h, src_w, d, &img, base + L->pad, base + L->resample, rest);
    if (err) return err;
    err = fl_pixel_ops_run(p->pixel_ops, p->n_pixel_ops, &img, g->seed, g->epoch, g->index,
                           base + L->resample, rest);
    if (err) return err;
    if (p->normalize)
        fl_normalize_u8(&img, (float *)out, p->mean, p->std, p->chw);
    else if (p->chw)
        to_chw_u8(&img, (uint8_t *)out);
    if (p->erase)
        fl_erasing_run(&p->erasing, out, p->out_dtype, oh, ow, c, p->chw, g->seed, g->epoch,
                       g->index);
    return FL_OK;
}

int fl_pipeline_run_scaled(const fl_pipeline *p, const fl_image *decoded, int src_h, int src_w,
                           int scale_denom, uint64_t seed, uint64_t epoch, uint64_t index,
                           void *out, void *scratch, size_t scratch_bytes) {
    int d = scale_denom;
    if (!image_ok(decoded) || decoded->c == 2 || !out || (d != 1 && d != 2 && d != 4 && d != 8))
        return FL_EINVAL;
    if (decoded->h != (src_h + d - 1) / d || decoded->w != (src_w + d - 1) / d) return FL_EINVAL;
    geometry g;
    int err = plan_geometry(p, src_h, src_w, seed, epoch, index, &g);
    if (err) return err;
    if (d != 1 && (!g.resize || g.pad_first)) return FL_EINVAL;
    run_layout L = pipeline_layout(p, &g, src_h, src_w, decoded->c);
    if (!scratch || scratch_bytes < L.total) return FL_ESCRATCH;
    return run_planned(p, &g, &L, decoded, src_h, src_w, d, out, scratch, scratch_bytes);
}

int fl_pipeline_run_into(const fl_pipeline *p, const fl_image *decoded, uint64_t seed,
                         uint64_t epoch, uint64_t index, void *out, size_t out_bytes, void *scratch,
                         size_t scratch_bytes, size_t *need) {
    if (!image_ok(decoded) || decoded->c == 2 || !out) return FL_EINVAL;
    geometry g;
    int err = plan_geometry(p, decoded->h, decoded->w, seed, epoch, index, &g);
    if (err) return err;
    int oh, ow, oc = p->channels ? p->channels : decoded->c;
    geometry_output(&g, &oh, &ow);
    if ((size_t)oh * ow * oc * (p->out_dtype == FL_DTYPE_FLOAT32 ? 4 : 1) != out_bytes)
        return FL_ESHAPE;
    run_layout L = pipeline_layout(p, &g, decoded->h, decoded->w, decoded->c);
    if (!scratch || scratch_bytes < L.total) {
        *need = L.total;
        return FL_ESCRATCH;
    }
    return run_planned(p, &g, &L, decoded, decoded->h, decoded->w, 1, out, scratch, scratch_bytes);
}

int fl_pipeline_run(const fl_pipeline *p, const fl_image *decoded, int scale_denom, uint64_t seed,
                    uint64_t epoch, uint64_t index, void *out, void *scratch,
                    size_t scratch_bytes) {
    if (scale_denom != 1 || !decoded) return FL_EINVAL;
    return fl_pipeline_run_scaled(p, decoded, decoded->h, decoded->w, 1, seed, epoch, index, out,
                                  scratch, scratch_bytes);
}

/* ---- running on a decoded region ------------------------------------------------------ */

/* The pixels of the image at 1/d scale that a run with geometry g reads: the crop's rows and
 * columns when the crop is taken from the source (resampled or copied), else all of it. */
static fl_rect read_region(const geometry *g, int h, int w, int d) {
    int dh = (h + d - 1) / d, dw = (w + d - 1) / d;
    int y0 = 0, x0 = 0, y1 = dh, x1 = dw;
    if (g->crop_first || !g->resize) {
        y0 = imax((int)floor((double)g->rect.y / d), 0);
        x0 = imax((int)floor((double)g->rect.x / d), 0);
        y1 = imin((int)ceil((double)(g->rect.y + g->rect.h) / d), dh);
        x1 = imin((int)ceil((double)(g->rect.x + g->rect.w) / d), dw);
        if (y1 <= y0 || x1 <= x0) { /* the crop lies in the padding: no pixel is read */
            y0 = x0 = 0;
            y1 = dh;
            x1 = dw;
        }
    }
    fl_rect r = {y0, x0, y1 - y0, x1 - x0};
    return r;
}

int fl_pipeline_region(const fl_pipeline *p, int h, int w, int exact, uint64_t seed, uint64_t epoch,
                       uint64_t index, int *scale_denom, fl_rect *region) {
    fl_rect crop;
    geometry g;
    int err = fl_pipeline_prepare(p, h, w, seed, epoch, index, &crop, scale_denom);
    if (!err) err = plan_geometry(p, h, w, seed, epoch, index, &g);
    if (err) return err;
    if (exact) *scale_denom = 1;
    *region = read_region(&g, h, w, *scale_denom);
    return FL_OK;
}

int fl_pipeline_run_region(const fl_pipeline *p, const fl_image *part, int part_y, int part_x,
                           int src_h, int src_w, int scale_denom, uint64_t seed, uint64_t epoch,
                           uint64_t index, void *out, void *scratch, size_t scratch_bytes) {
    int d = scale_denom;
    if (!image_ok(part) || part->c == 2 || !out || (d != 1 && d != 2 && d != 4 && d != 8))
        return FL_EINVAL;
    geometry g;
    int err = plan_geometry(p, src_h, src_w, seed, epoch, index, &g);
    if (err) return err;
    if (d != 1 && (!g.resize || g.pad_first)) return FL_EINVAL;
    /* The part must lie in the scaled image and hold every pixel the run reads. */
    fl_rect need = read_region(&g, src_h, src_w, d);
    int dh = (src_h + d - 1) / d, dw = (src_w + d - 1) / d;
    if (part_y < 0 || part_x < 0 || part_y + part->h > dh || part_x + part->w > dw ||
        need.y < part_y || need.x < part_x || need.y + need.h > part_y + part->h ||
        need.x + need.w > part_x + part->w)
        return FL_EINVAL;
    /* Shifting the crop by whole scaled pixels moves no sample: the same pixels are read. */
    g.rect.y -= part_y * d;
    g.rect.x -= part_x * d;
    run_layout L = pipeline_layout(p, &g, src_h, src_w, part->c);
    if (!scratch || scratch_bytes < L.total) return FL_ESCRATCH;
    return run_planned(p, &g, &L, part, src_h, src_w, d, out, scratch, scratch_bytes);
}

/* ---- building a pipeline ------------------------------------------------------------ */

fl_pipeline *fl_pipeline_create(void) {
    fl_pipeline *p = calloc(1, sizeof *p);
    if (p) p->out_dtype = FL_DTYPE_UINT8;
    return p;
}

void fl_pipeline_destroy(fl_pipeline *p) { free(p); }

int fl_pipeline_set_channels(fl_pipeline *p, int channels) {
    if (channels < 0 || channels > 4 || channels == 2) return FL_EINVAL;
    p->channels = channels;
    return FL_OK;
}

int fl_pipeline_set_crop(fl_pipeline *p, int kind, int op, int after_resize, int h, int w,
                         int padding, double scale_lo, double scale_hi, double ratio_lo,
                         double ratio_hi) {
    if (kind < FL_CROP_NONE || kind > FL_CROP_RANDOM_RESIZED || op < 0) return FL_EINVAL;
    p->crop_kind = kind;
    p->crop_op = op;
    p->crop_after_resize = after_resize != 0;
    p->crop_h = h;
    p->crop_w = w;
    p->crop_padding = padding;
    p->scale_lo = scale_lo;
    p->scale_hi = scale_hi;
    p->ratio_lo = ratio_lo;
    p->ratio_hi = ratio_hi;
    return FL_OK;
}

int fl_pipeline_set_resize(fl_pipeline *p, int kind, int h, int w) {
    if (kind < FL_RESIZE_NONE || kind > FL_RESIZE_EXACT) return FL_EINVAL;
    p->resize_kind = kind;
    p->resize_h = h;
    p->resize_w = w;
    return FL_OK;
}

int fl_pipeline_set_flip(fl_pipeline *p, double prob, int op) {
    if (!(prob >= 0.0 && prob <= 1.0) || op < 0) return FL_EINVAL;
    p->flip_p = prob;
    p->flip_op = op;
    return FL_OK;
}

int fl_pipeline_set_normalize(fl_pipeline *p, const float *mean, const float *std, int n) {
    if (n < 1 || n > 4) return FL_EINVAL;
    for (int i = 0; i < 4; i++) {
        p->mean[i] = mean[i % n];
        p->std[i] = std[i % n];
    }
    p->normalize = 1;
    p->out_dtype = FL_DTYPE_FLOAT32;
    return FL_OK;
}

void fl_pipeline_set_chw(fl_pipeline *p, int chw) { p->chw = chw != 0; }

/* The next free colour op, or NULL past FL_MAX_PIXEL_OPS. */
static fl_pixel_op *next_pixel_op(fl_pipeline *p, int kind, int op) {
    if (p->n_pixel_ops >= FL_MAX_PIXEL_OPS) return NULL;
    fl_pixel_op *o = &p->pixel_ops[p->n_pixel_ops++];
    memset(o, 0, sizeof *o);
    o->kind = kind;
    o->op = op;
    return o;
}

int fl_pipeline_add_jitter(fl_pipeline *p, int op, int present, const double lo[4],
                           const double hi[4]) {
    if (present < 0 || present > 15) return FL_EINVAL;
    fl_pixel_op *o = next_pixel_op(p, FL_PIXEL_JITTER, op);
    if (!o) return FL_ELIMIT;
    o->present = present;
    for (int k = 0; k < 4; k++) {
        o->lo[k] = lo[k];
        o->hi[k] = hi[k];
    }
    return FL_OK;
}

int fl_pipeline_add_grayscale(fl_pipeline *p, int op, double prob) {
    fl_pixel_op *o = next_pixel_op(p, FL_PIXEL_GRAYSCALE, op);
    if (!o) return FL_ELIMIT;
    o->p = prob;
    return FL_OK;
}

int fl_pipeline_add_blur(fl_pipeline *p, int op, int kh, int kw, double sigma_lo, double sigma_hi) {
    fl_pixel_op *o = next_pixel_op(p, FL_PIXEL_BLUR, op);
    if (!o) return FL_ELIMIT;
    o->kh = kh;
    o->kw = kw;
    o->sigma_lo = sigma_lo;
    o->sigma_hi = sigma_hi;
    return FL_OK;
}

int fl_pipeline_set_erasing(fl_pipeline *p, int op, double prob, double scale_lo, double scale_hi,
                            double ratio_lo, double ratio_hi, int random, const float *value,
                            int n_values) {
    if (n_values < 1 || n_values > 4) return FL_EINVAL;
    fl_erasing *e = &p->erasing;
    memset(e, 0, sizeof *e);
    e->op = op;
    e->p = prob;
    e->scale_lo = scale_lo;
    e->scale_hi = scale_hi;
    e->ratio_lo = ratio_lo;
    e->ratio_hi = ratio_hi;
    e->random = random != 0;
    e->n_values = n_values;
    for (int i = 0; i < n_values; i++) e->value[i] = value[i];
    p->erase = 1;
    return FL_OK;
}
