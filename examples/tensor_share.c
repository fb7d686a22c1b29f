/* tensor_share: a tensor created in one process, moved into shared memory,
 * modified by a child (an mproc process started with fork, which gets the
 * view in its argument message and dies with its parent) and read back by
 * the parent, under each sharing strategy. Exits 0 when the parent sees
 * every change, and mp_tensor_stats_get counts one copy into shared memory
 * per strategy and no segment left mapped at the end.
 *
 *   build/tensor_share
 */
#include <stdio.h>
#include <stdlib.h>

#include "mproc.h"

static void print_row(const char *who, const mp_tensor *t)
{
    const float *p = mp_tensor_data(t);
    printf("  %-7s [", who);
    for (int64_t i = 0; i < mp_tensor_numel(t); i++)
        printf("%s%g", i ? ", " : "", p[i]);
    printf("]\n");
}

/* The child writes through the view it was sent: the parent's shared pages. */
MP_ENTRY(share_child)
{
    mp_tensor *row = NULL, *t = NULL;
    float *p;
    if (mp_msg_find_tensor(args, "row", &row) != 0 || mp_msg_find_tensor(args, "t", &t) != 0)
        mp_raise("share_child: %s", mp_last_error());
    p = mp_tensor_data(row);
    for (int i = 0; i < 3; i++)
        p[i] *= 100.0f;
    print_row("child", t);
    mp_tensor_release(row);
    mp_tensor_release(t);
    return 0;
}

/* Runs share_child on t and its view row; 0 when it exited 0. */
static int run_child(mp_tensor *t, mp_tensor *row)
{
    mp_msg *args = NULL;
    mp_process *p = NULL;
    int code = -1;
    int rc = mp_msg_create(&args);
    if (!rc && !(rc = mp_msg_add_tensor(args, "t", t)) &&
        !(rc = mp_msg_add_tensor(args, "row", row)))
        rc = mp_process_create("share_child", args, NULL, &p);
    if (!rc)
        rc = mp_process_start(p);
    if (!rc)
        rc = mp_process_join(p, -1);
    if (!rc)
        rc = mp_process_exitcode(p, &code);
    if (!rc && code != 0) {
        fprintf(stderr, "tensor_share: the child exited with %d\n", code);
        rc = MP_ECHILD;
    }
    mp_process_destroy(p);
    mp_msg_destroy(args);
    return rc;
}

static int run(const char *strategy)
{
    int64_t shape[2] = {2, 3};
    mp_tensor *t = NULL, *row = NULL;
    int rc;

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

    if ((rc = run_child(t, row)) < 0)
        goto out;
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

int main(int argc, char **argv)
{
    const char *const *names;
    mp_tensor_stats st = {.size = sizeof st};
    int n = 0;
    if (mp_setup(&argc, &argv) != 0)
        return 1;
    names = mp_get_all_sharing_strategies();
    printf("mproc %s: sharing a tensor with a forked child\n", mp_version());
    for (; names[n]; n++)
        if (run(names[n]) < 0)
            return 1;
    if (mp_tensor_stats_get(&st) != 0)
        return 1;
    printf("copies into shared memory: %llu of %llu bytes (one per tensor shared)\n"
           "segments mapped now: %llu\n",
           (unsigned long long)st.shared_copies, (unsigned long long)st.shared_copy_bytes,
           (unsigned long long)st.segments_live);
    return st.shared_copies == (uint64_t)n && st.segments_live == 0 ? 0 : 1;
}
