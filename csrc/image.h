/* Image kernels and the fused per-item augmentation pipeline.
 *
 * C99 plus GCC/Clang extensions: `target_clones` (an AVX2 copy of the hot loops, picked at
 * load time) and, through rng.h, `unsigned __int128`. No global state: every function is
 * safe to call from any thread at once, on distinct outputs. Images are 8-bit interleaved HWC, rows `stride` bytes apart.
 * Randomness comes only from rng.h, keyed by (seed, epoch, index, op), where op is the
 * position of the random transform in the chain. */
#ifndef FASTLOAD_IMAGE_H
#define FASTLOAD_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "rng.h"
#include "status.h"

typedef struct {
    uint8_t *data;
    int h, w, c;
    ptrdiff_t stride;
} fl_image;

static inline fl_image fl_image_of(uint8_t *data, int h, int w, int c, ptrdiff_t stride) {
    fl_image im = {data, h, w, c, stride};
    return im;
}

/* The largest side a pipeline computes with; larger resize targets are clamped to it. */
#define FL_MAX_SIDE (1 << 24)

/* A rectangle in pixels; it may reach outside its image (that part reads as zeros). */
typedef struct {
    int y, x, h, w;
} fl_rect;

static inline fl_rect fl_rect_of(int y, int x, int h, int w) {
    fl_rect r = {y, x, h, w};
    return r;
}

/* ---- kernels ---------------------------------------------------------------------- */

/* Resamples src to dst's size (same channel count). Triangle filter whose support widens
 * with the shrink factor (antialiased, as PIL's BILINEAR), plain bilinear when enlarging;
 * separable, 14-bit fixed point, vertical pass then horizontal pass. */
size_t fl_resize_scratch_bytes(int sh, int sw, int dh, int dw, int c);
int fl_resize(const fl_image *src, fl_image *dst, void *scratch, size_t scratch_bytes);

/* Shrinks src to dst's size by exact area averaging: each output pixel is the mean of the
 * input area it covers, fractional pixels weighted by their overlap (as OpenCV's
 * INTER_AREA), summed in 64-bit integers and rounded to the nearest value, halves up, so
 * that the result depends on no float rounding. Only shrinks (dst no larger than src on
 * either side); at most 2^52 source pixels. scratch: fl_resize_area_scratch_bytes() bytes
 * (0 for sizes it does not take). Returns FL_OK, FL_EINVAL or FL_ESCRATCH. */
size_t fl_resize_area_scratch_bytes(int sh, int sw, int dh, int dw, int c);
int fl_resize_area(const fl_image *src, fl_image *dst, void *scratch, size_t scratch_bytes);

/* Turns the resampler's hand-written AVX2 kernel on (where the CPU has it) or off, for
 * every thread; returns whether it was on. Both give the same bytes: the tests compare
 * them. Not to be called while images are resampled. */
int fl_set_simd(int on);

void fl_flip_horizontal(fl_image *img);

/* out = (x/255 - mean[c]) / std[c] as float32; dst is h*w*c floats, HWC, or CHW if chw. */
void fl_normalize_u8(const fl_image *src, float *dst, const float *mean, const float *std, int chw);

/* Converts between 1 (gray), 3 (RGB) and 4 (RGBA) channels; same h, w. Gray from RGB uses
 * ITU-R 601 luma (as PIL's "L"); alpha is dropped, or set to 255 when added. */
int fl_convert_channels(const fl_image *src, fl_image *dst);

/* ---- crop parameters (torchvision's rules) ---------------------------------------- */

/* RandomResizedCrop.get_params: 10 tries, then the central crop clamped to the ratio range.
 * Returns FL_EINVAL for bad ranges. */
int fl_rrc_params(fl_rng *rng, int h, int w, double scale_lo, double scale_hi, double ratio_lo,
                  double ratio_hi, int *y, int *x, int *ch, int *cw);

/* CenterCrop: offset round((h - th) / 2) (half to even, as Python); when the image is
 * smaller than the target, the offset is negative: -(th - h) // 2, the rest zero padding. */
void fl_center_crop_params(int h, int w, int th, int tw, int *y, int *x);

/* RandomCrop on the image zero-padded by `padding` on every side; y, x are in source
 * coordinates (negative inside the padding). FL_ETOOSMALL when the padded image is smaller. */
int fl_random_crop_params(fl_rng *rng, int h, int w, int th, int tw, int padding, int *y, int *x);

/* ---- fused pipeline ----------------------------------------------------------------- */

enum { FL_CROP_NONE = 0, FL_CROP_CENTER, FL_CROP_RANDOM, FL_CROP_RANDOM_RESIZED };
enum { FL_RESIZE_NONE = 0, FL_RESIZE_SHORTER, FL_RESIZE_EXACT };
enum { FL_DTYPE_UINT8 = 0, FL_DTYPE_FLOAT32 = 1 };

/* Colour ops: they run on the uint8 HWC image once its geometry is done (augment.h). */
#define FL_MAX_PIXEL_OPS 8
enum { FL_PIXEL_JITTER = 1, FL_PIXEL_GRAYSCALE, FL_PIXEL_BLUR };
enum { FL_JITTER_BRIGHTNESS = 0, FL_JITTER_CONTRAST, FL_JITTER_SATURATION, FL_JITTER_HUE };

typedef struct {
    int kind;                  /* FL_PIXEL_* */
    int op;                    /* position in the chain: the op of its RNG key */
    int present;               /* JITTER: bit k set when adjustment k (FL_JITTER_*) is on */
    double lo[4], hi[4];       /* JITTER: factor ranges; hue: shift range in turns */
    double p;                  /* GRAYSCALE: probability */
    int kh, kw;                /* BLUR: kernel height and width, odd */
    double sigma_lo, sigma_hi; /* BLUR: sigma range in pixels, 0 < lo <= hi */
} fl_pixel_op;

/* RandomErasing on the final output (float32 or uint8, HWC or CHW). */
typedef struct {
    int op; /* position in the chain: the op of its RNG key */
    double p, scale_lo, scale_hi, ratio_lo, ratio_hi;
    int random;   /* values drawn per element, not `value` */
    int n_values; /* 1 (every channel) or the channel count */
    float value[4];
} fl_erasing;

/* One transform chain, in the fixed order it runs: crop (before or after the resize),
 * resize, horizontal flip, colour ops, normalize, layout, erasing. `*_op` is the op's
 * position in the user's chain, the `op` of its RNG key. Built with the setters below. */
typedef struct {
    int channels;  /* 1, 3 or 4; 0: same as the input */
    int crop_kind; /* FL_CROP_* */
    int crop_op;
    int crop_after_resize; /* 1: crop the resized image (Resize then CenterCrop) */
    int crop_h, crop_w;    /* crop size; RandomResizedCrop: the output size */
    int crop_padding;      /* FL_CROP_RANDOM */
    double scale_lo, scale_hi, ratio_lo, ratio_hi; /* FL_CROP_RANDOM_RESIZED */
    int resize_kind;                               /* FL_RESIZE_* */
    int resize_h, resize_w; /* EXACT: target; SHORTER: resize_h is the shorter side */
    double flip_p;          /* 0: no flip */
    int flip_op;
    int normalize; /* output float32 (x/255 - mean) / std */
    float mean[4], std[4];
    int chw;         /* output channels first */
    int out_dtype;   /* FL_DTYPE_*; float32 iff normalize */
    int n_pixel_ops; /* colour ops, run in order on the uint8 image after the flip */
    fl_pixel_op pixel_ops[FL_MAX_PIXEL_OPS];
    int erase; /* apply `erasing` to the output, last */
    fl_erasing erasing;
} fl_pipeline;

/* Building a chain: fl_pipeline_create gives the identity (no crop, no resize, uint8 HWC
 * output, channels as the input); each setter adds or replaces one stage. A setter checks
 * what it stores (FL_EINVAL, FL_ELIMIT past FL_MAX_PIXEL_OPS colour ops); the runs check
 * that the stages fit together. `op` is the stage's position in the user's chain. */
fl_pipeline *fl_pipeline_create(void);
void fl_pipeline_destroy(fl_pipeline *p);
int fl_pipeline_set_channels(fl_pipeline *p, int channels);
/* crop: FL_CROP_*, h x w (RandomResizedCrop: the output size), padding (RandomCrop),
 * scale and ratio ranges (RandomResizedCrop); after_resize: crop the resized image. */
int fl_pipeline_set_crop(fl_pipeline *p, int kind, int op, int after_resize, int h, int w,
                         int padding, double scale_lo, double scale_hi, double ratio_lo,
                         double ratio_hi);
int fl_pipeline_set_resize(fl_pipeline *p, int kind, int h, int w);
int fl_pipeline_set_flip(fl_pipeline *p, double prob, int op);
/* n (1 to 4) means and stds, repeated over the channels; the output becomes float32. */
int fl_pipeline_set_normalize(fl_pipeline *p, const float *mean, const float *std, int n);
void fl_pipeline_set_chw(fl_pipeline *p, int chw);
/* ColorJitter: bit k of `present` turns on adjustment k (FL_JITTER_*) with factors
 * uniform in [lo[k], hi[k]); hue in turns. */
int fl_pipeline_add_jitter(fl_pipeline *p, int op, int present, const double lo[4],
                           const double hi[4]);
int fl_pipeline_add_grayscale(fl_pipeline *p, int op, double prob);
int fl_pipeline_add_blur(fl_pipeline *p, int op, int kh, int kw, double sigma_lo, double sigma_hi);
/* RandomErasing on the output: with `random`, values drawn per element; else n_values
 * (1, or one per channel) given values. */
int fl_pipeline_set_erasing(fl_pipeline *p, int op, double prob, double scale_lo, double scale_hi,
                            double ratio_lo, double ratio_hi, int random, const float *value,
                            int n_values);

/* Output size for a source of h x w x c. Returns FL_OK or FL_EINVAL. */
int fl_pipeline_output_shape(const fl_pipeline *p, int h, int w, int c, int *oh, int *ow, int *oc);

/* From the source size alone: the crop rectangle in source pixels (for a crop after the
 * resize, mapped back to source pixels, rounded outward) and the JPEG DCT scale to decode
 * at, 1, 2, 4 or 8: the largest that keeps the resampled region at least the resize target
 * in both dimensions (1 when nothing is resized). */
int fl_pipeline_prepare(const fl_pipeline *p, int h, int w, uint64_t seed, uint64_t epoch,
                        uint64_t index, fl_rect *crop, int *scale_denom);

/* Bytes of scratch that fl_pipeline_run(_scaled) needs for a source of h x w (any scale)
 * decoded to c channels. */
size_t fl_pipeline_scratch_bytes(const fl_pipeline *p, int h, int w, int c);

/* Runs the chain on a full-size decoded image (scale_denom must be 1: a reduced decode has
 * lost the exact source size that the draws depend on; use fl_pipeline_run_scaled) and
 * writes one item into out (uint8 or float32, HWC or CHW, contiguous). */
int fl_pipeline_run(const fl_pipeline *p, const fl_image *decoded, int scale_denom, uint64_t seed,
                    uint64_t epoch, uint64_t index, void *out, void *scratch, size_t scratch_bytes);

/* As fl_pipeline_run, for an image decoded at 1/scale_denom of a src_h x src_w source
 * (decoded is then ceil(src_h/d) x ceil(src_w/d), as libjpeg's DCT scaling makes it).
 * The draws are those of fl_pipeline_prepare(p, src_h, src_w, ...). */
int fl_pipeline_run_scaled(const fl_pipeline *p, const fl_image *decoded, int src_h, int src_w,
                           int scale_denom, uint64_t seed, uint64_t epoch, uint64_t index,
                           void *out, void *scratch, size_t scratch_bytes);

/* As fl_pipeline_run at full scale, drawing the geometry once: checks that the output is
 * exactly `out_bytes` (FL_ESHAPE otherwise, before anything is written), and when the
 * scratch is smaller than the item needs returns FL_ESCRATCH with the size in *need. */
int fl_pipeline_run_into(const fl_pipeline *p, const fl_image *decoded, uint64_t seed,
                         uint64_t epoch, uint64_t index, void *out, size_t out_bytes, void *scratch,
                         size_t scratch_bytes, size_t *need);

/* The DCT scale to decode an h x w source at (1 when `exact`) and the region of the image
 * at that scale that a run with this key reads: the crop's rows and columns when the crop
 * is taken from the source, else the whole image. Decoding only the region and passing it
 * to fl_pipeline_run_region gives the pixels of a run on the whole decoded image. */
int fl_pipeline_region(const fl_pipeline *p, int h, int w, int exact, uint64_t seed, uint64_t epoch,
                       uint64_t index, int *scale_denom, fl_rect *region);

/* As fl_pipeline_run_scaled, on `part`: the pixels of the image decoded at 1/scale_denom
 * whose first pixel sits at (part_y, part_x). FL_EINVAL unless the part holds the region
 * that fl_pipeline_region gives for the same key. */
int fl_pipeline_run_region(const fl_pipeline *p, const fl_image *part, int part_y, int part_x,
                           int src_h, int src_w, int scale_denom, uint64_t seed, uint64_t epoch,
                           uint64_t index, void *out, void *scratch, size_t scratch_bytes);

#endif
