/* The native image field; see imagesource.h. */
#include "imagesource.h"

#include <ctype.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jpeg.h"
#include "qoi.h"

enum {
    SOURCE_BUFFERS = 0, /* item i is ptrs[i][0 .. lens[i]) */
    SOURCE_OFFSETS,     /* item i is base[offsets[i] .. offsets[i + 1]) */
    SOURCE_FILES,       /* item i is the contents of the file paths[i] */
    SOURCE_PIXELS       /* item i is a decoded uint8 image: ptrs[i], dims[3i..3i+2] */
};

struct fl_image_source {
    const fl_pipeline *pipeline;
    int kind; /* SOURCE_* */
    int64_t count;
    const uint8_t *const *ptrs; /* BUFFERS, PIXELS */
    const int64_t *lens;        /* BUFFERS */
    const uint8_t *base;        /* OFFSETS */
    const int64_t *offsets;     /* OFFSETS: count + 1 entries */
    const char *const *paths;   /* FILES */
    const int32_t *dims;        /* PIXELS: h, w, c per item */
    const int64_t *row_strides; /* PIXELS */
    int channels;               /* channels to decode encoded images to (1, 3 or 4) */
    int exact;                  /* decode at full scale, never at a reduced DCT scale */
    /* libjpeg's region decoder (fastload._jpeg's); NULL where it could not be loaded */
    fl_jpeg_decode_fn libjpeg_decode;
    fl_decode_fn fallback_decode_jpeg; /* JPEG, where libjpeg is not there or for CMYK */
    fl_decode_other_fn decode_other;
    void *decode_ctx; /* of both */
    char *name;       /* what to call the source in messages */
    /* Refused before memory is set aside (fastload.limits): a forged header must not
     * make a thread reserve gigabytes, nor a huge file be read whole. */
    int64_t max_pixels;
    int64_t max_file_bytes;
};

fl_image_source *fl_image_source_create(const fl_pipeline *pipeline, int channels, int exact,
                                        const char *name, int64_t max_pixels,
                                        int64_t max_file_bytes, fl_jpeg_decode_fn libjpeg_decode,
                                        fl_decode_fn fallback_decode_jpeg,
                                        fl_decode_other_fn decode_other, void *decode_ctx) {
    if (!pipeline || (channels != 1 && channels != 3 && channels != 4) || !name ||
        !fallback_decode_jpeg || !decode_other)
        return NULL;
    fl_image_source *src = calloc(1, sizeof *src);
    if (!src) return NULL;
    src->name = strdup(name);
    if (!src->name) {
        free(src);
        return NULL;
    }
    src->pipeline = pipeline;
    src->channels = channels;
    src->exact = exact != 0;
    src->max_pixels = max_pixels;
    src->max_file_bytes = max_file_bytes;
    src->libjpeg_decode = libjpeg_decode;
    src->fallback_decode_jpeg = fallback_decode_jpeg;
    src->decode_other = decode_other;
    src->decode_ctx = decode_ctx;
    return src;
}

void fl_image_source_destroy(fl_image_source *src) {
    if (!src) return;
    free(src->name);
    free(src);
}

void fl_image_source_buffers(fl_image_source *src, int64_t count, const uint8_t *const *ptrs,
                             const int64_t *lens) {
    src->kind = SOURCE_BUFFERS;
    src->count = count;
    src->ptrs = ptrs;
    src->lens = lens;
}

void fl_image_source_offsets(fl_image_source *src, int64_t count, const uint8_t *base,
                             const int64_t *offsets) {
    src->kind = SOURCE_OFFSETS;
    src->count = count;
    src->base = base;
    src->offsets = offsets;
}

void fl_image_source_files(fl_image_source *src, int64_t count, const char *const *paths) {
    src->kind = SOURCE_FILES;
    src->count = count;
    src->paths = paths;
}

void fl_image_source_pixels(fl_image_source *src, int64_t count, const uint8_t *const *ptrs,
                            const int32_t *dims, const int64_t *row_strides) {
    src->kind = SOURCE_PIXELS;
    src->count = count;
    src->ptrs = ptrs;
    src->dims = dims;
    src->row_strides = row_strides;
}

void fl_image_source_field(fl_field *fields, int f, const fl_image_source *src, int64_t row_bytes) {
    fl_field_set_fill(fields, f, fl_fill_image, fl_prefetch_image, (void *)src, row_bytes);
}

int fl_jpeg_size(const uint8_t *data, size_t n, int *h, int *w) {
    if (n < 4 || data[0] != 0xFF || data[1] != 0xD8) return FL_EFORMAT;
    size_t p = 2;
    while (p + 1 < n) {
        if (data[p] != 0xFF) return FL_EFORMAT;
        while (p < n && data[p] == 0xFF) p++; /* fill bytes */
        if (p >= n) return FL_EFORMAT;
        uint8_t marker = data[p++];
        if (marker == 0xD8 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;
        if (marker == 0xD9 || marker == 0xDA) return FL_EFORMAT; /* end or scan before a frame */
        if (p + 2 > n) return FL_EFORMAT;
        size_t length = ((size_t)data[p] << 8) | data[p + 1];
        if (length < 2 || p + length > n) return FL_EFORMAT;
        int is_frame =
            marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
        if (is_frame) {
            if (length < 7) return FL_EFORMAT;
            *h = (data[p + 3] << 8) | data[p + 4];
            *w = (data[p + 5] << 8) | data[p + 6];
            return *h > 0 && *w > 0 ? FL_OK : FL_EFORMAT;
        }
        p += length;
    }
    return FL_EFORMAT;
}

/* The format of encoded bytes, from their first bytes. JPEG: the start-of-image marker and
 * the FF of the next marker, as fastload._images.codecs.JPEG_MAGIC (FF D8 alone starts other files). */
enum { FORMAT_JPEG, FORMAT_QOI, FORMAT_OTHER, FORMAT_UNKNOWN };

static int format_of(const uint8_t *d, size_t n) {
    if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return FORMAT_JPEG;
    if (n >= 4 && memcmp(d, "qoif", 4) == 0) return FORMAT_QOI;
    if ((n >= 8 && memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0) || (n >= 2 && memcmp(d, "BM", 2) == 0) ||
        (n >= 4 && memcmp(d, "GIF8", 4) == 0) ||
        (n >= 12 && memcmp(d, "RIFF", 4) == 0 && memcmp(d + 8, "WEBP", 4) == 0) ||
        (n >= 4 && (memcmp(d, "II*\0", 4) == 0 || memcmp(d, "MM\0*", 4) == 0)) ||
        (n >= 3 && d[0] == 'P' && d[1] >= '1' && d[1] <= '6' && isspace(d[2]))) /* PNM */
        return FORMAT_OTHER;
    return FORMAT_UNKNOWN;
}

/* Reads the file at `path` into scratch memory; returns its bytes or NULL with a message.
 * Only regular files (opening a FIFO or device must not block a pool thread), at most
 * `max_bytes` of them, and only after their first bytes show an image format fastload
 * reads: a huge file of anything else costs no memory. */
static const uint8_t *read_file(const char *path, int64_t max_bytes, size_t *n, fl_scratch *scratch,
                                char *message) {
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
        snprintf(message, FL_MESSAGE_BYTES,
                 "a file of %lld bytes is over the limit of "
                 "%lld bytes (fastload.limits.MAX_FILE_BYTES)",
                 (long long)st.st_size, (long long)max_bytes);
    } else if (head_n < 2 || format_of(head, (size_t)head_n) == FORMAT_UNKNOWN) {
        snprintf(message, FL_MESSAGE_BYTES,
                 "not an image file fastload reads (JPEG, PNG, "
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
    case SOURCE_BUFFERS: *n = (size_t)src->lens[index]; return src->ptrs[index];
    case SOURCE_OFFSETS:
        *n = (size_t)(src->offsets[index + 1] - src->offsets[index]);
        return src->base + src->offsets[index];
    case SOURCE_FILES:
        return read_file(src->paths[index], src->max_file_bytes, n, file_scratch, message);
    }
    return NULL;
}

/* FL_OK when the pipeline's output for an h x w x c source is exactly the slot's row, else
 * FL_ESHAPE with a message: an image that would give another size must never be written
 * there. */
static int fits_row(int64_t row_bytes, const fl_pipeline *p, int h, int w, int c, char *message) {
    int oh, ow, oc;
    if (fl_pipeline_output_shape(p, h, w, c, &oh, &ow, &oc) != FL_OK) {
        snprintf(message, FL_MESSAGE_BYTES, "the pipeline does not fit a %dx%d image", h, w);
        return FL_ESHAPE;
    }
    int64_t bytes = (int64_t)oh * ow * oc * (p->out_dtype == FL_DTYPE_FLOAT32 ? 4 : 1);
    if (bytes != row_bytes) {
        snprintf(message, FL_MESSAGE_BYTES,
                 "a %dx%dx%d image gives a %dx%dx%d output, not the "
                 "size of the others",
                 h, w, c, oh, ow, oc);
        return FL_ESHAPE;
    }
    return FL_OK;
}

/* Returns `code` after prefixing the message (or `what` when there is none) with the image
 * it is about. */
static int fail(int code, char *message, const fl_image_source *src, int64_t index,
                const char *what) {
    char detail[FL_MESSAGE_BYTES];
    snprintf(detail, sizeof detail, "%s", message[0] ? message : what);
    if (src->kind == SOURCE_FILES)
        snprintf(message, FL_MESSAGE_BYTES, "image %lld (%s): %s", (long long)index,
                 src->paths[index], detail);
    else
        snprintf(message, FL_MESSAGE_BYTES, "image %lld of %s: %s", (long long)index, src->name,
                 detail);
    return code;
}

void fl_prefetch_image(const fl_field *field, int64_t index) {
    const fl_image_source *src = field->state;
    if (index < 0 || index >= src->count) return;
    if (src->kind == SOURCE_PIXELS)
        fl_prefetch_lines(src->ptrs[index], src->row_strides[index] * src->dims[3 * index]);
    else if (src->kind == SOURCE_BUFFERS)
        fl_prefetch_lines(src->ptrs[index], src->lens[index]);
    else if (src->kind == SOURCE_OFFSETS)
        fl_prefetch_lines(src->base + src->offsets[index],
                          src->offsets[index + 1] - src->offsets[index]);
}

static void *reserve(void *scratch, size_t bytes) {
    return fl_scratch_reserve((fl_scratch *)scratch, bytes);
}

static size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* The size of an encoded JPEG or QOI image from its header. Returns FL_OK, or with a
 * message FL_EFORMAT (an unreadable header), FL_ETRUNCATED (a QOI stream too short for its
 * pixels) or FL_ELIMIT (over the pixel limit). */
static int encoded_size(const fl_image_source *src, const uint8_t *data, size_t n, int format,
                        int *h, int *w, char *message) {
    int stored;
    if (format == FORMAT_QOI) {
        if (fl_qoi_header(data, n, w, h, &stored) != FL_OK) {
            snprintf(message, FL_MESSAGE_BYTES, "corrupt QOI header");
            return FL_EFORMAT;
        }
        if (!fl_qoi_plausible(n, *w, *h)) {
            snprintf(message, FL_MESSAGE_BYTES, "truncated QOI stream");
            return FL_ETRUNCATED;
        }
    } else if (fl_jpeg_size(data, n, h, w) != FL_OK) {
        snprintf(message, FL_MESSAGE_BYTES, "truncated or corrupt JPEG header");
        return FL_EFORMAT;
    }
    if ((int64_t)*h * *w > src->max_pixels) {
        snprintf(message, FL_MESSAGE_BYTES,
                 "a %dx%d image is over the limit of %lld pixels "
                 "(fastload.limits.MAX_IMAGE_PIXELS)",
                 *h, *w, (long long)src->max_pixels);
        return FL_ELIMIT;
    }
    return FL_OK;
}

/* Decodes a JPEG: the region the run reads, in C, or (where libjpeg is not there, or a CMYK
 * image) the whole image at the same scale through src->fallback_decode_jpeg. */
static int decode_jpeg(const fl_image_source *src, const uint8_t *data, size_t n, int h, int w,
                       int denom, const fl_rect *region, fl_scratch *scratch, fl_image *img,
                       int *img_y, int *img_x, char *message) {
    int rc = FL_EUNSUPPORTED;
    if (src->libjpeg_decode)
        rc = src->libjpeg_decode(data, n, src->channels, denom, region, reserve, scratch, img,
                                 img_y, img_x, message, FL_MESSAGE_BYTES);
    if (rc != FL_EUNSUPPORTED) return rc;
    int dh = (h + denom - 1) / denom, dw = (w + denom - 1) / denom, c = src->channels;
    uint8_t *pixels = fl_scratch_reserve(scratch, (size_t)dh * dw * c);
    if (!pixels) {
        snprintf(message, FL_MESSAGE_BYTES, "out of memory");
        return FL_ENOMEM;
    }
    message[0] = '\0';
    rc = src->fallback_decode_jpeg(src->decode_ctx, data, n, denom, c, h, w, pixels, message);
    if (rc != FL_OK) return rc;
    *img = fl_image_of(pixels, dh, dw, c, (ptrdiff_t)dw * c);
    *img_y = *img_x = 0;
    return FL_OK;
}

int fl_image_source_decode(const fl_image_source *src, const uint8_t *data, size_t n, uint64_t seed,
                           uint64_t epoch, uint64_t index, int64_t dst_bytes, fl_scratch *scratch,
                           fl_decoded *out, char *message) {
    const fl_pipeline *p = src->pipeline;
    int format = format_of(data, n), h = 0, w = 0, denom = 1, img_y = 0, img_x = 0, rc;
    fl_image img;
    message[0] = '\0';
    if (n == 0) {
        snprintf(message, FL_MESSAGE_BYTES, "empty image");
        return FL_ETRUNCATED;
    }
    if (format == FORMAT_UNKNOWN) {
        snprintf(message, FL_MESSAGE_BYTES,
                 "not an image file fastload reads (JPEG, PNG, "
                 "BMP, GIF, WebP, TIFF, PNM or QOI)");
        return FL_EFORMAT;
    }
    if (format == FORMAT_OTHER) {
        /* Decoded whole (with the GIL) by src->decode_other, which checks the pixel limit
         * from the file's header before decoding. */
        rc = src->decode_other(src->decode_ctx, data, n, src->channels, src->max_pixels, reserve,
                               scratch, &img, message);
        if (rc != FL_OK) return rc;
        h = img.h;
        w = img.w;
    } else if ((rc = encoded_size(src, data, n, format, &h, &w, message)) != FL_OK) {
        return rc;
    }
    int decoded_c = format == FORMAT_QOI ? (src->channels == 4 ? 4 : 3) : src->channels;
    if (dst_bytes >= 0 && (rc = fits_row(dst_bytes, p, h, w, decoded_c, message)) != FL_OK)
        return rc;
    fl_rect region;
    if (fl_pipeline_region(p, h, w, src->exact || format != FORMAT_JPEG, seed, epoch, index, &denom,
                           &region) != FL_OK) {
        snprintf(message, FL_MESSAGE_BYTES, "the pipeline does not fit a %dx%d image", h, w);
        return FL_ESHAPE;
    }
    if (format == FORMAT_QOI) {
        uint8_t *pixels = fl_scratch_reserve(scratch, (size_t)h * w * decoded_c);
        if (!pixels) {
            snprintf(message, FL_MESSAGE_BYTES, "out of memory");
            return FL_ENOMEM;
        }
        rc = fl_qoi_decode(data, n, pixels, w, h, decoded_c);
        if (rc != FL_OK) {
            snprintf(message, FL_MESSAGE_BYTES, "QOI stream: %s", fl_strerror(rc));
            return rc;
        }
        img = fl_image_of(pixels, h, w, decoded_c, (ptrdiff_t)w * decoded_c);
    } else if (format == FORMAT_JPEG) {
        rc =
            decode_jpeg(src, data, n, h, w, denom, &region, scratch, &img, &img_y, &img_x, message);
        if (rc != FL_OK) {
            if (!message[0]) snprintf(message, FL_MESSAGE_BYTES, "corrupt JPEG");
            return rc;
        }
    }
    out->part = img;
    out->y = img_y;
    out->x = img_x;
    out->src_h = h;
    out->src_w = w;
    out->denom = denom;
    return FL_OK;
}

int fl_image_source_run(const fl_image_source *src, const uint8_t *data, size_t n, uint64_t seed,
                        uint64_t epoch, uint64_t index, char *dst, int64_t dst_bytes,
                        fl_scratch *scratch, char *message) {
    fl_decoded d;
    int rc =
        fl_image_source_decode(src, data, n, seed, epoch, index, dst_bytes, scratch, &d, message);
    if (rc != FL_OK) return rc;
    /* The pipeline's scratch goes after the pixels, in the same region: growing it keeps
     * the pixels (realloc). */
    const fl_pipeline *p = src->pipeline;
    size_t image_bytes = align64((size_t)d.part.stride * d.part.h);
    size_t work_bytes = fl_pipeline_scratch_bytes(p, d.src_h, d.src_w, d.part.c);
    uint8_t *base = fl_scratch_reserve(scratch, image_bytes + work_bytes);
    if (!base) {
        snprintf(message, FL_MESSAGE_BYTES, "out of memory");
        return FL_ENOMEM;
    }
    d.part.data = base;
    rc = fl_pipeline_run_region(p, &d.part, d.y, d.x, d.src_h, d.src_w, d.denom, seed, epoch, index,
                                dst, base + image_bytes, work_bytes);
    if (rc != FL_OK) {
        snprintf(message, FL_MESSAGE_BYTES, "the pipeline does not fit a %dx%d image", d.src_h,
                 d.src_w);
        return rc;
    }
    return FL_OK;
}

/* A decoded image: one geometry per item, the run checking the output size against the
 * row and saying how much scratch it needs, which grows once to the largest image. */
static int fill_pixels(const fl_field *field, const fl_image_source *src, int64_t index,
                       uint64_t seed, uint64_t epoch, char *dst, fl_scratch *scratch,
                       char *message) {
    const fl_pipeline *p = src->pipeline;
    const int32_t *d = src->dims + 3 * index;
    fl_image img =
        fl_image_of((uint8_t *)src->ptrs[index], d[0], d[1], d[2], src->row_strides[index]);
    size_t need = 0;
    int rc = fl_pipeline_run_into(p, &img, seed, epoch, (uint64_t)index, dst,
                                  (size_t)field->row_bytes, scratch->data, scratch->bytes, &need);
    if (rc == FL_ESCRATCH) {
        if (!fl_scratch_reserve(scratch, need))
            return fail(FL_ENOMEM, message, src, index, "out of memory");
        rc = fl_pipeline_run_into(p, &img, seed, epoch, (uint64_t)index, dst,
                                  (size_t)field->row_bytes, scratch->data, scratch->bytes, &need);
    }
    if (rc == FL_OK) return FL_OK;
    if (fits_row(field->row_bytes, p, img.h, img.w, img.c, message) != FL_OK)
        return fail(FL_ESHAPE, message, src, index, ""); /* says how the size differs */
    return fail(rc, message, src, index, "the pipeline does not fit this image");
}

int fl_fill_image(const fl_field *field, const fl_item *item, char *dst, fl_scratch *scratch,
                  char *message) {
    const fl_image_source *src = field->state;
    const int64_t index = item->index;
    const uint64_t seed = item->run->seed, epoch = item->run->epoch;
    if (index < 0 || index >= src->count) {
        snprintf(message, FL_MESSAGE_BYTES, "index %lld is out of range for %lld images",
                 (long long)index, (long long)src->count);
        return FL_EINVAL;
    }
    if (src->kind == SOURCE_PIXELS)
        return fill_pixels(field, src, index, seed, epoch, dst, scratch, message);
    size_t n = 0;
    message[0] = '\0';
    const uint8_t *data = encoded_item(src, index, &n, &scratch[1], message);
    if (!data && message[0]) return fail(FL_EFAILED, message, src, index, "");
    int rc = fl_image_source_run(src, data, n, seed, epoch, (uint64_t)index, dst, field->row_bytes,
                                 &scratch[0], message);
    return rc == FL_OK ? FL_OK : fail(rc, message, src, index, "");
}
