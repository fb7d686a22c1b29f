/* hogwild: several processes train one MLP on Fashion-MNIST, updating
 * parameters that live in shared memory in place, without locks. The
 * program `make demo` runs; see docs/hogwild.md. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mproc.h>

#include "mpi_backend.h"
#include "train.h"

static void usage(FILE *f)
{
    train_options d;
    train_options_init(&d);
    fprintf(f,
            "usage: hogwild [options]\n"
            "Trains an MLP 784-%d-%d-10 on Fashion-MNIST with --workers processes.\n\n"
            "  --sync shared|periodic  shared (default): Hogwild, parameters in shared\n"
            "                          memory updated in place without locks; periodic:\n"
            "                          local copies averaged by the parent every K steps\n"
            "  --every K               periodic: steps between exchanges (default %d)\n"
            "  --workers N             worker processes (default %d)\n"
            "  --start-method M        fork, spawn or forkserver (default: mproc's)\n"
            "  --epochs N              passes over the training set (default %d)\n"
            "  --batch N               samples per step and worker (default %d)\n"
            "  --lr X                  initial learning rate, cosine-annealed (default %g)\n"
            "  --momentum X            SGD momentum (default %g)\n"
            "  --hidden H1,H2          hidden layer sizes (default %d,%d)\n"
            "  --seed N                parameter init and shuffles (default %llu); a\n"
            "                          1-worker run with a seed is reproducible\n"
            "  --limit N               train on the first N samples only (default all)\n"
            "  --data DIR              Fashion-MNIST idx .gz files (default\n"
            "                          %s)\n"
            "  --compare               also train with 1 worker and compare throughput\n"
            "  --progress bar|lines|none  default: a bar on a terminal, else lines\n"
            "  --backend local|mpi     mpi: one training per MPI rank (run under mpirun),\n"
            "                          parameters averaged across ranks every K steps\n"
            "                          (--every) and at each epoch's end\n"
            "  --fail-rank R           worker R dies of SIGSEGV mid-epoch (shows the\n"
            "                          error record mp_spawn reports)\n"
            "  --help\n",
            d.h1, d.h2, d.every, d.workers, d.epochs, d.batch, d.lr, d.momentum, d.h1, d.h2,
            (unsigned long long)d.seed, DATA_DEFAULT_DIR);
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "hogwild: %s wants an integer in %ld..%ld, got '%s'\n", flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *flag, const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || *end || end == s) {
        fprintf(stderr, "hogwild: %s wants a number, got '%s'\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* Returns 0, 1 after --help, or -1 on a bad flag (message printed). */
static int parse_args(int argc, char **argv, train_options *o, bool *mpi)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n = 0;
        int rc = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--compare")) {
            o->compare = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "hogwild: unknown flag '%s' or missing value (try --help)\n", a);
            return -1;
        }
        i++;
        if (!strcmp(a, "--backend")) {
            *mpi = !strcmp(v, "mpi");
            if (!*mpi && strcmp(v, "local"))
                rc = -1, fprintf(stderr, "hogwild: --backend is local or mpi\n");
        } else if (!strcmp(a, "--sync")) {
            if (!strcmp(v, "shared"))
                o->sync = TRAIN_SHARED;
            else if (!strcmp(v, "periodic"))
                o->sync = TRAIN_PERIODIC;
            else
                rc = -1, fprintf(stderr, "hogwild: --sync is shared or periodic\n");
        } else if (!strcmp(a, "--progress")) {
            o->output = !strcmp(v, "bar")     ? OUT_BAR
                        : !strcmp(v, "lines") ? OUT_LINES
                        : !strcmp(v, "none")  ? OUT_QUIET
                                              : OUT_AUTO;
            if (o->output == OUT_AUTO)
                rc = -1, fprintf(stderr, "hogwild: --progress is bar, lines or none\n");
        } else if (!strcmp(a, "--hidden")) {
            int h1, h2, used = 0;
            if (sscanf(v, "%d,%d%n", &h1, &h2, &used) != 2 || v[used] || h1 < 1 || h2 < 1)
                rc = -1, fprintf(stderr, "hogwild: --hidden wants H1,H2, e.g. 256,128\n");
            else
                o->h1 = h1, o->h2 = h2;
        } else if (!strcmp(a, "--data")) {
            o->data_dir = v;
        } else if (!strcmp(a, "--start-method")) {
            o->start_method = v;
        } else if (!strcmp(a, "--lr")) {
            rc = parse_float(a, v, &o->lr);
        } else if (!strcmp(a, "--momentum")) {
            rc = parse_float(a, v, &o->momentum);
        } else if (!strcmp(a, "--seed")) {
            rc = parse_long(a, v, 0, 1L << 62, &n);
            o->seed = (uint64_t)n;
        } else if (!strcmp(a, "--limit")) {
            rc = parse_long(a, v, 0, 1L << 40, &n);
            o->limit = n;
        } else {
            static const struct {
                const char *flag;
                long lo, hi;
            } ints[] = {
                {"--epochs", 1, 10000},
                {"--batch", 1, 65536},
                {"--workers", 1, TRAIN_MAX_WORKERS},
                {"--every", 1, 1 << 30},
                {"--fail-rank", 0, TRAIN_MAX_WORKERS - 1},
            };
            int k = 0, nk = (int)(sizeof ints / sizeof ints[0]);
            while (k < nk && strcmp(a, ints[k].flag))
                k++;
            if (k == nk) {
                fprintf(stderr, "hogwild: unknown flag '%s' (try --help)\n", a);
                return -1;
            }
            rc = parse_long(a, v, ints[k].lo, ints[k].hi, &n);
            int *dst[] = {&o->epochs, &o->batch, &o->workers, &o->every, &o->fail_rank};
            *dst[k] = (int)n;
        }
        if (rc != 0)
            return -1;
    }
    return 0;
}

static void summary(const char *label, const train_options *o, const train_result *r)
{
    char ranks[32] = "";
    if (o->shards > 1) /* --backend mpi */
        snprintf(ranks, sizeof ranks, "%d ranks x ", o->shards);
    /* Two lines, each within 80 columns (with 3 digits of ranks and workers). */
    printf("%-9s %s%d worker%s, %s, %d epochs, test accuracy %.4f\n", label, ranks, o->workers,
           o->workers == 1 ? "" : "s", o->sync == TRAIN_SHARED ? "Hogwild shared" : "periodic",
           r->epochs, r->test_accuracy);
    printf("%-9s wall %.1f s (training %.1f s), %.0f samples/s\n", "", r->wall_s, r->train_s,
           r->samples_per_s);
    if (o->workers == 1 && o->shards == 1) /* what --seed reproduces */
        printf("%-9s parameters fnv1a %016llx (seed %llu)\n", "", (unsigned long long)r->param_hash,
               (unsigned long long)o->seed);
}

/* --compare: the N-worker and the 1-worker training take their epochs in
 * turn, so both see the same load on a shared machine. */
static int compare(train_options *o, const dataset *d)
{
    train_options o1 = *o;
    train_state *a = NULL, *b = NULL;
    train_result ra, rb;
    char label[32];
    int rc;
    snprintf(label, sizeof label, "%d worker%s: ", o->workers, o->workers == 1 ? "" : "s");
    o->label = label;
    o1.workers = 1;
    o1.label = "1 worker:  ";
    printf("--compare: each epoch with %d workers, then with 1 worker\n", o->workers);
    rc = train_start(o, d, &a);
    if (rc == 0)
        rc = train_start(&o1, d, &b);
    for (int e = 0; e < o->epochs && rc == 0; e++) {
        rc = train_epoch(a, e);
        if (rc == 0)
            rc = train_epoch(b, e);
    }
    train_finish(a, &ra);
    train_finish(b, &rb);
    if (rc != 0)
        return rc;
    printf("\n");
    summary("summary:", o, &ra);
    summary("compare:", &o1, &rb);
    printf("speedup:  %.2fx the samples/s of 1 worker\n", ra.samples_per_s / rb.samples_per_s);
    return 0;
}

int main(int argc, char **argv)
{
    train_options o;
    train_result res;
    dataset d;
    char err[1024];
    bool mpi = false, root = true;
    int rc;
    if ((rc = mp_setup(&argc, &argv)) != 0) {
        fprintf(stderr, "hogwild: mp_setup: %s\n", mp_last_error());
        return 1;
    }
    train_options_init(&o);
    if ((rc = parse_args(argc, argv, &o, &mpi)) != 0)
        return rc > 0 ? 0 : 2;
    if (dataset_load(o.data_dir, &d, err, sizeof err) != 0) {
        fprintf(stderr, "hogwild: %s\n", err);
        return 1;
    }
    if (!mpi) /* under MPI rank 0 says it, once */
        printf("hogwild: MLP 784-%d-%d-10 on Fashion-MNIST (%lld train, %lld test)\n"
               "         %d worker%s, sync %s, start method %s\n",
               o.h1, o.h2, (long long)(o.limit ? o.limit : d.n_train), (long long)d.n_test,
               o.workers, o.workers == 1 ? "" : "s", o.sync == TRAIN_SHARED ? "shared" : "periodic",
               o.start_method ? o.start_method : mp_get_start_method());
    if (mpi && (o.compare || o.sync != TRAIN_SHARED)) {
        fprintf(stderr, "hogwild: --backend mpi trains with --sync shared, without --compare\n");
        rc = MP_EINVAL;
    } else if (mpi) {
        rc = mpi_backend_run(&argc, &argv, &o, &d, &res, &root);
        if (rc == 0 && root) {
            printf("\n");
            summary("summary:", &o, &res);
        }
    } else if (!o.compare) {
        rc = train_run(&o, &d, &res);
        if (rc == 0) {
            printf("\n");
            summary("summary:", &o, &res);
        }
    } else {
        rc = compare(&o, &d);
    }
    dataset_free(&d);
    return rc == 0 ? 0 : 1;
}
