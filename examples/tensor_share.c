/* tensor_share: a tensor created in one process, moved into shared memory,
 * modified by a forked child and read back by the parent, under each
 * sharing strategy. Exits 0 when the parent sees every change.
 *
 *   build/tensor_share
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mproc.h"

static void print_row(const char *who, const mp_tensor *t)
{
    const float *p = mp_tensor_data(t);
    printf("  %-7s [", who);
    for (int64_t i = 0; i < mp_tensor_numel(t); i++)
        printf("%s%g", i ? ", " : "", p[i]);
    printf("]\n");
}

static int run(const char *strategy)
{
    int64_t shape[2] = {2, 3};
    mp_tensor *t = NULL, *row = NULL;
    int rc, status;
    pid_t pid;

    printf("strategy %s\n", strategy);
    if ((rc = mp_set_sharing_strategy(strategy)) < 0 ||
        (rc = mp_tensor_empty(MP_FLOAT32, 2, shape, &t)) < 0)
        goto out;
    for (int i = 0; i < 6; i++)
        ((float *)mp_tensor_data(t))[i] = (float)i;
    /* a view made before the move follows the storage into shared memory */
    if ((rc = mp_tensor_select(t, 0, 1, &row)) < 0)
        goto out;
    print_row("created", t);

    if ((rc = mp_tensor_share_memory_(t)) < 0)
        goto out;
    printf("  shared: %s (%s), view shared too: %s\n", mp_tensor_is_shared(t) ? "yes" : "no",
           mp_tensor_sharing_strategy(t), mp_tensor_is_shared(row) ? "yes" : "no");

    fflush(stdout);
    pid = fork();
    if (pid < 0) {
        perror("fork");
        rc = MP_ESYS;
        goto out;
    }
    if (pid == 0) { /* the child writes through its inherited view */
        float *p = mp_tensor_data(row);
        for (int i = 0; i < 3; i++)
            p[i] *= 100.0f;
        print_row("child", t);
        fflush(stdout);
        _exit(0);
    }
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "tensor_share: child failed\n");
        rc = MP_ECHILD;
        goto out;
    }
    print_row("parent", t);
    for (int i = 0; i < 6; i++) {
        float want = i < 3 ? (float)i : (float)i * 100.0f;
        if (((float *)mp_tensor_data(t))[i] != want) {
            fprintf(stderr, "tensor_share: element %d is %g, expected %g\n", i,
                    ((float *)mp_tensor_data(t))[i], want);
            rc = MP_EPROTO;
            goto out;
        }
    }
    printf("  the parent sees the child's writes\n");
out:
    if (rc < 0)
        fprintf(stderr, "tensor_share: %s: %s\n", mp_err_name(rc), mp_last_error());
    mp_tensor_release(row);
    mp_tensor_release(t);
    return rc;
}

int main(void)
{
    const char *const *names = mp_get_all_sharing_strategies();
    printf("mproc %s: sharing a tensor with a forked child\n", mp_version());
    for (int i = 0; names[i]; i++)
        if (run(names[i]) < 0)
            return 1;
    printf("copies into shared memory: %llu (one per tensor shared)\n",
           (unsigned long long)mp_tensor_shared_copy_count());
    return 0;
}
