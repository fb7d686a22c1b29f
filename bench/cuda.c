/* bench_cuda: handoff latency of device tensors between two processes.
 *
 *   cuda_handoff_first   a new allocation each time: mproc's send (IPC handle,
 *                        event, shared count) + the receiver's decode (opens
 *                        the handle, waits on the event) + release + ack,
 *                        beside the bare CUDA IPC round trip (cudaMalloc +
 *                        cudaMemset as mproc does, cudaIpcGetMemHandle, an
 *                        interprocess event created, recorded and its handle
 *                        taken, both handles over the same socket,
 *                        cudaIpcOpenMemHandle + cudaIpcOpenEventHandle +
 *                        cudaStreamWaitEvent, close, ack). Target: <= 1.5x.
 *   cuda_handoff_repeat  the same allocation again while the receiver still
 *                        holds it (the handle cache hits: no open), beside a
 *                        SOCK_SEQPACKET ping-pong carrying one fd (SCM_RIGHTS),
 *                        the CPU handoff. The sender's stream is idle, so
 *                        mproc sends no event. Target: <= 2x.
 *   cuda_handoff_repeat_raw  the same figure beside the bare cached-handle
 *                        variant: the receiver keeps the allocation open, so
 *                        each handoff is cudaEventRecord + the event handle
 *                        over the socket + cudaIpcOpenEventHandle +
 *                        cudaStreamWaitEvent + ack.
 *   cuda_handoff_repeat_busy  the repeated handoff right after queuing GPU
 *                        work (a 1 MiB cudaMemset of the allocation), so an
 *                        event is needed, beside the cached-handle variant
 *                        after the same cudaMemset.
 *
 * One JSON line per figure on stdout (median of several repetitions, us per
 * handoff); human text, with the targets met or not, on stderr. Without a
 * CUDA device it prints only a "skipped" note on stderr and exits 0 with no
 * JSON line, which bench_all (bench/all.c) reports as skipped; a status of
 * 77 would be a failure there.
 * --quick: tiny counts (smoke test); --reps N.
 * MPROC_BENCH_FAKE_CUDA=1 runs on the test suite's fake device (host memory):
 * it checks the benchmark itself, its figures say nothing about GPUs. */
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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

enum { MODE_MPROC_FIRST = 'f', MODE_MPROC_REPEAT = 'r', MODE_RAW_IPC = 'i', MODE_RAW_OPEN = 'o',
       MODE_RAW_EVENT = 'e', MODE_FD = 'p', MODE_STOP = 's' };

/* What the raw primitives send: the allocation's and the event's handles. */
typedef struct raw_msg {
    uint8_t mode;
    cudaIpcMemHandle_t mem;
    cudaIpcEventHandle_t event;
} raw_msg;

/* The receiving side of the raw primitives: orders this process's stream
 * after the sender's recorded event, as mproc's receive does. */
static int raw_wait(const raw_msg *m)
{
    cudaEvent_t ev;
    if (mp__cuda.IpcOpenEventHandle(&ev, m->event) != cudaSuccess)
        return -1;
    cudaError_t e = mp__cuda.StreamWaitEvent(0, ev, 0);
    mp__cuda.EventDestroy(ev);
    return e == cudaSuccess ? 0 : -1;
}

/* The consumer's raw modes; *map is the allocation kept open by 'o'. */
static int raw_consume(const raw_msg *m, void **map)
{
    void *p = NULL;
    switch (m->mode) {
    case MODE_RAW_IPC:
        if (mp__cuda.IpcOpenMemHandle(&p, m->mem, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess)
            return -1;
        int rc = raw_wait(m);
        mp__cuda.IpcCloseMemHandle(p);
        return rc;
    case MODE_RAW_OPEN:
        if (*map)
            mp__cuda.IpcCloseMemHandle(*map);
        *map = NULL;
        return mp__cuda.IpcOpenMemHandle(map, m->mem, cudaIpcMemLazyEnablePeerAccess) ==
                       cudaSuccess
                   ? 0
                   : -1;
    default:
        return raw_wait(m);
    }
}

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
    const mp__objkind *k = &mp__cuda_tensor_kind;
    uint8_t buf[1024];
    mp_tensor *held = NULL;
    void *map = NULL;
    for (;;) {
        size_t len;
        int fds[4], nfds = 0;
        if (mp__recv_record(sock, buf, sizeof buf, &len, fds, 4, &nfds, -1) < 0 || len < 1)
            return 1;
        int mode = buf[0];
        if (mode == MODE_STOP) {
            mp_tensor_release(held);
            if (map)
                mp__cuda.IpcCloseMemHandle(map);
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
        } else if (mode == MODE_RAW_IPC || mode == MODE_RAW_OPEN || mode == MODE_RAW_EVENT) {
            raw_msg m;
            if (len != sizeof m)
                return 3;
            memcpy(&m, buf, sizeof m);
            if (raw_consume(&m, &map) < 0)
                return 3;
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
    const mp__objkind *k = &mp__cuda_tensor_kind;
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
    void *raw;      /* the raw cached-handle variant's allocation ... */
    cudaEvent_t raw_event; /* ... and its interprocess event */
    bool has_raw_event;
    bool busy;      /* queue a cudaMemset of the allocation before each send */
    raw_msg raw_handles;   /* their handles */
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

/* An interprocess event for a raw handoff, recorded, with its handle. */
static int raw_event(cudaEvent_t *ev, raw_msg *m)
{
    if (mp__cuda.EventCreateWithFlags(ev, cudaEventInterprocess | cudaEventDisableTiming) !=
        cudaSuccess)
        return -1;
    if (mp__cuda.IpcGetEventHandle(&m->event, *ev) != cudaSuccess ||
        mp__cuda.EventRecord(*ev, 0) != cudaSuccess) {
        mp__cuda.EventDestroy(*ev);
        return -1;
    }
    return 0;
}

static int raw_send(int sock, const raw_msg *m)
{
    if (mp__send_record(sock, m, sizeof *m, NULL, 0, -1) < 0)
        return -1;
    return wait_ack(sock);
}

/* The bare CUDA IPC round trip over the same socket: a new allocation (and
 * event) each time, as mproc's first send of an allocation has. */
static int op_raw_ipc(void *p, size_t iters)
{
    ctx *c = p;
    for (size_t i = 0; i < iters; i++) {
        void *d = NULL;
        cudaEvent_t ev;
        raw_msg m = {.mode = MODE_RAW_IPC};
        if (mp__cuda.Malloc(&d, NBYTES) != cudaSuccess)
            return 1;
        /* zeroed, as mp_tensor_empty_cuda's are: only the handoff differs */
        int ok = mp__cuda.Memset(d, 0, NBYTES) == cudaSuccess &&
                 mp__cuda.IpcGetMemHandle(&m.mem, d) == cudaSuccess;
        if (ok && (ok = raw_event(&ev, &m) == 0)) {
            ok = raw_send(c->sock, &m) == 0;
            mp__cuda.EventDestroy(ev);
        }
        mp__cuda.Free(d);
        if (!ok) {
            fprintf(stderr, "bench_cuda: raw CUDA IPC round trip failed\n");
            return 1;
        }
    }
    return 0;
}

/* The bare cached-handle variant: the receiver has the allocation open
 * already; each handoff records the event and sends its handle. */
static int op_raw_cached(void *p, size_t iters)
{
    ctx *c = p;
    c->raw_handles.mode = MODE_RAW_EVENT;
    for (size_t i = 0; i < iters; i++) {
        if ((c->busy && mp__cuda.Memset(c->raw, (int)i, NBYTES) != cudaSuccess) ||
            mp__cuda.EventRecord(c->raw_event, 0) != cudaSuccess ||
            raw_send(c->sock, &c->raw_handles) < 0) {
            fprintf(stderr, "bench_cuda: raw cached-handle handoff failed\n");
            return 1;
        }
    }
    return 0;
}

/* Makes the raw cached-handle variant's allocation and event, and has the
 * consumer open the allocation once. */
static int raw_cached_setup(ctx *c)
{
    c->raw_handles.mode = MODE_RAW_OPEN;
    if (mp__cuda.Malloc(&c->raw, NBYTES) != cudaSuccess) {
        c->raw = NULL;
        return -1;
    }
    if (mp__cuda.IpcGetMemHandle(&c->raw_handles.mem, c->raw) != cudaSuccess ||
        raw_event(&c->raw_event, &c->raw_handles) < 0)
        return -1;
    c->has_raw_event = true;
    return raw_send(c->sock, &c->raw_handles);
}

static int op_repeat(void *p, size_t iters)
{
    ctx *c = p;
    for (size_t i = 0; i < iters; i++) {
        if ((c->busy && mp__cuda.Memset(mp_tensor_data(c->t), (int)i, NBYTES) != cudaSuccess) ||
            send_tensor(c->sock, MODE_MPROC_REPEAT, c->t) < 0) {
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

static void verdict(const char *what, double ratio, double target)
{
    fprintf(stderr, "bench_cuda: %s: %.2fx (target <= %.1fx): %s\n", what, ratio, target,
            ratio <= target ? "met" : "NOT met");
}

static int bench(int sock, const bench_opts *o)
{
    ctx c = {.sock = sock, .memfd = memfd_create("bench-cuda", MFD_CLOEXEC)};
    int64_t shape[1] = {NBYTES / 4};
    int rc = 1;
    if (c.memfd < 0 || mp_tensor_empty_cuda(0, MP_FLOAT32, 1, shape, &c.t) < 0 ||
        send_tensor(sock, MODE_MPROC_REPEAT, c.t) < 0) /* from now on "already shared" */
        goto out;
    if (raw_cached_setup(&c) < 0) {
        fprintf(stderr, "bench_cuda: setting up the raw cached-handle variant failed\n");
        goto out;
    }
    double first = bench_measure_us(op_first, &c, bench_iters(o, 200), o);
    double raw = bench_measure_us(op_raw_ipc, &c, bench_iters(o, 200), o);
    double rep = bench_measure_us(op_repeat, &c, bench_iters(o, 1000), o);
    double fd = bench_measure_us(op_fd, &c, bench_iters(o, 1000), o);
    double cached = bench_measure_us(op_raw_cached, &c, bench_iters(o, 1000), o);
    c.busy = true;
    double rep_busy = bench_measure_us(op_repeat, &c, bench_iters(o, 1000), o);
    double cached_busy = bench_measure_us(op_raw_cached, &c, bench_iters(o, 1000), o);
    if (first < 0 || raw < 0 || rep < 0 || fd < 0 || cached < 0 || rep_busy < 0 ||
        cached_busy < 0)
        goto out;
    bench_emit("cuda_handoff_first", first,
               "cudaMalloc+cudaIpcGetMemHandle+event+send+cudaIpcOpenMemHandle+event wait",
               raw);
    bench_emit("cuda_handoff_repeat", rep, "socketpair SCM_RIGHTS ping-pong (CPU handoff)", fd);
    bench_emit("cuda_handoff_repeat_raw", rep,
               "cached handle: cudaEventRecord+send+cudaIpcOpenEventHandle+event wait", cached);
    bench_emit("cuda_handoff_repeat_busy", rep_busy,
               "cudaMemset+cached handle: cudaEventRecord+send+cudaIpcOpenEventHandle+event wait",
               cached_busy);
    verdict("first send vs raw CUDA IPC", raw > 0 ? first / raw : 0, 1.5);
    verdict("repeated send vs CPU handoff", fd > 0 ? rep / fd : 0, 2.0);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "bench_cuda: %s\n", mp_last_error());
    mp_tensor_release(c.t);
    if (c.has_raw_event)
        mp__cuda.EventDestroy(c.raw_event);
    if (c.raw)
        mp__cuda.Free(c.raw);
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
    if (fake_on && fake_device_install() < 0)
        return 1;
    if (argc == 3 && !strcmp(argv[1], "--consumer"))
        return consumer(atoi(argv[2]));
    if ((rc = bench_parse_args(argc, argv, "handoff latency of CUDA tensors between two\n"
                                           "processes (first and repeated sends)", &o)) != 0)
        return rc > 0 ? 0 : 2;
    if ((rc = mp_cuda_device_count(&n)) < 0 || n == 0) {
        fprintf(stderr, "bench_cuda: skipped: no CUDA device, nothing measured (%s)\n",
                rc < 0 ? mp_last_error() : "0 devices visible");
        return 0; /* no JSON line: a skip for bench_all */
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
    fprintf(stderr, "bench_cuda: skipped: built without the CUDA headers (rebuild with "
                    "-DMPROC_CUDA=ON and the CUDA toolkit's headers), nothing measured\n");
    return 0; /* no JSON line: a skip for bench_all */
}
#endif
