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
int mp_mpi_pool_create(mp_mpi_pool **out) { return off("mp_mpi_pool_create"); }
int mp_mpi_pool_size(const mp_mpi_pool *p) { return off("mp_mpi_pool_size"); }
int mp_mpi_pool_apply_async(mp_mpi_pool *p, const char *task, const mp_msg *in,
                            mp_mpi_result **res)
{
    return off("mp_mpi_pool_apply_async");
}
int mp_mpi_pool_apply(mp_mpi_pool *p, const char *task, const mp_msg *in, mp_msg **out)
{
    return off("mp_mpi_pool_apply");
}
int mp_mpi_pool_map(mp_mpi_pool *p, const char *task, const mp_msg *const *in, size_t n,
                    mp_msg **out)
{
    return off("mp_mpi_pool_map");
}
int mp_mpi_result_wait(mp_mpi_result *r, mp_mpi_pool *p, double timeout)
{
    return off("mp_mpi_result_wait");
}
int mp_mpi_result_get(mp_mpi_result *r, mp_mpi_pool *p, double timeout, mp_msg **out)
{
    return off("mp_mpi_result_get");
}
const char *mp_mpi_result_error(const mp_mpi_result *r) { return ""; }
void mp_mpi_result_release(mp_mpi_result *r) {}
void mp_mpi_pool_destroy(mp_mpi_pool *p) {}
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
int mp_mpi_pool_map_async(mp_mpi_pool *p, const char *task, const mp_msg *const *in, size_t n,
                          mp_mpi_result **res)
{
    return off("mp_mpi_pool_map_async");
}
int mp_mpi_pool_starmap(mp_mpi_pool *p, const char *task, const mp_msg *const *args, size_t n,
                        size_t nargs, mp_msg **out)
{
    return off("mp_mpi_pool_starmap");
}
int mp_mpi_pool_starmap_async(mp_mpi_pool *p, const char *task, const mp_msg *const *args,
                              size_t n, size_t nargs, mp_mpi_result **res)
{
    return off("mp_mpi_pool_starmap_async");
}
size_t mp_mpi_result_count(const mp_mpi_result *r) { return 0; }
bool mp_mpi_result_ready(mp_mpi_result *r) { return false; }
int mp_mpi_result_item(mp_mpi_result *r, size_t i, mp_msg **out)
{
    return off("mp_mpi_result_item");
}
int mp_mpi_pool_imap(mp_mpi_pool *p, const char *task, const mp_msg *const *in, size_t n,
                     mp_mpi_imap **it)
{
    return off("mp_mpi_pool_imap");
}
int mp_mpi_pool_imap_unordered(mp_mpi_pool *p, const char *task, const mp_msg *const *in,
                               size_t n, mp_mpi_imap **it)
{
    return off("mp_mpi_pool_imap_unordered");
}
int mp_mpi_imap_next(mp_mpi_imap *it, double timeout, mp_msg **out, size_t *index)
{
    return off("mp_mpi_imap_next");
}
void mp_mpi_imap_destroy(mp_mpi_imap *it) {}
int mp_mpi_pool_map_array(mp_mpi_pool *p, const char *task, const void *in, size_t n,
                          size_t in_size, void *out, size_t out_size, size_t chunksize)
{
    return off("mp_mpi_pool_map_array");
}
int mp_mpi_pool_map_array_async(mp_mpi_pool *p, const char *task, const void *in, size_t n,
                                size_t in_size, void *out, size_t out_size, size_t chunksize,
                                mp_mpi_result **res)
{
    return off("mp_mpi_pool_map_array_async");
}
