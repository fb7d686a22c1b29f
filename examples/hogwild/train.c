/* The parent side of the hogwild example: shared state, one mp_spawn per
 * epoch, the periodic averaging loop, evaluation. */
#include "train.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "progress.h"
#include "worker.h"

#define EVAL_BATCH 500

void train_options_init(train_options *o)
{
    memset(o, 0, sizeof *o);
    o->epochs = 5;
    o->batch = 64;
    o->lr = 0.05f;
    o->momentum = 0.9f;
    o->h1 = 256;
    o->h2 = 128;
    o->workers = 2;
    o->sync = TRAIN_SHARED;
    o->every = 20;
    o->seed = 1;
    o->fail_rank = -1;
    o->shards = 1;
}

typedef struct run run;

struct run {
    const train_options *o;
    const dataset *d;
    mlp_shape shape;
    mlp_layout layout;
    int64_t samples;
    int32_t steps;
    mp_tensor *params, *velocity, *progress_t;
    mp_tensor *views[2 * MLP_LAYERS]; /* of params, for state_dicts */
    mp_queue *up, *down[TRAIN_MAX_WORKERS];
    float *sum; /* periodic: the round's state_dicts added up */
    progress bar;
    /* figures so far (train_epoch) */
    int epochs_done;
    double wall_s, train_s, train_loss, test_accuracy, test_loss;
};

int train_param_view(mp_tensor *flat, const mlp_layout *l, int i, mp_tensor **out)
{
    mp_tensor *n = NULL;
    int rc = mp_tensor_narrow(flat, 0, (int64_t)l->off[i], (int64_t)l->len[i], &n);
    if (rc == 0)
        rc = mp_tensor_reshape(n, l->ndim[i], l->dims[i], out);
    mp_tensor_release(n);
    return rc;
}

int train_evaluate(const mlp_shape *s, const float *params, const dataset *d, double *accuracy,
                   double *loss)
{
    const uint8_t *images = mp_tensor_data(d->test_x), *labels = mp_tensor_data(d->test_y);
    float *x = malloc((size_t)EVAL_BATCH * DATA_PIXELS * sizeof *x);
    uint32_t idx[EVAL_BATCH];
    int64_t correct = 0;
    double sum = 0;
    mlp_work w;
    if (!x || mlp_work_init(&w, s, EVAL_BATCH) != 0) {
        free(x);
        fprintf(stderr, "hogwild: evaluation: out of memory\n");
        return MP_ENOMEM;
    }
    for (int64_t b = 0; b < d->n_test; b += EVAL_BATCH) {
        int n = d->n_test - b < EVAL_BATCH ? (int)(d->n_test - b) : EVAL_BATCH;
        for (int k = 0; k < n; k++)
            idx[k] = (uint32_t)(b + k);
        data_gather(images, idx, n, x);
        sum += mlp_evaluate(s, params, x, labels + b, n, &w, &correct);
    }
    *accuracy = (double)correct / (double)d->n_test;
    *loss = sum / (double)d->n_test;
    mlp_work_free(&w);
    free(x);
    return 0;
}

static int fail(int rc, const char *what)
{
    fprintf(stderr, "hogwild: %s: %s (%s)\n", what, mp_last_error(), mp_err_name(rc));
    return rc;
}

static void run_free(run *r)
{
    for (int i = 0; i < 2 * MLP_LAYERS; i++)
        mp_tensor_release(r->views[i]);
    mp_tensor_release(r->params);
    mp_tensor_release(r->velocity);
    mp_tensor_release(r->progress_t);
    mp_queue_release(r->up);
    for (int i = 0; i < TRAIN_MAX_WORKERS; i++)
        mp_queue_release(r->down[i]);
    free(r->sum);
}

static int check_options(const train_options *o, const dataset *d, int64_t samples)
{
    const char *bad = NULL;
    if (o->epochs < 1)
        bad = "--epochs must be at least 1";
    else if (o->batch < 1 || o->batch > 65536)
        bad = "--batch must be 1..65536";
    else if (o->workers < 1 || o->workers > TRAIN_MAX_WORKERS)
        bad = "--workers must be 1..64";
    else if (!(o->lr > 0) || !(o->momentum >= 0 && o->momentum < 1))
        bad = "--lr must be > 0 and --momentum in [0, 1)";
    else if (o->h1 < 1 || o->h2 < 1 || o->h1 > 65536 || o->h2 > 65536)
        bad = "--hidden sizes must be 1..65536";
    else if (o->sync == TRAIN_PERIODIC && o->every < 1)
        bad = "--every must be at least 1";
    else if (o->limit < 0 || samples > d->n_train)
        bad = "--limit must be 0 (all) or at most the training set's size";
    else if (samples / ((int64_t)o->workers * o->shards) < o->batch)
        bad = "each worker's shard is smaller than one batch: lower --workers or --batch";
    if (!bad)
        return 0;
    fprintf(stderr, "hogwild: %s\n", bad);
    return MP_EINVAL;
}

static int run_open(run *r, const train_options *o, const dataset *d)
{
    int64_t vshape[2], pshape[2];
    int rc;
    memset(r, 0, sizeof *r);
    r->o = o;
    r->d = d;
    r->samples = o->limit > 0 ? o->limit : d->n_train;
    if ((rc = check_options(o, d, r->samples)) != 0)
        return rc;
    r->steps = (int32_t)(r->samples / ((int64_t)o->workers * o->shards) / o->batch);
    r->shape = (mlp_shape){DATA_PIXELS, o->h1, o->h2, DATA_CLASSES};
    mlp_layout_init(&r->layout, &r->shape);
    vshape[0] = o->workers;
    vshape[1] = (int64_t)r->layout.total;
    pshape[0] = o->workers;
    pshape[1] = PROGRESS_COLS;
    /* Hogwild: the parameters are born in shared memory, no copy ever. */
    rc = o->sync == TRAIN_SHARED ? mp_tensor_empty_shared(MP_FLOAT32, 1, &vshape[1], &r->params)
                                 : mp_tensor_empty(MP_FLOAT32, 1, &vshape[1], &r->params);
    if (rc == 0)
        rc = mp_tensor_empty_shared(MP_FLOAT32, 2, vshape, &r->velocity);
    if (rc == 0)
        rc = mp_tensor_empty_shared(MP_FLOAT64, 2, pshape, &r->progress_t);
    for (int i = 0; i < 2 * MLP_LAYERS && rc == 0; i++)
        rc = train_param_view(r->params, &r->layout, i, &r->views[i]);
    if (rc == 0 && o->sync == TRAIN_PERIODIC) {
        r->sum = malloc(r->layout.total * sizeof *r->sum);
        rc = r->sum ? mp_queue_create(0, &r->up) : MP_ENOMEM;
        for (int i = 0; i < o->workers && rc == 0; i++)
            rc = mp_queue_create(0, &r->down[i]);
    }
    if (rc != 0)
        return fail(rc, "setting up shared state");
    mlp_init_params(&r->shape, mp_tensor_data(r->params), o->seed);
    return 0;
}

/* Sums the workers' progress rows: samples done and mean loss so far. */
static void progress_read(run *r, int64_t *done, double *loss)
{
    const double *p = mp_tensor_data(r->progress_t);
    double samples = 0, sum = 0, batches = 0;
    for (int w = 0; w < r->o->workers; w++) {
        double v[PROGRESS_COLS];
        for (int c = 0; c < PROGRESS_COLS; c++)
            __atomic_load(&p[w * PROGRESS_COLS + c], &v[c], __ATOMIC_RELAXED);
        samples += v[PROGRESS_SAMPLES];
        sum += v[PROGRESS_LOSS_SUM];
        batches += v[PROGRESS_BATCHES];
    }
    *done = (int64_t)samples;
    *loss = batches > 0 ? sum / batches : 0;
}

static int epoch_args(run *r, int epoch, mp_msg **out)
{
    const train_options *o = r->o;
    worker_cfg c = {
        .version = WORKER_CFG_VERSION,
        .sync = o->sync,
        .workers = o->workers,
        .batch = o->batch,
        .every = o->every,
        .steps = r->steps,
        .epoch = epoch,
        .fail_rank = o->fail_rank,
        .h1 = o->h1,
        .h2 = o->h2,
        .momentum = o->momentum,
        .seed = o->seed,
        .samples = r->samples,
        .shard_base = o->shard * o->workers,
        .shard_count = o->shards * o->workers,
    };
    mp_msg *m = NULL;
    int rc;
    /* Cosine annealing of the learning rate over the epochs. */
    c.lr = o->lr * 0.5f * (1.0f + cosf(3.14159265f * (float)epoch / (float)o->epochs));
    rc = mp_msg_create(&m);
    if (rc == 0)
        rc = mp_msg_set_payload(m, &c, sizeof c);
    if (rc == 0)
        rc = mp_msg_add_tensor(m, "params", r->params);
    if (rc == 0)
        rc = mp_msg_add_tensor(m, "velocity", r->velocity);
    if (rc == 0)
        rc = mp_msg_add_tensor(m, "train_x", r->d->train_x);
    if (rc == 0)
        rc = mp_msg_add_tensor(m, "train_y", r->d->train_y);
    if (rc == 0)
        rc = mp_msg_add_tensor(m, "progress", r->progress_t);
    if (rc == 0 && o->sync == TRAIN_PERIODIC) {
        rc = mp_msg_add_queue(m, "up", r->up);
        for (int i = 0; i < o->workers && rc == 0; i++) {
            char name[32];
            snprintf(name, sizeof name, "down%d", i);
            rc = mp_msg_add_queue(m, name, r->down[i]);
        }
    }
    if (rc != 0) {
        mp_msg_destroy(m);
        return fail(rc, "building the workers' arguments");
    }
    *out = m;
    return 0;
}

/* Waits up to timeout s for the workers: 1 when all are done, 0 when some
 * still run, or MP_ECHILD after printing mp_spawn's error record. */
static int poll_workers(mp_spawn_context *ctx, double timeout)
{
    mp_child_error e = {.size = sizeof e};
    int rc = mp_spawn_context_join(ctx, timeout);
    if (rc == 0)
        return 1;
    if (rc == MP_ETIMEDOUT)
        return 0;
    fprintf(stderr, "\nhogwild: a worker failed; training stopped.\n");
    if (rc == MP_ECHILD && mp_spawn_context_error(ctx, &e) == 0) {
        progress_child_error(stderr, "rank", &e);
    } else {
        fprintf(stderr, "  %s (%s)\n", mp_last_error(), mp_err_name(rc));
    }
    return rc;
}

/* Adds message m's state_dict (a worker's parameters) into sum. */
static int accumulate(run *r, mp_msg *m, float *sum)
{
    for (int i = 0; i < 2 * MLP_LAYERS; i++) {
        mp_tensor *t = NULL;
        int rc = mp_msg_find_tensor(m, mlp_param_names[i], &t);
        if (rc != 0)
            return fail(rc, "reading a worker's state_dict");
        if (mp_tensor_dtype(t) != MP_FLOAT32 || !mp_tensor_is_contiguous(t) ||
            (size_t)mp_tensor_numel(t) != r->layout.len[i]) {
            mp_tensor_release(t);
            fprintf(stderr, "hogwild: a worker sent a malformed %s\n", mlp_param_names[i]);
            return MP_EPROTO;
        }
        const float *src = mp_tensor_data(t);
        float *dst = sum + r->layout.off[i];
        for (size_t k = 0; k < r->layout.len[i]; k++)
            dst[k] += src[k];
        mp_tensor_release(t);
    }
    return 0;
}

/* One exchange round: a state_dict from every worker, their average into
 * params, and (unless last) the average back to every worker. The sum
 * builds up apart from params: params is written only once every worker
 * has sent, i.e. is done reading the previous average (or, in the first
 * round, copying the initial parameters). */
static int periodic_round(run *r, mp_spawn_context *ctx, bool last)
{
    float *params = mp_tensor_data(r->params), *sum = r->sum;
    int n = r->o->workers, got = 0, rc = 0;
    int64_t done;
    double loss;
    memset(sum, 0, r->layout.total * sizeof *sum);
    while (got < n) {
        mp_msg *m = NULL;
        rc = mp_queue_get(r->up, &m, 0.1);
        if (rc == MP_ETIMEDOUT) {
            /* Nothing for 0.1 s: a dead worker would leave us waiting forever. */
            if ((rc = poll_workers(ctx, 0)) < 0)
                return rc;
            if (rc == 1 && mp_queue_empty(r->up)) {
                fprintf(stderr, "hogwild: the workers exited before sending every "
                                "state_dict\n");
                return MP_EPROTO;
            }
            progress_read(r, &done, &loss);
            progress_update(&r->bar, done, loss);
            continue;
        }
        if (rc != 0)
            return fail(rc, "receiving a worker's state_dict");
        rc = accumulate(r, m, sum);
        mp_msg_destroy(m);
        if (rc != 0)
            return rc;
        got++;
    }
    for (size_t k = 0; k < r->layout.total; k++)
        params[k] = sum[k] / (float)n;
    for (int i = 0; i < n && !last; i++) {
        mp_msg *m = NULL;
        rc = mp_msg_from_state_dict(2 * MLP_LAYERS, mlp_param_names, r->views, &m);
        if (rc == 0)
            rc = mp_queue_put(r->down[i], m, -1);
        mp_msg_destroy(m);
        if (rc != 0)
            return fail(rc, "sending the average to a worker");
    }
    return 0;
}

/* The steps the slowest worker has done this epoch. */
static int64_t slowest_steps(run *r)
{
    const double *p = mp_tensor_data(r->progress_t);
    double least = -1;
    for (int w = 0; w < r->o->workers; w++) {
        double v;
        __atomic_load(&p[w * PROGRESS_COLS + PROGRESS_BATCHES], &v, __ATOMIC_RELAXED);
        least = least < 0 || v < least ? v : least;
    }
    return (int64_t)least;
}

/* Shared mode with an average hook (--backend mpi): while the workers run,
 * the parameters are averaged every `every` steps of the slowest worker,
 * the same steps/every times in every process, plus once after the join. */
static int average_rounds(run *r, mp_spawn_context *ctx)
{
    const train_options *o = r->o;
    int32_t rounds = r->steps / o->every, done_rounds = 0;
    int rc = 0, finished = 0;
    while (done_rounds < rounds && rc == 0) {
        if (!finished && slowest_steps(r) < (int64_t)(done_rounds + 1) * o->every) {
            rc = finished = poll_workers(ctx, 0.002);
            rc = rc < 0 ? rc : 0;
            continue;
        }
        rc = o->average(r->params, o->average_ctx);
        done_rounds++;
    }
    return rc;
}

static int run_epoch(run *r, int epoch)
{
    mp_spawn_context *ctx = NULL;
    mp_msg *args = NULL;
    int rc;
    memset(mp_tensor_data(r->progress_t), 0, mp_tensor_nbytes(r->progress_t));
    if ((rc = epoch_args(r, epoch, &args)) != 0)
        return rc;
    fflush(NULL); /* else fork children inherit unwritten output and print it again */
    rc = mp_spawn("hogwild_worker", args, r->o->workers, false, false, r->o->start_method, &ctx);
    mp_msg_destroy(args);
    if (rc != 0)
        return fail(rc, "starting the workers (mp_spawn)");
    if (r->o->sync == TRAIN_PERIODIC) {
        worker_cfg c = {.steps = r->steps, .every = r->o->every};
        int32_t rounds = worker_rounds(&c);
        for (int32_t i = 0; i < rounds && rc == 0; i++)
            rc = periodic_round(r, ctx, i + 1 == rounds);
    }
    if (r->o->sync == TRAIN_SHARED && r->o->average)
        rc = average_rounds(r, ctx);
    while (rc == 0) {
        int64_t done;
        double loss;
        rc = poll_workers(ctx, 0.1);
        if (rc == 0) {
            progress_read(r, &done, &loss);
            progress_update(&r->bar, done, loss);
        }
    }
    mp_spawn_context_destroy(ctx);
    if (rc >= 0 && r->o->average)
        rc = r->o->average(r->params, r->o->average_ctx);
    return rc < 0 ? rc : 0;
}

static uint64_t fnv1a(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

int train_start(const train_options *o, const dataset *d, train_state **out)
{
    double t0 = progress_now();
    run *r = calloc(1, sizeof *r);
    int rc;
    *out = NULL;
    if (!r) {
        fprintf(stderr, "hogwild: out of memory\n");
        return MP_ENOMEM;
    }
    openblas_set_num_threads(1);
    if ((rc = run_open(r, o, d)) != 0) {
        run_free(r);
        free(r);
        return rc;
    }
    progress_init(&r->bar, stdout, o->output, o->label);
    r->wall_s = progress_now() - t0;
    *out = r;
    return 0;
}

int train_epoch(train_state *r, int epoch)
{
    const train_options *o = r->o;
    double t0 = progress_now();
    int64_t done = 0;
    int rc;
    progress_begin(&r->bar, epoch, o->epochs, (int64_t)r->steps * o->batch * o->workers);
    rc = run_epoch(r, epoch);
    r->train_s += progress_now() - t0;
    if (rc == 0) {
        progress_read(r, &done, &r->train_loss);
        rc = train_evaluate(&r->shape, mp_tensor_data(r->params), r->d, &r->test_accuracy,
                            &r->test_loss);
    }
    if (rc == 0) {
        progress_end(&r->bar, done, r->train_loss, r->test_accuracy, r->test_loss);
        r->epochs_done = epoch + 1;
    }
    r->wall_s += progress_now() - t0;
    return rc;
}

void train_finish(train_state *r, train_result *res)
{
    if (res)
        memset(res, 0, sizeof *res);
    if (!r)
        return;
    if (res && r->epochs_done > 0) {
        const train_options *o = r->o;
        res->epochs = r->epochs_done;
        res->wall_s = r->wall_s;
        res->train_s = r->train_s;
        res->samples_per_s =
            (double)r->steps * o->batch * o->workers * o->shards * r->epochs_done / r->train_s;
        res->test_accuracy = r->test_accuracy;
        res->test_loss = r->test_loss;
        res->train_loss = r->train_loss;
        res->param_hash = fnv1a(mp_tensor_data(r->params), r->layout.total * sizeof(float));
    }
    run_free(r);
    free(r);
}

int train_run(const train_options *o, const dataset *d, train_result *res)
{
    train_state *r = NULL;
    int rc = train_start(o, d, &r);
    for (int e = 0; e < o->epochs && rc == 0; e++)
        rc = train_epoch(r, e);
    train_finish(r, rc == 0 ? res : NULL);
    if (rc != 0)
        memset(res, 0, sizeof *res);
    return rc;
}
