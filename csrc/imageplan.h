/* The native image field: read one encoded or decoded image, decode only the part the
 * pipeline reads at the scale it allows, run the fused pipeline, and write the item
 * straight into its place in the batch slot. Runs on a pool thread. JPEG (through libjpeg)
 * and QOI decode in C without the GIL; other formats (PNG, BMP, GIF, WebP, TIFF) take the
 * GIL in `decode_other`, as does a JPEG in a build without libjpeg (`decode_jpeg`). */
#ifndef FASTLOAD_IMAGEPLAN_H
#define FASTLOAD_IMAGEPLAN_H

#include <stdint.h>

#include "engine.h"
#include "image.h"
#include "jpeg.h"

enum {
    FL_SOURCE_BUFFERS = 0,  /* item i is ptrs[i][0 .. lens[i]) */
    FL_SOURCE_OFFSETS,      /* item i is base[offsets[i] .. offsets[i+1]) */
    FL_SOURCE_FILES,        /* item i is the contents of the file paths[i] */
    FL_SOURCE_PIXELS        /* item i is a decoded uint8 image: ptrs[i], dims[3i..3i+2], row strides */
};


/* Decodes a JPEG at 1/scale_denom into out (ceil(h/d) x ceil(w/d) x channels, rows packed).
 * Returns 0, or nonzero after writing a message. */
typedef int (*fl_decode_fn)(void *ctx, const uint8_t *data, size_t n, int scale_denom,
                            int channels, int h, int w, uint8_t *out, char *message);

/* Decodes an image of another format whole, to `channels`, into memory from alloc (*out
 * describes it), refusing more than max_pixels from the header, before decoding.
 * Returns 0, or nonzero after writing a message. */
typedef int (*fl_decode_other_fn)(void *ctx, const uint8_t *data, size_t n, int channels,
                                  int64_t max_pixels, fl_alloc_fn alloc, void *alloc_ctx,
                                  fl_image *out, char *message);

typedef struct {
    const fl_pipeline *pipeline;
    int kind;                      /* FL_SOURCE_* */
    int64_t count;
    const uint8_t *const *ptrs;    /* BUFFERS, PIXELS */
    const int64_t *lens;           /* BUFFERS */
    const uint8_t *base;           /* OFFSETS */
    const int64_t *offsets;        /* OFFSETS: count + 1 entries */
    const char *const *paths;      /* FILES */
    const int32_t *dims;           /* PIXELS: h, w, c per item */
    const int64_t *row_strides;    /* PIXELS */
    int channels;                  /* channels to decode encoded images to (1, 3 or 4) */
    int exact;                     /* decode at full scale, never at a reduced DCT scale */
    fl_decode_fn decode_jpeg;      /* JPEG, in a build without libjpeg or for CMYK */
    fl_decode_other_fn decode_other;
    void *decode_ctx;              /* of both */
    const char *name;              /* what to call the source in messages */
    /* Refused before memory is set aside (fastload.limits): a forged header must not
     * make a thread reserve gigabytes, nor a huge file be read whole. */
    int64_t max_pixels;
    int64_t max_file_bytes;
} fl_image_source;

/* Height and width from a JPEG's frame header. Returns 0, or -1 when the bytes are not a
 * well-formed JPEG up to its frame header. */
int fl_jpeg_size(const uint8_t *data, size_t n, int *h, int *w);

/* What fl_decode_for_run decoded: `part` holds the pixels of the source (src_h x src_w)
 * decoded at 1/denom whose first pixel sits at (y, x); in scratch memory. */
typedef struct {
    fl_image part;
    int y, x;
    int src_h, src_w;
    int denom;
} fl_decoded;

/* Decodes what the pipeline reads for item `index` of encoded bytes (JPEG: only the crop's
 * region, at the scale the pipeline allows; other formats whole) into `scratch`, after
 * checking that the output would be dst_bytes (-1: not checked). Returns 0, or -1 with a
 * message. */
int fl_decode_for_run(const fl_image_source *src, const uint8_t *data, size_t n,
                      uint64_t seed, uint64_t epoch, uint64_t index, int64_t dst_bytes,
                      fl_scratch *scratch, fl_decoded *out, char *message);

/* Decodes `data` (encoded bytes) and runs the pipeline on item `index` into dst, which
 * must be dst_bytes (-1: sized by the caller from the image's header). Returns 0, or -1
 * with a message. */
int fl_run_encoded(const fl_image_source *src, const uint8_t *data, size_t n, uint64_t seed,
                   uint64_t epoch, uint64_t index, char *dst, int64_t dst_bytes,
                   fl_scratch *scratch, char *message);

/* Prefetches the start of an image's bytes or pixels (see fl_prefetch_fn). */
void fl_prefetch_image(const fl_field *field, int64_t index);

/* The fill function of an image field; field->state is an fl_image_source. */
int fl_fill_image(const fl_field *field, const fl_item *item, char *dst, fl_scratch *scratch,
                  char *message);

#endif
