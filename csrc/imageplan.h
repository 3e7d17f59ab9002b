/* The native image field: read one encoded (JPEG or QOI) or decoded image, decode it at
 * the scale the pipeline allows, run the fused pipeline, and write the item straight into
 * its place in the batch slot. Runs on a pool thread; only a JPEG decode takes the GIL,
 * through `decode_jpeg`, whose decoder releases it again while it works. */
#ifndef FASTLOAD_IMAGEPLAN_H
#define FASTLOAD_IMAGEPLAN_H

#include <stdint.h>

#include "engine.h"
#include "image.h"

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
    fl_decode_fn decode_jpeg;
    void *decode_ctx;
    const char *name;              /* what to call the source in messages */
    /* Refused before memory is set aside (fastload.limits): a forged header must not
     * make a thread reserve gigabytes, nor a huge file be read whole. */
    int64_t max_pixels;
    int64_t max_file_bytes;
} fl_image_source;

/* Height and width from a JPEG's frame header. Returns 0, or -1 when the bytes are not a
 * well-formed JPEG up to its frame header. */
int fl_jpeg_size(const uint8_t *data, size_t n, int *h, int *w);

/* Prefetches the start of an image's bytes or pixels (see fl_prefetch_fn). */
void fl_prefetch_image(const fl_field *field, int64_t index);

/* The fill function of an image field; field->state is an fl_image_source. */
int fl_fill_image(const fl_field *field, const fl_item *item, char *dst, fl_scratch *scratch,
                  char *message);

#endif
