/* Augmentation kernels: colour jitter, grayscale, Gaussian blur, random erasing, and the
 * batch mixes MixUp and CutMix; plus the part of the fused pipeline that runs them.
 *
 * C99 plus GCC/Clang extensions (`target_clones`, as image.h). No global state, no
 * allocation: every function is safe to call from any thread
 * at once, on distinct outputs. Images are 8-bit interleaved HWC (image.h's fl_image).
 *
 * Rounding: a uint8 result v is floor(v + 0.5) clamped to 0..255 (half up). Luma is
 * ITU-R 601 as fl_convert_channels makes it: (19595 r + 38470 g + 7471 b + 32768) >> 16.
 * The colour ops leave a 4th (alpha) channel as it is; the blur filters every channel.
 * Randomness comes only from rng.h. */
#ifndef FASTLOAD_AUGMENT_H
#define FASTLOAD_AUGMENT_H

#include <stddef.h>
#include <stdint.h>

#include "image.h"
#include "rng.h"

/* ---- colour ----------------------------------------------------------------------- */

/* Applies the adjustments whose bit is set in `present` (bit k for FL_JITTER_k) in the
 * order order[0..3], a permutation of 0..3; each one reads the result of the one before.
 * With x a channel value, in double:
 *   brightness f: round(f x)
 *   contrast f:   round(f x + (1 - f) m), m the mean luma of the image (1 channel: the mean)
 *   saturation f: round(f x + (1 - f) l), l the pixel's luma; 1 channel: nothing
 *   hue h:        H = (H + h) mod 1 in HSV (h in turns, within [-0.5, 0.5]): the largest
 *                 and smallest channel values stay, the one between them is rounded;
 *                 1 channel: nothing */
void fl_color_jitter(fl_image *img, const double factor[4], int present, const int order[4]);

/* Every pixel's colour becomes its luma, in every colour channel; 1 channel: nothing. */
void fl_grayscale(fl_image *img);

/* ---- blur ------------------------------------------------------------------------- */

/* Bytes of scratch that fl_gaussian_blur needs for an image w pixels wide of c channels. */
size_t fl_gaussian_blur_scratch_bytes(int w, int c, int kh, int kw);

/* Separable Gaussian blur in place: taps exp(-x^2 / (2 sigma^2)) at x = -(k-1)/2 ..
 * (k-1)/2, normalized to sum 1; the image extended by reflection (mirrored without
 * repeating the edge pixel, again and again when the kernel is wider than the image);
 * a horizontal then a vertical pass accumulated in float32, rounded half up once.
 * kh, kw odd and positive, sigmas > 0; FL_EINVAL otherwise, FL_ESCRATCH for too little
 * scratch. Keeps kh rows of the horizontal pass, not a whole float image. */
int fl_gaussian_blur(fl_image *img, int kh, int kw, double sigma_y, double sigma_x, void *scratch,
                     size_t scratch_bytes);

/* ---- in the pipeline -------------------------------------------------------------- */

/* Whether n pixel ops hold valid parameters (n <= FL_MAX_PIXEL_OPS). */
int fl_pixel_ops_ok(const fl_pixel_op *ops, int n);

/* Bytes of scratch fl_pixel_ops_run needs for an image w pixels wide of c channels. */
size_t fl_pixel_ops_scratch_bytes(const fl_pixel_op *ops, int n, int w, int c);

/* Runs the ops in order on img, each drawing from (seed, epoch, index, op->op):
 * ColorJitter a permutation (Fisher-Yates) then the 4 factors, uniform in [lo, hi);
 * RandomGrayscale one uniform (< p: gray); GaussianBlur one sigma for both axes. */
int fl_pixel_ops_run(const fl_pixel_op *ops, int n, fl_image *img, uint64_t seed, uint64_t epoch,
                     uint64_t index, void *scratch, size_t scratch_bytes);

int fl_erasing_ok(const fl_erasing *e);

/* torchvision's RandomErasing draws for an h x w output: erase with probability prob; then
 * up to 10 tries of an area fraction uniform in [scale_lo, scale_hi) and a log-uniform
 * aspect ratio, eh = round(sqrt(area * ratio)), ew = round(sqrt(area / ratio)) (half to
 * even), kept when eh < h and ew < w, at a uniform offset. Returns 1 with *box, or 0 when
 * nothing is erased (no draw under p, or no try fits). */
int fl_erasing_params(fl_rng *rng, double prob, double scale_lo, double scale_hi, double ratio_lo,
                      double ratio_hi, int h, int w, fl_rect *box);

/* Erases the drawn box of `out` (h x w x c, float32 or uint8 by `dtype`, CHW when chw):
 * with `value`, or with one draw per element in channel, row, column order, standard
 * normal for float32 and uniform 0..255 for uint8. Key (seed, epoch, index, e->op). */
void fl_erasing_run(const fl_erasing *e, void *out, int dtype, int h, int w, int c, int chw,
                    uint64_t seed, uint64_t epoch, uint64_t index);

/* ---- random variates -------------------------------------------------------------- */

/* Standard normal (Box-Muller, one per call). */
double fl_rng_normal(fl_rng *r);

/* Beta(a, b) as X / (X + Y), X ~ Gamma(a), Y ~ Gamma(b) (Marsaglia-Tsang, boosted by
 * U^(1/a) below 1), computed from their logarithms so that small a, b stay finite. */
double fl_rng_beta(fl_rng *r, double a, double b);

/* ---- batch mixes ------------------------------------------------------------------ */

/* MixUp's lambda ~ Beta(alpha, alpha) for the batch of (seed, epoch, step). */
double fl_mixup_lambda(double alpha, uint64_t seed, uint64_t epoch, uint64_t step);

/* CutMix's draws for (seed, epoch, step) on h x w images (torchvision.transforms.v2):
 * lambda ~ Beta(alpha, alpha), a centre uniform in the image, half sides
 * (int)(sqrt(1 - lambda) / 2 * side), the box clamped to the image. Returns lambda
 * corrected to the box: 1 - box area / image area. */
double fl_cutmix_params(double alpha, uint64_t seed, uint64_t epoch, uint64_t step, int h, int w,
                        fl_rect *box);

/* The box and corrected lambda of fl_cutmix_params for a drawn lambda and centre. */
double fl_cutmix_box(double lam, int cy, int cx, int h, int w, fl_rect *box);

/* Mixes a contiguous batch of n items of item_elems elements (float32 or uint8 by dtype)
 * in place with itself rolled by one: item i becomes lam * x[i] + (1 - lam) * x[i - 1],
 * item 0 takes item n - 1. float32: in float32, as b * (1 - lam) + a * lam; uint8: the
 * same, rounded half up. `scratch` holds one item. */
int fl_mixup(void *batch, int dtype, int n, size_t item_elems, double lam, void *scratch);

/* CutMix in place: the box of item i is replaced by the box of item i - 1 (item 0 takes
 * item n - 1). Items are h x w x c (CHW when chw). `scratch` holds one item. */
int fl_cutmix(void *batch, int dtype, int n, int h, int w, int c, int chw, const fl_rect *box,
              void *scratch);

#endif
