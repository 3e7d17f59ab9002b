/* QOI ("Quite OK Image") lossless image codec, written from the specification at
 * qoiformat.org (version 1.0).
 *
 * Stream: 14-byte header ("qoif", width and height as big-endian uint32, channels 3|4,
 * colorspace 0|1), then chunks (RGB, RGBA, INDEX, DIFF, LUMA, RUN), then the end marker
 * 00 00 00 00 00 00 00 01.
 *
 * Thread safety: no global state; every function only touches its arguments, so any
 * number of threads may encode or decode at once. Nothing here needs the GIL.
 * The decoder is safe on hostile input: it never reads before buf or at/after buf + n,
 * never writes outside out[0 .. w*h*out_channels), and reports a negative code of status.h
 * for a truncated or corrupt stream. */
#ifndef FASTLOAD_QOI_H
#define FASTLOAD_QOI_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define FL_QOI_HEADER_SIZE 14
#define FL_QOI_END_SIZE    8
/* Largest image accepted by encoder and decoder (the reference limit), in pixels. */
#define FL_QOI_PIXELS_MAX 400000000L

/* Parses the header of buf[0..n). On success stores width, height and stored channels
 * (any pointer may be NULL) and returns FL_OK; else a negative error code. */
int fl_qoi_header(const uint8_t *buf, size_t n, int *w, int *h, int *channels);

/* Whether a stream of n bytes (header and end marker included) is long enough for w * h
 * pixels: one chunk byte gives at most 62 of them. Checked before any memory is set aside
 * for the pixels, so that a forged header cannot make a reader reserve gigabytes. */
int fl_qoi_plausible(size_t n, int w, int h);

/* Worst-case encoded size of a w x h image with 3 or 4 channels, in bytes; 0 when the
 * arguments are invalid or the image is over FL_QOI_PIXELS_MAX. */
size_t fl_qoi_max_size(int w, int h, int channels);

/* Encodes w*h pixels, row-major, `channels` (3: RGB, 4: RGBA) bytes each, into
 * out[0..cap). Returns the number of bytes written, or a negative error code.
 * cap >= fl_qoi_max_size(w, h, channels) always suffices. Colorspace is written as 0. */
long fl_qoi_encode(const uint8_t *pixels, int w, int h, int channels, uint8_t *out, size_t cap);

/* Decodes buf[0..n) into out, which holds w*h*out_channels bytes (row-major, 3: RGB,
 * 4: RGBA), whatever the stored channel count; w and h must equal the header's. Alpha is
 * dropped for out_channels 3; read as 4, a 3-channel stream has alpha 255 unless it
 * holds RGBA ops. Returns
 * FL_OK or a negative error code; on error out holds unspecified bytes. */
int fl_qoi_decode(const uint8_t *buf, size_t n, uint8_t *out, int w, int h, int out_channels);

#endif
