/* Loading the CUDA runtime at run time (src/cuda/cudart.c): MPROC_CUDART
 * naming a library that does not exist, a library that is not a CUDA runtime
 * (lacks the symbols), the fake runtime, an empty value, and the default
 * name. The load happens once per process, so each case runs in a child
 * forked from this process, which never loads CUDA itself. Without a CUDA
 * runtime every public CUDA call must return MP_ENOTSUP with a sentence
 * naming the call, the library looked for and MPROC_CUDART. */
#include "mp_test.h"

#include <stdio.h>

#ifdef MPROC_HAVE_CUDA
#include "cuda/gpu.h"
#include "cuda_helpers.h"

#include <fcntl.h>
#include <string.h>
#include <sys/wait.h>

/* Exits the child with 100 (CHECK) on a wrong code or sentence. */
static void check_enotsup(int rc, const char *call, const char *lib, const char *also)
{
    const char *why = mp_last_error();
    if (rc != MP_ENOTSUP || !strstr(why, call) || !strstr(why, lib) ||
        !strstr(why, "MPROC_CUDART") || (also && !strstr(why, also))) {
        fprintf(stderr, "child: %s -> %s: \"%s\" (wanted MP_ENOTSUP naming %s, %s%s%s)\n",
                call, mp_err_name(rc), why, call, lib, also ? " and " : "", also ? also : "");
        _exit(100);
    }
}

/* Every public CUDA call in a process whose runtime could not be loaded. */
static void all_enotsup(const char *lib, const char *also)
{
    int n = 5;
    size_t z = 5;
    int64_t shape[1] = {4};
    mp_tensor *h = NULL, *t = (mp_tensor *)&n;
    mp_msg *m = NULL;
    CHECK(mp_tensor_empty(MP_FLOAT32, 1, shape, &h) == 0 && mp_msg_create(&m) == 0);
    CHECK(!mp_cuda_is_available());
    check_enotsup(mp_cuda_device_count(&n), "mp_cuda_device_count", lib, also);
    CHECK(n == 0);
    check_enotsup(mp_cuda_synchronize(0), "mp_cuda_synchronize", lib, also);
    check_enotsup(mp_tensor_empty_cuda(0, MP_FLOAT32, 1, shape, &t), "mp_tensor_empty_cuda",
                  lib, also);
    CHECK(t == NULL);
    check_enotsup(mp_tensor_to_cuda(h, 0, &t), "mp_tensor_to_cuda", lib, also);
    check_enotsup(mp_tensor_to_cpu(h, &t), "mp_tensor_to_cpu", lib, also);
    check_enotsup(mp_tensor_copy_cuda_(h, h), "mp_tensor_copy_cuda_", lib, also);
    check_enotsup(mp_msg_add_cuda_tensor(m, "t", h), "mp_msg_add_cuda_tensor", lib, also);
    check_enotsup(mp_msg_get_cuda_tensor(m, 0, &t), "mp_msg_get_cuda_tensor", lib, also);
    check_enotsup(mp_cuda_ipc_collect(&z), "mp_cuda_ipc_collect", lib, also);
    CHECK(z == 0);
    check_enotsup(mp_cuda_ipc_pending(&z), "mp_cuda_ipc_pending", lib, also);
    check_enotsup(mp_tensor_cuda_share_count(h, &n), "mp_tensor_cuda_share_count", lib, also);
    /* A CUDA attachment arriving here: refused, its fd closed. */
    const mp__objkind *k = &mp__cuda_tensor_kind;
    int fds[1] = {open("/dev/null", O_RDONLY | O_CLOEXEC)};
    void *obj = NULL;
    check_enotsup(k->decode("junk", 4, fds, 1, &obj), "receiving a CUDA tensor", lib, also);
    CHECK(obj == NULL && fcntl(fds[0], F_GETFD) == -1);
    CHECK(!mp__cuda_initialized());
    mp_msg_destroy(m);
    mp_tensor_release(h);
}

/* Runs fn in a child with MPROC_CUDART = value (NULL: unset). */
static void in_child(const char *value, void (*fn)(const char *), const char *arg)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (value)
            setenv("MPROC_CUDART", value, 1);
        else
            unsetenv("MPROC_CUDART");
        fn(arg);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("child for MPROC_CUDART=%s: status %#x", value ? value : "(unset)", status);
}

static void missing(const char *lib) { all_enotsup(lib, "could not be loaded"); }

static void test_missing_library(void **state)
{
    in_child("/nonexistent/libcudart.so.13", missing, "/nonexistent/libcudart.so.13");
}

static void not_cudart(const char *lib) { all_enotsup(lib, "has no cudaGetDeviceCount"); }

/* A real shared library, but no CUDA runtime: the first missing symbol is
 * named, and nothing of it is used. */
static void test_not_a_cuda_runtime(void **state)
{
    in_child("libm.so.6", not_cudart, "libm.so.6");
}

static void fake_loads(const char *path)
{
    int n = 0;
    CHECK(mp_cuda_device_count(&n) == 0 && n == 2);
    CHECK(strcmp(mp__cuda_library(), path) == 0);
    CHECK(mp_cuda_is_available() && mp__cuda_initialized());
}

static void test_fake_runtime(void **state)
{
    in_child(MP_FAKE_CUDART, fake_loads, MP_FAKE_CUDART);
}

/* Unset or empty: libcudart.so.<major of the headers>; whether it loads
 * depends on this machine, but a failure names it. */
static void default_name(const char *want)
{
    int n = 0;
    CHECK(strcmp(mp__cuda_library(), want) == 0);
    if (mp__cuda_load("probe") < 0)
        all_enotsup(want, NULL);
    else
        CHECK(mp_cuda_device_count(&n) != MP_ENOTSUP);
}

static void test_default_name(void **state)
{
    char want[32];
    snprintf(want, sizeof want, "libcudart.so.%d", CUDART_VERSION / 1000);
    in_child(NULL, default_name, want);
    in_child("", default_name, want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_missing_library, mp_test_setup, mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_not_a_cuda_runtime, mp_test_setup,
                                        mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_fake_runtime, mp_test_setup, mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_default_name, mp_test_setup, mp_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void)
{
    printf("skipped: built without the CUDA headers, so there is no runtime loader to test\n");
    return 77;
}
#endif
