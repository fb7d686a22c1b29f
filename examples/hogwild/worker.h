/* What the parent sends each worker (payload of the mp_spawn argument
 * message; the tensors and queues ride along as named attachments). */
#ifndef HOGWILD_WORKER_H
#define HOGWILD_WORKER_H

#include <stdint.h>

#define WORKER_CFG_VERSION 2

/* Columns of the shared progress tensor (float64 [workers, PROGRESS_COLS]):
 * each worker writes only its own row; the parent reads them for the bar. */
enum { PROGRESS_SAMPLES = 0, PROGRESS_LOSS_SUM, PROGRESS_BATCHES, PROGRESS_COLS };

typedef struct worker_cfg {
    uint32_t version;
    int32_t sync; /* train_sync */
    int32_t workers;
    int32_t batch;
    int32_t every; /* periodic: steps between exchanges */
    int32_t steps; /* steps per worker this epoch (the same for all) */
    int32_t epoch;
    int32_t fail_rank; /* -1, or the rank that dies of SIGSEGV (a demonstration) */
    int32_t h1, h2;
    float lr, momentum;
    uint64_t seed;
    int64_t samples; /* training samples in use (the first n) */
    /* The epoch's permutation is cut into shard_count slices; worker rank
     * takes slice shard_base + rank (--backend mpi: the workers of every
     * rank share one cut). Single host: 0 and workers. */
    int32_t shard_base, shard_count;
} worker_cfg;

/* Number of exchanges a periodic epoch makes: after every `every` steps and
 * after the last one. */
static inline int32_t worker_rounds(const worker_cfg *c)
{
    return (c->steps + c->every - 1) / c->every;
}

/* The epoch's shuffle: every worker computes the same permutation of
 * [0, samples) from (seed, epoch) and takes rank's slice of it. */
uint64_t worker_shuffle_seed(uint64_t seed, int32_t epoch);

#endif
