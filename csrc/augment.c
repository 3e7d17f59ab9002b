/* Augmentation kernels and batch mixes; see augment.h. */
#include "augment.h"

#include <math.h>
#include <string.h>

#define FL_ALIGN 64
#define FL_PI    3.14159265358979323846

/* The hot loops get an AVX2 clone, picked at load time on CPUs that have it. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define FL_HOT __attribute__((target_clones("avx2", "default")))
#else
#define FL_HOT
#endif

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }
static size_t align_up(size_t n) { return (n + FL_ALIGN - 1) & ~(size_t)(FL_ALIGN - 1); }

static float *aligned_floats(void *p) {
    uintptr_t u = (uintptr_t)p;
    return (float *)((u + FL_ALIGN - 1) & ~(uintptr_t)(FL_ALIGN - 1));
}

static inline uint8_t round_u8(double v) {
    return v <= 0.0 ? 0 : v >= 255.0 ? 255 : (uint8_t)(v + 0.5);
}

static inline int luma(int r, int g, int b) {
    return (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16;
}

/* The colour channels: a 4th is alpha, left alone. */
static int colour_channels(const fl_image *img) { return img->c == 4 ? 3 : img->c; }

/* ---- colour ----------------------------------------------------------------------- */

static void apply_lut(fl_image *img, const uint8_t lut[256]) {
    int c = img->c, cc = colour_channels(img);
    for (int y = 0; y < img->h; y++) {
        uint8_t *px = img->data + y * img->stride;
        if (cc == c) { /* every byte of the row is a colour value */
            for (size_t i = 0, n = (size_t)img->w * c; i < n; i++) px[i] = lut[px[i]];
            continue;
        }
        for (int x = 0; x < img->w; x++, px += c)
            for (int ch = 0; ch < cc; ch++) px[ch] = lut[px[ch]];
    }
}

/* The mean luma of the image as it would be with `lut` applied to its colour values. */
static double mean_luma(const fl_image *img, const uint8_t lut[256]) {
    uint64_t sum = 0;
    int c = img->c;
    for (int y = 0; y < img->h; y++) {
        const uint8_t *px = img->data + y * img->stride;
        for (int x = 0; x < img->w; x++, px += c)
            sum += c >= 3 ? (uint64_t)luma(lut[px[0]], lut[px[1]], lut[px[2]]) : lut[px[0]];
    }
    return (double)sum / ((double)img->h * img->w);
}

/* lut := (blend with the constant m: round(f v + (1 - f) m)) after lut. */
static void blend_constant(uint8_t lut[256], double f, double m) {
    for (int v = 0; v < 256; v++) lut[v] = round_u8(f * lut[v] + (1.0 - f) * m);
}

/* Blend with the pixel's luma l: f x + (1 - f) l = l + f (x - l), and as l is a whole
 * number, rounding it half up is l + round(f (x - l)), a table over x - l (-255..255). */
static void saturate(fl_image *img, double f) {
    int16_t turn[511];
    for (int d = -255; d <= 255; d++) turn[d + 255] = (int16_t)floor(f * d + 0.5);
    int c = img->c;
    for (int y = 0; y < img->h; y++) {
        uint8_t *px = img->data + y * img->stride;
        for (int x = 0; x < img->w; x++, px += c) {
            int l = luma(px[0], px[1], px[2]);
            for (int ch = 0; ch < 3; ch++) {
                int v = l + turn[px[ch] - l + 255];
                px[ch] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
        }
    }
}

/* One pixel's hue turned by `turn6` sixths of a turn. HSV keeps V = max and, as the
 * saturation is kept, min; only the channel between them moves (torchvision's hsv2rgb:
 * t = min + (max - min) f rising, q = max - (max - min) f falling). */
static inline void turn_hue(uint8_t *px, double turn6) {
    int r = px[0], g = px[1], b = px[2];
    int mx = imax(r, imax(g, b)), mn = imin(r, imin(g, b)), cr = mx - mn;
    if (cr == 0) return; /* gray: no hue */
    double h;            /* in sixths of a turn */
    if (mx == r)
        h = (double)(g - b) / cr;
    else if (mx == g)
        h = 2.0 + (double)(b - r) / cr;
    else
        h = 4.0 + (double)(r - g) / cr;
    h += turn6;
    h -= 6.0 * floor(h / 6.0);
    int sector = (int)h;
    double f = h - sector;
    if (sector > 5) { /* h rounded up to 6.0 */
        sector = 0;
        f = 0.0;
    }
    uint8_t hi = (uint8_t)mx, lo = (uint8_t)mn;
    uint8_t up = round_u8(mn + cr * f), down = round_u8(mx - cr * f);
    static const int order[6][3] = {{0, 1, 2}, {3, 0, 2}, {2, 0, 1},
                                    {2, 3, 0}, {1, 2, 0}, {0, 2, 3}};
    uint8_t v[4] = {hi, up, lo, down}; /* indexed by order: max, rising, min, falling */
    px[0] = v[order[sector][0]];
    px[1] = v[order[sector][1]];
    px[2] = v[order[sector][2]];
}

static void shift_hue(fl_image *img, double turns) {
    int c = img->c;
    for (int y = 0; y < img->h; y++) {
        uint8_t *px = img->data + y * img->stride;
        for (int x = 0; x < img->w; x++, px += c) turn_hue(px, turns * 6.0);
    }
}

void fl_color_jitter(fl_image *img, const double factor[4], int present, const int order[4]) {
    /* Brightness and contrast are tables of the value; those in a row compose into one
     * table, applied once (contrast's mean is taken through the table so far). */
    uint8_t lut[256];
    int pending = 0;
    for (int v = 0; v < 256; v++) lut[v] = (uint8_t)v;
    for (int k = 0; k < 4; k++) {
        int which = order[k];
        if (which < 0 || which > 3 || !(present >> which & 1)) continue;
        double f = factor[which];
        if (which == FL_JITTER_BRIGHTNESS || which == FL_JITTER_CONTRAST) {
            blend_constant(lut, f, which == FL_JITTER_CONTRAST ? mean_luma(img, lut) : 0.0);
            pending = 1;
            continue;
        }
        if (img->c < 3) continue; /* saturation and hue need colour */
        if (pending) {
            apply_lut(img, lut);
            for (int v = 0; v < 256; v++) lut[v] = (uint8_t)v;
            pending = 0;
        }
        if (which == FL_JITTER_SATURATION)
            saturate(img, f);
        else
            shift_hue(img, f);
    }
    if (pending) apply_lut(img, lut);
}

void fl_grayscale(fl_image *img) {
    int c = img->c;
    if (c < 3) return;
    for (int y = 0; y < img->h; y++) {
        uint8_t *px = img->data + y * img->stride;
        for (int x = 0; x < img->w; x++, px += c)
            px[0] = px[1] = px[2] = (uint8_t)luma(px[0], px[1], px[2]);
    }
}

/* ---- blur -------------------------------------------------------------------------- */

/* Index i of an axis of n pixels, mirrored at both ends without repeating the edge. */
static int reflect(int i, int n) {
    if (n == 1) return 0;
    int period = 2 * (n - 1);
    i %= period;
    if (i < 0) i += period;
    return i < n ? i : period - i;
}

static void gaussian_taps(float *k, int n, double sigma) {
    double half = (n - 1) * 0.5, sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp(-0.5 * ((i - half) / sigma) * ((i - half) / sigma));
    for (int i = 0; i < n; i++)
        k[i] = (float)(exp(-0.5 * ((i - half) / sigma) * ((i - half) / sigma)) / sum);
}

/* acc[i] = sum_j k[j] * rows[j][i] for i < len, rows[j] = base + offset[j]: whole rows at
 * a time, which gcc vectorizes. */
FL_HOT static void weighted_sum(const float *const *rows, const float *restrict k, int taps,
                                size_t len, float *restrict acc) {
    for (size_t i = 0; i < len; i++) acc[i] = 0.0f;
    for (int j = 0; j < taps; j++) {
        const float *restrict s = rows[j];
        const float w = k[j];
        for (size_t i = 0; i < len; i++) acc[i] += w * s[i];
    }
}

typedef struct {
    size_t kx, ky, ring, pad, rows, total;
} blur_layout;

static blur_layout blur_layout_for(int w, int c, int kh, int kw) {
    blur_layout L;
    size_t off = 0, row = (size_t)w * c;
    L.kx = off;
    off += align_up(sizeof(float) * (size_t)kw);
    L.ky = off;
    off += align_up(sizeof(float) * (size_t)kh);
    L.ring = off;
    off += align_up(sizeof(float) * row * kh);
    L.pad = off;
    off += align_up(sizeof(float) * ((size_t)w + kw - 1) * c);
    L.rows = off;
    off += align_up(sizeof(float *) * (size_t)imax(kh, kw));
    L.total = off + FL_ALIGN;
    return L;
}

size_t fl_gaussian_blur_scratch_bytes(int w, int c, int kh, int kw) {
    if (w <= 0 || c < 1 || c > 4 || kh <= 0 || kw <= 0) return 0;
    return blur_layout_for(w, c, kh, kw).total;
}

/* The horizontal pass of one source row into `dst` (w * c floats), via the reflected row
 * in `pad`. */
static void blur_row(const uint8_t *src, int w, int c, const float *k, int kw, float *pad,
                     const float **rows, float *dst) {
    int r = kw / 2;
    for (int x = 0; x < w + 2 * r; x++) {
        const uint8_t *s = src + (size_t)reflect(x - r, w) * c;
        for (int ch = 0; ch < c; ch++) pad[(size_t)x * c + ch] = s[ch];
    }
    for (int j = 0; j < kw; j++) rows[j] = pad + (size_t)j * c;
    weighted_sum(rows, k, kw, (size_t)w * c, dst);
}

int fl_gaussian_blur(fl_image *img, int kh, int kw, double sigma_y, double sigma_x, void *scratch,
                     size_t scratch_bytes) {
    if (!img || !img->data || img->h <= 0 || img->w <= 0 || img->c < 1 || img->c > 4 || kh <= 0 ||
        kw <= 0 || kh % 2 == 0 || kw % 2 == 0 || !(sigma_y > 0.0) || !(sigma_x > 0.0))
        return FL_EINVAL;
    int h = img->h, w = img->w, c = img->c, ry = kh / 2;
    blur_layout L = blur_layout_for(w, c, kh, kw);
    if (!scratch || scratch_bytes < L.total) return FL_ESCRATCH;
    uint8_t *base = (uint8_t *)aligned_floats(scratch);
    float *kx = (float *)(base + L.kx), *ky = (float *)(base + L.ky);
    float *ring = (float *)(base + L.ring), *pad = (float *)(base + L.pad);
    const float **rows = (const float **)(base + L.rows);
    size_t row = (size_t)w * c;
    gaussian_taps(kx, kw, sigma_x);
    gaussian_taps(ky, kh, sigma_y);
    /* Row j's horizontal pass lives in ring slot j % kh. Output row y reads rows reflected
     * from y - ry .. y + ry, all within the last kh rows done (or all rows, when the image
     * has no more than kh), and is written over source row y, which no later row reads. */
    int done = 0;
    for (int y = 0; y < h; y++) {
        for (int last = imin(y + ry, h - 1); done <= last; done++)
            blur_row(img->data + done * img->stride, w, c, kx, kw, pad, rows,
                     ring + (size_t)(done % kh) * row);
        for (int j = 0; j < kh; j++) rows[j] = ring + (size_t)(reflect(y - ry + j, h) % kh) * row;
        weighted_sum(rows, ky, kh, row, pad);
        uint8_t *d = img->data + y * img->stride;
        for (size_t i = 0; i < row; i++) d[i] = pad[i] >= 255.0f ? 255 : (uint8_t)(pad[i] + 0.5f);
    }
    return FL_OK;
}

/* ---- in the pipeline --------------------------------------------------------------- */

static int jitter_ok(const fl_pixel_op *o) {
    for (int k = 0; k < 4; k++) {
        if (!(o->present >> k & 1)) continue;
        double lo = k == FL_JITTER_HUE ? -0.5 : 0.0, hi = k == FL_JITTER_HUE ? 0.5 : INFINITY;
        if (!(lo <= o->lo[k] && o->lo[k] <= o->hi[k] && o->hi[k] <= hi)) return 0;
    }
    return o->present >= 0 && o->present < 16;
}

int fl_pixel_ops_ok(const fl_pixel_op *ops, int n) {
    if (n < 0 || n > FL_MAX_PIXEL_OPS || (n && !ops)) return 0;
    for (int k = 0; k < n; k++) {
        const fl_pixel_op *o = &ops[k];
        if (o->op < 0) return 0;
        if (o->kind == FL_PIXEL_JITTER && !jitter_ok(o)) return 0;
        if (o->kind == FL_PIXEL_GRAYSCALE && !(o->p >= 0.0 && o->p <= 1.0)) return 0;
        if (o->kind == FL_PIXEL_BLUR &&
            (o->kh <= 0 || o->kw <= 0 || o->kh % 2 == 0 || o->kw % 2 == 0 || !(o->sigma_lo > 0.0) ||
             !(o->sigma_lo <= o->sigma_hi)))
            return 0;
        if (o->kind < FL_PIXEL_JITTER || o->kind > FL_PIXEL_BLUR) return 0;
    }
    return 1;
}

size_t fl_pixel_ops_scratch_bytes(const fl_pixel_op *ops, int n, int w, int c) {
    size_t need = 0;
    for (int k = 0; k < n; k++) {
        if (ops[k].kind != FL_PIXEL_BLUR) continue;
        size_t b = fl_gaussian_blur_scratch_bytes(w, c, ops[k].kh, ops[k].kw);
        if (b > need) need = b;
    }
    return need;
}

static double uniform_in(fl_rng *rng, double lo, double hi) {
    return lo + (hi - lo) * fl_rng_uniform(rng);
}

static void jitter(const fl_pixel_op *o, fl_rng *rng, fl_image *img) {
    int order[4] = {0, 1, 2, 3};
    for (int i = 3; i > 0; i--) {
        int j = (int)fl_rng_below(rng, (uint64_t)i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    double factor[4];
    for (int k = 0; k < 4; k++) factor[k] = uniform_in(rng, o->lo[k], o->hi[k]);
    fl_color_jitter(img, factor, o->present, order);
}

int fl_pixel_ops_run(const fl_pixel_op *ops, int n, fl_image *img, uint64_t seed, uint64_t epoch,
                     uint64_t index, void *scratch, size_t scratch_bytes) {
    for (int k = 0; k < n; k++) {
        const fl_pixel_op *o = &ops[k];
        fl_rng rng = fl_rng_for(seed, epoch, index, (uint64_t)o->op);
        if (o->kind == FL_PIXEL_JITTER) {
            jitter(o, &rng, img);
        } else if (o->kind == FL_PIXEL_GRAYSCALE) {
            if (fl_rng_uniform(&rng) < o->p) fl_grayscale(img);
        } else if (o->kind == FL_PIXEL_BLUR) {
            double sigma = uniform_in(&rng, o->sigma_lo, o->sigma_hi);
            int err = fl_gaussian_blur(img, o->kh, o->kw, sigma, sigma, scratch, scratch_bytes);
            if (err) return err;
        } else {
            return FL_EINVAL;
        }
    }
    return FL_OK;
}

int fl_erasing_ok(const fl_erasing *e) {
    return e && e->op >= 0 && e->p >= 0.0 && e->p <= 1.0 && e->scale_lo >= 0.0 &&
        e->scale_lo <= e->scale_hi && e->scale_hi <= 1.0 && e->ratio_lo > 0.0 &&
        e->ratio_lo <= e->ratio_hi && e->n_values >= 1 && e->n_values <= 4;
}

int fl_erasing_params(fl_rng *rng, double prob, double scale_lo, double scale_hi, double ratio_lo,
                      double ratio_hi, int h, int w, fl_rect *box) {
    if (!(fl_rng_uniform(rng) < prob)) return 0;
    double area = (double)h * w, log_lo = log(ratio_lo), log_hi = log(ratio_hi);
    for (int attempt = 0; attempt < 10; attempt++) {
        double target = area * uniform_in(rng, scale_lo, scale_hi);
        double aspect = exp(uniform_in(rng, log_lo, log_hi));
        /* Compared before the conversion: an extreme ratio gives sides beyond any int. */
        double fh = rint(sqrt(target * aspect)), fw = rint(sqrt(target / aspect));
        if (!(fh < h && fw < w)) continue;
        int eh = (int)fh, ew = (int)fw;
        box->y = (int)fl_rng_below(rng, (uint64_t)(h - eh + 1));
        box->x = (int)fl_rng_below(rng, (uint64_t)(w - ew + 1));
        box->h = eh;
        box->w = ew;
        return 1;
    }
    return 0;
}

void fl_erasing_run(const fl_erasing *e, void *out, int dtype, int h, int w, int c, int chw,
                    uint64_t seed, uint64_t epoch, uint64_t index) {
    fl_rng rng = fl_rng_for(seed, epoch, index, (uint64_t)e->op);
    fl_rect b;
    if (!fl_erasing_params(&rng, e->p, e->scale_lo, e->scale_hi, e->ratio_lo, e->ratio_hi, h, w,
                           &b))
        return;
    for (int ch = 0; ch < c; ch++) {
        float value = e->value[e->n_values == 1 ? 0 : ch];
        for (int y = b.y; y < b.y + b.h; y++)
            for (int x = b.x; x < b.x + b.w; x++) {
                size_t o = chw ? ((size_t)ch * h + y) * w + x : ((size_t)y * w + x) * c + ch;
                if (dtype == FL_DTYPE_FLOAT32)
                    ((float *)out)[o] = e->random ? (float)fl_rng_normal(&rng) : value;
                else
                    ((uint8_t *)out)[o] =
                        e->random ? (uint8_t)fl_rng_below(&rng, 256) : (uint8_t)value;
            }
    }
}

/* ---- random variates --------------------------------------------------------------- */

double fl_rng_normal(fl_rng *r) {
    double u1 = 1.0 - fl_rng_uniform(r), u2 = fl_rng_uniform(r); /* u1 in (0, 1] */
    return sqrt(-2.0 * log(u1)) * cos(2.0 * FL_PI * u2);
}

/* log of a Gamma(a, 1) draw. Marsaglia and Tsang (2000) for a >= 1; below 1 a Gamma(a + 1)
 * draw times U^(1/a), whose logarithm stays finite where the draw itself underflows. */
static double log_gamma_draw(fl_rng *r, double a) {
    if (a < 1.0) {
        double u = 1.0 - fl_rng_uniform(r);
        return log_gamma_draw(r, a + 1.0) + log(u) / a;
    }
    double d = a - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = fl_rng_normal(r), v = 1.0 + c * x;
        if (v <= 0.0) continue;
        v = v * v * v;
        double u = 1.0 - fl_rng_uniform(r);
        if (u < 1.0 - 0.0331 * x * x * x * x || log(u) < 0.5 * x * x + d * (1.0 - v + log(v)))
            return log(d) + log(v);
    }
}

double fl_rng_beta(fl_rng *r, double a, double b) {
    double lx = log_gamma_draw(r, a), ly = log_gamma_draw(r, b);
    return 1.0 / (1.0 + exp(ly - lx));
}

/* ---- batch mixes ------------------------------------------------------------------- */

/* Keys of the batch draws: (seed, epoch, step, one op per kind of mix). */
enum { MIXUP_OP = 0, CUTMIX_OP = 1 };

double fl_mixup_lambda(double alpha, uint64_t seed, uint64_t epoch, uint64_t step) {
    fl_rng rng = fl_rng_for(seed, epoch, step, MIXUP_OP);
    return fl_rng_beta(&rng, alpha, alpha);
}

double fl_cutmix_params(double alpha, uint64_t seed, uint64_t epoch, uint64_t step, int h, int w,
                        fl_rect *box) {
    fl_rng rng = fl_rng_for(seed, epoch, step, CUTMIX_OP);
    double lam = fl_rng_beta(&rng, alpha, alpha);
    int cx = (int)fl_rng_below(&rng, (uint64_t)w), cy = (int)fl_rng_below(&rng, (uint64_t)h);
    return fl_cutmix_box(lam, cy, cx, h, w, box);
}

double fl_cutmix_box(double lam, int cy, int cx, int h, int w, fl_rect *box) {
    double r = 0.5 * sqrt(1.0 - lam);
    /* In 64 bits: a centre plus a half side can pass INT_MAX before it is clamped. */
    int64_t half_w = (int64_t)(r * w), half_h = (int64_t)(r * h);
    int64_t x0 = (int64_t)cx - half_w, y0 = (int64_t)cy - half_h;
    int64_t x1 = (int64_t)cx + half_w, y1 = (int64_t)cy + half_h;
    x0 = x0 < 0 ? 0 : x0;
    y0 = y0 < 0 ? 0 : y0;
    x1 = x1 > w ? w : x1;
    y1 = y1 > h ? h : y1;
    box->y = (int)y0;
    box->x = (int)x0;
    box->h = (int)(y1 - y0);
    box->w = (int)(x1 - x0);
    return 1.0 - (double)box->h * box->w / ((double)h * w);
}

FL_HOT static void mix_f32(float *restrict a, const float *restrict b, size_t n, float lam,
                           float rest) {
    for (size_t i = 0; i < n; i++) a[i] = b[i] * rest + a[i] * lam;
}

FL_HOT static void mix_u8(uint8_t *restrict a, const uint8_t *restrict b, size_t n, float lam,
                          float rest) {
    for (size_t i = 0; i < n; i++) {
        float v = (float)b[i] * rest + (float)a[i] * lam + 0.5f;
        a[i] = v >= 255.0f ? 255 : (uint8_t)v;
    }
}

static void mix_item(void *a, const void *b, int dtype, size_t n, double lam) {
    if (dtype == FL_DTYPE_FLOAT32)
        mix_f32((float *)a, (const float *)b, n, (float)lam, (float)(1.0 - lam));
    else
        mix_u8((uint8_t *)a, (const uint8_t *)b, n, (float)lam, (float)(1.0 - lam));
}

static size_t elem_bytes(int dtype) { return dtype == FL_DTYPE_FLOAT32 ? 4 : 1; }

/* Item i reads item i - 1 before that one changes: walk down from the last item, with the
 * original last item kept in scratch for item 0. */
int fl_mixup(void *batch, int dtype, int n, size_t item_elems, double lam, void *scratch) {
    if (!batch || !scratch || n <= 0 || (dtype != FL_DTYPE_FLOAT32 && dtype != FL_DTYPE_UINT8))
        return FL_EINVAL;
    size_t item = item_elems * elem_bytes(dtype);
    uint8_t *b = (uint8_t *)batch;
    memcpy(scratch, b + (size_t)(n - 1) * item, item);
    for (int i = n - 1; i >= 1; i--)
        mix_item(b + (size_t)i * item, b + (size_t)(i - 1) * item, dtype, item_elems, lam);
    mix_item(b, scratch, dtype, item_elems, lam);
    return FL_OK;
}

static void copy_box(uint8_t *dst, const uint8_t *src, int h, int w, int c, int chw,
                     const fl_rect *box, size_t es) {
    if (chw) {
        for (int ch = 0; ch < c; ch++)
            for (int y = box->y; y < box->y + box->h; y++) {
                size_t o = (((size_t)ch * h + y) * w + box->x) * es;
                memcpy(dst + o, src + o, (size_t)box->w * es);
            }
    } else {
        for (int y = box->y; y < box->y + box->h; y++) {
            size_t o = (((size_t)y * w + box->x) * c) * es;
            memcpy(dst + o, src + o, (size_t)box->w * c * es);
        }
    }
}

int fl_cutmix(void *batch, int dtype, int n, int h, int w, int c, int chw, const fl_rect *box,
              void *scratch) {
    if (!batch || !scratch || !box || n <= 0 || h <= 0 || w <= 0 || c <= 0 ||
        (dtype != FL_DTYPE_FLOAT32 && dtype != FL_DTYPE_UINT8) || box->y < 0 || box->x < 0 ||
        box->h < 0 || box->w < 0 || box->y + box->h > h || box->x + box->w > w)
        return FL_EINVAL;
    size_t es = elem_bytes(dtype), item = (size_t)h * w * c * es;
    uint8_t *b = (uint8_t *)batch;
    memcpy(scratch, b + (size_t)(n - 1) * item, item);
    for (int i = n - 1; i >= 1; i--)
        copy_box(b + (size_t)i * item, b + (size_t)(i - 1) * item, h, w, c, chw, box, es);
    copy_box(b, (const uint8_t *)scratch, h, w, c, chw, box, es);
    return FL_OK;
}
