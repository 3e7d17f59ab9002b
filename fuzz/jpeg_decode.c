/* libFuzzer target: the JPEG region decode (fl_jpeg_decode) on arbitrary bytes.
 *
 * The first 6 bytes choose the call: channels, DCT scale and the wanted region (as
 * fractions of the scaled image); the rest is the JPEG. As in the image field, only a
 * stream whose frame header fl_jpeg_size reads, and whose pixels are within a limit, is
 * decoded. Checks, beyond memory safety: a decode that succeeds agrees with fl_jpeg_size
 * on the size, and its part lies in the scaled image and holds the whole wanted region. */
#include <stdint.h>
#include <stdlib.h>

#include "imagesource.h"
#include "jpeg.h"

#define MAX_PIXELS (1 << 22)
#define MAX_ALLOC  ((size_t)64 << 20)

typedef struct {
    void *block;
} allocation;

static void *alloc_once(void *ctx, size_t bytes) {
    allocation *a = ctx;
    if (a->block || bytes > MAX_ALLOC) return NULL;
    a->block = malloc(bytes ? bytes : 1);
    return a->block;
}

/* A coordinate from a byte: a fraction of `side`, reaching a little beyond both ends. */
static int fraction(uint8_t b, int side) { return (int)((long)(b - 32) * side / 192); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const int channel_counts[4] = {1, 3, 4, 3}, denoms[4] = {1, 2, 4, 8};
    if (size < 6) return 0;
    int channels = channel_counts[data[0] & 3], denom = denoms[(data[0] >> 2) & 3];
    int whole = data[0] >> 7;
    const uint8_t *jpeg = data + 6;
    size_t n = size - 6;
    int h, w;
    if (fl_jpeg_size(jpeg, n, &h, &w) != 0 || (long long)h * w > MAX_PIXELS) return 0;
    int sh = (h + denom - 1) / denom, sw = (w + denom - 1) / denom;
    fl_rect want = {fraction(data[1], sh), fraction(data[2], sw), 0, 0};
    want.h = fraction(data[3], sh) - want.y;
    want.w = fraction(data[4], sw) - want.x;
    (void)data[5]; /* spare: keeps the JPEG at the same offset for every seed */

    allocation a = {NULL};
    fl_image out;
    int y, x;
    char message[256];
    int err = fl_jpeg_decode(jpeg, n, channels, denom, whole ? NULL : &want, alloc_once, &a, &out,
                             &y, &x, message, sizeof message);
    if (err == FL_OK) {
        if (out.data != a.block || out.c != channels || out.stride != (ptrdiff_t)out.w * channels)
            abort();
        if (y < 0 || x < 0 || out.h < 1 || out.w < 1 || y + out.h > sh || x + out.w > sw)
            abort(); /* outside the scaled image, or another size than the header's */
        int y0 = want.y < 0 ? 0 : want.y, x0 = want.x < 0 ? 0 : want.x;
        int y1 = want.y + want.h > sh ? sh : want.y + want.h;
        int x1 = want.x + want.w > sw ? sw : want.x + want.w;
        if (whole && (y != 0 || x != 0 || out.h != sh || out.w != sw)) abort();
        if (!whole && y1 > y0 && x1 > x0 && (y > y0 || x > x0 || y + out.h < y1 || x + out.w < x1))
            abort(); /* a part that misses some of the wanted region */
    } else if (err != FL_ECORRUPT && err != FL_EUNSUPPORTED) {
        abort();
    }
    free(a.block);
    return 0;
}
