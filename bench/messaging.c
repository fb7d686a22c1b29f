/* Messaging benchmarks, each beside the bare primitive in the same run:
 *
 *  - one-way handoff of an already-shared tensor: ping-pong of a message
 *    over a Pipe between two processes, reported per one-way trip (round
 *    trip / 2, both sides). First handoff (4 KiB, 64 MiB; pins off, so the
 *    fd crosses every time) beside a raw socketpair ping-pong carrying 1
 *    byte + 1 fd (SCM_RIGHTS); repeated handoff (4 KiB, 1 MiB, 64 MiB; the
 *    ends pin the storage, no fd) beside a 16-byte message on the same pipe.
 *  - fresh private tensor throughput (1 MiB, 64 MiB): a borrowed private
 *    tensor sent over a Pipe (moved into shared memory, one copy, then only
 *    the fd crosses; the receiver maps it), beside mmap of a fresh shared
 *    mapping + memcpy + munmap.
 *  - 16-byte message rate over a Pipe and over a Queue, beside raw
 *    SOCK_SEQPACKET send/recv of 16 bytes; a producer streams, a consumer
 *    process receives, one acknowledgement at the end of each repetition.
 *  - 16-byte message latency: ping-pong over a Pipe, beside a futex
 *    ping-pong between two processes on a shared word (one way each).
 *  - 4x4 MPMC: 4 producer and 4 consumer processes on one Queue (16-byte
 *    messages, total rate), beside 1 producer and 1 consumer started the
 *    same way, alternately; the helpers are not pinned (they are started
 *    afresh each repetition, which the figure includes).
 *
 * Latency figures are p50 and p99 of single round trips (halved);
 * throughput figures the median and slowest of o->reps repetitions.
 *
 * Helper processes are plain fork() children. */
#include <linux/futex.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "mproc.h"

#define KIB 1024ull
#define MIB (1024ull * 1024ull)

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_messaging: %s: %s: %s\n", what, mp_err_name(rc), mp_last_error());
    exit(1);
}

/* ---- children ------------------------------------------------------------- */

/* Echoes every message back until EOF. */
static int echo_child(mp_conn *c)
{
    for (;;) {
        mp_msg *m = NULL;
        int rc = mp_conn_recv(c, &m, -1);
        if (rc == MP_ECLOSED)
            return 0;
        if (rc || (rc = mp_conn_send(c, m, -1)))
            return 1;
        mp_msg_destroy(m);
    }
}

/* Drops every message from c (or from q when q is set); a 1-byte payload
 * asks for a 1-byte acknowledgement on c. */
static int sink_child(mp_conn *c, mp_queue *q)
{
    for (;;) {
        mp_msg *m = NULL;
        size_t len = 0;
        int rc = q ? mp_queue_get(q, &m, -1) : mp_conn_recv(c, &m, -1);
        if (rc == MP_ECLOSED)
            return 0;
        if (rc)
            return 1;
        mp_msg_payload(m, &len);
        mp_msg_destroy(m);
        if (len == 1 && mp_conn_send_bytes(c, "a", 1, -1))
            return 1;
    }
}

static int raw_fd_echo_child(int s)
{
    for (;;) {
        char b, cbuf[CMSG_SPACE(sizeof(int))];
        struct iovec iov = {&b, 1};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                            .msg_controllen = sizeof cbuf};
        ssize_t n = recvmsg(s, &mh, MSG_CMSG_CLOEXEC);
        if (n <= 0)
            return n == 0 ? 0 : 1;
        int fd;
        memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&mh)), sizeof fd);
        mh.msg_controllen = sizeof cbuf;
        if (sendmsg(s, &mh, MSG_NOSIGNAL) != 1)
            return 1;
        close(fd);
    }
}

static int raw_sink_child(int s)
{
    char buf[64];
    for (;;) {
        ssize_t n = recv(s, buf, sizeof buf, 0);
        if (n <= 0)
            return n == 0 ? 0 : 1;
        if (n == 1 && send(s, "a", 1, MSG_NOSIGNAL) != 1)
            return 1;
    }
}

/* Forks a helper running fn(arg). The helper first drops its copy of the
 * parent's end (mine / my_fd), so the parent closing it means EOF there. */
static pid_t start(int (*fn)(void *), void *arg, mp_conn *mine, int my_fd)
{
    pid_t pid = fork();
    if (pid == 0) {
        /* The parent is pinned already: take its CPUs back, then the second. */
        bench_unpin();
        if (bench_pin_cpu(1) != 0)
            fprintf(stderr, "bench_messaging: a helper could not be pinned\n");
        mp_conn_close(mine);
        if (my_fd >= 0)
            close(my_fd);
        _exit(fn(arg));
    }
    return pid;
}

static void reap(pid_t pid)
{
    int status;
    if (waitpid(pid, &status, 0) != pid || status != 0)
        fprintf(stderr, "bench_messaging: helper %d ended with status 0x%x\n", pid, status);
}

/* A round trip's figures as one-way figures. */
static void halve(bench_stats *s)
{
    s->p50 /= 2;
    s->p99 /= 2;
}

/* Pairs are taken alternately (bench_latency_pair / bench_throughput_pair),
 * so both sides see the same load; a failure is fatal. */
static void latency_pair(bench_fn mfn, void *mctx, bench_fn rfn, void *rctx, size_t n,
                         const bench_opts *o, bench_stats *m, bench_stats *r)
{
    if (bench_latency_pair(mfn, mctx, rfn, rctx, n, o, m, r) != 0)
        die("latency measurement", MP_ESYS);
}

static void throughput_pair(bench_fn mfn, void *mctx, bench_fn rfn, void *rctx, size_t iters,
                            const bench_opts *o, bench_stats *m, bench_stats *r)
{
    if (bench_throughput_pair(mfn, mctx, rfn, rctx, iters, o, m, r) != 0)
        die("throughput measurement", MP_ESYS);
}

static int run_echo(void *c) { return echo_child(c); }
static int run_sink(void *c) { return sink_child(c, NULL); }
static int run_raw_echo(void *s) { return raw_fd_echo_child(*(int *)s); }
static int run_raw_sink(void *s) { return raw_sink_child(*(int *)s); }

/* ---- handoff of an already-shared tensor ------------------------------------ */

typedef struct pingpong {
    mp_conn *c;
    mp_msg *m;
    int sock;
    int fd;
} pingpong;

static int mproc_pingpong(void *ctx, size_t iters)
{
    pingpong *p = ctx;
    for (size_t i = 0; i < iters; i++) {
        mp_msg *r = NULL;
        int rc = mp_conn_send(p->c, p->m, -1);
        if (rc || (rc = mp_conn_recv(p->c, &r, -1)))
            die("handoff", rc);
        mp_msg_destroy(r);
    }
    return 0;
}

static int raw_pingpong(void *ctx, size_t iters)
{
    pingpong *p = ctx;
    for (size_t i = 0; i < iters; i++) {
        char b = 'x', cbuf[CMSG_SPACE(sizeof(int))];
        struct iovec iov = {&b, 1};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                            .msg_controllen = sizeof cbuf};
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        int fd;
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &p->fd, sizeof(int));
        if (sendmsg(p->sock, &mh, MSG_NOSIGNAL) != 1)
            return 1;
        mh.msg_controllen = sizeof cbuf;
        if (recvmsg(p->sock, &mh, MSG_CMSG_CLOEXEC) != 1)
            return 1;
        memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&mh)), sizeof fd);
        close(fd);
    }
    return 0;
}

/* pinned: the repeated handoff, which the receiving ends pin after the
 * second arrival, so it crosses with no fd; beside a 16-byte message over
 * the same pipe and echo child (what the ring costs without a storage).
 * Not pinned (MPROC_PINS=0 in both processes): every handoff passes the
 * fd, as a first handoff does; beside the raw SCM_RIGHTS ping-pong. */
static void bench_handoff(const bench_opts *o, size_t bytes, const char *label, bool pinned)
{
    int64_t n = (int64_t)bytes;
    mp_tensor *t = NULL;
    mp_conn *a = NULL, *b = NULL;
    pingpong p = {0}, small = {0};
    int sv[2], rc;
    bench_stats m, r;
    char op[96];
    pid_t pid, raw_pid;
    if (!pinned)
        setenv("MPROC_PINS", "0", 1);
    if ((rc = mp_tensor_empty_shared(MP_UINT8, 1, &n, &t)) || (rc = mp_pipe(true, &a, &b)) ||
        (rc = mp_msg_create(&p.m)) || (rc = mp_msg_add_tensor(p.m, "t", t)) ||
        (rc = mp_msg_create(&small.m)) ||
        (rc = mp_msg_set_payload(small.m, "0123456789abcdef", 16)))
        die("handoff setup", rc);
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        die("socketpair", MP_ESYS);
    p.c = small.c = a;
    p.sock = sv[0];
    p.fd = memfd_create("bench", MFD_CLOEXEC);
    pid = start(run_echo, b, a, sv[0]);
    raw_pid = start(run_raw_echo, &sv[1], a, sv[0]);
    mp_conn_release(b);
    close(sv[1]);
    if (pinned)
        latency_pair(mproc_pingpong, &p, mproc_pingpong, &small, bench_iters(o, 2000), o, &m,
                     &r);
    else
        latency_pair(mproc_pingpong, &p, raw_pingpong, &p, bench_iters(o, 2000), o, &m, &r);
    mp_conn_close(a);
    close(sv[0]);
    reap(pid);
    reap(raw_pid);
    mp_conn_release(a);
    close(p.fd);
    unsetenv("MPROC_PINS");
    snprintf(op, sizeof op, "handoff shared tensor %s, %s (pipe, one way)", label,
             pinned ? "repeated: pinned, no fd" : "first: with its fd");
    halve(&m);
    halve(&r);
    bench_emit_stats(op, "latency", &m,
                     pinned ? "16-byte message ping-pong, same pipe (one way)"
                            : "socketpair SCM_RIGHTS ping-pong 1 byte + 1 fd (one way)",
                     &r);
    mp_msg_destroy(p.m);
    mp_msg_destroy(small.m);
    mp_tensor_release(t);
}

/* ---- fresh private tensor ---------------------------------------------------- */

typedef struct fresh {
    mp_conn *c;
    void *src;
    size_t bytes;
} fresh;

static void wait_ack(mp_conn *c)
{
    void *ack = NULL;
    size_t len = 0;
    int rc = mp_conn_send_bytes(c, "s", 1, -1);
    if (rc || (rc = mp_conn_recv_bytes(c, &ack, &len, -1)))
        die("ack", rc);
    free(ack);
}

static int mproc_fresh(void *ctx, size_t iters)
{
    fresh *f = ctx;
    int64_t n = (int64_t)f->bytes;
    for (size_t i = 0; i < iters; i++) {
        mp_tensor *t = NULL;
        mp_msg *m = NULL;
        int rc = mp_tensor_from_blob(f->src, f->bytes, MP_UINT8, 1, &n, NULL, NULL, NULL, &t);
        if (rc || (rc = mp_msg_create(&m)) || (rc = mp_msg_add_tensor(m, NULL, t)) ||
            (rc = mp_conn_send(f->c, m, -1)))
            die("fresh tensor", rc);
        mp_msg_destroy(m);
        mp_tensor_release(t);
    }
    wait_ack(f->c);
    return 0;
}

static int raw_fresh(void *ctx, size_t iters)
{
    fresh *f = ctx;
    for (size_t i = 0; i < iters; i++) {
        void *p = mmap(NULL, f->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                       -1, 0);
        if (p == MAP_FAILED)
            return 1;
        memcpy(p, f->src, f->bytes);
        munmap(p, f->bytes);
    }
    return 0;
}

static void bench_fresh(const bench_opts *o, size_t bytes, const char *label, size_t iters)
{
    fresh f = {.bytes = bytes, .src = malloc(bytes)};
    mp_conn *b = NULL;
    char op[64];
    int rc;
    if (!f.src)
        die("malloc", MP_ENOMEM);
    memset(f.src, 0x5a, bytes);
    if ((rc = mp_pipe(true, &f.c, &b)))
        die("pipe", rc);
    pid_t pid = start(run_sink, b, f.c, -1);
    bench_stats m, r;
    mp_conn_release(b);
    throughput_pair(mproc_fresh, &f, raw_fresh, &f, bench_iters(o, iters), o, &m, &r);
    mp_conn_close(f.c);
    reap(pid);
    mp_conn_release(f.c);
    snprintf(op, sizeof op, "fresh private tensor %s (pipe)", label);
    bench_emit_stats(op, "throughput", &m, "mmap fresh shared mapping + memcpy + munmap", &r);
    free(f.src);
}

/* ---- 16-byte messages -------------------------------------------------------- */

typedef struct small {
    mp_conn *c;
    mp_queue *q;
    mp_conn *ack;
    mp_msg *m;
    mp_msg *end;
    int sock;
} small;

static int mproc_small_pipe(void *ctx, size_t iters)
{
    small *s = ctx;
    for (size_t i = 0; i < iters; i++) {
        int rc = mp_conn_send(s->c, s->m, -1);
        if (rc)
            die("16-byte send", rc);
    }
    wait_ack(s->c);
    return 0;
}

static int mproc_small_queue(void *ctx, size_t iters)
{
    small *s = ctx;
    void *ack = NULL;
    size_t len;
    int rc;
    for (size_t i = 0; i < iters; i++)
        if ((rc = mp_queue_put(s->q, s->m, -1)))
            die("16-byte put", rc);
    if ((rc = mp_queue_put(s->q, s->end, -1)) || (rc = mp_conn_recv_bytes(s->ack, &ack, &len, -1)))
        die("queue ack", rc);
    free(ack);
    return 0;
}

static int raw_small(void *ctx, size_t iters)
{
    small *s = ctx;
    char buf[16] = "0123456789abcdef", a;
    for (size_t i = 0; i < iters; i++)
        if (send(s->sock, buf, 16, MSG_NOSIGNAL) != 16)
            return 1;
    if (send(s->sock, "s", 1, MSG_NOSIGNAL) != 1 || recv(s->sock, &a, 1, 0) != 1)
        return 1;
    return 0;
}

typedef struct qsink_arg {
    mp_queue *q;
    mp_conn *ack;
} qsink_arg;
static int run_queue_sink(void *p)
{
    qsink_arg *a = p;
    return sink_child(a->ack, a->q);
}

static void bench_small(const bench_opts *o)
{
    small s = {0};
    qsink_arg qa = {0};
    mp_conn *b = NULL, *qb = NULL;
    int sv[2], rc;
    size_t iters = bench_iters(o, 100000);
    bench_stats m, r, mq, rq;
    pid_t raw_pid, pid, qpid;
    if ((rc = mp_msg_create(&s.m)) || (rc = mp_msg_set_payload(s.m, "0123456789abcdef", 16)) ||
        (rc = mp_msg_create(&s.end)) || (rc = mp_msg_set_payload(s.end, "e", 1)))
        die("messages", rc);
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        die("socketpair", MP_ESYS);
    if ((rc = mp_pipe(true, &s.c, &b)) || (rc = mp_queue_create(0, &s.q)) ||
        (rc = mp_pipe(true, &s.ack, &qb)))
        die("pipe/queue", rc);
    s.sock = sv[0];
    qa.q = s.q;
    qa.ack = qb;
    raw_pid = start(run_raw_sink, &sv[1], s.c, sv[0]);
    pid = start(run_sink, b, s.c, sv[0]);
    qpid = start(run_queue_sink, &qa, s.c, sv[0]);
    close(sv[1]);
    mp_conn_release(b);
    mp_conn_release(qb);
    throughput_pair(mproc_small_pipe, &s, raw_small, &s, iters, o, &m, &r);
    throughput_pair(mproc_small_queue, &s, raw_small, &s, iters, o, &mq, &rq);
    close(sv[0]);
    mp_conn_close(s.c);
    mp_queue_close(s.q);
    reap(raw_pid);
    reap(pid);
    reap(qpid);
    bench_emit_stats("16-byte message (pipe)", "throughput", &m,
                     "SOCK_SEQPACKET send/recv 16 bytes", &r);
    bench_emit_stats("16-byte message (queue)", "throughput", &mq,
                     "SOCK_SEQPACKET send/recv 16 bytes", &rq);
    mp_conn_release(s.c);
    mp_queue_release(s.q);
    mp_conn_release(s.ack);
    mp_msg_destroy(s.m);
    mp_msg_destroy(s.end);
}

/* ---- 16-byte latency ----------------------------------------------------------- */

static void futex_op(_Atomic uint32_t *w, int op, uint32_t val)
{
    syscall(SYS_futex, (uint32_t *)w, op, val, NULL, NULL, 0);
}

/* The bare primitive: the parent stores 1 and wakes, the helper stores 2
 * and wakes; each sleeps in FUTEX_WAIT until its turn (3: stop). */
static int futex_echo_child(void *arg)
{
    _Atomic uint32_t *w = arg;
    for (;;) {
        uint32_t v = atomic_load(w);
        if (v == 3)
            return 0;
        if (v != 1) {
            futex_op(w, FUTEX_WAIT, v);
            continue;
        }
        atomic_store(w, 2);
        futex_op(w, FUTEX_WAKE, 1);
    }
}

static int futex_pingpong(void *ctx, size_t iters)
{
    _Atomic uint32_t *w = ctx;
    for (size_t i = 0; i < iters; i++) {
        atomic_store(w, 1);
        futex_op(w, FUTEX_WAKE, 1);
        while (atomic_load(w) != 2)
            futex_op(w, FUTEX_WAIT, 1);
    }
    return 0;
}

static void bench_latency(const bench_opts *o)
{
    _Atomic uint32_t *w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                               -1, 0);
    mp_conn *a = NULL, *b = NULL;
    pingpong p = {0};
    pid_t pid, fpid;
    bench_stats m, r;
    int rc;
    if (w == MAP_FAILED)
        die("mmap", MP_ESYS);
    atomic_store(w, 0);
    if ((rc = mp_pipe(true, &a, &b)) || (rc = mp_msg_create(&p.m)) ||
        (rc = mp_msg_set_payload(p.m, "0123456789abcdef", 16)))
        die("latency setup", rc);
    p.c = a;
    pid = start(run_echo, b, a, -1);
    fpid = start(futex_echo_child, (void *)w, a, -1);
    mp_conn_release(b);
    latency_pair(mproc_pingpong, &p, futex_pingpong, (void *)w, bench_iters(o, 20000), o, &m,
                 &r);
    atomic_store(w, 3);
    futex_op(w, FUTEX_WAKE, 1);
    mp_conn_close(a);
    reap(pid);
    reap(fpid);
    mp_conn_release(a);
    mp_msg_destroy(p.m);
    munmap((void *)w, 4096);
    halve(&m);
    halve(&r);
    bench_emit_stats("16-byte message latency (pipe, one way)", "latency", &m,
                     "futex ping-pong between 2 processes (one way)", &r);
}

/* ---- 4x4 MPMC ------------------------------------------------------------------ */

#define MPMC_SIDE 4

typedef struct mpmc {
    mp_queue *q;
    mp_msg *m, *stop;
    int side;  /* producers, and consumers */
} mpmc;

static pid_t mpmc_child(mpmc *x, size_t puts)
{
    pid_t pid = fork();
    if (pid == 0) {
        bench_unpin();
        for (size_t i = 0; i < puts; i++)
            if (mp_queue_put(x->q, x->m, -1))
                _exit(1);
        for (;;) {
            mp_msg *r = NULL;
            size_t len = 0;
            if (puts || mp_queue_get(x->q, &r, -1))
                _exit(puts ? 0 : 1);
            mp_msg_payload(r, &len);
            mp_msg_destroy(r);
            if (len == 1)
                _exit(0);
        }
    }
    return pid;
}

/* side producers put iters messages between them, side consumers take
 * them; every process is started afresh (its start is in the figure). */
static int mproc_mpmc(void *ctx, size_t iters)
{
    mpmc *x = ctx;
    pid_t pids[2 * MPMC_SIDE];
    int rc;
    for (int i = 0; i < x->side; i++)
        pids[i] = mpmc_child(x, 0);
    for (int i = 0; i < x->side; i++)
        pids[x->side + i] = mpmc_child(x, iters / (size_t)x->side);
    for (int i = 0; i < x->side; i++)
        reap(pids[x->side + i]);
    for (int i = 0; i < x->side; i++)
        if ((rc = mp_queue_put(x->q, x->stop, -1)))
            die("mpmc stop", rc);
    for (int i = 0; i < x->side; i++)
        reap(pids[i]);
    return 0;
}

static void mpmc_setup(mpmc *x, int side)
{
    int rc;
    x->side = side;
    if ((rc = mp_queue_create(0, &x->q)) || (rc = mp_msg_create(&x->m)) ||
        (rc = mp_msg_set_payload(x->m, "0123456789abcdef", 16)) ||
        (rc = mp_msg_create(&x->stop)) || (rc = mp_msg_set_payload(x->stop, "e", 1)))
        die("mpmc setup", rc);
}

static void mpmc_done(mpmc *x)
{
    mp_msg_destroy(x->m);
    mp_msg_destroy(x->stop);
    mp_queue_release(x->q);
}

/* Beside the same run with one producer and one consumer, taken
 * alternately: "scales past 1->1" reads directly off the ratio. */
static void bench_mpmc(const bench_opts *o)
{
    mpmc many = {0}, one = {0};
    bench_stats m, r;
    mpmc_setup(&many, MPMC_SIDE);
    mpmc_setup(&one, 1);
    bench_unpin();
    bench_set_placement("unpinned (the %d processes of each side start afresh per repetition)",
                        2 * MPMC_SIDE);
    throughput_pair(mproc_mpmc, &many, mproc_mpmc, &one, bench_iters(o, 400000), o, &m, &r);
    bench_emit_stats("16-byte messages 4x4 MPMC (queue, total)", "throughput", &m,
                     "16-byte messages 1->1, processes started the same way", &r);
    mpmc_done(&many);
    mpmc_done(&one);
}

int main(int argc, char **argv)
{
    bench_opts o;
    int rc = bench_parse_args(argc, argv,
                              "shared-tensor handoff, fresh-tensor throughput and\n"
                              "16-byte message rate, each beside the raw primitive", &o);
    if (rc)
        return rc > 0 ? 0 : 2;
    signal(SIGPIPE, SIG_IGN);
    /* Parent on one CPU, every helper on another: see bench_pin_cpu. */
    if (bench_pin_cpu(0) != 0)
        fprintf(stderr, "bench_messaging: not pinned (fewer than 2 CPUs): figures mix "
                        "same-core and cross-core hand-offs\n");
    else
        bench_set_placement("parent on cpu %d, helper processes on cpu %d",
                            bench_cpu_of_slot(0), bench_cpu_of_slot(1));
    bench_handoff(&o, 4 * KIB, "4 KiB", false);
    bench_handoff(&o, 64 * MIB, "64 MiB", false);
    bench_handoff(&o, 4 * KIB, "4 KiB", true);
    bench_handoff(&o, 1 * MIB, "1 MiB", true);
    bench_handoff(&o, 64 * MIB, "64 MiB", true);
    bench_fresh(&o, 1 * MIB, "1 MiB", 200);
    bench_fresh(&o, 64 * MIB, "64 MiB", 8);
    bench_small(&o);
    bench_latency(&o);
    bench_mpmc(&o);
    return 0;
}
