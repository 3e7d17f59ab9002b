/* QOI encoder and decoder; see qoi.h for the contract. */
#include "qoi.h"

#include <string.h>

#define OP_INDEX 0x00 /* 00xxxxxx */
#define OP_DIFF  0x40 /* 01xxxxxx */
#define OP_LUMA  0x80 /* 10xxxxxx */
#define OP_RUN   0xc0 /* 11xxxxxx */
#define OP_RGB   0xfe
#define OP_RGBA  0xff
#define MASK_2   0xc0
#define RUN_MAX  62 /* run lengths 63 and 64 would collide with OP_RGB and OP_RGBA */

typedef struct {
    uint8_t r, g, b, a;
} px_t;

static const uint8_t end_marker[FL_QOI_END_SIZE] = {0, 0, 0, 0, 0, 0, 0, 1};

static inline unsigned px_hash(px_t p) {
    return ((unsigned)p.r * 3u + (unsigned)p.g * 5u + (unsigned)p.b * 7u + (unsigned)p.a * 11u) %
        64u;
}

static inline int px_eq(px_t x, px_t y) {
    return x.r == y.r && x.g == y.g && x.b == y.b && x.a == y.a;
}

static inline uint32_t read_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline void write_be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static int pixels_ok(int w, int h) {
    return w > 0 && h > 0 && (long long)w * (long long)h <= FL_QOI_PIXELS_MAX;
}

int fl_qoi_header(const uint8_t *buf, size_t n, int *w, int *h, int *channels) {
    if (buf == NULL || n < FL_QOI_HEADER_SIZE || memcmp(buf, "qoif", 4) != 0) return FL_EFORMAT;
    uint32_t width = read_be32(buf + 4), height = read_be32(buf + 8);
    if ((buf[12] != 3 && buf[12] != 4) || buf[13] > 1) return FL_EFORMAT;
    if (width == 0 || height == 0) return FL_EFORMAT;
    if (width > FL_QOI_PIXELS_MAX || height > FL_QOI_PIXELS_MAX ||
        !pixels_ok((int)width, (int)height))
        return FL_ELIMIT;
    if (w) *w = (int)width;
    if (h) *h = (int)height;
    if (channels) *channels = buf[12];
    return FL_OK;
}

size_t fl_qoi_max_size(int w, int h, int channels) {
    if ((channels != 3 && channels != 4) || !pixels_ok(w, h)) return 0;
    /* Worst case: every pixel an RGB or RGBA op, one tag byte plus the channels. */
    return FL_QOI_HEADER_SIZE + (size_t)w * (size_t)h * (size_t)(channels + 1) + FL_QOI_END_SIZE;
}

static void write_header(uint8_t *out, int w, int h, int channels) {
    memcpy(out, "qoif", 4);
    write_be32(out + 4, (uint32_t)w);
    write_be32(out + 8, (uint32_t)h);
    out[12] = (uint8_t)channels;
    out[13] = 0;
}

/* The op that ends a run of `run` copies of `prev`. A run of one pixel that is in the
 * index is written as an INDEX op: the same size, and what the reference encoder (qoi.h,
 * as shipped by PyPI `qoi`) does, so our streams are byte-identical to it. */
static inline uint8_t run_op(int run, px_t prev, const px_t *index) {
    unsigned hprev = px_hash(prev);
    if (run == 1 && px_eq(index[hprev], prev)) return (uint8_t)(OP_INDEX | hprev);
    return (uint8_t)(OP_RUN | (run - 1));
}

/* Writes the op of a pixel that is not in the index into o[0..room): DIFF or LUMA for a
 * small change from `prev` at the same alpha, else the pixel itself (RGB, RGBA). Returns
 * the bytes written, or FL_ECAPACITY when the op does not fit. */
static inline int put_new_px(uint8_t *o, size_t room, px_t px, px_t prev) {
    if (px.a != prev.a) {
        if (room < 5) return FL_ECAPACITY;
        o[0] = OP_RGBA;
        o[1] = px.r;
        o[2] = px.g;
        o[3] = px.b;
        o[4] = px.a;
        return 5;
    }
    /* Differences wrap around, as unsigned bytes do. */
    int dr = (int8_t)(uint8_t)(px.r - prev.r);
    int dg = (int8_t)(uint8_t)(px.g - prev.g);
    int db = (int8_t)(uint8_t)(px.b - prev.b);
    int dr_dg = dr - dg, db_dg = db - dg;
    if (dr >= -2 && dr <= 1 && dg >= -2 && dg <= 1 && db >= -2 && db <= 1) {
        if (room < 1) return FL_ECAPACITY;
        o[0] = (uint8_t)(OP_DIFF | ((dr + 2) << 4) | ((dg + 2) << 2) | (db + 2));
        return 1;
    }
    if (dg >= -32 && dg <= 31 && dr_dg >= -8 && dr_dg <= 7 && db_dg >= -8 && db_dg <= 7) {
        if (room < 2) return FL_ECAPACITY;
        o[0] = (uint8_t)(OP_LUMA | (dg + 32));
        o[1] = (uint8_t)(((dr_dg + 8) << 4) | (db_dg + 8));
        return 2;
    }
    if (room < 4) return FL_ECAPACITY;
    o[0] = OP_RGB;
    o[1] = px.r;
    o[2] = px.g;
    o[3] = px.b;
    return 4;
}

long fl_qoi_encode(const uint8_t *pixels, int w, int h, int channels, uint8_t *out, size_t cap) {
    if (pixels == NULL || out == NULL || (channels != 3 && channels != 4) || w <= 0 || h <= 0)
        return FL_EINVAL;
    if (!pixels_ok(w, h)) return FL_ELIMIT;
    if (cap < FL_QOI_HEADER_SIZE + FL_QOI_END_SIZE) return FL_ECAPACITY;
    write_header(out, w, h, channels);

    /* Chunks must leave room for the end marker. Invariant: p <= limit. */
    const size_t limit = cap - FL_QOI_END_SIZE;
#define NEED(k)                                                                                    \
    do {                                                                                           \
        if (limit - p < (size_t)(k)) return FL_ECAPACITY;                                          \
    } while (0)
    size_t p = FL_QOI_HEADER_SIZE;
    px_t index[64];
    memset(index, 0, sizeof index);
    px_t prev = {0, 0, 0, 255}, px = prev;
    const size_t npix = (size_t)w * (size_t)h;
    int run = 0;

    for (size_t i = 0; i < npix; i++) {
        const uint8_t *s = pixels + i * (size_t)channels;
        px.r = s[0];
        px.g = s[1];
        px.b = s[2];
        px.a = channels == 4 ? s[3] : 255;
        if (px_eq(px, prev)) {
            run++;
            if (run == RUN_MAX || i == npix - 1) {
                NEED(1);
                out[p++] = (uint8_t)(OP_RUN | (run - 1));
                run = 0;
            }
            continue;
        }
        if (run > 0) {
            NEED(1);
            out[p++] = run_op(run, prev, index);
            run = 0;
        }
        unsigned hp = px_hash(px);
        if (px_eq(index[hp], px)) {
            NEED(1);
            out[p++] = (uint8_t)(OP_INDEX | hp);
        } else {
            index[hp] = px;
            int k = put_new_px(out + p, limit - p, px, prev);
            if (k < 0) return k;
            p += (size_t)k;
        }
        prev = px;
    }
#undef NEED
    memcpy(out + p, end_marker, FL_QOI_END_SIZE);
    return (long)(p + FL_QOI_END_SIZE);
}

static inline void put_px(uint8_t *o, px_t px, int out_channels) {
    o[0] = px.r;
    o[1] = px.g;
    o[2] = px.b;
    if (out_channels == 4) o[3] = px.a;
}

int fl_qoi_plausible(size_t n, int w, int h) {
    if (w < 1 || h < 1 || n < FL_QOI_HEADER_SIZE + FL_QOI_END_SIZE) return 0;
    return (n - FL_QOI_HEADER_SIZE - FL_QOI_END_SIZE) * (size_t)RUN_MAX >= (size_t)w * (size_t)h;
}

int fl_qoi_decode(const uint8_t *buf, size_t n, uint8_t *out, int w, int h, int out_channels) {
    int hw, hh, hc;
    if (out == NULL || (out_channels != 3 && out_channels != 4)) return FL_EINVAL;
    int err = fl_qoi_header(buf, n, &hw, &hh, &hc);
    if (err != FL_OK) return err;
    if (hw != w || hh != h) return FL_ESHAPE;
    if (!fl_qoi_plausible(n, w, h)) return FL_ETRUNCATED;

    /* Invariant: chunk bytes are read only from buf[p .. end), end = n - 8, so every read
     * stays in bounds and the end marker's bytes are never taken for chunk data. */
    const size_t end = n - FL_QOI_END_SIZE;
    const size_t npix = (size_t)w * (size_t)h;
    size_t p = FL_QOI_HEADER_SIZE, i = 0;
    px_t index[64];
    memset(index, 0, sizeof index);
    px_t px = {0, 0, 0, 255};

    while (i < npix) {
        if (p >= end) return FL_ETRUNCATED;
        uint8_t b1 = buf[p++];
        if (b1 == OP_RGB) {
            if (end - p < 3) return FL_ETRUNCATED;
            px.r = buf[p];
            px.g = buf[p + 1];
            px.b = buf[p + 2];
            p += 3;
        } else if (b1 == OP_RGBA) {
            if (end - p < 4) return FL_ETRUNCATED;
            px.r = buf[p];
            px.g = buf[p + 1];
            px.b = buf[p + 2];
            px.a = buf[p + 3];
            p += 4;
        } else if ((b1 & MASK_2) == OP_INDEX) {
            px = index[b1];
        } else if ((b1 & MASK_2) == OP_DIFF) {
            px.r = (uint8_t)(px.r + ((b1 >> 4) & 3) - 2);
            px.g = (uint8_t)(px.g + ((b1 >> 2) & 3) - 2);
            px.b = (uint8_t)(px.b + (b1 & 3) - 2);
        } else if ((b1 & MASK_2) == OP_LUMA) {
            if (p >= end) return FL_ETRUNCATED;
            uint8_t b2 = buf[p++];
            int dg = (b1 & 0x3f) - 32;
            px.r = (uint8_t)(px.r + dg - 8 + ((b2 >> 4) & 0x0f));
            px.g = (uint8_t)(px.g + dg);
            px.b = (uint8_t)(px.b + dg - 8 + (b2 & 0x0f));
        } else { /* OP_RUN: the previous pixel, (b1 & 0x3f) + 1 times in all */
            size_t run = (size_t)(b1 & 0x3f) + 1;
            if (run > npix - i) return FL_ECORRUPT;
            index[px_hash(px)] = px;
            for (size_t k = 0; k < run; k++, i++)
                put_px(out + i * (size_t)out_channels, px, out_channels);
            continue;
        }
        index[px_hash(px)] = px;
        put_px(out + i * (size_t)out_channels, px, out_channels);
        i++;
    }
    if (memcmp(buf + p, end_marker, FL_QOI_END_SIZE) != 0) return FL_ECORRUPT;
    return FL_OK;
}
