/* Counter-based randomness: the stream for (seed, epoch, index, op) is a pure function of
 * those four numbers, so results never depend on threads, scheduling or order.
 * SplitMix64 mixes the key; the stream then steps a Weyl sequence through the same mixer.
 * Needs `unsigned __int128` (GCC, Clang) for unbiased bounded draws. */
#ifndef FASTLOAD_RNG_H
#define FASTLOAD_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t state;
} fl_rng;

static inline uint64_t fl_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline fl_rng fl_rng_for(uint64_t seed, uint64_t epoch, uint64_t index, uint64_t op) {
    uint64_t h = fl_mix64(seed + 0x9E3779B97F4A7C15ULL);
    h = fl_mix64(h ^ (epoch + 0x632BE59BD9B4E019ULL));
    h = fl_mix64(h ^ (index + 0x85EBCA77C2B2AE63ULL));
    h = fl_mix64(h ^ (op + 0xC2B2AE3D27D4EB4FULL));
    fl_rng r = {h};
    return r;
}

static inline uint64_t fl_rng_next(fl_rng *r) {
    r->state += 0x9E3779B97F4A7C15ULL;
    return fl_mix64(r->state);
}

/* Uniform double in [0, 1) with 53 random bits. */
static inline double fl_rng_uniform(fl_rng *r) {
    return (double)(fl_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Uniform integer in [0, n); n > 0. Lemire's multiply-shift, bias below 2^-32 for n < 2^32. */
static inline uint64_t fl_rng_below(fl_rng *r, uint64_t n) {
    return (uint64_t)(((unsigned __int128)fl_rng_next(r) * n) >> 64);
}

#endif
