/* JPEG decoding through libjpeg(-turbo); see jpeg.h. */
#include "jpeg.h"

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

int fl_jpeg_library_version(void) {
#ifdef LIBJPEG_TURBO_VERSION_NUMBER
    return LIBJPEG_TURBO_VERSION_NUMBER;
#else
    return JPEG_LIB_VERSION;
#endif
}

/* libjpeg reports errors through these callbacks: an error, or a warning of corrupt data,
 * leaves the decode by longjmp with its text in `message`. */
typedef struct {
    struct jpeg_error_mgr mgr;
    jmp_buf jump;
    char *message;
    size_t message_bytes;
} error_state;

static void on_error(j_common_ptr cinfo) {
    error_state *e = (error_state *)cinfo->err;
    char text[JMSG_LENGTH_MAX];
    cinfo->err->format_message(cinfo, text);
    snprintf(e->message, e->message_bytes, "corrupt or truncated JPEG: %s", text);
    longjmp(e->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) on_error(cinfo); /* a warning: the data is corrupt */
}

/* Whether the stream ends in an EOI marker (allowing a few bytes of padding after it). */
static int ends_with_eoi(const uint8_t *data, size_t n) {
    size_t from = n > 32 ? n - 32 : 0;
    for (size_t i = n; i-- > from + 1;)
        if (data[i - 1] == 0xFF && data[i] == 0xD9) return 1;
    return 0;
}

/* The part of an h x w image to decode for `want`: `want` and one pixel more on every side,
 * within the image (the whole image when they do not meet). libjpeg upsamples the chroma at
 * the edges of a cropped decode without its neighbours, so those pixels differ from a full
 * decode's; the margin keeps them out of the part the caller reads. */
static fl_rect with_margin(const fl_rect *want, int h, int w) {
    int y0 = want->y - 1 < 0 ? 0 : want->y - 1;
    int x0 = want->x - 1 < 0 ? 0 : want->x - 1;
    int y1 = want->y + want->h + 1 > h ? h : want->y + want->h + 1;
    int x1 = want->x + want->w + 1 > w ? w : want->x + want->w + 1;
    if (y1 <= y0 || x1 <= x0) return fl_rect_of(0, 0, h, w);
    return fl_rect_of(y0, x0, y1 - y0, x1 - x0);
}

/* Reads the rows [y0, y1) of a started decompression into `pixels`, rows of `row_bytes`,
 * skipping the rows above y0 undecoded. Returns FL_OK, or FL_ECORRUPT with a message when
 * the data stops early; libjpeg's own errors leave by longjmp to the caller's setjmp. */
static int read_rows(struct jpeg_decompress_struct *cinfo, uint8_t *pixels, size_t row_bytes,
                     int y0, int y1, char *message, size_t message_bytes) {
    JSAMPROW rows[16];
    if (y0 > 0 && jpeg_skip_scanlines(cinfo, (JDIMENSION)y0) != (JDIMENSION)y0) {
        snprintf(message, message_bytes, "corrupt JPEG: cannot skip to row %d", y0);
        return FL_ECORRUPT;
    }
    while (cinfo->output_scanline < (JDIMENSION)y1) {
        int k, want_rows = y1 - (int)cinfo->output_scanline;
        if (want_rows > 16) want_rows = 16;
        for (k = 0; k < want_rows; k++)
            rows[k] = pixels + row_bytes * (size_t)((int)cinfo->output_scanline - y0 + k);
        if (jpeg_read_scanlines(cinfo, (JSAMPARRAY)rows, (JDIMENSION)want_rows) == 0) {
            snprintf(message, message_bytes, "corrupt JPEG: no data at row %d",
                     (int)cinfo->output_scanline);
            return FL_ECORRUPT;
        }
    }
    return FL_OK;
}

int fl_jpeg_decode(const uint8_t *data, size_t n, int channels, int denom, const fl_rect *want,
                   fl_alloc_fn alloc, void *alloc_ctx, fl_image *out, int *out_y, int *out_x,
                   char *message, size_t message_bytes) {
    struct jpeg_decompress_struct cinfo;
    error_state err;
    if ((channels != 1 && channels != 3 && channels != 4) ||
        (denom != 1 && denom != 2 && denom != 4 && denom != 8)) {
        snprintf(message, message_bytes, "cannot decode a JPEG to %d channels at 1/%d", channels,
                 denom);
        return FL_EINVAL;
    }
    cinfo.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = on_error;
    err.mgr.emit_message = on_message;
    err.message = message;
    err.message_bytes = message_bytes;
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump)) {
        jpeg_destroy_decompress(&cinfo);
        return FL_ECORRUPT;
    }
    jpeg_mem_src(&cinfo, data, (unsigned long)n);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
        jpeg_destroy_decompress(&cinfo);
        return FL_EUNSUPPORTED;
    }
    cinfo.out_color_space = channels == 1 ? JCS_GRAYSCALE : channels == 3 ? JCS_RGB : JCS_EXT_RGBA;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned)denom;
    cinfo.dct_method = JDCT_ISLOW;
    jpeg_start_decompress(&cinfo);
    int h = (int)cinfo.output_height, w = (int)cinfo.output_width;
    fl_rect part =
        want && ends_with_eoi(data, n) ? with_margin(want, h, w) : fl_rect_of(0, 0, h, w);
    int y0 = part.y, y1 = part.y + part.h, x0 = part.x, x1 = part.x + part.w;
    JDIMENSION xoff = (JDIMENSION)x0, width = (JDIMENSION)(x1 - x0);
    if (width < (JDIMENSION)w) jpeg_crop_scanline(&cinfo, &xoff, &width);
    size_t row_bytes = (size_t)width * (size_t)channels;
    uint8_t *pixels = alloc(alloc_ctx, row_bytes * (size_t)(y1 - y0));
    if (!pixels) {
        snprintf(message, message_bytes, "out of memory decoding a %dx%d JPEG", h, w);
        jpeg_destroy_decompress(&cinfo);
        return FL_ENOMEM;
    }
    if (read_rows(&cinfo, pixels, row_bytes, y0, y1, message, message_bytes) != FL_OK) {
        jpeg_destroy_decompress(&cinfo);
        return FL_ECORRUPT;
    }
    if (cinfo.output_scanline == cinfo.output_height)
        jpeg_finish_decompress(&cinfo); /* reads up to EOI: reports a truncated end */
    else
        jpeg_abort_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    out->data = pixels;
    out->h = y1 - y0;
    out->w = (int)width;
    out->c = channels;
    out->stride = (ptrdiff_t)row_bytes;
    *out_y = y0;
    *out_x = (int)xoff;
    return FL_OK;
}
