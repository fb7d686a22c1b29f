/* MPI benchmarks: mproc's cross-rank pipe and queue beside raw
 * MPI_Send/MPI_Recv between two ranks, in the same job:
 *
 *  - small-message latency: one-way trip of an 8-byte message (ping-pong
 *    round trip / 2), mp_conn_send/recv on an mp_mpi_pipe beside MPI_Send/MPI_Recv, and
 *    through two cross-rank queues (rank 1 gets and answers on the other):
 *    both homed on rank 0, then across hosts one homed on each rank, each
 *    rank putting to the queue it homes, then to the other's, then the
 *    same with puts that run ahead (mp_mpi_queue_put_ahead, window 64);
 *  - 64 MiB bandwidth: a 64 MiB tensor through the conn, and through the
 *    queue both ways (rank 0, the queues' home, puts and rank 1 gets; rank
 *    1 puts and rank 0 gets), beside MPI_Send/MPI_Recv of 64 MiB the same
 *    way between the same pages (raw_bandwidth says why); one small
 *    acknowledgement per transfer, all;
 *  - on one host (the same-host path on), the same beside mproc's local
 *    path itself: a plain mp_pipe and a pair of mp_queues to a forked
 *    mproc process.
 *
 * Each pair is measured alternately, repetition by repetition, and the
 * medians are compared, so a load that comes and goes hits both.
 *
 * Run directly (make bench, bench_all), it runs itself three times under
 * mpirun with 2 ranks: Open MPI's default transports with the same-host
 * path on ("shm"); the same transports with that path off
 * (MPROC_MPI_LOCAL=0: the cross-host encoding over MPI's shared memory,
 * "mpi"); TCP only with it off ("tcp"), which is what crosses hosts.
 * Built without MPI it measures nothing (a skip). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#ifndef MPROC_HAVE_MPI
int main(void)
{
    fprintf(stderr, "bench_mpi: built without MPI (install libopenmpi-dev openmpi-bin and "
                    "rebuild with -DMPROC_MPI=ON): nothing to measure\n");
    return 0;
}
#else
#include <mpi.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mproc.h"
#include "mproc/mpi.h"

#define MIB (1024ull * 1024ull)

static int rank;
static const char *variant; /* "shm", "mpi" or "tcp", for the op names */

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_mpi: rank %d: %s: %s: %s\n", rank, what, mp_err_name(rc),
            mp_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

typedef struct ctx {
    mp_conn *c;
    mp_queue *qin, *qout; /* home rank 0: rank 0 -> 1, and back */
    mp_queue *rqin, *rqout;   /* the same for rank 1 -> 0, on one host: each
                               * queue has one getter, as the local queues
                               * have (two getting processes turn an end's
                               * pins off). Across hosts qin and qout again:
                               * two more queues would make the home's every
                               * broker round probe for them too. */
    bool reverse;             /* queue figures: rank 1 sends, rank 0 answers */
    mp_queue *q1;             /* across hosts, for its two figures only: homed
                               * on rank 1 (whose waits then serve its broker) */
    int homes;                /* 0: qin and qout; 1: rank 0 puts on qin, rank 1
                               * on q1 (each its own); 2: the other way round */
    mp_conn *lc;              /* rank 0: the plain pipe to the forked acker */
    mp_queue *lqin, *lqout;   /* rank 0: the local queues to the forked acker */
    mp_tensor *t;
    char *buf;
    size_t len;
    bool local;   /* the same-host path is on: tensors go by handle */
    mp_msg *kept; /* across hosts: the last tensor received, kept for the raw figure */
} ctx;

/* ---- raw MPI ----------------------------------------------------------- */

static int raw_pingpong(void *p, size_t iters)
{
    ctx *x = p;
    for (size_t i = 0; i < iters; i++) {
        if (rank == 0) {
            MPI_Send(x->buf, (int)x->len, MPI_BYTE, 1, 7, MPI_COMM_WORLD);
            MPI_Recv(x->buf, (int)x->len, MPI_BYTE, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(x->buf, (int)x->len, MPI_BYTE, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(x->buf, (int)x->len, MPI_BYTE, 0, 7, MPI_COMM_WORLD);
        }
    }
    return 0;
}

/* The bytes go the way the figure beside it sends them and, across hosts,
 * between the same pages: out of the sender's tensor, into the memory the
 * receiver's last mproc receive used (it comes back for the next one).
 * Copying between two other 64 MiB buffers takes 7 to 11 ms on the
 * development VM depending on how scattered their physical pages are
 * (docs/performance-log.md), which would compare page placement, not the
 * transfers. */
static int raw_bandwidth(void *p, size_t iters)
{
    ctx *x = p;
    char ack = 0, *src = x->buf, *dst = x->buf;
    int peer = rank ^ 1;
    bool sender = (rank == 0) != x->reverse;
    if (!x->local && sender)
        src = mp_tensor_data(x->t);
    if (!x->local && !sender && x->kept) {
        mp_tensor *in = NULL;
        if (mp_msg_get_tensor(x->kept, 0, &in) == 0 && mp_tensor_nbytes(in) == x->len)
            dst = mp_tensor_data(in);
        mp_tensor_release(in); /* x->kept holds it */
    }
    for (size_t i = 0; i < iters; i++) {
        if (sender) {
            MPI_Send(src, (int)x->len, MPI_BYTE, peer, 8, MPI_COMM_WORLD);
            MPI_Recv(&ack, 1, MPI_BYTE, peer, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(dst, (int)x->len, MPI_BYTE, peer, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(&ack, 1, MPI_BYTE, peer, 9, MPI_COMM_WORLD);
        }
    }
    return 0;
}

/* ---- mproc --------------------------------------------------------------- */

/* The message a figure sends: 8 payload bytes, or the 64 MiB tensor. */
static mp_msg *out_msg(ctx *x)
{
    mp_msg *m = NULL;
    int rc = mp_msg_create(&m);
    if (rc == 0)
        rc = x->t ? mp_msg_add_tensor(m, NULL, x->t) : mp_msg_set_payload(m, x->buf, x->len);
    if (rc)
        die("message", rc);
    return m;
}

/* A received message is dropped, except the last tensor a receiver
 * takes in a round across hosts: the raw figure after it receives into
 * the same memory, and it is dropped before the next round, whose first
 * receive then reuses that memory as every later one does. */
static void done_with(ctx *x, mp_msg *in, bool last)
{
    if (last && x->t && !x->local && mp_msg_count(in) == 1) {
        mp_msg_destroy(x->kept);
        x->kept = in;
    } else {
        mp_msg_destroy(in);
    }
}

/* Rank 0 sends, rank 1 receives (a tensor: a fresh shared tensor or a
 * reused one across hosts, a handle on one host) and answers: the echo
 * for 8 bytes, an empty message for a tensor. */
static int conn_roundtrip(void *p, size_t iters)
{
    ctx *x = p;
    mp_msg *m = out_msg(x), *empty = NULL;
    int rc = mp_msg_create(&empty);
    mp_msg_destroy(x->kept), x->kept = NULL;
    for (size_t i = 0; i < iters && rc == 0; i++) {
        mp_msg *in = NULL;
        if (rank == 0) {
            if ((rc = mp_conn_send(x->c, m, -1)) == 0)
                rc = mp_conn_recv(x->c, &in, -1);
        } else if ((rc = mp_conn_recv(x->c, &in, -1)) == 0) {
            rc = mp_conn_send(x->c, x->t ? empty : in, -1);
        }
        done_with(x, in, i + 1 == iters);
    }
    mp_msg_destroy(m), mp_msg_destroy(empty);
    if (rc)
        die("conn", rc);
    return 0;
}

/* The same through two queues: the sender puts on qin, the other rank
 * gets and answers on qout (reverse: rank 1 is the sender, on rqin and
 * rqout). */
static int queue_roundtrip(void *p, size_t iters)
{
    ctx *x = p;
    bool sender = (rank == 0) != x->reverse;
    mp_queue *qin = x->reverse ? x->rqin : x->qin, *qout = x->reverse ? x->rqout : x->qout;
    if (x->homes)
        qin = x->homes == 1 ? x->qin : x->q1, qout = x->homes == 1 ? x->q1 : x->qin;
    /* homes 3 is homes 2 with puts that run ahead */
    mp_msg *m = out_msg(x), *empty = NULL;
    int rc = mp_msg_create(&empty);
    mp_msg_destroy(x->kept), x->kept = NULL;
    for (size_t i = 0; i < iters && rc == 0; i++) {
        mp_msg *in = NULL;
        if (sender) {
            if ((rc = mp_queue_put(qin, m, -1)) == 0)
                rc = mp_queue_get(qout, &in, -1);
        } else if ((rc = mp_queue_get(qin, &in, -1)) == 0) {
            rc = mp_queue_put(qout, x->t ? empty : in, -1);
        }
        done_with(x, in, i + 1 == iters);
    }
    mp_msg_destroy(m), mp_msg_destroy(empty);
    if (rc)
        die("queue", rc);
    return 0;
}

/* The local path itself, rank 0 only: the same to a forked process over a
 * plain mp_pipe, or a pair of mp_queues. */
static int local_roundtrip(ctx *x, size_t iters, bool queue)
{
    mp_msg *m = out_msg(x);
    int rc = 0;
    for (size_t i = 0; i < iters && rc == 0; i++) {
        mp_msg *in = NULL;
        rc = queue ? mp_queue_put(x->lqin, m, -1) : mp_conn_send(x->lc, m, -1);
        if (rc == 0)
            rc = queue ? mp_queue_get(x->lqout, &in, -1) : mp_conn_recv(x->lc, &in, -1);
        mp_msg_destroy(in);
    }
    mp_msg_destroy(m);
    if (rc)
        die("local path", rc);
    return 0;
}

static int local_pipe_roundtrip(void *p, size_t iters)
{
    return rank == 0 ? local_roundtrip(p, iters, false) : 0;
}

static int local_queue_roundtrip(void *p, size_t iters)
{
    return rank == 0 ? local_roundtrip(p, iters, true) : 0;
}

/* Rank 0's helpers for the local-path figures: forked mproc processes
 * that answer each message on the pipe, or on the in-queue (the echo for
 * bytes, an empty message for a tensor), until it closes. Forked before
 * the 64 MiB tensor exists, so they map each received segment as rank 1
 * does. */
static pid_t fork_acker(ctx *x, bool queue)
{
    mp_conn *a = NULL, *b = NULL;
    int rc = queue ? mp_queue_create(0, &x->lqin) : mp_pipe(true, &a, &b);
    if (rc == 0 && queue)
        rc = mp_queue_create(0, &x->lqout);
    if (rc)
        die("local pipe and queues", rc);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        bench_unpin();    /* the parent's pin to CPU 0 came along */
        bench_pin_cpu(1); /* where rank 1 runs: both figures cross cores */
        mp_conn_close(a);
        for (;;) {
            mp_msg *m = NULL, *ack = NULL;
            if ((queue ? mp_queue_get(x->lqin, &m, -1) : mp_conn_recv(b, &m, -1)) != 0)
                _exit(0); /* closed: done */
            if (mp_msg_count(m) == 0)
                ack = m, m = NULL;
            else if (mp_msg_create(&ack) != 0)
                _exit(1);
            if ((queue ? mp_queue_put(x->lqout, ack, -1) : mp_conn_send(b, ack, -1)) != 0)
                _exit(1);
            mp_msg_destroy(m), mp_msg_destroy(ack);
        }
    }
    mp_conn_release(b);
    if (!queue)
        x->lc = a;
    return pid;
}

/* Medians of fa and fb over o->reps repetitions taken alternately (after
 * one untimed round of each); both ranks run it. */
static void measure_pair(bench_fn fa, bench_fn fb, ctx *x, size_t iters, const bench_opts *o,
                         double *a, double *b)
{
    double sa[1000], sb[1000];
    int reps = o->reps < 1 ? 1 : o->reps > 1000 ? 1000 : o->reps;
    bench_fn f[2] = {fa, fb};
    double *out[2] = {sa, sb};
    for (int r = -1; r < reps; r++) {
        for (int k = 0; k < 2; k++) {
            mp_mpi_barrier(); /* a rank with no part in this one waits asleep */
            uint64_t t0 = bench_now_ns();
            f[k](x, iters);
            if (r >= 0)
                out[k][r] = (double)(bench_now_ns() - t0) / 1e3 / (double)iters;
        }
    }
    *a = bench_median(sa, (size_t)reps);
    *b = bench_median(sb, (size_t)reps);
}

static void emit(const char *op, double mproc_us, const char *prim, double prim_us)
{
    char name[160];
    snprintf(name, sizeof name, "%s (%s)", op, variant);
    if (rank == 0)
        bench_emit(name, mproc_us, prim, prim_us);
}

static void figures(ctx *x, const bench_opts *o, bool local, bool big)
{
    const char *size = big ? "64 MiB" : "8 B";
    size_t iters = big ? bench_iters(o, 4) : bench_iters(o, 4000);
    char op[128], prim[64];
    double own, raw;
    snprintf(prim, sizeof prim, "MPI_Send/MPI_Recv %s", size);
    measure_pair(conn_roundtrip, big ? raw_bandwidth : raw_pingpong, x, iters, o, &own, &raw);
    snprintf(op, sizeof op, "mpi conn %s %s", size, big ? "transfer" : "one-way latency");
    emit(op, big ? own : own / 2, prim, big ? raw : raw / 2);
    if (big && rank == 0)
        fprintf(stderr, "bench_mpi (%s): 64 MiB: raw MPI %.0f MiB/s, mproc conn %.0f MiB/s\n",
                variant, 64e6 / raw / 1.048576, 64e6 / own / 1.048576);
    for (int rev = 0; rev < 2; rev++) {
        x->reverse = rev;
        measure_pair(queue_roundtrip, big ? raw_bandwidth : raw_pingpong, x, iters, o, &own,
                     &raw);
        snprintf(op, sizeof op, "mpi queue %s %s, %s", size,
                 big ? "transfer" : "one-way latency",
                 rev ? "rank 1 puts, home gets" : "home puts, rank 1 gets");
        emit(op, big ? own : own / 2, prim, big ? raw : raw / 2);
    }
    x->reverse = false;
    if (!big && !local) {
        int rc = mp_mpi_queue_create(1, &x->q1);
        if (rc)
            die("queue homed on rank 1", rc);
        for (x->homes = 1; x->homes <= 3; x->homes++) {
            /* 3: homed on the getter, with puts that run ahead */
            int window = x->homes == 3 ? 64 : 0;
            if ((rc = mp_mpi_queue_put_ahead(x->q1, window)) != 0 ||
                (rc = mp_mpi_queue_put_ahead(x->qin, window)) != 0)
                die("mp_mpi_queue_put_ahead", rc);
            measure_pair(queue_roundtrip, raw_pingpong, x, iters, o, &own, &raw);
            snprintf(op, sizeof op, "mpi queue 8 B one-way latency, each queue homed on its %s%s",
                     x->homes == 1 ? "putter" : "getter",
                     x->homes == 3 ? ", puts run ahead (window 64)" : "");
            emit(op, own / 2, prim, raw / 2);
        }
        if ((rc = mp_mpi_queue_put_ahead(x->q1, 0)) != 0 ||
            (rc = mp_mpi_queue_put_ahead(x->qin, 0)) != 0)
            die("mp_mpi_queue_put_ahead", rc);
        x->homes = 0;
        mp_queue_release(x->q1), x->q1 = NULL; /* collective */
    }
    if (!local)
        return;
    /* The same-host path beside the local path it is made of. A tensor
     * goes by handle there, as fast as 8 bytes: as many round trips as for
     * 8 bytes, or the ranks' way out of the barrier before the first one
     * would be most of what 4 of them measure. */
    iters = bench_iters(o, 4000);
    measure_pair(conn_roundtrip, local_pipe_roundtrip, x, iters, o, &own, &raw);
    snprintf(op, sizeof op, "mpi conn %s round trip, same host", size);
    snprintf(prim, sizeof prim, "mp_pipe %s round trip", size);
    emit(op, own, prim, raw);
    measure_pair(queue_roundtrip, local_queue_roundtrip, x, iters, o, &own, &raw);
    snprintf(op, sizeof op, "mpi queue %s round trip, same host", size);
    snprintf(prim, sizeof prim, "mp_queue %s round trip", size);
    emit(op, own, prim, raw);
}

static int bench_rank(const bench_opts *o)
{
    ctx x = {0};
    int64_t n = (int64_t)(64 * MIB);
    pid_t acker[2] = {-1, -1};
    int rc;
    rank = mp_mpi_rank();
    bench_pin_cpu(rank); /* mpirun runs us with --bind-to none */
    x.buf = calloc(1, 64 * MIB);
    if (!x.buf || (rc = mp_mpi_pipe(rank ^ 1, &x.c)) != 0 ||
        (rc = mp_mpi_queue_create(0, &x.qin)) != 0 || (rc = mp_mpi_queue_create(0, &x.qout)))
        die("setup", x.buf ? rc : MP_ENOMEM);
    bool local = mp_mpi_conn_is_local(x.c) == 1;
    x.local = local;
    x.rqin = x.qin, x.rqout = x.qout;
    if (local && ((rc = mp_mpi_queue_create(0, &x.rqin)) != 0 ||
                  (rc = mp_mpi_queue_create(0, &x.rqout)) != 0))
        die("setup", rc);
    if (local && rank == 0)
        acker[0] = fork_acker(&x, false), acker[1] = fork_acker(&x, true);
    x.len = 8;
    figures(&x, o, local, false);
    x.len = 64 * MIB;
    if ((rc = mp_tensor_empty_shared(MP_UINT8, 1, &n, &x.t)) != 0)
        die("tensor", rc);
    /* Written, as data to send is: MPI reading never-touched pages (the
     * zero page, or a fresh segment's unmapped ones) would time the
     * kernel's page handling, not the transfer. */
    memset(x.buf, 1, 64 * MIB);
    memset(mp_tensor_data(x.t), 1, 64 * MIB);
    figures(&x, o, local, true);
    mp_conn_release(x.lc); /* the ackers see their pipe or queue close and exit */
    if (x.lqin)
        mp_queue_close(x.lqin);
    for (int i = 0; i < 2; i++)
        if (acker[i] > 0)
            waitpid(acker[i], NULL, 0);
    mp_queue_release(x.lqin), mp_queue_release(x.lqout);
    mp_msg_destroy(x.kept);
    mp_tensor_release(x.t);
    mp_queue_release(x.qin), mp_queue_release(x.qout);
    if (local)
        mp_queue_release(x.rqin), mp_queue_release(x.rqout);
    mp_conn_release(x.c);
    free(x.buf);
    return 0;
}

/* Not under mpirun: run the three variants under it, 2 ranks each. */
static int launch(bool quick)
{
    static const char *const variants[][8] = {
        {"-x", "MPROC_MPI_LOCAL=1", "-x", "MPROC_BENCH_VARIANT=shm", NULL},
        {"-x", "MPROC_MPI_LOCAL=0", "-x", "MPROC_BENCH_VARIANT=mpi", NULL},
        {"-x", "MPROC_MPI_LOCAL=0", "-x", "MPROC_BENCH_VARIANT=tcp", "--mca", "btl", "self,tcp",
         NULL},
    };
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        return 1;
    self[len] = 0;
    for (int v = 0; v < 3; v++) {
        const char *args[32];
        int n = 0;
        args[n++] = "mpirun";
        args[n++] = "--oversubscribe";
        args[n++] = "-np";
        args[n++] = "2";
        args[n++] = "--mca";
        args[n++] = "mpi_warn_on_fork";
        args[n++] = "0";
        args[n++] = "--bind-to";
        args[n++] = "none";
        /* One host: TCP over loopback only. An interface that comes and goes
         * (a test's network namespace, a container bridge) otherwise breaks
         * the job when Open MPI picked it at start. */
        args[n++] = "--mca";
        args[n++] = "btl_tcp_if_include";
        args[n++] = "lo";
        args[n++] = "--mca";
        args[n++] = "oob_tcp_if_include";
        args[n++] = "lo";
        if (getuid() == 0)
            args[n++] = "--allow-run-as-root";
        for (int k = 0; k < 8 && variants[v][k]; k++)
            args[n++] = variants[v][k];
        args[n++] = self;
        if (quick)
            args[n++] = "--quick";
        args[n] = NULL;
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            execvp("mpirun", (char **)args);
            fprintf(stderr, "bench_mpi: mpirun not found: install openmpi-bin\n");
            _exit(0);
        }
        int st = 0;
        if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    bench_opts o;
    int rc = bench_parse_args(argc, argv, "mproc's cross-rank pipe beside raw MPI", &o);
    if (rc)
        return rc > 0 ? 0 : 2;
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE")) {
        char asan[1024];
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
        /* Open MPI keeps allocations until exit: in a sanitizer build
         * LeakSanitizer would report them as ours. */
        snprintf(asan, sizeof asan, "%s%sdetect_leaks=0",
                 getenv("ASAN_OPTIONS") ? getenv("ASAN_OPTIONS") : "",
                 getenv("ASAN_OPTIONS") ? ":" : "");
        setenv("ASAN_OPTIONS", asan, 1);
        return launch(o.quick);
    }
    variant = getenv("MPROC_BENCH_VARIANT") ? getenv("MPROC_BENCH_VARIANT") : "default";
    if ((rc = mp_setup(&argc, &argv)) != 0 || (rc = mp_mpi_init(&argc, &argv)) != 0) {
        fprintf(stderr, "bench_mpi: %s\n", mp_last_error());
        return 1;
    }
    if (mp_mpi_size() != 2) {
        if (mp_mpi_rank() == 0)
            fprintf(stderr, "bench_mpi: run with 2 ranks\n");
        mp_mpi_finalize();
        return 2;
    }
    bench_rank(&o);
    mp_mpi_finalize();
    return 0;
}
#endif
