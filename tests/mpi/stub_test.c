/* The layer built without MPI (src/mpi/stub.c, what -DMPROC_MPI=OFF
 * builds, linked here beside the real one): every constructor of a
 * cross-rank object fails with MP_ENOTSUP, leaves *out NULL and says how to
 * enable MPI; so do the job's calls. */
#include <stdio.h>
#include <string.h>

#include <mproc.h>
#include <mproc/mpi.h>

static int failures;

static void check(const char *call, int rc, const void *out)
{
    const char *why = mp_last_error();
    if (rc != MP_ENOTSUP || out != NULL || !strstr(why, call) ||
        !strstr(why, "-DMPROC_MPI=ON")) {
        fprintf(stderr, "%s: %s, out %p, \"%s\"; want MP_ENOTSUP, NULL and how to enable "
                        "MPI\n", call, mp_err_name(rc), out, why);
        failures++;
    }
}

int main(void)
{
    static int dummy;
    mp_queue *q = (mp_queue *)&dummy, *jq = (mp_queue *)&dummy;
    mp_conn *c = (mp_conn *)&dummy;
    mp_pool *p = (mp_pool *)&dummy;
    int rc = mp_mpi_queue_create(0, &q);
    check("mp_mpi_queue_create", rc, q);
    rc = mp_mpi_joinable_queue_create(0, &jq);
    check("mp_mpi_joinable_queue_create", rc, jq);
    rc = mp_mpi_pipe(1, &c);
    check("mp_mpi_pipe", rc, c);
    rc = mp_mpi_pool_create(&p);
    check("mp_mpi_pool_create", rc, p);
    check("mp_mpi_init", mp_mpi_init(NULL, NULL), NULL);
    check("mp_mpi_queue_is_local", mp_mpi_queue_is_local(NULL), NULL);
    check("mp_mpi_conn_is_local", mp_mpi_conn_is_local(NULL), NULL);
    check("mp_mpi_queue_put_ahead", mp_mpi_queue_put_ahead(NULL, 8), NULL);
    check("mp_mpi_queue_flush", mp_mpi_queue_flush(NULL, 0), NULL);
    if (failures == 0)
        printf("stub: every constructor is MP_ENOTSUP\n");
    return failures ? 1 : 0;
}
