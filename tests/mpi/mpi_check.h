/* What the MPI test programs share: checks that end the whole job with
 * their text, and the main that runs one case on every rank. */
#ifndef MPROC_TESTS_MPI_CHECK_H
#define MPROC_TESTS_MPI_CHECK_H

#include <stdbool.h>
#include <stdio.h>

#include <mpi.h>
#include <mproc.h>
#include <mproc/mpi.h>

/* This rank and the job's size, set by mpi_suite_main before the case runs. */
extern int rank, size;

#define CHECK(cond, ...)                                                                 \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", rank, __FILE__,        \
                    __LINE__, #cond);                                                    \
            fprintf(stderr, __VA_ARGS__);                                                \
            fprintf(stderr, " (last mproc error, maybe older: %s)\n", mp_last_error());   \
            MPI_Abort(MPI_COMM_WORLD, 2);                                                \
        }                                                                                \
    } while (0)
#define OK(expr) CHECK((expr) == 0, "%s", #expr)

/* Whether rank r runs on this rank's host (by name: tests/mpi/hosts.sh
 * runs ranks on hosts of their own). */
bool same_host(int r);
/* Whether this rank reaches rank r by mproc's same-host path: r is on
 * this host and MPROC_MPI_LOCAL=0 did not turn the path off. */
bool local_to(int r);

/* `suite CASE` under mpirun: runs the entry "case_CASE" on every rank with
 * mp_mpi_spawn; rank 0 prints "SUITE CASE: ok on N ranks" or the failing
 * rank's record. before_spawn (may be NULL) runs on every rank first. */
int mpi_suite_main(const char *suite, int argc, char **argv,
                   void (*before_spawn)(const char *entry));

#endif
