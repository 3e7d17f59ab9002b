/* JPEG decoding through libjpeg(-turbo); see jpeg.h. */
#include "jpeg.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
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

/* libjpeg's error manager for `err`: errors jump to err->jump, warnings are errors, and
 * either's words go to `message`. Returns what a struct's `err` field takes. */
static struct jpeg_error_mgr *errors_to(error_state *err, char *message, size_t message_bytes) {
    struct jpeg_error_mgr *mgr = jpeg_std_error(&err->mgr);
    err->mgr.error_exit = on_error;
    err->mgr.emit_message = on_message;
    err->message = message;
    err->message_bytes = message_bytes;
    return mgr;
}

/* Whether the stream ends in an EOI marker (allowing a few bytes of padding after it). */
static int ends_with_eoi(const uint8_t *data, size_t n) {
    size_t from = n > 32 ? n - 32 : 0;
    for (size_t i = n; i-- > from + 1;)
        if (data[i - 1] == 0xFF && data[i] == 0xD9) return 1;
    return 0;
}

/* The part of an h x w image to decode for `want`: `want` and one pixel more on every side,
 * within the image (the whole image when they do not meet), and at least `min_w` pixels
 * wide where the image is. libjpeg upsamples the chroma at the edges of a cropped decode
 * without its neighbours, so those pixels differ from a full decode's: the margin keeps
 * them out of the part the caller reads. And it upsamples a crop whose chroma is under 2
 * samples wide by replication, not the smooth filter of the full decode (jpeg_crop_scanline
 * re-chooses the upsampler then): `min_w` (upsample_width) keeps the chroma 3 wide. */
static fl_rect with_margin(const fl_rect *want, int h, int w, int min_w) {
    int y0 = want->y - 1 < 0 ? 0 : want->y - 1;
    int x0 = want->x - 1 < 0 ? 0 : want->x - 1;
    int y1 = want->y + want->h + 1 > h ? h : want->y + want->h + 1;
    int x1 = want->x + want->w + 1 > w ? w : want->x + want->w + 1;
    if (y1 <= y0 || x1 <= x0) return fl_rect_of(0, 0, h, w);
    if (x1 - x0 < min_w) x1 = x0 + min_w > w ? w : x0 + min_w;
    if (x1 - x0 < min_w) x0 = x1 - min_w < 0 ? 0 : x1 - min_w;
    return fl_rect_of(y0, x0, y1 - y0, x1 - x0);
}

/* The narrowest crop (in output pixels, at any scale) whose every component is at least 3
 * samples wide, for an image whose widest component has `max_h` samples per MCU across:
 * jpeg_crop_scanline gives a component ceil(width * h_samp / max_h) samples. */
static int upsample_width(int max_h) { return 2 * max_h + 1; }

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

/* The row to read up to, past `y1`, so that libjpeg reads on past the end of the last
 * restart interval that rows [0, y1) use, and so checks that its data ends at its marker (a
 * warning of extraneous bytes when it does not, as a full decode gives): the first row of
 * the iMCU row that holds the next interval's first MCU, or the whole image, after which
 * jpeg_finish_decompress reads up to EOI. y1 itself where there is nothing to check: a
 * stream without restart intervals (damage below a crop's rows goes unnoticed), or one of
 * several scans (libjpeg reads those whole when it starts). */
static int check_row(const struct jpeg_decompress_struct *c, int y1) {
    int h = (int)c->output_height;
    if (!c->restart_interval || y1 >= h || c->progressive_mode ||
        c->comps_in_scan != c->num_components)
        return y1;
    /* An iMCU row is one row of MCUs, or v_samp_factor rows of a lone component's blocks. */
    int64_t mcu_rows = c->comps_in_scan == 1 ? c->cur_comp_info[0]->v_samp_factor : 1;
    int64_t imcu_h = (int64_t)c->max_v_samp_factor * c->min_DCT_scaled_size; /* output rows */
    int64_t per_row = c->MCUs_per_row, total = per_row * c->MCU_rows_in_scan;
    int64_t done = ((y1 - 1) / imcu_h + 1) * mcu_rows * per_row; /* MCUs decoded for y1 */
    int64_t next = (done + c->restart_interval - 1) / c->restart_interval * c->restart_interval;
    if (next >= total) return h;
    int64_t row = next / per_row / mcu_rows * imcu_h + 1;
    return row < h ? (int)row : h;
}

/* Reads (and drops) rows of a started decompression up to row y, one at a time, in memory
 * that libjpeg frees with the decompression. Returns FL_OK, or FL_ECORRUPT with a message. */
static int read_past(struct jpeg_decompress_struct *c, size_t row_bytes, int y, char *message,
                     size_t message_bytes) {
    JSAMPARRAY row =
        (*c->mem->alloc_sarray)((j_common_ptr)c, JPOOL_IMAGE, (JDIMENSION)row_bytes, 1);
    while ((int)c->output_scanline < y)
        if (jpeg_read_scanlines(c, row, 1) == 0) {
            snprintf(message, message_bytes, "corrupt JPEG: no data at row %d",
                     (int)c->output_scanline);
            return FL_ECORRUPT;
        }
    return FL_OK;
}

/* fl_jpeg_decode on `data` as it is: without the checks of the arguments, and without
 * cutting out the restart intervals under `want`. */
static int decode_stream(const uint8_t *data, size_t n, int channels, int denom,
                         const fl_rect *want, fl_alloc_fn alloc, void *alloc_ctx, fl_image *out,
                         int *out_y, int *out_x, char *message, size_t message_bytes) {
    struct jpeg_decompress_struct cinfo;
    error_state err;
    cinfo.err = errors_to(&err, message, message_bytes);
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
    int max_h = cinfo.num_components == 1 ? 1 : cinfo.max_h_samp_factor;
    fl_rect part = want && ends_with_eoi(data, n) ? with_margin(want, h, w, upsample_width(max_h))
                                                  : fl_rect_of(0, 0, h, w);
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
    if (read_rows(&cinfo, pixels, row_bytes, y0, y1, message, message_bytes) != FL_OK ||
        read_past(&cinfo, row_bytes, check_row(&cinfo, y1), message, message_bytes) != FL_OK) {
        jpeg_destroy_decompress(&cinfo);
        return FL_ECORRUPT;
    }
    if (cinfo.output_scanline == cinfo.output_height)
        jpeg_finish_decompress(&cinfo); /* reads up to EOI: a truncated end, extraneous bytes */
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

/* ---- restart intervals -----------------------------------------------------------------
 * A scan with restart markers is a row of independent intervals: each starts byte-aligned
 * after its marker, with the DC predictions reset. When every MCU row is a whole number of
 * intervals, the intervals under a crop (and its margin) make a smaller JPEG of their own:
 * the same headers with the smaller size in the frame header, those intervals in order,
 * renumbered markers between them. Decoding it entropy-decodes only the crop's intervals,
 * where a plain stream is entropy-decoded over every row down to the crop's last. */

/* The layout of a stream, from its markers up to the first scan. */
typedef struct {
    int h, w;         /* the image */
    int mcu_h, mcu_w; /* one MCU, in pixels */
    int per_row;      /* MCUs in a row */
    int interval;     /* MCUs in a restart interval; 0 without restarts */
    size_t sof;       /* where the frame header's payload starts */
    size_t data;      /* where the entropy-coded data starts (after the SOS segment) */
} jpeg_layout;

static int be16(const uint8_t *p) { return (p[0] << 8) | p[1]; }

static void put_be16(uint8_t *p, int v) {
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

/* Reads the markers of a stream from SOI to its first SOS. Returns 1 for a stream that
 * the intervals' shortcut understands: 8-bit sequential Huffman coding (SOF0, SOF1), one
 * scan of every component, a restart interval that divides the MCU row. Else 0. */
static int read_layout(const uint8_t *d, size_t n, jpeg_layout *L) {
    int comps = 0, hmax = 1, vmax = 1, have_sof = 0;
    size_t i = 2;
    memset(L, 0, sizeof *L);
    if (n < 4 || d[0] != 0xFF || d[1] != 0xD8) return 0;
    while (!L->data) {
        if (i + 4 > n || d[i] != 0xFF) return 0;
        int m = d[i + 1];
        if (m == 0xFF) { /* a fill byte */
            i++;
            continue;
        }
        size_t len = (size_t)be16(d + i + 2);
        if (len < 2 || i + 2 + len > n) return 0;
        const uint8_t *s = d + i + 4;
        if (m == 0xC0 || m == 0xC1) {
            if (have_sof || len < 8 || s[0] != 8) return 0;
            L->h = be16(s + 1);
            L->w = be16(s + 3);
            comps = s[5];
            if (L->h < 1 || L->w < 1 || comps < 1 || comps > 4 || len != 8 + 3 * (size_t)comps)
                return 0;
            for (int c = 0; c < comps; c++) {
                int hs = s[7 + 3 * c] >> 4, vs = s[7 + 3 * c] & 15;
                if (hs < 1 || hs > 4 || vs < 1 || vs > 4) return 0;
                hmax = hs > hmax ? hs : hmax;
                vmax = vs > vmax ? vs : vmax;
            }
            L->sof = i + 4;
            have_sof = 1;
        } else if (m >= 0xC2 && m <= 0xCF && m != 0xC4 && m != 0xCC) {
            return 0; /* progressive, lossless, arithmetic or hierarchical */
        } else if (m == 0xDD) {
            if (len != 4) return 0;
            L->interval = be16(s);
        } else if (m == 0xDA) {
            if (!have_sof || len < 3 || s[0] != comps) return 0;
            L->data = i + 2 + len;
        } else if (m == 0xD8 || m == 0xD9 || (m >= 0xD0 && m <= 0xD7) || m == 0xDC) {
            return 0; /* a marker out of place, or DNL (a height given after the scan) */
        }
        i += 2 + len;
    }
    /* A scan of one component has one block per MCU, whatever its sampling factors. */
    L->mcu_h = comps == 1 ? 8 : 8 * vmax;
    L->mcu_w = comps == 1 ? 8 : 8 * hmax;
    L->per_row = (L->w + L->mcu_w - 1) / L->mcu_w;
    return L->interval > 0 && L->per_row % L->interval == 0;
}

/* Walks the whole scan: returns 1 when it has exactly `count` intervals, closed by
 * RST0..RST7 in turn and the last by EOI, having appended those of rows [r0, r1) and
 * interval columns [c0, c1) (in scan order, which is the part's) to out[*at...], each
 * closed by the part's own marker: RST0..RST7 in turn, EOI after the last. */
static int copy_intervals(const uint8_t *d, size_t n, const jpeg_layout *L, int64_t count, int r0,
                          int r1, int c0, int c1, uint8_t *out, size_t *at) {
    int per_row = L->per_row / L->interval;
    int64_t k = 0, copied = 0, wanted = (int64_t)(r1 - r0) * (c1 - c0);
    size_t from = L->data, next = L->data;
    for (;;) {
        const uint8_t *f = next < n ? memchr(d + next, 0xFF, n - next) : NULL;
        if (!f || (size_t)(f - d) + 1 >= n) return 0;
        size_t pos = (size_t)(f - d);
        int m = d[pos + 1];
        if (m == 0x00 || m == 0xFF) { /* a stuffed 0xFF, or fill bytes before a marker */
            next = pos + (m == 0x00 ? 2 : 1);
            continue;
        }
        int closes = m >= 0xD0 && m <= 0xD7 ? 1 : m == 0xD9 ? 2 : 0;
        if (!closes || (closes == 1 && (m & 7) != (int)(k & 7))) return 0;
        int row = (int)(k / per_row), col = (int)(k % per_row);
        if (row >= r0 && row < r1 && col >= c0 && col < c1) {
            memcpy(out + *at, d + from, pos - from);
            *at += pos - from;
            copied++;
            out[(*at)++] = 0xFF;
            out[(*at)++] = copied == wanted ? 0xD9 : (uint8_t)(0xD0 + ((copied - 1) & 7));
        }
        k++;
        if (closes == 2) return k == count;
        if (k >= count) return 0;
        from = next = pos + 2;
    }
}

int fl_jpeg_part(const uint8_t *data, size_t n, int denom, const fl_rect *want, uint8_t **part,
                 size_t *part_n, int *dy, int *dx) {
    jpeg_layout L;
    *part = NULL;
    if (!want || !read_layout(data, n, &L)) return 0;
    int dh = (L.h + denom - 1) / denom, dw = (L.w + denom - 1) / denom;
    fl_rect m = with_margin(want, dh, dw, upsample_width(L.mcu_w / 8));
    int rows = (L.h + L.mcu_h - 1) / L.mcu_h, per_row = L.per_row / L.interval;
    int span = L.mcu_w * L.interval; /* pixels across an interval */
    int r0 = m.y * denom / L.mcu_h, r1 = ((m.y + m.h) * denom + L.mcu_h - 1) / L.mcu_h;
    int c0 = m.x * denom / span, c1 = ((m.x + m.w) * denom + span - 1) / span;
    r1 = r1 < rows ? r1 : rows;
    c1 = c1 < per_row ? c1 : per_row;
    if (r0 == 0 && c0 == 0 && c1 == per_row) return 0; /* as many intervals as a plain decode */
    /* The headers, the intervals' bytes and a marker after each: at most n + 2 per one. */
    uint8_t *out = malloc(n + 2 * (size_t)(r1 - r0) * (size_t)(c1 - c0));
    if (!out) return -1;
    memcpy(out, data, L.data);
    put_be16(out + L.sof + 1, r1 == rows ? L.h - r0 * L.mcu_h : (r1 - r0) * L.mcu_h);
    put_be16(out + L.sof + 3, c1 == per_row ? L.w - c0 * span : (c1 - c0) * span);
    size_t at = L.data;
    if (!copy_intervals(data, n, &L, (int64_t)rows * per_row, r0, r1, c0, c1, out, &at)) {
        free(out);
        return 0;
    }
    *part = out;
    *part_n = at;
    *dy = r0 * L.mcu_h / denom;
    *dx = c0 * span / denom;
    return 1;
}

int fl_jpeg_decode(const uint8_t *data, size_t n, int channels, int denom, const fl_rect *want,
                   fl_alloc_fn alloc, void *alloc_ctx, fl_image *out, int *out_y, int *out_x,
                   char *message, size_t message_bytes) {
    if ((channels != 1 && channels != 3 && channels != 4) ||
        (denom != 1 && denom != 2 && denom != 4 && denom != 8)) {
        snprintf(message, message_bytes, "cannot decode a JPEG to %d channels at 1/%d", channels,
                 denom);
        return FL_EINVAL;
    }
    uint8_t *part;
    size_t part_n;
    int dy, dx;
    int found = want && ends_with_eoi(data, n)
        ? fl_jpeg_part(data, n, denom, want, &part, &part_n, &dy, &dx)
        : 0;
    if (found < 0) {
        snprintf(message, message_bytes, "out of memory decoding a JPEG of %zu bytes", n);
        return FL_ENOMEM;
    }
    if (!found)
        return decode_stream(data, n, channels, denom, want, alloc, alloc_ctx, out, out_y, out_x,
                             message, message_bytes);
    fl_rect moved = fl_rect_of(want->y - dy, want->x - dx, want->h, want->w);
    int err = decode_stream(part, part_n, channels, denom, &moved, alloc, alloc_ctx, out, out_y,
                            out_x, message, message_bytes);
    free(part);
    if (err == FL_OK) {
        *out_y += dy;
        *out_x += dx;
    }
    return err;
}

/* Has libjpeg keep the stream's APPn and COM segments (EXIF, ICC profiles, comments) with
 * the header it reads, so that copy_markers can write them out again. */
static void keep_markers(struct jpeg_decompress_struct *src) {
    jpeg_save_markers(src, JPEG_COM, 0xFFFF);
    for (int m = 0; m < 16; m++) jpeg_save_markers(src, JPEG_APP0 + m, 0xFFFF);
}

/* Writes the segments keep_markers kept into `dst`, after its frame's own JFIF or Adobe
 * segment, which libjpeg writes itself (and which are therefore not copied twice). */
static void copy_markers(struct jpeg_decompress_struct *src, struct jpeg_compress_struct *dst) {
    for (jpeg_saved_marker_ptr m = src->marker_list; m; m = m->next) {
        int jfif = m->marker == JPEG_APP0 && m->data_length >= 5 && memcmp(m->data, "JFIF", 5) == 0;
        int adobe =
            m->marker == JPEG_APP0 + 14 && m->data_length >= 5 && memcmp(m->data, "Adobe", 5) == 0;
        if ((jfif && dst->write_JFIF_header) || (adobe && dst->write_Adobe_marker)) continue;
        jpeg_write_marker(dst, m->marker, m->data, m->data_length);
    }
}

/* The restart interval for an image `width` pixels across in MCUs `mcu_w` pixels wide:
 * the most MCUs that divide the MCU row and span at most `span` pixels (one at least). */
static int restart_interval(int width, int mcu_w, int span) {
    int per_row = (width + mcu_w - 1) / mcu_w, interval = 1;
    for (int k = 2; k <= per_row && k * mcu_w <= span; k++)
        if (per_row % k == 0) interval = k;
    return interval;
}

int fl_jpeg_add_restarts(const uint8_t *data, size_t n, int span, uint8_t **out, size_t *out_n,
                         char *message, size_t message_bytes) {
    struct jpeg_decompress_struct src;
    struct jpeg_compress_struct dst;
    error_state err;
    unsigned char *volatile ours = NULL;
    *out = NULL;
    src.err = dst.err = errors_to(&err, message, message_bytes);
    jpeg_create_decompress(&src);
    jpeg_create_compress(&dst);
    if (setjmp(err.jump)) {
        jpeg_destroy_compress(&dst);
        jpeg_destroy_decompress(&src);
        free(ours);
        return FL_ECORRUPT;
    }
    jpeg_mem_src(&src, data, (unsigned long)n);
    keep_markers(&src);
    jpeg_read_header(&src, TRUE);
    if (src.progressive_mode || src.arith_code || src.data_precision != 8) {
        jpeg_destroy_compress(&dst);
        jpeg_destroy_decompress(&src);
        return FL_EUNSUPPORTED;
    }
    int one = src.num_components == 1;
    int mcu_w = one ? 8 : 8 * src.max_h_samp_factor, mcu_h = one ? 8 : 8 * src.max_v_samp_factor;
    int per_row = ((int)src.image_width + mcu_w - 1) / mcu_w;
    int interval = restart_interval((int)src.image_width, mcu_w, span);
    /* Room for the stream and 8 bytes per interval (its marker, a partial byte, whole DC
     * values at its start): libjpeg then never grows the buffer, in memory of its own. */
    size_t mcus = (size_t)per_row * (((size_t)src.image_height + mcu_h - 1) / mcu_h);
    unsigned long room = (unsigned long)(n + 8 * mcus + 4096), bytes = room;
    unsigned char *buffer = ours = malloc(room);
    if (!ours) {
        jpeg_destroy_compress(&dst);
        jpeg_destroy_decompress(&src);
        snprintf(message, message_bytes, "out of memory adding restart markers to a JPEG");
        return FL_ENOMEM;
    }
    jvirt_barray_ptr *coefficients = jpeg_read_coefficients(&src);
    jpeg_copy_critical_parameters(&src, &dst);
    dst.restart_interval = (unsigned)interval;
    jpeg_mem_dest(&dst, &buffer, &bytes);
    jpeg_write_coefficients(&dst, coefficients);
    copy_markers(&src, &dst);
    jpeg_finish_compress(&dst);
    jpeg_finish_decompress(&src);
    jpeg_destroy_compress(&dst);
    jpeg_destroy_decompress(&src);
    if (buffer != ours) free(ours);
    *out = buffer;
    *out_n = (size_t)bytes;
    return FL_OK;
}

int fl_jpeg_encode(const fl_image *img, int quality, int h_samp, int v_samp, int span,
                   uint8_t **out, size_t *out_n, char *message, size_t message_bytes) {
    *out = NULL;
    if (!img || !img->data || img->h < 1 || img->w < 1 || img->c != 3 || quality < 1 ||
        quality > 100 || (h_samp != 1 && h_samp != 2) || (v_samp != 1 && v_samp != 2) ||
        img->h > JPEG_MAX_DIMENSION || img->w > JPEG_MAX_DIMENSION) {
        snprintf(message, message_bytes, "no JPEG encoding for these arguments");
        return FL_EINVAL;
    }
    struct jpeg_compress_struct dst;
    error_state err;
    /* Room for the stream (libjpeg grows it, in memory of its own, in the rare case it
     * needs more than the pixels' bytes). */
    unsigned long room = (unsigned long)((size_t)img->h * img->w * 3 + 65536), bytes = room;
    unsigned char *volatile ours = malloc(room);
    unsigned char *buffer = ours;
    if (!ours) {
        snprintf(message, message_bytes, "out of memory encoding a JPEG");
        return FL_ENOMEM;
    }
    dst.err = errors_to(&err, message, message_bytes);
    jpeg_create_compress(&dst);
    if (setjmp(err.jump)) {
        jpeg_destroy_compress(&dst);
        free(ours);
        return FL_ECORRUPT;
    }
    dst.image_width = (JDIMENSION)img->w;
    dst.image_height = (JDIMENSION)img->h;
    dst.input_components = 3;
    dst.in_color_space = JCS_RGB;
    jpeg_set_defaults(&dst);
    jpeg_set_quality(&dst, quality, TRUE);
    dst.comp_info[0].h_samp_factor = h_samp;
    dst.comp_info[0].v_samp_factor = v_samp;
    dst.dct_method = JDCT_ISLOW;
    if (span > 0) dst.restart_interval = (unsigned)restart_interval(img->w, 8 * h_samp, span);
    jpeg_mem_dest(&dst, &buffer, &bytes);
    jpeg_start_compress(&dst, TRUE);
    while (dst.next_scanline < dst.image_height) {
        JSAMPROW row = (JSAMPROW)(img->data + (ptrdiff_t)dst.next_scanline * img->stride);
        jpeg_write_scanlines(&dst, &row, 1);
    }
    jpeg_finish_compress(&dst);
    jpeg_destroy_compress(&dst);
    if (buffer != ours) free(ours);
    *out = buffer;
    *out_n = (size_t)bytes;
    return FL_OK;
}
