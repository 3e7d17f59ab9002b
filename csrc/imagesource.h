/* The native image field: read one encoded or decoded image, decode only the part the
 * pipeline reads at the scale it allows, run the fused pipeline, and write the item
 * straight into its place in the batch slot. Runs on a pool thread. JPEG (through libjpeg)
 * and QOI decode in C without the GIL; other formats (PNG, BMP, GIF, WebP, TIFF) take the
 * GIL in `decode_other`, as does a JPEG where libjpeg is not there (`fallback_decode_jpeg`). */
#ifndef FASTLOAD_IMAGESOURCE_H
#define FASTLOAD_IMAGESOURCE_H

#include <stdint.h>

#include "engine.h"
#include "image.h"
#include "jpeg.h"

/* Decodes a JPEG at 1/scale_denom into out (ceil(h/d) x ceil(w/d) x channels, rows packed).
 * Returns FL_OK, or a negative code after writing a message. */
typedef int (*fl_decode_fn)(void *ctx, const uint8_t *data, size_t n, int scale_denom, int channels,
                            int h, int w, uint8_t *out, char *message);

/* Decodes an image of another format whole, to `channels`, into memory from alloc (*out
 * describes it), refusing more than max_pixels from the header, before decoding.
 * Returns FL_OK, or a negative code after writing a message. */
typedef int (*fl_decode_other_fn)(void *ctx, const uint8_t *data, size_t n, int channels,
                                  int64_t max_pixels, fl_alloc_fn alloc, void *alloc_ctx,
                                  fl_image *out, char *message);

/* Where a native image field's images are, how to decode them and the pipeline to run:
 * the state of its fill function. Opaque; made by fl_image_source_create, then given its
 * images by one of the fl_image_source_<kind> calls. The pipeline and the arrays given
 * must outlive the source (the binding keeps them). */
typedef struct fl_image_source fl_image_source;

/* `channels`: what encoded images decode to (1, 3 or 4); `exact`: never at a reduced DCT
 * scale; `name`: what messages call the images (copied). Images over max_pixels (from the
 * header) and files over max_file_bytes are refused before memory is set aside for them.
 * `libjpeg_decode`: libjpeg's region decoder (fl_jpeg_decode), or NULL where it could not be
 * loaded: JPEGs then decode whole through `fallback_decode_jpeg`, as do CMYK JPEGs always.
 * NULL when out of memory or for bad arguments. */
fl_image_source *fl_image_source_create(const fl_pipeline *pipeline, int channels, int exact,
                                        const char *name, int64_t max_pixels,
                                        int64_t max_file_bytes, fl_jpeg_decode_fn libjpeg_decode,
                                        fl_decode_fn fallback_decode_jpeg,
                                        fl_decode_other_fn decode_other, void *decode_ctx);
void fl_image_source_destroy(fl_image_source *src);

/* Image i is encoded bytes ptrs[i][0 .. lens[i]). */
void fl_image_source_buffers(fl_image_source *src, int64_t count, const uint8_t *const *ptrs,
                             const int64_t *lens);
/* Image i is encoded bytes base[offsets[i] .. offsets[i + 1]) (count + 1 offsets). */
void fl_image_source_offsets(fl_image_source *src, int64_t count, const uint8_t *base,
                             const int64_t *offsets);
/* Image i is the encoded contents of the file paths[i]. */
void fl_image_source_files(fl_image_source *src, int64_t count, const char *const *paths);
/* Image i is decoded: ptrs[i], h, w, c at dims[3i .. 3i + 2], rows row_strides[i] apart. */
void fl_image_source_pixels(fl_image_source *src, int64_t count, const uint8_t *const *ptrs,
                            const int32_t *dims, const int64_t *row_strides);

/* Makes fields[f] load images from `src` into rows of row_bytes (fl_fill_image). */
void fl_image_source_field(fl_field *fields, int f, const fl_image_source *src, int64_t row_bytes);

/* Height and width from a JPEG's frame header. Returns FL_OK, or FL_EFORMAT when the bytes
 * are not a well-formed JPEG up to its frame header. */
int fl_jpeg_size(const uint8_t *data, size_t n, int *h, int *w);

/* What fl_image_source_decode decoded: `part` holds the pixels of the source (src_h x src_w)
 * decoded at 1/denom whose first pixel sits at (y, x); in scratch memory. */
typedef struct {
    fl_image part;
    int y, x;
    int src_h, src_w;
    int denom;
} fl_decoded;

/* Decodes what the pipeline reads for item `index` of encoded bytes (JPEG: only the crop's
 * region, at the scale the pipeline allows; other formats whole) into `scratch`, after
 * checking that the output would be dst_bytes (-1: not checked). Returns FL_OK, or a
 * negative code with a message. */
int fl_image_source_decode(const fl_image_source *src, const uint8_t *data, size_t n, uint64_t seed,
                           uint64_t epoch, uint64_t index, int64_t dst_bytes, fl_scratch *scratch,
                           fl_decoded *out, char *message);

/* Decodes `data` (encoded bytes) and runs the pipeline on item `index` into dst, which
 * must be dst_bytes (-1: sized by the caller from the image's header). Returns FL_OK, or a
 * negative code with a message. */
int fl_image_source_run(const fl_image_source *src, const uint8_t *data, size_t n, uint64_t seed,
                        uint64_t epoch, uint64_t index, char *dst, int64_t dst_bytes,
                        fl_scratch *scratch, char *message);

/* Prefetches the start of an image's bytes or pixels (see fl_prefetch_fn). */
void fl_prefetch_image(const fl_field *field, int64_t index);

/* The fill function of an image field; field->state is an fl_image_source. */
int fl_fill_image(const fl_field *field, const fl_item *item, char *dst, fl_scratch *scratch,
                  char *message);

#endif
