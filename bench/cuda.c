/* bench_cuda: handoff latency of device tensors between two processes.
 *
 *   cuda_handoff_first   a new allocation each time: mproc's send (IPC handle,
 *                        event, shared count) + the receiver's decode (opens
 *                        the handle) + release + ack, beside the bare CUDA IPC
 *                        round trip (cudaMalloc + cudaMemset as mproc does,
 *                        cudaIpcGetMemHandle, 64 bytes over a socket,
 *                        cudaIpcOpenMemHandle, close, ack).
 *   cuda_handoff_repeat  the same allocation again while the receiver still
 *                        holds it (the handle cache hits: no open), beside a
 *                        SOCK_SEQPACKET ping-pong carrying one fd (SCM_RIGHTS).
 *
 * One JSON line per figure on stdout (median of several repetitions, us per
 * handoff); human text on stderr. Without a CUDA device it prints only a note
 * on stderr and exits 0. --quick: tiny counts (smoke test).
 * MPROC_BENCH_FAKE_CUDA=1 runs on the test suite's fake device (host memory):
 * it checks the benchmark itself, its figures say nothing about GPUs. */
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mproc.h"

#ifdef MPROC_HAVE_CUDA
#include "../tests/cuda/fake_device.h"
#include "cuda/gpu.h"
#include "wire/wire.h"

extern char **environ;

enum { MODE_MPROC_FIRST = 'f', MODE_MPROC_REPEAT = 'r', MODE_RAW_IPC = 'i', MODE_FD = 'p',
       MODE_STOP = 's' };

static int ack(int sock) { return mp__send_record(sock, "a", 1, NULL, 0, -1); }

static int wait_ack(int sock)
{
    char c;
    size_t len;
    int nfds;
    return mp__recv_record(sock, &c, 1, &len, NULL, 0, &nfds, mp__deadline(60));
}

/* The receiving process: one record per handoff, first byte = mode. */
static int consumer(int sock)
{
    const mp__objkind *k = mp__objkind_lookup(MP_ATTACH_CUDA_TENSOR);
    uint8_t buf[1024];
    mp_tensor *held = NULL;
    for (;;) {
        size_t len;
        int fds[4], nfds = 0;
        if (mp__recv_record(sock, buf, sizeof buf, &len, fds, 4, &nfds, -1) < 0 || len < 1)
            return 1;
        int mode = buf[0];
        if (mode == MODE_STOP) {
            mp_tensor_release(held);
            return 0;
        }
        if (mode == MODE_MPROC_FIRST || mode == MODE_MPROC_REPEAT) {
            mp_tensor *t = NULL;
            if (k->decode(buf + 1, len - 1, fds, nfds, (void **)&t) < 0)
                return 2;
            if (mode == MODE_MPROC_REPEAT && !held)
                held = t; /* keeps the mapping open: later ones hit the cache */
            else
                mp_tensor_release(t);
        } else if (mode == MODE_RAW_IPC) {
            cudaIpcMemHandle_t h;
            void *p = NULL;
            memcpy(&h, buf + 1, sizeof h);
            if (mp__cuda.IpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess)
                return 3;
            mp__cuda.IpcCloseMemHandle(p);
        } else if (mode == MODE_FD) {
            for (int i = 0; i < nfds; i++)
                close(fds[i]);
        }
        if (ack(sock) < 0)
            return 4;
    }
}

static int send_tensor(int sock, int mode, mp_tensor *t)
{
    const mp__objkind *k = mp__objkind_lookup(MP_ATTACH_CUDA_TENSOR);
    uint8_t buf[1024];
    size_t len;
    int fds[4], nfds = 0, rc;
    buf[0] = (uint8_t)mode;
    if ((rc = k->encode(t, buf + 1, sizeof buf - 1, &len, fds, 4, &nfds)) < 0)
        return rc;
    if ((rc = mp__send_record(sock, buf, len + 1, fds, nfds, -1)) < 0)
        return rc;
    return wait_ack(sock);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* us per handoff: new allocation each time through mproc. */
static int run_first(int sock, int iters, double *us)
{
    int64_t shape[1] = {1 << 18}; /* 1 MiB of float32 */
    double t0 = mp__now();
    for (int i = 0; i < iters; i++) {
        mp_tensor *t = NULL;
        int rc = mp_tensor_empty_cuda(0, MP_FLOAT32, 1, shape, &t);
        if (rc == 0)
            rc = send_tensor(sock, MODE_MPROC_FIRST, t);
        mp_tensor_release(t);
        if (rc < 0)
            return rc;
    }
    *us = (mp__now() - t0) * 1e6 / iters;
    return mp_cuda_ipc_collect(NULL);
}

/* The bare CUDA IPC round trip over the same socket, same allocation size. */
static int run_raw_ipc(int sock, int iters, double *us)
{
    uint8_t buf[1 + sizeof(cudaIpcMemHandle_t)];
    double t0 = mp__now();
    for (int i = 0; i < iters; i++) {
        void *p = NULL;
        cudaIpcMemHandle_t h;
        if (mp__cuda.Malloc(&p, (size_t)1 << 20) != cudaSuccess)
            return MP_ENOMEM;
        /* zeroed, as mp_tensor_empty_cuda's are: only the handoff differs */
        int ok = mp__cuda.Memset(p, 0, (size_t)1 << 20) == cudaSuccess &&
                 mp__cuda.IpcGetMemHandle(&h, p) == cudaSuccess;
        buf[0] = MODE_RAW_IPC;
        memcpy(buf + 1, &h, sizeof h);
        ok = ok && mp__send_record(sock, buf, sizeof buf, NULL, 0, -1) == 0 && wait_ack(sock) == 0;
        mp__cuda.Free(p);
        if (!ok)
            return MP_ESYS;
    }
    *us = (mp__now() - t0) * 1e6 / iters;
    return 0;
}

static int run_repeat(int sock, mp_tensor *t, int iters, double *us)
{
    double t0 = mp__now();
    for (int i = 0; i < iters; i++) {
        int rc = send_tensor(sock, MODE_MPROC_REPEAT, t);
        if (rc < 0)
            return rc;
    }
    *us = (mp__now() - t0) * 1e6 / iters;
    return 0;
}

static int run_fd(int sock, int fd, int iters, double *us)
{
    uint8_t buf[256] = {MODE_FD};
    double t0 = mp__now();
    for (int i = 0; i < iters; i++)
        if (mp__send_record(sock, buf, sizeof buf, &fd, 1, -1) < 0 || wait_ack(sock) < 0)
            return MP_ESYS;
    *us = (mp__now() - t0) * 1e6 / iters;
    return 0;
}

static void report(const char *op, double m, const char *pname, double p)
{
    printf("{\"op\":\"%s\",\"unit\":\"us\",\"mproc\":%.3f,\"primitive_name\":\"%s\","
           "\"primitive\":%.3f,\"ratio\":%.3f}\n", op, m, pname, p, p > 0 ? m / p : 0.0);
    fflush(stdout);
}

static int bench(int sock, bool quick)
{
    enum { REPS = 7 };
    int reps = quick ? 3 : REPS, iters = quick ? 10 : 200, rc = 0;
    double first[REPS], raw[REPS], rep[REPS], fd[REPS];
    mp_tensor *t = NULL;
    int64_t shape[1] = {1 << 18};
    int memfd = memfd_create("bench-cuda", MFD_CLOEXEC); /* what the primitive passes */
    if (memfd < 0)
        return mp__errno_error(errno, "bench_cuda: memfd_create");
    if ((rc = mp_tensor_empty_cuda(0, MP_FLOAT32, 1, shape, &t)) < 0)
        goto out;
    /* First handoff of t, outside the clock: from now on it is "already shared". */
    if ((rc = send_tensor(sock, MODE_MPROC_REPEAT, t)) < 0)
        goto out;
    for (int r = 0; r < reps && rc == 0; r++) {
        if ((rc = run_first(sock, iters, &first[r])) < 0 ||
            (rc = run_raw_ipc(sock, iters, &raw[r])) < 0 ||
            (rc = run_repeat(sock, t, iters * 5, &rep[r])) < 0 ||
            (rc = run_fd(sock, memfd, iters * 5, &fd[r])) < 0)
            break;
    }
    if (rc == 0) {
        report("cuda_handoff_first", median(first, reps),
               "cudaIpcGetMemHandle+send+cudaIpcOpenMemHandle+close", median(raw, reps));
        report("cuda_handoff_repeat", median(rep, reps), "socketpair SCM_RIGHTS ping-pong",
               median(fd, reps));
    }
out:
    mp_tensor_release(t);
    close(memfd);
    return rc;
}

int main(int argc, char **argv)
{
    bool quick = false;
    int n = 0, rc, sv[2];
    const char *fake_env = getenv("MPROC_BENCH_FAKE_CUDA");
    bool fake_on = fake_env && !strcmp(fake_env, "1");
    if (fake_on)
        fake_device_install();
    if (argc == 3 && !strcmp(argv[1], "--consumer"))
        return consumer(atoi(argv[2]));
    for (int i = 1; i < argc; i++)
        quick |= !strcmp(argv[i], "--quick");
    if ((rc = mp_cuda_device_count(&n)) < 0 || n == 0) {
        fprintf(stderr, "bench_cuda: no CUDA device, nothing measured (%s)\n",
                rc < 0 ? mp_last_error() : "0 devices visible");
        return 0;
    }
    if (fake_on)
        fprintf(stderr, "bench_cuda: FAKE device (host memory): these figures check the "
                        "benchmark, they do not measure a GPU\n");
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) {
        perror("bench_cuda: socketpair");
        return 1;
    }
    char fdarg[16];
    char *cargv[] = {"/proc/self/exe", "--consumer", fdarg, NULL};
    pid_t pid = -1;
    snprintf(fdarg, sizeof fdarg, "%d", sv[1]);
    mp__set_cloexec(sv[1], false);
    rc = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, cargv, environ);
    close(sv[1]);
    if (rc != 0) {
        fprintf(stderr, "bench_cuda: posix_spawn: %s\n", strerror(rc));
        close(sv[0]);
        return 1;
    }
    fprintf(stderr, "bench_cuda: device 0 of %d, consumer pid %d%s\n", n, (int)pid,
            quick ? " (quick)" : "");
    rc = bench(sv[0], quick);
    if (rc < 0)
        fprintf(stderr, "bench_cuda: %s: %s\n", mp_err_name(rc), mp_last_error());
    mp__send_record(sv[0], "s", 1, NULL, 0, -1);
    int status = 0;
    waitpid(pid, &status, 0);
    close(sv[0]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "bench_cuda: consumer ended with status %#x\n", status);
    return rc < 0 ? 1 : 0;
}
#else
int main(void)
{
    fprintf(stderr, "bench_cuda: built without CUDA (rebuild with -DMPROC_CUDA=ON and the CUDA "
                    "toolkit), nothing measured\n");
    return 0;
}
#endif
