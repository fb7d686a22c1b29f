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
 * on stderr and exits 0. --quick: tiny counts (smoke test); --reps N.
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

#include "bench.h"
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

typedef struct ctx {
    int sock;
    mp_tensor *t;   /* already shared with the consumer, which holds it */
    int memfd;      /* what the SCM_RIGHTS primitive passes */
} ctx;

enum { NBYTES = 1 << 20 }; /* 1 MiB allocations */

/* mproc: a new allocation each time, sent, opened, released, acked. */
static int op_first(void *p, size_t iters)
{
    ctx *c = p;
    int64_t shape[1] = {NBYTES / 4};
    for (size_t i = 0; i < iters; i++) {
        mp_tensor *t = NULL;
        int rc = mp_tensor_empty_cuda(0, MP_FLOAT32, 1, shape, &t);
        if (rc == 0)
            rc = send_tensor(c->sock, MODE_MPROC_FIRST, t);
        mp_tensor_release(t);
        if (rc < 0) {
            fprintf(stderr, "bench_cuda: first handoff: %s\n", mp_last_error());
            return 1;
        }
    }
    return mp_cuda_ipc_collect(NULL) < 0;
}

/* The bare CUDA IPC round trip over the same socket, same allocation. */
static int op_raw_ipc(void *p, size_t iters)
{
    ctx *c = p;
    uint8_t buf[1 + sizeof(cudaIpcMemHandle_t)];
    for (size_t i = 0; i < iters; i++) {
        void *d = NULL;
        cudaIpcMemHandle_t h;
        if (mp__cuda.Malloc(&d, NBYTES) != cudaSuccess)
            return 1;
        /* zeroed, as mp_tensor_empty_cuda's are: only the handoff differs */
        int ok = mp__cuda.Memset(d, 0, NBYTES) == cudaSuccess &&
                 mp__cuda.IpcGetMemHandle(&h, d) == cudaSuccess;
        buf[0] = MODE_RAW_IPC;
        memcpy(buf + 1, &h, sizeof h);
        ok = ok && mp__send_record(c->sock, buf, sizeof buf, NULL, 0, -1) == 0 &&
             wait_ack(c->sock) == 0;
        mp__cuda.Free(d);
        if (!ok) {
            fprintf(stderr, "bench_cuda: raw CUDA IPC round trip failed\n");
            return 1;
        }
    }
    return 0;
}

static int op_repeat(void *p, size_t iters)
{
    ctx *c = p;
    for (size_t i = 0; i < iters; i++) {
        if (send_tensor(c->sock, MODE_MPROC_REPEAT, c->t) < 0) {
            fprintf(stderr, "bench_cuda: repeated handoff: %s\n", mp_last_error());
            return 1;
        }
    }
    return 0;
}

static int op_fd(void *p, size_t iters)
{
    ctx *c = p;
    uint8_t buf[256] = {MODE_FD};
    for (size_t i = 0; i < iters; i++)
        if (mp__send_record(c->sock, buf, sizeof buf, &c->memfd, 1, -1) < 0 ||
            wait_ack(c->sock) < 0)
            return 1;
    return 0;
}

static int bench(int sock, const bench_opts *o)
{
    ctx c = {.sock = sock, .memfd = memfd_create("bench-cuda", MFD_CLOEXEC)};
    int64_t shape[1] = {NBYTES / 4};
    int rc = 1;
    if (c.memfd < 0 || mp_tensor_empty_cuda(0, MP_FLOAT32, 1, shape, &c.t) < 0 ||
        send_tensor(sock, MODE_MPROC_REPEAT, c.t) < 0) /* from now on "already shared" */
        goto out;
    double first = bench_measure_us(op_first, &c, bench_iters(o, 200), o);
    double raw = bench_measure_us(op_raw_ipc, &c, bench_iters(o, 200), o);
    double rep = bench_measure_us(op_repeat, &c, bench_iters(o, 1000), o);
    double fd = bench_measure_us(op_fd, &c, bench_iters(o, 1000), o);
    if (first < 0 || raw < 0 || rep < 0 || fd < 0)
        goto out;
    bench_emit("cuda_handoff_first", first,
               "cudaMalloc+cudaIpcGetMemHandle+send+cudaIpcOpenMemHandle+close", raw);
    bench_emit("cuda_handoff_repeat", rep, "socketpair SCM_RIGHTS ping-pong", fd);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "bench_cuda: %s\n", mp_last_error());
    mp_tensor_release(c.t);
    if (c.memfd >= 0)
        close(c.memfd);
    return rc;
}

int main(int argc, char **argv)
{
    bench_opts o;
    int n = 0, rc, sv[2];
    const char *fake_env = getenv("MPROC_BENCH_FAKE_CUDA");
    bool fake_on = fake_env && !strcmp(fake_env, "1");
    if (fake_on)
        fake_device_install();
    if (argc == 3 && !strcmp(argv[1], "--consumer"))
        return consumer(atoi(argv[2]));
    if ((rc = bench_parse_args(argc, argv, "handoff latency of CUDA tensors between two "
                                           "processes (first and repeated sends)", &o)) != 0)
        return rc > 0 ? 0 : 2;
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
            o.quick ? " (quick)" : "");
    rc = bench(sv[0], &o);
    mp__send_record(sv[0], "s", 1, NULL, 0, -1);
    int status = 0;
    waitpid(pid, &status, 0);
    close(sv[0]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "bench_cuda: consumer ended with status %#x\n", status);
    /* The tensor the consumer held until now is pending: free it (and its
     * IPC event) before exit, so nothing is left for a leak checker. */
    size_t pending = 0;
    if (mp_cuda_ipc_collect(NULL) < 0 || mp_cuda_ipc_pending(&pending) < 0 || pending) {
        fprintf(stderr, "bench_cuda: %zu allocations still pending at exit (%s)\n", pending,
                mp_last_error());
        rc = 1;
    }
    return rc;
}
#else
int main(void)
{
    fprintf(stderr, "bench_cuda: built without CUDA (rebuild with -DMPROC_CUDA=ON and the CUDA "
                    "toolkit), nothing measured\n");
    return 0;
}
#endif
