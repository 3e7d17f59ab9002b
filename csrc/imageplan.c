/* The native image field; see imageplan.h. */
#include "imageplan.h"

#include <ctype.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jpeg.h"
#include "qoi.h"

int fl_jpeg_size(const uint8_t *data, size_t n, int *h, int *w) {
    if (n < 4 || data[0] != 0xFF || data[1] != 0xD8) return -1;
    size_t p = 2;
    while (p + 1 < n) {
        if (data[p] != 0xFF) return -1;
        while (p < n && data[p] == 0xFF) p++;           /* fill bytes */
        if (p >= n) return -1;
        uint8_t marker = data[p++];
        if (marker == 0xD8 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;
        if (marker == 0xD9 || marker == 0xDA) return -1; /* end or scan before a frame */
        if (p + 2 > n) return -1;
        size_t length = ((size_t)data[p] << 8) | data[p + 1];
        if (length < 2 || p + length > n) return -1;
        int is_frame = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 &&
                       marker != 0xC8 && marker != 0xCC;
        if (is_frame) {
            if (length < 7) return -1;
            *h = (data[p + 3] << 8) | data[p + 4];
            *w = (data[p + 5] << 8) | data[p + 6];
            return *h > 0 && *w > 0 ? 0 : -1;
        }
        p += length;
    }
    return -1;
}

/* The format of encoded bytes, from their first bytes. */
enum { FORMAT_JPEG, FORMAT_QOI, FORMAT_OTHER, FORMAT_UNKNOWN };

static int format_of(const uint8_t *d, size_t n) {
    if (n >= 2 && d[0] == 0xFF && d[1] == 0xD8) return FORMAT_JPEG;
    if (n >= 4 && memcmp(d, "qoif", 4) == 0) return FORMAT_QOI;
    if ((n >= 8 && memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0) ||
        (n >= 2 && memcmp(d, "BM", 2) == 0) ||
        (n >= 4 && memcmp(d, "GIF8", 4) == 0) ||
        (n >= 12 && memcmp(d, "RIFF", 4) == 0 && memcmp(d + 8, "WEBP", 4) == 0) ||
        (n >= 4 && (memcmp(d, "II*\0", 4) == 0 || memcmp(d, "MM\0*", 4) == 0)) ||
        (n >= 3 && d[0] == 'P' && d[1] >= '1' && d[1] <= '6' && isspace(d[2])))  /* PNM */
        return FORMAT_OTHER;
    return FORMAT_UNKNOWN;
}

/* Reads the file at `path` into scratch memory; returns its bytes or NULL with a message.
 * Only regular files (opening a FIFO or device must not block a pool thread), at most
 * `max_bytes` of them, and only after their first bytes show an image format fastload
 * reads: a huge file of anything else costs no memory. */
static const uint8_t *read_file(const char *path, int64_t max_bytes, size_t *n,
                                fl_scratch *scratch, char *message) {
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) {
        snprintf(message, FL_MESSAGE_BYTES, "cannot open the file");
        return NULL;
    }
    struct stat st;
    uint8_t head[12];
    uint8_t *buf = NULL;
    int regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    ssize_t head_n = regular && st.st_size <= max_bytes ? pread(fd, head, sizeof head, 0) : -1;
    if (!regular) {
        snprintf(message, FL_MESSAGE_BYTES, "not a regular file");
    } else if (st.st_size > max_bytes) {
        snprintf(message, FL_MESSAGE_BYTES, "a file of %lld bytes is over the limit of "
                 "%lld bytes (fastload.limits.MAX_FILE_BYTES)", (long long)st.st_size,
                 (long long)max_bytes);
    } else if (head_n < 2 || format_of(head, (size_t)head_n) == FORMAT_UNKNOWN) {
        snprintf(message, FL_MESSAGE_BYTES, "not an image file fastload reads (JPEG, PNG, "
                 "BMP, GIF, WebP, TIFF, PNM or QOI)");
    } else if (!(buf = fl_scratch_reserve(scratch, (size_t)st.st_size + 1))) {
        snprintf(message, FL_MESSAGE_BYTES, "out of memory reading the file");
    } else {
        size_t got = 0;
        while (got < (size_t)st.st_size) {
            ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
            if (r <= 0) break;
            got += (size_t)r;
        }
        *n = got;
    }
    close(fd);
    return buf;
}

/* Where item `index` lives: its encoded bytes, or (PIXELS) a decoded image. */
static const uint8_t *encoded_item(const fl_image_source *src, int64_t index, size_t *n,
                                   fl_scratch *file_scratch, char *message) {
    switch (src->kind) {
    case FL_SOURCE_BUFFERS:
        *n = (size_t)src->lens[index];
        return src->ptrs[index];
    case FL_SOURCE_OFFSETS:
        *n = (size_t)(src->offsets[index + 1] - src->offsets[index]);
        return src->base + src->offsets[index];
    case FL_SOURCE_FILES:
        return read_file(src->paths[index], src->max_file_bytes, n, file_scratch, message);
    }
    return NULL;
}

/* Whether the pipeline's output for an h x w x c source is exactly the slot's row; an
 * image that would give another size must never be written there. */
static int fits_row(int64_t row_bytes, const fl_pipeline *p, int h, int w, int c,
                    char *message) {
    int oh, ow, oc;
    if (fl_pipeline_output_shape(p, h, w, c, &oh, &ow, &oc) != FL_OK) {
        snprintf(message, FL_MESSAGE_BYTES, "the pipeline does not fit a %dx%d image", h, w);
        return 0;
    }
    int64_t bytes = (int64_t)oh * ow * oc * (p->out_dtype == FL_DTYPE_FLOAT32 ? 4 : 1);
    if (bytes != row_bytes) {
        snprintf(message, FL_MESSAGE_BYTES, "a %dx%dx%d image gives a %dx%dx%d output, not the "
                 "size of the others", h, w, c, oh, ow, oc);
        return 0;
    }
    return 1;
}

static int fail(char *message, const fl_image_source *src, int64_t index, const char *what) {
    char detail[FL_MESSAGE_BYTES];
    snprintf(detail, sizeof detail, "%s", message[0] ? message : what);
    if (src->kind == FL_SOURCE_FILES)
        snprintf(message, FL_MESSAGE_BYTES, "image %lld (%s): %s", (long long)index,
                 src->paths[index], detail);
    else
        snprintf(message, FL_MESSAGE_BYTES, "image %lld of %s: %s", (long long)index,
                 src->name, detail);
    return -1;
}

void fl_prefetch_image(const fl_field *field, int64_t index) {
    const fl_image_source *src = field->state;
    if (index < 0 || index >= src->count) return;
    if (src->kind == FL_SOURCE_PIXELS)
        fl_prefetch_lines(src->ptrs[index], src->row_strides[index] * src->dims[3 * index]);
    else if (src->kind == FL_SOURCE_BUFFERS)
        fl_prefetch_lines(src->ptrs[index], src->lens[index]);
    else if (src->kind == FL_SOURCE_OFFSETS)
        fl_prefetch_lines(src->base + src->offsets[index],
                          src->offsets[index + 1] - src->offsets[index]);
}

static void *reserve(void *scratch, size_t bytes) {
    return fl_scratch_reserve((fl_scratch *)scratch, bytes);
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* The size of an encoded JPEG or QOI image from its header; -1 with a message when the
 * header is unreadable, the image over the pixel limit, or (QOI) the stream too short. */
static int encoded_size(const fl_image_source *src, const uint8_t *data, size_t n, int format,
                        int *h, int *w, char *message) {
    int stored;
    if (format == FORMAT_QOI) {
        if (fl_qoi_header(data, n, w, h, &stored) != FL_QOI_OK) {
            snprintf(message, FL_MESSAGE_BYTES, "corrupt QOI header");
            return -1;
        }
        if (!fl_qoi_plausible(n, *w, *h)) {
            snprintf(message, FL_MESSAGE_BYTES, "truncated QOI stream");
            return -1;
        }
    } else if (fl_jpeg_size(data, n, h, w) != 0) {
        snprintf(message, FL_MESSAGE_BYTES, "truncated or corrupt JPEG header");
        return -1;
    }
    if ((int64_t)*h * *w > src->max_pixels) {
        snprintf(message, FL_MESSAGE_BYTES, "a %dx%d image is over the limit of %lld pixels "
                 "(fastload.limits.MAX_IMAGE_PIXELS)", *h, *w, (long long)src->max_pixels);
        return -1;
    }
    return 0;
}

/* Decodes a JPEG: the region the run reads, in C, or (a build without libjpeg, or a CMYK
 * image) the whole image at the same scale through src->decode_jpeg. */
static int decode_jpeg(const fl_image_source *src, const uint8_t *data, size_t n, int h,
                       int w, int denom, const fl_plan_rect *region, fl_scratch *scratch,
                       fl_image *img, int *img_y, int *img_x, char *message) {
    int rc = fl_jpeg_decode(data, n, src->channels, denom, region, reserve, scratch, img,
                            img_y, img_x, message, FL_MESSAGE_BYTES);
    if (rc != FL_JPEG_FALLBACK) return rc == FL_JPEG_OK ? 0 : -1;
    int dh = (h + denom - 1) / denom, dw = (w + denom - 1) / denom, c = src->channels;
    uint8_t *pixels = fl_scratch_reserve(scratch, (size_t)dh * dw * c);
    if (!pixels) {
        snprintf(message, FL_MESSAGE_BYTES, "out of memory");
        return -1;
    }
    message[0] = '\0';
    if (src->decode_jpeg(src->decode_ctx, data, n, denom, c, h, w, pixels, message)) return -1;
    fl_image whole = {pixels, dh, dw, c, (ptrdiff_t)dw * c};
    *img = whole;
    *img_y = *img_x = 0;
    return 0;
}

int fl_decode_for_run(const fl_image_source *src, const uint8_t *data, size_t n,
                      uint64_t seed, uint64_t epoch, uint64_t index, int64_t dst_bytes,
                      fl_scratch *scratch, fl_decoded *out, char *message) {
    const fl_pipeline *p = src->pipeline;
    int format = format_of(data, n), h = 0, w = 0, denom = 1, img_y = 0, img_x = 0;
    fl_image img;
    message[0] = '\0';
    if (n == 0) {
        snprintf(message, FL_MESSAGE_BYTES, "empty image");
        return -1;
    }
    if (format == FORMAT_UNKNOWN) {
        snprintf(message, FL_MESSAGE_BYTES, "not an image file fastload reads (JPEG, PNG, "
                 "BMP, GIF, WebP, TIFF, PNM or QOI)");
        return -1;
    }
    if (format == FORMAT_OTHER) {
        /* Decoded whole (with the GIL) by src->decode_other, which checks the pixel limit
         * from the file's header before decoding. */
        if (src->decode_other(src->decode_ctx, data, n, src->channels, src->max_pixels,
                              reserve, scratch, &img, message))
            return -1;
        h = img.h;
        w = img.w;
    } else if (encoded_size(src, data, n, format, &h, &w, message)) {
        return -1;
    }
    int decoded_c = format == FORMAT_QOI ? (src->channels == 4 ? 4 : 3) : src->channels;
    if (dst_bytes >= 0 && !fits_row(dst_bytes, p, h, w, decoded_c, message)) return -1;
    fl_plan_rect region;
    if (fl_pipeline_region(p, h, w, src->exact || format != FORMAT_JPEG, seed, epoch, index,
                           &denom, &region) != 0) {
        snprintf(message, FL_MESSAGE_BYTES, "the pipeline does not fit a %dx%d image", h, w);
        return -1;
    }
    if (format == FORMAT_QOI) {
        uint8_t *pixels = fl_scratch_reserve(scratch, (size_t)h * w * decoded_c);
        if (!pixels) {
            snprintf(message, FL_MESSAGE_BYTES, "out of memory");
            return -1;
        }
        int err = fl_qoi_decode(data, n, pixels, w, h, decoded_c);
        if (err != FL_QOI_OK) {
            snprintf(message, FL_MESSAGE_BYTES, "%s", fl_qoi_strerror(err));
            return -1;
        }
        fl_image whole = {pixels, h, w, decoded_c, (ptrdiff_t)w * decoded_c};
        img = whole;
    } else if (format == FORMAT_JPEG &&
               decode_jpeg(src, data, n, h, w, denom, &region, scratch, &img, &img_y, &img_x,
                           message)) {
        if (!message[0]) snprintf(message, FL_MESSAGE_BYTES, "corrupt JPEG");
        return -1;
    }
    out->part = img;
    out->y = img_y;
    out->x = img_x;
    out->src_h = h;
    out->src_w = w;
    out->denom = denom;
    return 0;
}

int fl_run_encoded(const fl_image_source *src, const uint8_t *data, size_t n, uint64_t seed,
                   uint64_t epoch, uint64_t index, char *dst, int64_t dst_bytes,
                   fl_scratch *scratch, char *message) {
    fl_decoded d;
    if (fl_decode_for_run(src, data, n, seed, epoch, index, dst_bytes, scratch, &d, message))
        return -1;
    /* The pipeline's scratch goes after the pixels, in the same region: growing it keeps
     * the pixels (realloc). */
    const fl_pipeline *p = src->pipeline;
    size_t image_bytes = align64((size_t)d.part.stride * d.part.h);
    size_t work_bytes = fl_pipeline_scratch_bytes(p, d.src_h, d.src_w, d.part.c);
    uint8_t *base = fl_scratch_reserve(scratch, image_bytes + work_bytes);
    if (!base) {
        snprintf(message, FL_MESSAGE_BYTES, "out of memory");
        return -1;
    }
    d.part.data = base;
    if (fl_pipeline_run_region(p, &d.part, d.y, d.x, d.src_h, d.src_w, d.denom, seed, epoch,
                               index, dst, base + image_bytes, work_bytes) != FL_OK) {
        snprintf(message, FL_MESSAGE_BYTES, "the pipeline does not fit a %dx%d image",
                 d.src_h, d.src_w);
        return -1;
    }
    return 0;
}

int fl_fill_image(const fl_field *field, const fl_item *item, char *dst, fl_scratch *scratch,
                  char *message) {
    const fl_image_source *src = field->state;
    const int64_t index = item->index;
    const uint64_t seed = item->run->seed, epoch = item->run->epoch;
    const fl_pipeline *p = src->pipeline;
    if (index < 0 || index >= src->count) {
        snprintf(message, FL_MESSAGE_BYTES, "index %lld is out of range for %lld images",
                 (long long)index, (long long)src->count);
        return -1;
    }
    if (src->kind == FL_SOURCE_PIXELS) {
        const int32_t *d = src->dims + 3 * index;
        fl_image img = {(uint8_t *)src->ptrs[index], d[0], d[1], d[2], src->row_strides[index]};
        /* One geometry per item: the run checks the output size against the row and
         * says how much scratch it needs, which grows once to the largest image. */
        size_t need = 0;
        int rc = fl_pipeline_run_into(p, &img, seed, epoch, (uint64_t)index, dst,
                                      (size_t)field->row_bytes, scratch->data, scratch->bytes,
                                      &need);
        if (rc == FL_ESCRATCH) {
            if (!fl_scratch_reserve(scratch, need)) return fail(message, src, index, "out of memory");
            rc = fl_pipeline_run_into(p, &img, seed, epoch, (uint64_t)index, dst,
                                      (size_t)field->row_bytes, scratch->data, scratch->bytes,
                                      &need);
        }
        if (rc != FL_OK && !fits_row(field->row_bytes, p, img.h, img.w, img.c, message))
            return fail(message, src, index, "");   /* says how the size differs */
        return rc == FL_OK ? 0 : fail(message, src, index, "the pipeline does not fit this image");
    }

    size_t n = 0;
    message[0] = '\0';
    const uint8_t *data = encoded_item(src, index, &n, &scratch[1], message);
    if (!data && message[0]) return fail(message, src, index, "");
    if (fl_run_encoded(src, data, n, seed, epoch, (uint64_t)index, dst, field->row_bytes,
                       &scratch[0], message) != 0)
        return fail(message, src, index, "");
    return 0;
}
