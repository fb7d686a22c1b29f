/* hogwild --backend mpi: every MPI rank runs the usual Hogwild training
 * (its --workers processes share its parameters in shared memory) on its
 * own slice of each epoch, and the ranks average their parameters with
 * mp_mpi_allreduce_tensor every --every steps and at the end of each
 * epoch, so every rank evaluates the same model. */
#include "mpi_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mproc.h>
#include <mproc/mpi.h>

static struct {
    train_options *o;
    const dataset *d;
    train_result *res;
    float *own;      /* this rank's parameters when the exchange began */
    mp_tensor *mean; /* the same, then their mean over the ranks */
} job;

/* Parameter averaging across ranks. The workers keep stepping while the
 * ranks exchange (a rank may wait in the allreduce for a slower one), so
 * writing the mean over params would drop every update made meanwhile;
 * instead params moves by (mean - own snapshot), which keeps them. After an
 * epoch's join nothing moves and every rank holds the mean exactly.
 * (Overwriting cost 2 points of test accuracy on 2 ranks x 2 workers;
 * docs/mpi.md has the figures.) */
static int average(mp_tensor *params, void *ctx)
{
    int64_t n = mp_tensor_numel(params);
    float *p = mp_tensor_data(params), *m;
    int rc;
    if (!job.own) {
        job.own = malloc((size_t)n * sizeof *job.own);
        if (!job.own || mp_tensor_empty(MP_FLOAT32, 1, &n, &job.mean) != 0)
            return MP_ENOMEM;
    }
    m = mp_tensor_data(job.mean);
    memcpy(job.own, p, (size_t)n * sizeof *p);
    memcpy(m, job.own, (size_t)n * sizeof *p);
    rc = mp_mpi_allreduce_tensor(job.mean, MP_MPI_MEAN);
    if (rc != 0) {
        fprintf(stderr, "hogwild: rank %d: averaging the parameters: %s\n", mp_mpi_rank(),
                mp_last_error());
        return rc;
    }
    for (int64_t k = 0; k < n; k++)
        p[k] += m[k] - job.own[k];
    return 0;
}

MP_ENTRY(hogwild_rank)
{
    return train_run(job.o, job.d, job.res);
}

int mpi_backend_run(int *argc, char ***argv, train_options *o, const dataset *d,
                    train_result *r, bool *is_root)
{
    mp_mpi_error e = {.size = sizeof e};
    int rc = mp_mpi_init(argc, argv);
    *is_root = true;
    if (rc != 0) {
        fprintf(stderr, "hogwild: --backend mpi: %s\n", mp_last_error());
        return rc;
    }
    *is_root = mp_mpi_rank() == 0;
    o->shards = mp_mpi_size();
    o->shard = mp_mpi_rank();
    o->average = average;
    if (!*is_root)
        o->output = OUT_QUIET;
    job.o = o, job.d = d, job.res = r;
    if (*is_root)
        printf("hogwild: MLP 784-%d-%d-10 on Fashion-MNIST, --backend mpi\n"
               "         %d ranks x %d workers (Hogwild within a rank); parameters averaged\n"
               "         across ranks every %d steps and at each epoch's end\n",
               o->h1, o->h2, o->shards, o->workers, o->every);
    fflush(stdout);
    rc = mp_mpi_spawn("hogwild_rank", NULL, &e);
    if (rc != 0 && *is_root)
        fprintf(stderr, "hogwild: rank %d (pid %d on %s) failed, exit code %d, signal %d: %s\n",
                e.rank, (int)e.pid, e.host, e.exitcode, e.signal, e.message);
    free(job.own);
    mp_tensor_release(job.mean);
    mp_mpi_finalize(); /* after a failure: MP_ECHILD; our non-zero exit ends the job */
    return rc;
}
