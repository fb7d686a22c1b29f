/* The dataloader example's worker side: what the trainer sends each loader
 * process (payload of the mp_spawn argument message; the dataset tensors,
 * the two queues and the stats tensor ride along as named attachments) and
 * the augmentation it applies. */
#ifndef DATALOADER_LOADER_H
#define DATALOADER_LOADER_H

#include <stdint.h>

#include <mproc.h>

#include "rng.h"

#define LOADER_CFG_VERSION 1
/* Pixels of zero padding around an image before the random 28x28 crop. */
#define LOADER_PAD 4

/* Columns of the shared stats tensor (float64 [workers, STATS_COLS]): each
 * loader writes only its own row, the trainer reads them at the end. */
enum { STATS_BATCHES = 0, STATS_COPIES, STATS_COLS };

typedef struct loader_cfg {
    uint32_t version;
    int32_t workers;
    int32_t batch;
    int32_t fail_rank; /* -1, or the loader that dies of SIGSEGV (a demonstration) */
    int64_t batches;   /* batches this run, over all loaders */
    int64_t samples;   /* training samples in use */
    uint64_t seed;
} loader_cfg;

/* What a filled batch carries as payload, beside the tensors "x" and "y". */
typedef struct loader_batch {
    int32_t rank;
    int32_t seq; /* the loader's batch number, from 0 */
} loader_batch;

/* Batches loader `rank` produces: an equal share, the first ranks taking one
 * more when the count does not divide. */
static inline int64_t loader_quota(const loader_cfg *c, int rank)
{
    return c->batches / c->workers + (rank < c->batches % c->workers);
}

/* This process's copies into shared memory so far (mp_tensor_stats_get). */
static inline uint64_t loader_shared_copies(void)
{
    mp_tensor_stats st = {.size = sizeof st};
    return mp_tensor_stats_get(&st) == 0 ? st.shared_copies : 0;
}

/* Decodes image (uint8, 28x28) into out (28x28 floats, normalized) shifted
 * by (dx, dy) in -LOADER_PAD..LOADER_PAD with zero padding (the random
 * crop of the padded image) and mirrored left-right when flip. */
void loader_augment(const uint8_t *image, int dx, int dy, int flip, float *out);

/* The random crop and flip of one image, drawn from r. */
void loader_augment_random(const uint8_t *image, rng *r, float *out);

#endif
