#include "mpi_check.h"

#include <stdlib.h>
#include <string.h>

int rank, size;

bool same_host(int r)
{
    const char *there = NULL, *here = NULL;
    OK(mp_mpi_rank_info(r, &there, NULL));
    OK(mp_mpi_rank_info(rank, &here, NULL));
    return !strcmp(there, here);
}

bool local_to(int r)
{
    const char *env = getenv("MPROC_MPI_LOCAL");
    return !(env && !strcmp(env, "0")) && same_host(r);
}

int mpi_suite_main(const char *suite, int argc, char **argv,
                   void (*before_spawn)(const char *entry))
{
    char entry[64];
    mp_mpi_error e = {.size = sizeof e};
    if (mp_setup(&argc, &argv) != 0 || argc < 2) {
        fprintf(stderr, "usage: %s CASE (under mpirun)\n", suite);
        return 2;
    }
    if (mp_mpi_init(&argc, &argv) != 0) {
        fprintf(stderr, "mp_mpi_init: %s\n", mp_last_error());
        return 2;
    }
    rank = mp_mpi_rank(), size = mp_mpi_size();
    snprintf(entry, sizeof entry, "case_%s", argv[1]);
    if (before_spawn)
        before_spawn(entry);
    double t0 = MPI_Wtime();
    int rc = mp_mpi_spawn(entry, NULL, &e);
    if (rc != 0) {
        if (rank == 0)
            fprintf(stderr, "rank 0: job failed after %.2f s: rank %d (pid %d on %s) exit %d "
                            "signal %d: %s\n", MPI_Wtime() - t0, e.rank, (int)e.pid, e.host,
                    e.exitcode, e.signal, e.message);
        CHECK(mp_mpi_finalize() == MP_ECHILD, "finalize after a failure");
        return 1; /* mpirun ends the job */
    }
    if (rank == 0)
        printf("%s %s: ok on %d ranks in %.2f s\n", suite, argv[1], size, MPI_Wtime() - t0);
    mp_mpi_finalize();
    return 0;
}
