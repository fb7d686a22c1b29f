/* hogwild --backend mpi: one training per MPI rank, parameters averaged
 * across ranks (mpi_backend.c). */
#ifndef HOGWILD_MPI_BACKEND_H
#define HOGWILD_MPI_BACKEND_H

#include "data.h"
#include "train.h"

/* Initializes the MPI layer (argc/argv as mp_mpi_init takes them), sets o's
 * shard and average hook, trains inside mp_mpi_spawn and finalizes. On rank
 * 0 *r gets the figures and *is_root is set. Returns 0, MP_ENOTSUP without
 * MPI (the sentence says how to build it), or MP_ECHILD after rank 0 printed
 * the failed rank's record (then the job ends non-zero). */
int mpi_backend_run(int *argc, char ***argv, train_options *o, const dataset *d,
                    train_result *r, bool *is_root);

#endif
