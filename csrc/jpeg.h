/* JPEG decoding in C through libjpeg(-turbo)'s 6.2 API: only the rows and columns a crop
 * needs, at a reduced DCT scale, on any thread, without the GIL.
 *
 * This unit is the only one that links libjpeg, and it is built into a module of its own,
 * fastload._jpeg, only when the build finds libjpeg. The C core reaches fl_jpeg_decode
 * through a pointer (fl_jpeg_decode_fn) that the binding takes from that module when it
 * loads, so that the core itself never needs libjpeg: where the library cannot be loaded
 * the pointer stays NULL and JPEGs decode another way. */
#ifndef FASTLOAD_JPEG_H
#define FASTLOAD_JPEG_H

#include <stddef.h>
#include <stdint.h>

#include "image.h"

/* The libjpeg-turbo version number this build links (e.g. 2001005). */
int fl_jpeg_library_version(void);

/* Returns memory of at least `bytes` for the decoded pixels, or NULL. */
typedef void *(*fl_alloc_fn)(void *ctx, size_t bytes);

/* Decodes JPEG bytes at 1/denom scale (1, 2, 4 or 8; the scaled image is ceil(h/denom) x
 * ceil(w/denom)) to `channels` (1 gray, 3 RGB, 4 RGBA), only the part under `want` (in
 * scaled pixels; NULL: the whole image): its rows, and its columns widened to whole iMCUs
 * as libjpeg crops, each with a margin, so that they are the full decode's pixels. The
 * pixels go into memory from `alloc`, rows packed; *out describes them and (*out_y,
 * *out_x) is where their first pixel sits in the scaled image. Warnings of corrupt data are
 * errors; in a stream with restart markers the decode goes on up to the marker after the
 * last interval it uses, whose end is so checked. Rows below `want` are not decoded, nor,
 * in a stream with restart markers, the intervals beside and above it (fl_jpeg_part), so
 * damage there goes unnoticed; a stream that does not end in an EOI marker is decoded
 * whole, so that a truncated file is always reported. Returns FL_OK; FL_EUNSUPPORTED when the
 * caller must decode another way; else FL_ECORRUPT (corrupt, truncated or unsupported
 * data: the message has libjpeg's words), FL_ENOMEM or FL_EINVAL, with a message. */
int fl_jpeg_decode(const uint8_t *data, size_t n, int channels, int denom, const fl_rect *want,
                   fl_alloc_fn alloc, void *alloc_ctx, fl_image *out, int *out_y, int *out_x,
                   char *message, size_t message_bytes);

/* The restart intervals under `want` (with decode's margin, at 1/denom scale) as a JPEG of
 * their own, in *part (malloc'd, *part_n bytes; the caller frees it), whose first pixel is
 * (*dy, *dx) in the scaled image. Only for a stream whose every MCU row is a whole number
 * of restart intervals, in one sequential Huffman scan that ends in EOI, and only when
 * the part leaves out intervals that a plain decode reads (those of rows above the part,
 * or of columns beside it). Returns 1 with a part; 0 where there is none (the stream is
 * to be decoded as it is); -1 out of memory. fl_jpeg_decode uses it, so that a crop's
 * intervals alone are entropy-decoded; damage in the others goes unnoticed. */
int fl_jpeg_part(const uint8_t *data, size_t n, int denom, const fl_rect *want, uint8_t **part,
                 size_t *part_n, int *dy, int *dx);

/* The same JPEG with a restart marker after every interval of MCUs that spans at most
 * `span` pixels across (one MCU at least) and divides the MCU row, losslessly: the same
 * coefficients, the standard Huffman tables, the APPn and COM segments (EXIF, ICC
 * profiles) kept. *out is malloc'd, *out_n bytes; the caller
 * frees it. Returns FL_OK; FL_EUNSUPPORTED for a progressive, arithmetic-coded or 12-bit
 * stream; FL_ECORRUPT with libjpeg's words in `message`. */
int fl_jpeg_add_restarts(const uint8_t *data, size_t n, int span, uint8_t **out, size_t *out_n,
                         char *message, size_t message_bytes);

/* `img` (RGB, 3 channels) encoded as a baseline JPEG at `quality` (1..100, libjpeg's
 * scaled standard tables), chroma sampled h_samp x v_samp (2 x 2: 4:2:0; 2 x 1: 4:2:2;
 * 1 x 1: 4:4:4), the accurate integer DCT, the standard Huffman tables, and, where `span`
 * > 0, a restart marker after every interval of MCUs as fl_jpeg_add_restarts puts them,
 * in one pass (the bytes Pillow's libjpeg writes at the same settings). *out is
 * malloc'd, *out_n bytes; the caller frees it. Returns FL_OK; FL_EINVAL (a bad
 * argument), FL_ENOMEM or FL_ECORRUPT with a message. */
int fl_jpeg_encode(const fl_image *img, int quality, int h_samp, int v_samp, int span,
                   uint8_t **out, size_t *out_n, char *message, size_t message_bytes);

/* The name of the capsule in which fastload._jpeg hands fl_jpeg_decode to the core. Its last
 * part changes with fl_jpeg_decode's signature, so that a core and a _jpeg module built from
 * different sources refuse each other instead of calling through the wrong type. */
#define FL_JPEG_CAPSULE_NAME "fastload._jpeg.fl_jpeg_decode.1"

/* The type of fl_jpeg_decode, as the C core holds it. */
typedef int (*fl_jpeg_decode_fn)(const uint8_t *data, size_t n, int channels, int denom,
                                 const fl_rect *want, fl_alloc_fn alloc, void *alloc_ctx,
                                 fl_image *out, int *out_y, int *out_x, char *message,
                                 size_t message_bytes);

#endif
