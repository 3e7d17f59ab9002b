/* libFuzzer target: the QOI decoder on arbitrary bytes.
 *
 * Checks, beyond memory safety: a header that parses gives a size in range; a stream that
 * decodes decodes alike to 3 and 4 channels, and its pixels survive an encode and a second
 * decode unchanged. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qoi.h"

#define MAX_PIXELS (1 << 22)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int w, h, channels;
    if (fl_qoi_header(data, size, &w, &h, &channels) != FL_OK) return 0;
    if (w < 1 || h < 1 || (long long)w * h > FL_QOI_PIXELS_MAX || (channels != 3 && channels != 4))
        abort();
    if ((long long)w * h > MAX_PIXELS) return 0;
    size_t npix = (size_t)w * (size_t)h;
    uint8_t *rgb = malloc(npix * 3), *rgba = malloc(npix * 4);
    int err3 = fl_qoi_decode(data, size, rgb, w, h, 3);
    int err4 = fl_qoi_decode(data, size, rgba, w, h, 4);
    if (err3 != err4) abort();
    if (err4 == FL_OK) {
        for (size_t i = 0; i < npix; i++)
            if (memcmp(rgb + 3 * i, rgba + 4 * i, 3) != 0) abort();
        size_t cap = fl_qoi_max_size(w, h, 4);
        uint8_t *encoded = malloc(cap), *again = malloc(npix * 4);
        long n = fl_qoi_encode(rgba, w, h, 4, encoded, cap);
        if (n < FL_QOI_HEADER_SIZE + FL_QOI_END_SIZE) abort();
        if (fl_qoi_decode(encoded, (size_t)n, again, w, h, 4) != FL_OK) abort();
        if (memcmp(again, rgba, npix * 4) != 0) abort();
        free(encoded);
        free(again);
    }
    free(rgb);
    free(rgba);
    return 0;
}
