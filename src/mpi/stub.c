/* libmproc_mpi built without MPI: every call fails with MP_ENOTSUP and says
 * how to get the real layer. Only this file is compiled then. */
#include "mproc/mpi.h"
#include "os/os.h"

#include <stddef.h>

#define HOW "mproc was built without MPI; install Open MPI (apt-get install libopenmpi-dev " \
            "openmpi-bin) and rebuild with cmake -DMPROC_MPI=ON"

static int off(const char *fn)
{
    return mp__error(MP_ENOTSUP, "%s: %s", fn, HOW);
}

int mp_mpi_init(int *argc, char ***argv) { return off("mp_mpi_init"); }
int mp_mpi_finalize(void) { return 0; }
int mp_mpi_rank(void) { return off("mp_mpi_rank"); }
int mp_mpi_size(void) { return off("mp_mpi_size"); }
int mp_mpi_local_rank(void) { return off("mp_mpi_local_rank"); }
int mp_mpi_local_size(void) { return off("mp_mpi_local_size"); }
int mp_mpi_rank_info(int rank, const char **host, pid_t *pid) { return off("mp_mpi_rank_info"); }
int mp_mpi_is_local(int rank) { return off("mp_mpi_is_local"); }
int mp_mpi_spawn(const char *entry, mp_msg *args, mp_mpi_error *err)
{
    return off("mp_mpi_spawn");
}
int mp_mpi_failure(mp_mpi_error *err) { return off("mp_mpi_failure"); }
int mp_mpi_pipe(int peer, mp_conn **out)
{
    if (out)
        *out = NULL;
    return off("mp_mpi_pipe");
}
int mp_mpi_conn_is_local(const mp_conn *c) { return off("mp_mpi_conn_is_local"); }
int mp_mpi_allreduce_tensor(mp_tensor *t, mp_mpi_op op) { return off("mp_mpi_allreduce_tensor"); }
int mp_mpi_barrier(void) { return off("mp_mpi_barrier"); }
int mp_mpi_pool_create(mp_pool **out)
{
    if (out)
        *out = NULL;
    return off("mp_mpi_pool_create");
}
int mp_mpi_queue_create(int home, mp_queue **out)
{
    if (out)
        *out = NULL;
    return off("mp_mpi_queue_create");
}
int mp_mpi_joinable_queue_create(int home, mp_queue **out)
{
    if (out)
        *out = NULL;
    return off("mp_mpi_joinable_queue_create");
}
int mp_mpi_queue_is_local(const mp_queue *q) { return off("mp_mpi_queue_is_local"); }
int mp_mpi_queue_put_ahead(mp_queue *q, int window) { return off("mp_mpi_queue_put_ahead"); }
int mp_mpi_queue_flush(mp_queue *q, double timeout) { return off("mp_mpi_queue_flush"); }
