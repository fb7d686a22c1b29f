/* The hogwild example's training driver: N worker processes started with
 * mp_spawn train one MLP on Fashion-MNIST.
 *
 *   shared   (default) the parameters are created directly in shared memory
 *            (mp_tensor_empty_shared); every worker updates them in place,
 *            without locks (Hogwild, Niu et al. 2011), each on its own shard.
 *   periodic each worker trains a private copy; every K steps it sends its
 *            state_dict to the parent through a queue, the parent averages
 *            them and sends the average back (local SGD / model averaging).
 *
 * Workers are started once per epoch (so the parent can evaluate between
 * epochs on a quiet model); per-worker momentum buffers live in shared memory
 * and carry over. Each epoch every worker shuffles the training set with the
 * same seed and takes its own 1/N of it.
 */
#ifndef HOGWILD_TRAIN_H
#define HOGWILD_TRAIN_H

#include <stdbool.h>
#include <stdint.h>

#include "data.h"
#include "mlp.h"

typedef enum train_sync { TRAIN_SHARED = 0, TRAIN_PERIODIC = 1 } train_sync;
typedef enum train_output { OUT_AUTO = 0, OUT_BAR, OUT_LINES, OUT_QUIET } train_output;

#define TRAIN_MAX_WORKERS 64

typedef struct train_options {
    const char *data_dir;     /* NULL: DATA_DEFAULT_DIR */
    int epochs;               /* 5 */
    int batch;                /* 64 */
    float lr;                 /* 0.05, annealed over the epochs (cosine) */
    float momentum;           /* 0.9 */
    int h1, h2;               /* 256, 128 */
    int workers;              /* 2 */
    train_sync sync;          /* TRAIN_SHARED */
    int every;                /* periodic: steps between exchanges (20) */
    uint64_t seed;            /* 1 */
    const char *start_method; /* NULL: mproc's default */
    int64_t limit;            /* use the first `limit` training samples (0: all) */
    bool compare;             /* main.c: also run with 1 worker, report both */
    int fail_rank;            /* -1; else that worker dies of SIGSEGV (a demonstration) */
    train_output output;
    const char *label; /* NULL, or a prefix for the progress lines */
    /* --backend mpi (mpi_backend.c): this process is shard `shard` of
     * `shards` (1 and 0 on one host); shared mode calls average(params)
     * every `every` steps of the slowest worker and at each epoch's end,
     * the same number of times in every shard. */
    int shards, shard;
    int (*average)(mp_tensor *params, void *ctx);
    void *average_ctx;
} train_options;

void train_options_init(train_options *o);

typedef struct train_result {
    int epochs;
    double wall_s;        /* whole run: spawns, training, evaluation */
    double train_s;       /* epochs' training phases (spawn to join) */
    double samples_per_s; /* samples trained / train_s */
    double test_accuracy; /* after the last epoch */
    double test_loss;
    double train_loss;   /* mean over the last epoch's batches */
    uint64_t param_hash; /* FNV-1a of the final parameters' bytes */
} train_result;

/* A training in progress: train_start, train_epoch for each epoch, then
 * train_finish. Two of them can run their epochs in turn, which is how
 * --compare measures 1 and N workers under the same machine load. */
typedef struct run train_state;

/* Checks the options against d and sets up the shared state (parameters
 * initialized from the seed). Returns 0 or a negative mp_error, after printing
 * why to stderr (MP_EINVAL for options that do not fit the data). */
int train_start(const train_options *o, const dataset *d, train_state **out);
/* Runs epoch (0-based) with the workers, then evaluates on the test set.
 * Blocks until done. Errors as train_run's. */
int train_epoch(train_state *s, int epoch);
/* Fills r (if not NULL) with the figures of the epochs done and frees s.
 * NULL s is a no-op (r zeroed). */
void train_finish(train_state *s, train_result *r);

/* Trains as o says on d. Blocks until done. Returns 0, or a negative mp_error
 * after printing why to stderr: MP_EINVAL for options that do not fit the
 * data, MP_ECHILD with mp_spawn's error record when a worker died or failed
 * (the others are stopped), or the failing mproc call's code. */
int train_run(const train_options *o, const dataset *d, train_result *r);

/* View of parameter tensor i (mlp_param_names[i], PyTorch's shape) of the
 * flat float32 tensor flat. */
int train_param_view(mp_tensor *flat, const mlp_layout *l, int i, mp_tensor **out);

/* Evaluates the flat parameters on d's test set: accuracy and mean loss. */
int train_evaluate(const mlp_shape *s, const float *params, const dataset *d, double *accuracy,
                   double *loss);

#endif
