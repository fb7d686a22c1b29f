/* The worker processes: one epoch on one shard, Hogwild or periodic. */
#include "worker.h"

#include <cblas.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mproc.h>

#include "args.h"
#include "data.h"
#include "mlp.h"
#include "rng.h"
#include "train.h"

uint64_t worker_shuffle_seed(uint64_t seed, int32_t epoch)
{
    return seed * 1000003u + (uint64_t)epoch + 17;
}

typedef struct worker {
    int rank;
    worker_cfg cfg;
    mlp_shape shape;
    mlp_layout layout;
    mp_tensor *params, *velocity, *train_x, *train_y, *progress;
    mp_queue *up, *down; /* periodic only */
    mp_tensor *local;    /* periodic: this worker's private copy */
    uint32_t *order;     /* the epoch's permutation */
    float *x, *grad;
    uint8_t *y;
    mlp_work work;
} worker;

static void worker_free(worker *w)
{
    mp_tensor_release(w->params);
    mp_tensor_release(w->velocity);
    mp_tensor_release(w->train_x);
    mp_tensor_release(w->train_y);
    mp_tensor_release(w->progress);
    mp_tensor_release(w->local);
    mp_queue_release(w->up);
    mp_queue_release(w->down);
    free(w->order);
    free(w->x);
    free(w->grad);
    free(w->y);
    mlp_work_free(&w->work);
}

/* Reads the arguments and allocates; fails the worker with mp_raise. */
static void worker_open(worker *w, int rank, mp_msg *args)
{
    w->rank = rank;
    args_cfg(args, "worker", rank, &w->cfg, sizeof w->cfg, WORKER_CFG_VERSION);
    w->shape = (mlp_shape){DATA_PIXELS, w->cfg.h1, w->cfg.h2, DATA_CLASSES};
    mlp_layout_init(&w->layout, &w->shape);
    args_tensor(args, "worker", rank, "params", &w->params);
    args_tensor(args, "worker", rank, "velocity", &w->velocity);
    args_tensor(args, "worker", rank, "train_x", &w->train_x);
    args_tensor(args, "worker", rank, "train_y", &w->train_y);
    args_tensor(args, "worker", rank, "progress", &w->progress);
    if ((size_t)mp_tensor_numel(w->params) != w->layout.total ||
        mp_tensor_size(w->velocity, 0) != w->cfg.workers ||
        mp_tensor_size(w->train_x, 0) < w->cfg.samples)
        mp_raise("worker %d: tensors do not match the configuration", rank);
    if (w->cfg.sync == TRAIN_PERIODIC) {
        char down[32];
        snprintf(down, sizeof down, "down%d", rank);
        args_queue(args, "worker", rank, "up", &w->up);
        args_queue(args, "worker", rank, down, &w->down);
        if (mp_tensor_clone(w->params, &w->local) != 0)
            mp_raise("worker %d: local copy: %s", rank, mp_last_error());
    }
    w->order = malloc((size_t)w->cfg.samples * sizeof *w->order);
    w->x = malloc((size_t)w->cfg.batch * DATA_PIXELS * sizeof *w->x);
    w->y = malloc((size_t)w->cfg.batch);
    w->grad = malloc(w->layout.total * sizeof *w->grad);
    if (!w->order || !w->x || !w->y || !w->grad ||
        mlp_work_init(&w->work, &w->shape, w->cfg.batch) != 0)
        mp_raise("worker %d: out of memory", rank);
}

/* The parameters this worker steps: the shared ones, or its local copy.
 * Fetched each time: sending the local copy moves it into shared memory. */
static float *worker_params(worker *w)
{
    return mp_tensor_data(w->local ? w->local : w->params);
}

/* Sends the local copy as a state_dict (named views of one storage) with
 * this worker's rank as payload, then waits for the parent's average and
 * copies it in (unless this was the epoch's last exchange). */
static void worker_exchange(worker *w, bool last)
{
    mp_tensor *views[2 * MLP_LAYERS] = {0};
    mp_msg *m = NULL, *avg = NULL;
    int32_t rank = w->rank;
    int rc = 0;
    for (int i = 0; i < 2 * MLP_LAYERS && rc == 0; i++)
        rc = train_param_view(w->local, &w->layout, i, &views[i]);
    if (rc == 0)
        rc = mp_msg_from_state_dict(2 * MLP_LAYERS, mlp_param_names, views, &m);
    if (rc == 0)
        rc = mp_msg_set_payload(m, &rank, sizeof rank);
    if (rc == 0)
        rc = mp_queue_put(w->up, m, -1);
    if (rc == 0 && !last)
        rc = mp_queue_get(w->down, &avg, -1);
    for (int i = 0; i < 2 * MLP_LAYERS && rc == 0 && !last; i++) {
        mp_tensor *t = NULL;
        rc = mp_msg_find_tensor(avg, mlp_param_names[i], &t);
        if (rc == 0)
            rc = mp_tensor_copy_(views[i], t);
        mp_tensor_release(t);
    }
    for (int i = 0; i < 2 * MLP_LAYERS; i++)
        mp_tensor_release(views[i]);
    mp_msg_destroy(m);
    mp_msg_destroy(avg);
    if (rc != 0)
        mp_raise("worker %d: exchange with the parent: %s", w->rank, mp_last_error());
}

static void progress_store(worker *w, double samples, double loss_sum, double batches)
{
    double *row = (double *)mp_tensor_data(w->progress) + (size_t)w->rank * PROGRESS_COLS;
    __atomic_store(&row[PROGRESS_SAMPLES], &samples, __ATOMIC_RELAXED);
    __atomic_store(&row[PROGRESS_LOSS_SUM], &loss_sum, __ATOMIC_RELAXED);
    __atomic_store(&row[PROGRESS_BATCHES], &batches, __ATOMIC_RELAXED);
}

static void worker_epoch(worker *w)
{
    const worker_cfg *c = &w->cfg;
    const uint8_t *images = mp_tensor_data(w->train_x);
    const uint8_t *labels = mp_tensor_data(w->train_y);
    float *velocity = (float *)mp_tensor_data(w->velocity) + (size_t)w->rank * w->layout.total;
    int64_t per = c->samples / c->shard_count;
    const uint32_t *shard;
    double loss_sum = 0;
    rng r;
    for (int64_t i = 0; i < c->samples; i++)
        w->order[i] = (uint32_t)i;
    rng_seed(&r, worker_shuffle_seed(c->seed, c->epoch));
    rng_shuffle(&r, w->order, (uint32_t)c->samples);
    shard = w->order + (size_t)(per * (c->shard_base + w->rank));
    for (int32_t s = 0; s < c->steps; s++) {
        const uint32_t *idx = shard + (size_t)s * c->batch;
        float *params = worker_params(w);
        data_gather(images, idx, c->batch, w->x);
        for (int k = 0; k < c->batch; k++)
            w->y[k] = labels[idx[k]];
        loss_sum +=
            mlp_forward_backward(&w->shape, params, w->x, w->y, c->batch, w->grad, &w->work);
        mlp_sgd_step(params, w->grad, velocity, w->layout.total, c->lr, c->momentum);
        progress_store(w, (double)(s + 1) * c->batch, loss_sum, s + 1);
        if (c->fail_rank == w->rank && s == c->steps / 4)
            raise(SIGSEGV); /* --fail-rank: show what a crashed worker looks like */
        if (w->local && ((s + 1) % c->every == 0 || s + 1 == c->steps))
            worker_exchange(w, s + 1 == c->steps);
    }
}

MP_ENTRY(hogwild_worker)
{
    worker w;
    memset(&w, 0, sizeof w);
    openblas_set_num_threads(1); /* one BLAS thread per worker process */
    worker_open(&w, rank, args);
    worker_epoch(&w);
    worker_free(&w);
    return 0;
}
