/* cuda_probe: a CPU-only program linked with the shared libmproc, for the
 * tests that run it where the CUDA libraries cannot be found
 * (tests/cuda/hidden_cudart.sh). It must start, move a shared tensor through
 * a queue, and get MP_ENOTSUP, with a sentence containing argv[1] (the
 * library looked for), from a CUDA call. Exits 0 when all of that holds. */
#include <stdio.h>
#include <string.h>

#include <mproc.h>

static int cpu_work(void)
{
    int64_t shape[1] = {1024};
    mp_tensor *t = NULL, *back = NULL;
    mp_queue *q = NULL;
    int rc = mp_tensor_empty(MP_FLOAT32, 1, shape, &t);
    if (rc == 0 && (rc = mp_tensor_share_memory_(t)) == 0) {
        float *v = mp_tensor_data(t);
        for (int i = 0; i < 1024; i++)
            v[i] = (float)i;
        if ((rc = mp_queue_create(1, &q)) == 0 && (rc = mp_queue_put_tensor(q, t, 10)) == 0)
            rc = mp_queue_get_tensor(q, &back, 10);
    }
    if (rc == 0 && ((float *)mp_tensor_data(back))[1023] != 1023.0f)
        rc = -1;
    if (rc != 0)
        fprintf(stderr, "cuda_probe: CPU work failed: %s\n", mp_last_error());
    mp_tensor_release(back);
    mp_tensor_release(t);
    mp_queue_release(q);
    return rc;
}

int main(int argc, char **argv)
{
    int n = -1;
    if (argc != 2) {
        fprintf(stderr, "usage: cuda_probe <text the MP_ENOTSUP sentence must contain>\n");
        return 2;
    }
    const char *want = argv[1];
    if (mp_setup(&argc, &argv) != 0 || cpu_work() != 0)
        return 1;
    int rc = mp_cuda_device_count(&n);
    if (rc != MP_ENOTSUP || !strstr(mp_last_error(), want)) {
        fprintf(stderr, "cuda_probe: mp_cuda_device_count -> %s (%d devices): \"%s\"; wanted "
                        "MP_ENOTSUP naming %s\n", mp_err_name(rc), n, mp_last_error(), want);
        return 1;
    }
    printf("cuda_probe: CPU work done; mp_cuda_device_count: %s\n", mp_last_error());
    return 0;
}
