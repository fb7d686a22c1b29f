/* A small seeded PRNG (splitmix64): plenty for shuffles, crops and weight
 * init, and a seed reproduces a run exactly, on any libc. */
#ifndef HOGWILD_RNG_H
#define HOGWILD_RNG_H

#include <stdint.h>

typedef struct rng {
    uint64_t s;
} rng;

static inline uint64_t rng_next(rng *r)
{
    /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline void rng_seed(rng *r, uint64_t seed)
{
    r->s = seed * 0x2545f4914f6cdd1dull + 1;
}

/* Uniform in [0, 1). */
static inline float rng_float(rng *r)
{
    return (float)(rng_next(r) >> 40) / 16777216.0f;
}

/* Uniform in [0, n), n > 0 (the modulo bias is negligible for our n). */
static inline uint32_t rng_below(rng *r, uint32_t n)
{
    return (uint32_t)(rng_next(r) % n);
}

/* Fisher-Yates shuffle of idx[0..n). */
static inline void rng_shuffle(rng *r, uint32_t *idx, uint32_t n)
{
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = rng_below(r, i);
        uint32_t t = idx[i - 1];
        idx[i - 1] = idx[j];
        idx[j] = t;
    }
}

#endif
