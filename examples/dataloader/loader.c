/* The loader processes: take an empty batch buffer from the free queue,
 * decode and augment a batch into it, send it to the trainer on the ready
 * queue; until this loader's quota is done. */
#include "loader.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mproc.h>

#include "args.h"
#include "data.h"

void loader_augment(const uint8_t *image, int dx, int dy, int flip, float *out)
{
    const float scale = 1.0f / (255.0f * DATA_STD), zero = -DATA_MEAN / DATA_STD;
    for (int r = 0; r < DATA_ROWS; r++) {
        int sr = r + dy;
        float *dst = out + r * DATA_COLS;
        if (sr < 0 || sr >= DATA_ROWS) {
            for (int c = 0; c < DATA_COLS; c++)
                dst[c] = zero;
            continue;
        }
        for (int c = 0; c < DATA_COLS; c++) {
            int sc = (flip ? DATA_COLS - 1 - c : c) + dx;
            dst[c] =
                sc < 0 || sc >= DATA_COLS ? zero : (float)image[sr * DATA_COLS + sc] * scale + zero;
        }
    }
}

void loader_augment_random(const uint8_t *image, rng *r, float *out)
{
    int dx = (int)rng_below(r, 2 * LOADER_PAD + 1) - LOADER_PAD;
    int dy = (int)rng_below(r, 2 * LOADER_PAD + 1) - LOADER_PAD;
    loader_augment(image, dx, dy, (int)(rng_next(r) & 1), out);
}

typedef struct loader {
    int rank;
    loader_cfg cfg;
    mp_tensor *train_x, *train_y, *stats;
    mp_queue *free_q, *ready_q;
    uint32_t *order; /* this loader's shard, reshuffled every pass */
    uint32_t shard, next;
    rng r;
} loader;

static void loader_free(loader *l)
{
    mp_tensor_release(l->train_x);
    mp_tensor_release(l->train_y);
    mp_tensor_release(l->stats);
    mp_queue_release(l->free_q);
    mp_queue_release(l->ready_q);
    free(l->order);
}

static void loader_open(loader *l, int rank, mp_msg *args)
{
    l->rank = rank;
    args_cfg(args, "loader", rank, &l->cfg, sizeof l->cfg, LOADER_CFG_VERSION);
    args_tensor(args, "loader", rank, "train_x", &l->train_x);
    args_tensor(args, "loader", rank, "train_y", &l->train_y);
    args_tensor(args, "loader", rank, "stats", &l->stats);
    args_queue(args, "loader", rank, "free", &l->free_q);
    args_queue(args, "loader", rank, "ready", &l->ready_q);
    if (mp_tensor_size(l->train_x, 0) < l->cfg.samples ||
        mp_tensor_size(l->stats, 0) != l->cfg.workers)
        mp_raise("loader %d: tensors do not match the configuration", rank);
    /* Shard: the samples i with i % workers == rank. */
    l->shard = (uint32_t)((l->cfg.samples - rank + l->cfg.workers - 1) / l->cfg.workers);
    l->order = malloc((size_t)l->shard * sizeof *l->order);
    if (!l->order)
        mp_raise("loader %d: out of memory", rank);
    for (uint32_t i = 0; i < l->shard; i++)
        l->order[i] = (uint32_t)rank + i * (uint32_t)l->cfg.workers;
    rng_seed(&l->r, l->cfg.seed * 7919u + (uint64_t)rank);
    l->next = l->shard; /* shuffle before the first batch */
}

/* Checks that a buffer from the free queue is a batch buffer: x float32
 * [batch, 784], y uint8 [batch], both contiguous. */
static void check_buffer(loader *l, mp_tensor *x, mp_tensor *y)
{
    if (mp_tensor_dtype(x) != MP_FLOAT32 || mp_tensor_dtype(y) != MP_UINT8 ||
        mp_tensor_ndim(x) != 2 || mp_tensor_size(x, 0) != l->cfg.batch ||
        mp_tensor_size(x, 1) != DATA_PIXELS || mp_tensor_numel(y) != l->cfg.batch ||
        !mp_tensor_is_contiguous(x) || !mp_tensor_is_contiguous(y))
        mp_raise("loader %d: the free queue held a buffer of the wrong shape", l->rank);
}

static void fill(loader *l, mp_tensor *x, mp_tensor *y)
{
    const uint8_t *images = mp_tensor_data(l->train_x), *labels = mp_tensor_data(l->train_y);
    float *xd = mp_tensor_data(x);
    uint8_t *yd = mp_tensor_data(y);
    for (int k = 0; k < l->cfg.batch; k++) {
        if (l->next == l->shard) {
            rng_shuffle(&l->r, l->order, l->shard);
            l->next = 0;
        }
        uint32_t i = l->order[l->next++];
        loader_augment_random(images + (size_t)i * DATA_PIXELS, &l->r,
                              xd + (size_t)k * DATA_PIXELS);
        yd[k] = labels[i];
    }
}

/* One batch: a free buffer in, a full one out. */
static void produce(loader *l, int32_t seq)
{
    loader_batch b = {.rank = l->rank, .seq = seq};
    mp_tensor *x = NULL, *y = NULL;
    mp_msg *m = NULL;
    int rc = mp_queue_get(l->free_q, &m, -1);
    if (rc == 0)
        rc = mp_msg_find_tensor(m, "x", &x);
    if (rc == 0)
        rc = mp_msg_find_tensor(m, "y", &y);
    if (rc != 0)
        mp_raise("loader %d: taking a free buffer: %s", l->rank, mp_last_error());
    check_buffer(l, x, y);
    fill(l, x, y);
    /* The same message goes back out: its tensors are already in shared
     * memory, so this put sends handles and copies nothing. */
    rc = mp_msg_set_payload(m, &b, sizeof b);
    if (rc == 0)
        rc = mp_queue_put(l->ready_q, m, -1);
    mp_tensor_release(x);
    mp_tensor_release(y);
    mp_msg_destroy(m);
    if (rc != 0)
        mp_raise("loader %d: sending batch %d: %s", l->rank, seq, mp_last_error());
}

MP_ENTRY(dataloader_worker)
{
    loader l;
    uint64_t copies0 = loader_shared_copies();
    memset(&l, 0, sizeof l);
    loader_open(&l, rank, args);
    double *row = (double *)mp_tensor_data(l.stats) + (size_t)rank * STATS_COLS;
    int64_t quota = loader_quota(&l.cfg, rank);
    for (int64_t s = 0; s < quota; s++) {
        produce(&l, (int32_t)s);
        if (l.cfg.fail_rank == rank && s == quota / 4)
            raise(SIGSEGV); /* --fail-rank: show what a crashed loader looks like */
        double done = (double)(s + 1);
        __atomic_store(&row[STATS_BATCHES], &done, __ATOMIC_RELAXED);
    }
    double copies = (double)(loader_shared_copies() - copies0);
    __atomic_store(&row[STATS_COPIES], &copies, __ATOMIC_RELAXED);
    loader_free(&l);
    return 0;
}
