/* cuda_share: a CUDA tensor shared with a spawned child, which adds 1 to it
 * in place; the parent then sees the new values. Nothing is copied between
 * the processes: the child maps the parent's device memory through CUDA IPC,
 * and the parent's allocation stays alive until the child has released it.
 *
 *   build/cuda_share     (without a usable GPU: prints "skipped: no CUDA device
 *                        (why)" and exits 77)
 *
 * The CUDA runtime does not survive fork, so the child is started with the
 * spawn method (forkserver works too). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <mproc.h>

enum { ROWS = 4, COLS = 8 };

/* The child: gets the tensor, adds 1 to every element on the device's
 * memory (a host round trip keeps this example free of kernels). */
MP_ENTRY(add_one)
{
    mp_tensor *t = NULL, *host = NULL;
    if (mp_msg_get_cuda_tensor(args, 0, &t) != 0 || mp_tensor_to_cpu(t, &host) != 0)
        mp_raise("child: %s", mp_last_error());
    float *v = mp_tensor_data(host);
    for (int64_t i = 0; i < mp_tensor_numel(host); i++)
        v[i] += 1;
    if (mp_tensor_copy_cuda_(t, host) != 0)
        mp_raise("child: copy back: %s", mp_last_error());
    printf("child %d: added 1 to a %lldx%lld tensor on cuda:%d\n", (int)getpid(),
           (long long)mp_tensor_size(t, 0), (long long)mp_tensor_size(t, 1),
           (int)mp_tensor_device(t).device_id);
    mp_tensor_release(host);
    mp_tensor_release(t); /* the parent may free it from now on */
    return 0;
}

static int fail(const char *what)
{
    fprintf(stderr, "cuda_share: %s: %s\n", what, mp_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    int64_t shape[2] = {ROWS, COLS};
    mp_tensor *host = NULL, *dev = NULL, *back = NULL;
    mp_process *child = NULL;
    mp_process_options opts;
    mp_msg *args = NULL;
    int n = 0, code = -1, rc;

    if (mp_setup(&argc, &argv) != 0)
        return fail("mp_setup");
    if ((rc = mp_cuda_device_count(&n)) != 0 || n == 0) {
        printf("skipped: no CUDA device (%s)\n", rc != 0 ? mp_last_error() : "0 devices visible");
        return 77; /* the "skipped" code of CTest and automake */
    }
    if (mp_tensor_empty(MP_FLOAT32, 2, shape, &host) != 0)
        return fail("mp_tensor_empty");
    for (int i = 0; i < ROWS * COLS; i++)
        ((float *)mp_tensor_data(host))[i] = (float)i;
    if (mp_tensor_to_cuda(host, 0, &dev) != 0)
        return fail("mp_tensor_to_cuda");

    mp_process_options_init(&opts);
    opts.start_method = "spawn";
    if (mp_msg_create(&args) != 0 || mp_msg_add_cuda_tensor(args, "t", dev) != 0 ||
        mp_process_create("add_one", args, &opts, &child) != 0 ||
        mp_process_start(child) != 0)
        return fail("starting the child");
    mp_msg_destroy(args);
    if (mp_process_join(child, 60) != 0) {
        /* Still running (or not ours to wait for): it must not outlive us. */
        fprintf(stderr, "cuda_share: waiting for the child: %s\n", mp_last_error());
        mp_process_kill(child);
        mp_process_join(child, -1);
        mp_process_destroy(child);
        return 1;
    }
    if (mp_process_exitcode(child, &code) != 0 || code != 0) {
        mp_child_error e = {.size = sizeof e};
        const char *why = mp_process_error(child, &e) == 0 ? e.message : mp_last_error();
        fprintf(stderr, "cuda_share: child failed (exit %d): %s\n", code, why);
        return 1;
    }
    mp_process_destroy(child);

    if (mp_tensor_to_cpu(dev, &back) != 0)
        return fail("mp_tensor_to_cpu");
    for (int i = 0; i < ROWS * COLS; i++) {
        if (((float *)mp_tensor_data(back))[i] != (float)i + 1) {
            fprintf(stderr, "cuda_share: element %d is %g, expected %d\n", i,
                    ((float *)mp_tensor_data(back))[i], i + 1);
            return 1;
        }
    }
    printf("parent: the child's +1 is visible in place (element 0 = %g, last = %g)\n",
           ((float *)mp_tensor_data(back))[0], ((float *)mp_tensor_data(back))[ROWS * COLS - 1]);
    mp_tensor_release(back);
    mp_tensor_release(dev);
    mp_tensor_release(host);
    size_t pending = 0;
    mp_cuda_ipc_pending(&pending);
    printf("parent: %zu allocation(s) waiting for consumers\n", pending);
    return pending == 0 ? 0 : 1;
}
