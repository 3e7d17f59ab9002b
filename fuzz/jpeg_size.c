/* libFuzzer target: the JPEG frame-header parser (fl_jpeg_size) on arbitrary bytes.
 *
 * Checks, beyond memory safety: a size is given only for bytes that start with SOI, and is
 * one of a frame header (1 to 65535 on each side); the answer depends on nothing past the
 * frame header, so trailing bytes never change it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "imagesource.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int h = -1, w = -1;
    if (fl_jpeg_size(data, size, &h, &w) != 0) return 0;
    if (size < 4 || data[0] != 0xFF || data[1] != 0xD8) abort();
    if (h < 1 || h > 65535 || w < 1 || w > 65535) abort();
    /* A copy with garbage after it answers the same. */
    uint8_t *longer = malloc(size + 16);
    memcpy(longer, data, size);
    memset(longer + size, 0xA5, 16);
    int h2 = -1, w2 = -1;
    if (fl_jpeg_size(longer, size + 16, &h2, &w2) != 0 || h2 != h || w2 != w) abort();
    free(longer);
    return 0;
}
