/* libFuzzer target: the geometry of the fused pipeline (crop, resize, flip, colour ops,
 * normalize, erasing) with every parameter, the source size and the key from the input.
 *
 * Checks, beyond memory safety (outputs, parts and scratch are allocated at exactly the
 * size the functions ask for, so that ASan sees any overrun):
 * - fl_pipeline_output_shape gives a positive size, and the channels asked for;
 * - fl_pipeline_region gives a DCT scale of 1, 2, 4 or 8 (1 when exact) and a region that
 *   lies in the image at that scale;
 * - a run on a part holding that region (and a margin from the input) writes the same
 *   bytes as a run on the whole image at that scale, and at full scale the same bytes as
 *   fl_pipeline_run_into. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "image.h"

#define MAX_SIDE       4096
#define MAX_RUN_PIXELS (1 << 14)
#define MAX_SCRATCH    ((size_t)4 << 20)

typedef struct {
    const uint8_t *p;
    size_t n;
} input;

static unsigned byte(input *in) {
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

static unsigned u16(input *in) {
    unsigned hi = byte(in);
    return hi << 8 | byte(in);
}

/* A side length: mostly small, sometimes up to MAX_SIDE. */
static int side(input *in) {
    unsigned b = byte(in);
    return b & 0x80 ? 1 + (int)(u16(in) % MAX_SIDE) : 1 + (int)(b & 0x7f);
}

/* A fraction in [0, 1]. */
static double unit(input *in) { return byte(in) / 255.0; }

/* A positive ratio from e^-16 to e^16, or to e^+-255 for the extremes a user may give. */
static double ratio(input *in) {
    int b = (int8_t)byte(in);
    return exp(byte(in) & 1 ? b * 2.0 : b / 8.0);
}

static void read_pixel_op(input *in, fl_pixel_op *o, int position) {
    memset(o, 0, sizeof *o);
    o->op = position;
    switch (byte(in) % 3) {
    case 0:
        o->kind = FL_PIXEL_JITTER;
        o->present = byte(in) & 15;
        for (int k = 0; k < 4; k++) {
            double a = k == FL_JITTER_HUE ? unit(in) - 0.5 : 2.0 * unit(in);
            double b = k == FL_JITTER_HUE ? unit(in) - 0.5 : 2.0 * unit(in);
            o->lo[k] = a < b ? a : b;
            o->hi[k] = a < b ? b : a;
        }
        break;
    case 1:
        o->kind = FL_PIXEL_GRAYSCALE;
        o->p = unit(in);
        break;
    default:
        o->kind = FL_PIXEL_BLUR;
        o->kh = 1 + 2 * (int)(byte(in) % 8);
        o->kw = 1 + 2 * (int)(byte(in) % 8);
        o->sigma_lo = 0.1 + 3.0 * unit(in);
        o->sigma_hi = o->sigma_lo + 3.0 * unit(in);
    }
}

static void read_pipeline(input *in, fl_pipeline *p) {
    static const int channel_counts[4] = {0, 1, 3, 4};
    memset(p, 0, sizeof *p);
    int op = 0;
    unsigned flags = byte(in);
    p->channels = channel_counts[flags & 3];
    p->crop_kind = (int)(flags >> 2 & 3);
    p->resize_kind = (int)((flags >> 4) & 3) % 3;
    p->crop_after_resize = (int)(flags >> 6 & 1);
    p->normalize = (int)(flags >> 7);
    p->out_dtype = p->normalize ? FL_DTYPE_FLOAT32 : FL_DTYPE_UINT8;
    if (p->crop_kind == FL_CROP_RANDOM_RESIZED) p->resize_kind = FL_RESIZE_NONE;
    if (p->crop_kind != FL_CROP_NONE) {
        p->crop_op = op++;
        p->crop_h = side(in);
        p->crop_w = side(in);
        p->crop_padding = byte(in) % 40;
        double a = unit(in), b = unit(in);
        p->scale_lo = 0.01 + 0.99 * (a < b ? a : b);
        p->scale_hi = 0.01 + 0.99 * (a < b ? b : a);
        double r = ratio(in), s = ratio(in);
        p->ratio_lo = r < s ? r : s;
        p->ratio_hi = r < s ? s : r;
    }
    if (p->resize_kind != FL_RESIZE_NONE) {
        p->resize_h = side(in);
        p->resize_w = side(in);
    }
    unsigned more = byte(in);
    if (more & 1) {
        p->flip_op = op++;
        p->flip_p = unit(in);
    }
    p->chw = (int)(more >> 1 & 1);
    for (int c = 0; c < 4; c++) {
        p->mean[c] = (float)unit(in);
        p->std[c] = (float)(0.05 + unit(in));
    }
    p->n_pixel_ops = (int)(more >> 2 & 3);
    for (int k = 0; k < p->n_pixel_ops; k++) read_pixel_op(in, &p->pixel_ops[k], op++);
    if (more & 0x10) {
        fl_erasing *e = &p->erasing;
        p->erase = 1;
        e->op = op++;
        e->p = unit(in);
        double a = unit(in), b = unit(in);
        e->scale_lo = a < b ? a : b;
        e->scale_hi = a < b ? b : a;
        double r = ratio(in), s = ratio(in);
        e->ratio_lo = r < s ? r : s;
        e->ratio_hi = r < s ? s : r;
        e->random = (int)(more >> 5 & 1);
        e->n_values = 1 + (int)(byte(in) % 4);
        for (int c = 0; c < 4; c++) e->value[c] = (float)byte(in);
    }
}

/* A copy of the rows and columns [y, y + h) x [x, x + w) of img in memory of exactly its
 * size. */
static fl_image copy_part(const fl_image *img, int y, int x, int h, int w) {
    fl_image part = {malloc((size_t)h * w * img->c), h, w, img->c, (ptrdiff_t)w * img->c};
    for (int r = 0; r < h; r++)
        memcpy(part.data + r * part.stride, img->data + (y + r) * img->stride + (size_t)x * img->c,
               (size_t)w * img->c);
    return part;
}

static void check_runs(const fl_pipeline *p, int h, int w, int c, int oh, int ow, int oc, int d,
                       fl_rect region, input *in, uint64_t seed, uint64_t epoch, uint64_t index) {
    int dh = (h + d - 1) / d, dw = (w + d - 1) / d;
    size_t scratch_bytes = fl_pipeline_scratch_bytes(p, h, w, c);
    size_t out_bytes = (size_t)oh * ow * oc * (p->normalize ? 4 : 1);
    if ((size_t)dh * dw > MAX_RUN_PIXELS || (size_t)oh * ow > MAX_RUN_PIXELS ||
        scratch_bytes > MAX_SCRATCH)
        return;
    if (scratch_bytes == 0) abort();
    fl_image whole = {malloc((size_t)dh * dw * c), dh, dw, c, (ptrdiff_t)dw * c};
    for (size_t k = 0; k < (size_t)dh * dw * c; k++) whole.data[k] = (uint8_t)(k * 131 + k / 7);
    void *scratch = malloc(scratch_bytes);
    uint8_t *expected = malloc(out_bytes), *got = malloc(out_bytes);

    int err = fl_pipeline_run_scaled(p, &whole, h, w, d, seed, epoch, index, expected, scratch,
                                     scratch_bytes);
    if (err != FL_OK) abort();
    /* The part: the region and a margin, within the scaled image. */
    int top = (int)(byte(in) % 4), left = (int)(byte(in) % 4);
    int bottom = (int)(byte(in) % 4), right = (int)(byte(in) % 4);
    int y0 = region.y - top < 0 ? 0 : region.y - top;
    int x0 = region.x - left < 0 ? 0 : region.x - left;
    int y1 = region.y + region.h + bottom > dh ? dh : region.y + region.h + bottom;
    int x1 = region.x + region.w + right > dw ? dw : region.x + region.w + right;
    fl_image part = copy_part(&whole, y0, x0, y1 - y0, x1 - x0);
    err = fl_pipeline_run_region(p, &part, y0, x0, h, w, d, seed, epoch, index, got, scratch,
                                 scratch_bytes);
    if (err != FL_OK || memcmp(got, expected, out_bytes) != 0) abort();
    if (d == 1) {
        size_t need = 0;
        err = fl_pipeline_run_into(p, &whole, seed, epoch, index, got, out_bytes, scratch,
                                   scratch_bytes, &need);
        if (err != FL_OK || memcmp(got, expected, out_bytes) != 0) abort();
    }
    free(part.data);
    free(whole.data);
    free(scratch);
    free(expected);
    free(got);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    input in = {data, size};
    fl_pipeline p;
    read_pipeline(&in, &p);
    int h = side(&in), w = side(&in), c = (int)(byte(&in) % 4) + 1, exact = (int)(byte(&in) & 1);
    uint64_t seed = byte(&in), epoch = byte(&in), index = u16(&in);
    if (c == 2) c = 3;

    int oh = 0, ow = 0, oc = 0;
    int err = fl_pipeline_output_shape(&p, h, w, c, &oh, &ow, &oc);
    if (err != FL_OK) return 0;
    if (oh < 1 || ow < 1 || oc != (p.channels ? p.channels : c)) abort();

    int d = 0;
    fl_rect region;
    err = fl_pipeline_region(&p, h, w, exact, seed, epoch, index, &d, &region);
    if (err == FL_ETOOSMALL) return 0; /* a random crop larger than this image */
    if (err != FL_OK) abort();
    if (d != 1 && d != 2 && d != 4 && d != 8) abort();
    if (exact && d != 1) abort();
    int dh = (h + d - 1) / d, dw = (w + d - 1) / d;
    if (region.y < 0 || region.x < 0 || region.h < 1 || region.w < 1 || region.y + region.h > dh ||
        region.x + region.w > dw)
        abort();
    check_runs(&p, h, w, c, oh, ow, oc, d, region, &in, seed, epoch, index);
    return 0;
}
