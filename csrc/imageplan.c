/* The native image field; see imageplan.h. */
#include "imageplan.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* Whether the first bytes of a file can start a JPEG or a QOI image. */
static int image_magic(const uint8_t *head, size_t n) {
    return (n >= 2 && head[0] == 0xFF && head[1] == 0xD8) ||
           (n >= 4 && memcmp(head, "qoif", 4) == 0);
}

/* Reads the file at `path` into scratch memory; returns its bytes or NULL with a message.
 * Only regular files (opening a FIFO or device must not block a pool thread), at most
 * `max_bytes` of them, and only after their first bytes show a JPEG or QOI image: a huge
 * file of anything else costs no memory. */
static const uint8_t *read_file(const char *path, int64_t max_bytes, size_t *n,
                                fl_scratch *scratch, char *message) {
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) {
        snprintf(message, FL_MESSAGE_BYTES, "cannot open %s", path);
        return NULL;
    }
    struct stat st;
    uint8_t head[4];
    uint8_t *buf = NULL;
    int regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    ssize_t head_n = regular && st.st_size <= max_bytes ? pread(fd, head, sizeof head, 0) : -1;
    if (!regular) {
        snprintf(message, FL_MESSAGE_BYTES, "%s is not a regular file", path);
    } else if (st.st_size > max_bytes) {
        snprintf(message, FL_MESSAGE_BYTES, "%s: a file of %lld bytes is over the limit of "
                 "%lld bytes (fastload.limits.MAX_FILE_BYTES)", path, (long long)st.st_size,
                 (long long)max_bytes);
    } else if (head_n < 2 || !image_magic(head, (size_t)head_n)) {
        snprintf(message, FL_MESSAGE_BYTES, "%s: not a JPEG or QOI image", path);
    } else if (!(buf = fl_scratch_reserve(scratch, (size_t)st.st_size + 1))) {
        snprintf(message, FL_MESSAGE_BYTES, "out of memory reading %s", path);
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
static int fits_row(const fl_field *field, const fl_pipeline *p, int h, int w, int c,
                    char *message) {
    int oh, ow, oc;
    if (fl_pipeline_output_shape(p, h, w, c, &oh, &ow, &oc) != FL_OK) {
        snprintf(message, FL_MESSAGE_BYTES, "the pipeline does not fit a %dx%d image", h, w);
        return 0;
    }
    int64_t bytes = (int64_t)oh * ow * oc * (p->out_dtype == FL_DTYPE_FLOAT32 ? 4 : 1);
    if (bytes != field->row_bytes) {
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
        if (rc != FL_OK && !fits_row(field, p, img.h, img.w, img.c, message))
            return fail(message, src, index, "");   /* says how the size differs */
        return rc == FL_OK ? 0 : fail(message, src, index, "the pipeline does not fit this image");
    }

    /* Region 0 holds [decoded image | pipeline scratch], region 1 a file's bytes, so that
     * growing one never moves the other. */
    size_t n = 0;
    const uint8_t *data = encoded_item(src, index, &n, &scratch[1], message);
    int rc = -1;
    if (!data || n == 0) {
        fail(message, src, index, "empty image");
        goto done;
    }

    int h, w, stored, denom = 1, is_qoi = n >= 4 && memcmp(data, "qoif", 4) == 0;
    if (is_qoi) {
        if (fl_qoi_header(data, n, &w, &h, &stored) != FL_QOI_OK) {
            fail(message, src, index, "corrupt QOI header");
            goto done;
        }
        /* A QOI op codes at most 62 pixels per byte: a stream too short for its header's
         * size is truncated, found out before any memory is set aside for it. */
        if ((double)(n - FL_QOI_HEADER_SIZE) * 62 < (double)w * h) {
            fail(message, src, index, "truncated QOI stream");
            goto done;
        }
    } else if (fl_jpeg_size(data, n, &h, &w) != 0) {
        fail(message, src, index, n >= 2 && data[0] == 0xFF && data[1] == 0xD8
             ? "truncated or corrupt JPEG header" : "not a JPEG or QOI image");
        goto done;
    }
    if ((int64_t)h * w > src->max_pixels) {
        snprintf(message, FL_MESSAGE_BYTES, "a %dx%d image is over the limit of %lld pixels "
                 "(fastload.limits.MAX_IMAGE_PIXELS)", h, w, (long long)src->max_pixels);
        fail(message, src, index, "");
        goto done;
    }
    if (!fits_row(field, p, h, w, is_qoi ? (src->channels == 4 ? 4 : 3) : src->channels,
                  message)) {
        fail(message, src, index, "");
        goto done;
    }
    fl_plan_rect crop;
    if (fl_pipeline_prepare(p, h, w, seed, epoch, (uint64_t)index, &crop, &denom) != 0) {
        fail(message, src, index, "the pipeline does not fit this image");
        goto done;
    }
    if (is_qoi) denom = 1;
    int ch = src->channels, dh = (h + denom - 1) / denom, dw = (w + denom - 1) / denom;
    int decoded_c = is_qoi ? (ch == 4 ? 4 : 3) : ch;
    size_t image_bytes = (size_t)dh * dw * decoded_c;
    size_t work_bytes = fl_pipeline_scratch_bytes(p, h, w, decoded_c);
    uint8_t *pixels = fl_scratch_reserve(&scratch[0], image_bytes + work_bytes);
    if (!pixels) {
        fail(message, src, index, "out of memory");
        goto done;
    }
    if (is_qoi) {
        int err = fl_qoi_decode(data, n, pixels, w, h, decoded_c);
        if (err != FL_QOI_OK) {
            fail(message, src, index, fl_qoi_strerror(err));
            goto done;
        }
    } else if (src->decode_jpeg(src->decode_ctx, data, n, denom, ch, h, w, pixels, message)) {
        fail(message, src, index, "corrupt JPEG");
        goto done;
    }
    fl_image img = {pixels, dh, dw, decoded_c, (ptrdiff_t)dw * decoded_c};
    if (denom == 1)
        rc = fl_pipeline_run(p, &img, 1, seed, epoch, (uint64_t)index, dst,
                             pixels + image_bytes, work_bytes);
    else
        rc = fl_pipeline_run_scaled(p, &img, h, w, denom, seed, epoch,
                                    (uint64_t)index, dst, pixels + image_bytes, work_bytes);
    if (rc != 0) {
        message[0] = '\0';
        fail(message, src, index, "the pipeline does not fit this image");
        rc = -1;
    }
done:
    return rc;
}
