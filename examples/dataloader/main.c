/* dataloader: PyTorch's DataLoader pattern with processes. --workers loader
 * processes decode and augment (random crop + flip) Fashion-MNIST batches
 * into a fixed ring of batch buffers and send them to the trainer through a
 * queue; the trainer takes a step of the hogwild example's MLP on each batch
 * and sends the buffer back on a second queue for a loader to refill.
 *
 * The buffers start as private tensors: the first put of each copies it
 * into shared memory (one copy per ring buffer), after which every message
 * carries only handles. The program prints batches/s and those copy counts,
 * and exits non-zero if any batch after warm-up was copied. If a loader
 * dies the trainer reports mp_spawn's error record and exits; it never
 * waits on a queue without also watching the loaders. See docs/hogwild.md. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>
#include <mproc.h>

#include "data.h"
#include "mlp.h"
#include "progress.h"
#include "loader.h"

#define MAX_WORKERS 64

typedef struct options {
    int workers, batch, ring, fail_rank;
    long batches;
    bool train;
    uint64_t seed;
    const char *data_dir, *start_method;
} options;

typedef struct trainer {
    const options *o;
    mlp_shape shape;
    mlp_layout layout;
    float *params, *grad, *velocity;
    mlp_work work;
    long window;                  /* batches averaged for the loss: min(100, batches/2) */
    double first_loss, last_loss; /* mean losses of the first and last window */
    double loss_sum;
} trainer;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dataloader [options]\n"
            "Loader processes decode and augment Fashion-MNIST batches into a ring of\n"
            "shared buffers; the trainer steps an MLP on each and returns the buffer.\n\n"
            "  --workers N        loader processes (default 2)\n"
            "  --batch N          samples per batch (default 64)\n"
            "  --ring N           batch buffers in the ring (default 8)\n"
            "  --batches N        batches to load in all (default 3000)\n"
            "  --no-train         do not train: measure the loaders alone\n"
            "  --seed N           shuffles and augmentation (default 1)\n"
            "  --start-method M   fork, spawn or forkserver (default: mproc's)\n"
            "  --data DIR         Fashion-MNIST idx .gz files (default\n"
            "                     %s)\n"
            "  --fail-rank R      loader R dies of SIGSEGV early (shows the error record)\n"
            "  --help\n",
            DATA_DEFAULT_DIR);
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "dataloader: %s wants an integer in %ld..%ld\n", flag, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* Returns 0, 1 after --help, or -1 on a bad flag (message printed). */
static int parse_args(int argc, char **argv, options *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(a, "--no-train")) {
            o->train = false;
            continue;
        } else if (!strcmp(a, "--data") && v) {
            o->data_dir = v;
        } else if (!strcmp(a, "--start-method") && v) {
            o->start_method = v;
        } else {
            static const struct {
                const char *flag;
                long lo, hi;
            } ints[] = {{"--workers", 1, MAX_WORKERS}, {"--batch", 1, 4096},
                        {"--ring", 1, 1024},           {"--batches", 1, 1L << 30},
                        {"--seed", 0, 1L << 62},       {"--fail-rank", 0, MAX_WORKERS - 1}};
            int k = 0, nk = (int)(sizeof ints / sizeof ints[0]);
            while (k < nk && strcmp(a, ints[k].flag))
                k++;
            if (k == nk) {
                fprintf(stderr, "dataloader: unknown flag '%s' (try --help)\n", a);
                return -1;
            }
            if (parse_long(a, v, ints[k].lo, ints[k].hi, &n) != 0)
                return -1;
            if (k == 0)
                o->workers = (int)n;
            else if (k == 1)
                o->batch = (int)n;
            else if (k == 2)
                o->ring = (int)n;
            else if (k == 3)
                o->batches = n;
            else if (k == 4)
                o->seed = (uint64_t)n;
            else
                o->fail_rank = (int)n;
        }
        i++;
    }
    return 0;
}

static int fail(int rc, const char *what)
{
    fprintf(stderr, "dataloader: %s: %s (%s)\n", what, mp_last_error(), mp_err_name(rc));
    return rc;
}

static int trainer_open(trainer *t, const options *o)
{
    memset(t, 0, sizeof *t);
    t->o = o;
    t->shape = (mlp_shape){DATA_PIXELS, 256, 128, DATA_CLASSES};
    mlp_layout_init(&t->layout, &t->shape);
    t->params = malloc(t->layout.total * sizeof(float));
    t->grad = malloc(t->layout.total * sizeof(float));
    t->velocity = calloc(t->layout.total, sizeof(float));
    if (!t->params || !t->grad || !t->velocity ||
        mlp_work_init(&t->work, &t->shape, o->batch) != 0) {
        fprintf(stderr, "dataloader: trainer: out of memory\n");
        return MP_ENOMEM;
    }
    mlp_init_params(&t->shape, t->params, o->seed);
    t->window = o->batches / 2 < 100 ? (o->batches / 2 > 0 ? o->batches / 2 : 1) : 100;
    return 0;
}

static void trainer_free(trainer *t)
{
    free(t->params);
    free(t->grad);
    free(t->velocity);
    mlp_work_free(&t->work);
}

/* Puts o->ring private batch buffers on the free queue: each put copies
 * one into shared memory, the only copies of the run. */
static int ring_fill(const options *o, mp_queue *free_q)
{
    int64_t xs[2] = {o->batch, DATA_PIXELS}, ys[1] = {o->batch};
    int rc = 0;
    for (int i = 0; i < o->ring && rc == 0; i++) {
        mp_tensor *x = NULL, *y = NULL;
        mp_msg *m = NULL;
        rc = mp_tensor_empty(MP_FLOAT32, 2, xs, &x);
        if (rc == 0)
            rc = mp_tensor_empty(MP_UINT8, 1, ys, &y);
        if (rc == 0)
            rc = mp_msg_create(&m);
        if (rc == 0)
            rc = mp_msg_add_tensor(m, "x", x);
        if (rc == 0)
            rc = mp_msg_add_tensor(m, "y", y);
        if (rc == 0)
            rc = mp_queue_put(free_q, m, -1);
        mp_msg_destroy(m);
        mp_tensor_release(x);
        mp_tensor_release(y);
    }
    return rc == 0 ? 0 : fail(rc, "filling the ring of batch buffers");
}

static int loader_args(const options *o, const dataset *d, mp_tensor *stats, mp_queue *free_q,
                       mp_queue *ready_q, mp_msg **out)
{
    loader_cfg c = {.version = LOADER_CFG_VERSION,
                    .workers = o->workers,
                    .batch = o->batch,
                    .fail_rank = o->fail_rank,
                    .batches = o->batches,
                    .samples = d->n_train,
                    .seed = o->seed};
    mp_msg *m = NULL;
    int rc = mp_msg_create(&m);
    if (rc == 0)
        rc = mp_msg_set_payload(m, &c, sizeof c);
    if (rc == 0)
        rc = mp_msg_add_tensor(m, "train_x", d->train_x);
    if (rc == 0)
        rc = mp_msg_add_tensor(m, "train_y", d->train_y);
    if (rc == 0)
        rc = mp_msg_add_tensor(m, "stats", stats);
    if (rc == 0)
        rc = mp_msg_add_queue(m, "free", free_q);
    if (rc == 0)
        rc = mp_msg_add_queue(m, "ready", ready_q);
    if (rc != 0) {
        mp_msg_destroy(m);
        return fail(rc, "building the loaders' arguments");
    }
    *out = m;
    return 0;
}

/* 0 while the loaders run or after they all finished; MP_ECHILD (record
 * printed) when one failed. */
static int watch_loaders(mp_spawn_context *ctx)
{
    mp_child_error e = {.size = sizeof e};
    int rc = mp_spawn_context_join(ctx, 0);
    if (rc == 0 || rc == MP_ETIMEDOUT)
        return 0;
    fprintf(stderr, "\ndataloader: a loader failed; stopped.\n");
    if (rc == MP_ECHILD && mp_spawn_context_error(ctx, &e) == 0)
        progress_child_error(stderr, "loader", &e);
    else
        fprintf(stderr, "  %s (%s)\n", mp_last_error(), mp_err_name(rc));
    return rc;
}

/* Uses one batch: checks it, steps the MLP on it (unless --no-train). */
static int consume(trainer *t, mp_msg *m, long got)
{
    const options *o = t->o;
    size_t len = 0;
    const loader_batch *b = mp_msg_payload(m, &len);
    mp_tensor *x = NULL, *y = NULL;
    int rc = MP_EPROTO;
    if (len == sizeof *b && b->rank >= 0 && b->rank < o->workers &&
        mp_msg_find_tensor(m, "x", &x) == 0 && mp_msg_find_tensor(m, "y", &y) == 0 &&
        mp_tensor_dtype(x) == MP_FLOAT32 && mp_tensor_numel(x) == (int64_t)o->batch * DATA_PIXELS &&
        mp_tensor_dtype(y) == MP_UINT8 && mp_tensor_numel(y) == o->batch)
        rc = 0;
    const uint8_t *labels = rc == 0 ? mp_tensor_data(y) : NULL;
    for (int k = 0; rc == 0 && k < o->batch; k++)
        rc = labels[k] < DATA_CLASSES ? 0 : MP_EPROTO;
    if (rc != 0) {
        fprintf(stderr, "dataloader: a loader sent a malformed batch\n");
    } else if (o->train) {
        float loss = mlp_forward_backward(&t->shape, t->params, mp_tensor_data(x), labels, o->batch,
                                          t->grad, &t->work);
        mlp_sgd_step(t->params, t->grad, t->velocity, t->layout.total, 0.05f, 0.9f);
        long n = t->window;
        if (got == o->batches - n) /* the last window starts (after the first ended) */
            t->loss_sum = 0;
        t->loss_sum += loss;
        if (got + 1 == n)
            t->first_loss = t->loss_sum / (double)n;
        if (got + 1 == o->batches)
            t->last_loss = t->loss_sum / (double)n;
    }
    mp_tensor_release(x);
    mp_tensor_release(y);
    return rc;
}

/* The trainer's loop: every batch from the ready queue is used and its
 * buffer returned to the free queue. Waits at most 0.1 s at a time so a
 * dead loader is noticed within that, whatever the queues hold. */
static int train_loop(trainer *t, mp_spawn_context *ctx, mp_queue *free_q, mp_queue *ready_q)
{
    const options *o = t->o;
    double start = progress_now(), last_print = start;
    long got = 0;
    int rc = 0;
    while (got < o->batches) {
        mp_msg *m = NULL;
        rc = mp_queue_get(ready_q, &m, 0.1);
        if (rc == 0 || rc == MP_ETIMEDOUT) {
            int w = watch_loaders(ctx);
            if (w != 0) {
                mp_msg_destroy(m);
                return w;
            }
        }
        if (rc == MP_ETIMEDOUT)
            continue;
        if (rc != 0)
            return fail(rc, "taking a batch from the ready queue");
        rc = consume(t, m, got);
        /* The buffer goes back: handles only, its memory is shared already. */
        if (rc == 0 && (rc = mp_queue_put(free_q, m, -1)) != 0)
            fail(rc, "returning a buffer to the free queue");
        mp_msg_destroy(m);
        if (rc != 0)
            return rc;
        got++;
        double now = progress_now();
        if (now - last_print >= 1.0) {
            printf("  %5.1f s  %7ld batches  %7.0f batches/s\n", now - start, got,
                   (double)got / (now - start));
            fflush(stdout);
            last_print = now;
        }
    }
    return 0;
}

static int report(const options *o, const trainer *t, const mp_tensor *stats, double seconds,
                  uint64_t ring_copies, uint64_t trainer_copies)
{
    const double *s = mp_tensor_data(stats);
    double loader_copies = 0;
    for (int w = 0; w < o->workers; w++)
        loader_copies += s[w * STATS_COLS + STATS_COPIES];
    /* A buffer is two tensors (x, y) with a storage each: two copies. */
    bool ok = ring_copies == 2 * (uint64_t)o->ring && trainer_copies == 0 && loader_copies == 0;
    printf("\ndataloader: %ld batches of %d (%ld samples) from %d loader%s in %.2f s\n"
           "            %.0f batches/s, %.0f samples/s\n",
           o->batches, o->batch, o->batches * o->batch, o->workers, o->workers == 1 ? "" : "s",
           seconds, (double)o->batches / seconds, (double)(o->batches * o->batch) / seconds);
    printf("copies into shared memory (mp_tensor_stats_get): %llu at warm-up (x and y\n"
           "  of %d ring buffers), then %llu in the trainer and %.0f in the loaders:\n"
           "  %s\n",
           (unsigned long long)ring_copies, o->ring, (unsigned long long)trainer_copies,
           loader_copies,
           ok ? "one copy per buffer tensor, none per batch"
              : "WRONG: expected two per ring buffer at warm-up and none per batch");
    if (o->train)
        printf("trainer: MLP 784-256-128-10, mean loss %.3f over the first %ld batches,\n"
               "         %.3f over the last %ld\n",
               t->first_loss, t->window, t->last_loss, t->window);
    return ok ? 0 : MP_ESTATE;
}

int main(int argc, char **argv)
{
    options o = {.workers = 2,
                 .batch = 64,
                 .ring = 8,
                 .fail_rank = -1,
                 .batches = 3000,
                 .train = true,
                 .seed = 1};
    mp_queue *free_q = NULL, *ready_q = NULL;
    mp_spawn_context *ctx = NULL;
    mp_tensor *stats = NULL;
    mp_msg *args = NULL;
    trainer t;
    dataset d;
    char err[1024];
    int rc;
    if (mp_setup(&argc, &argv) != 0) {
        fprintf(stderr, "dataloader: mp_setup: %s\n", mp_last_error());
        return 1;
    }
    if ((rc = parse_args(argc, argv, &o)) != 0)
        return rc > 0 ? 0 : 2;
    openblas_set_num_threads(1); /* the loaders have the other cores */
    if (dataset_load(o.data_dir, &d, err, sizeof err) != 0) {
        fprintf(stderr, "dataloader: %s\n", err);
        return 1;
    }
    int64_t shape[2] = {o.workers, STATS_COLS};
    if ((rc = trainer_open(&t, &o)) != 0)
        goto out;
    if ((rc = mp_tensor_empty_shared(MP_FLOAT64, 2, shape, &stats)) != 0 ||
        (rc = mp_queue_create(0, &free_q)) != 0 || (rc = mp_queue_create(0, &ready_q)) != 0) {
        fail(rc, "creating the queues and stats");
        goto out;
    }
    uint64_t copies0 = loader_shared_copies();
    if ((rc = ring_fill(&o, free_q)) != 0)
        goto out;
    uint64_t copies1 = loader_shared_copies();
    if ((rc = loader_args(&o, &d, stats, free_q, ready_q, &args)) != 0)
        goto out;
    printf("dataloader: %d loader%s, ring of %d buffers of %d samples, %ld batches,\n"
           "            start method %s%s\n",
           o.workers, o.workers == 1 ? "" : "s", o.ring, o.batch, o.batches,
           o.start_method ? o.start_method : mp_get_start_method(),
           o.train ? ", training an MLP on them" : "");
    fflush(stdout); /* else fork children inherit the unwritten line */
    double start = progress_now();
    rc = mp_spawn("dataloader_worker", args, o.workers, false, false, o.start_method, &ctx);
    if (rc != 0) {
        fail(rc, "starting the loaders (mp_spawn)");
        goto out;
    }
    if ((rc = train_loop(&t, ctx, free_q, ready_q)) != 0)
        goto out;
    double seconds = progress_now() - start;
    rc = mp_spawn_context_join(ctx, 30);
    if (rc == MP_ECHILD) {
        watch_loaders(ctx); /* prints the record; the join's result stays */
        goto out;
    } else if (rc != 0) {
        fail(rc, "waiting for the loaders to finish");
        goto out;
    }
    rc = report(&o, &t, stats, seconds, copies1 - copies0, loader_shared_copies() - copies1);
out:
    mp_spawn_context_destroy(ctx);
    mp_msg_destroy(args);
    mp_queue_release(free_q);
    mp_queue_release(ready_q);
    mp_tensor_release(stats);
    trainer_free(&t);
    dataset_free(&d);
    return rc == 0 ? 0 : 1;
}
