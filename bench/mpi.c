/* MPI benchmarks: mproc's cross-rank pipe beside raw MPI_Send/MPI_Recv
 * between two ranks, in the same job:
 *
 *  - small-message latency: one-way trip of an 8-byte message (ping-pong
 *    round trip / 2), mp_mpi_conn_send/recv beside MPI_Send/MPI_Recv;
 *  - 64 MiB bandwidth: a 64 MiB tensor through the conn (received into a
 *    fresh shared-memory tensor) beside MPI_Send/MPI_Recv of 64 MiB into a
 *    preallocated buffer; one 1-byte acknowledgement per transfer, both;
 *  - same-host handoff (default transports only): a 64 MiB shared tensor
 *    echoed over the cross-rank conn's local path beside the same over a
 *    plain mp_pipe to a forked mproc process (the local path itself).
 *
 * Run directly (make bench, bench_all), it runs itself twice under mpirun
 * with 2 ranks: Open MPI's default transports with the same-host path on,
 * then TCP only with the same-host path off (MPROC_MPI_LOCAL=0), which is
 * what crosses hosts. Built without MPI it measures nothing (a skip). */
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
static const char *variant; /* "shm" or "tcp", for the op names */

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_mpi: rank %d: %s: %s: %s\n", rank, what, mp_err_name(rc),
            mp_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
}

typedef struct ctx {
    mp_mpi_conn *c;
    mp_conn *lc; /* the plain pipe to the forked echo process (rank 0) */
    mp_tensor *t;
    char *buf;
    size_t len;
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

static int raw_bandwidth(void *p, size_t iters)
{
    ctx *x = p;
    char ack = 0;
    for (size_t i = 0; i < iters; i++) {
        if (rank == 0) {
            MPI_Send(x->buf, (int)x->len, MPI_BYTE, 1, 8, MPI_COMM_WORLD);
            MPI_Recv(&ack, 1, MPI_BYTE, 1, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(x->buf, (int)x->len, MPI_BYTE, 0, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(&ack, 1, MPI_BYTE, 0, 9, MPI_COMM_WORLD);
        }
    }
    return 0;
}

/* ---- mproc --------------------------------------------------------------- */

static int conn_pingpong(void *p, size_t iters)
{
    ctx *x = p;
    mp_msg *m = NULL;
    int rc = mp_msg_create(&m);
    if (rc == 0)
        rc = mp_msg_set_payload(m, x->buf, x->len);
    for (size_t i = 0; i < iters && rc == 0; i++) {
        mp_msg *in = NULL;
        if (rank == 0) {
            if ((rc = mp_mpi_conn_send(x->c, m, -1)) == 0)
                rc = mp_mpi_conn_recv(x->c, &in, -1);
        } else if ((rc = mp_mpi_conn_recv(x->c, &in, -1)) == 0) {
            rc = mp_mpi_conn_send(x->c, in, -1);
        }
        mp_msg_destroy(in);
    }
    mp_msg_destroy(m);
    if (rc)
        die("conn ping-pong", rc);
    return 0;
}

/* Rank 0 sends the tensor, rank 1 receives it (a new shared tensor each
 * time across hosts, a handle on one host) and acknowledges. */
static int conn_bandwidth(void *p, size_t iters)
{
    ctx *x = p;
    int rc = 0;
    for (size_t i = 0; i < iters && rc == 0; i++) {
        mp_msg *m = NULL;
        if (rank == 0) {
            if ((rc = mp_msg_create(&m)) == 0 && (rc = mp_msg_add_tensor(m, NULL, x->t)) == 0)
                rc = mp_mpi_conn_send(x->c, m, -1);
            mp_msg_destroy(m), m = NULL;
            if (rc == 0)
                rc = mp_mpi_conn_recv(x->c, &m, -1);
        } else if ((rc = mp_mpi_conn_recv(x->c, &m, -1)) == 0) {
            mp_msg_destroy(m), m = NULL;
            if ((rc = mp_msg_create(&m)) == 0)
                rc = mp_mpi_conn_send(x->c, m, -1);
        }
        mp_msg_destroy(m);
    }
    if (rc)
        die("conn bandwidth", rc);
    return 0;
}

/* The local path itself: the same 64 MiB message to a forked process over
 * a plain mp_pipe, and its acknowledgement. */
static int local_bandwidth(void *p, size_t iters)
{
    ctx *x = p;
    int rc = 0;
    for (size_t i = 0; i < iters && rc == 0; i++) {
        mp_msg *m = NULL;
        if ((rc = mp_msg_create(&m)) == 0 && (rc = mp_msg_add_tensor(m, NULL, x->t)) == 0)
            rc = mp_conn_send(x->lc, m, -1);
        mp_msg_destroy(m), m = NULL;
        if (rc == 0)
            rc = mp_conn_recv(x->lc, &m, -1);
        mp_msg_destroy(m);
    }
    if (rc)
        die("local pipe bandwidth", rc);
    return 0;
}

/* Rank 0's helper for the local-path figures: a forked mproc process that
 * answers every message with an empty one. Forked before the 64 MiB tensor
 * exists, so it maps each received segment as rank 1 does. */
static pid_t fork_acker(mp_conn **keep)
{
    mp_conn *a = NULL, *b = NULL;
    int rc = mp_pipe(true, &a, &b);
    if (rc)
        die("mp_pipe", rc);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        bench_unpin(); /* the parent's pin to CPU 0 came along */
        bench_pin_cpu(1); /* where rank 1 runs: both figures cross cores */
        mp_conn_close(a);
        for (;;) {
            mp_msg *m = NULL, *ack = NULL;
            if (mp_conn_recv(b, &m, -1) != 0)
                _exit(0);
            mp_msg_destroy(m);
            if (mp_msg_create(&ack) != 0 || mp_conn_send(b, ack, -1) != 0)
                _exit(1);
            mp_msg_destroy(ack);
        }
    }
    mp_conn_release(b);
    *keep = a;
    return pid;
}

static int local_pingpong(void *p, size_t iters)
{
    ctx *x = p;
    mp_msg *m = NULL;
    int rc = mp_msg_create(&m);
    if (rc == 0)
        rc = mp_msg_set_payload(m, x->buf, 8);
    for (size_t i = 0; i < iters && rc == 0; i++) {
        mp_msg *in = NULL;
        if ((rc = mp_conn_send(x->lc, m, -1)) == 0)
            rc = mp_conn_recv(x->lc, &in, -1);
        mp_msg_destroy(in);
    }
    mp_msg_destroy(m);
    if (rc)
        die("local ping-pong", rc);
    return 0;
}

static void emit(const char *op, double mproc_us, const char *prim, double prim_us)
{
    char name[128];
    snprintf(name, sizeof name, "%s (%s)", op, variant);
    if (rank == 0)
        bench_emit(name, mproc_us, prim, prim_us);
}

static int bench_rank(const bench_opts *o)
{
    ctx x = {0};
    int64_t n = (int64_t)(64 * MIB);
    pid_t acker = -1;
    int rc;
    rank = mp_mpi_rank();
    bench_pin_cpu(rank); /* mpirun runs us with --bind-to none */
    x.buf = calloc(1, 64 * MIB);
    if (!x.buf || (rc = mp_mpi_pipe(rank ^ 1, &x.c)) != 0)
        die("setup", x.buf ? rc : MP_ENOMEM);
    bool local = mp_mpi_conn_is_local(x.c);
    if (local && rank == 0)
        acker = fork_acker(&x.lc);
    x.len = 8;
    double raw = bench_measure_us(raw_pingpong, &x, bench_iters(o, 20000), o) / 2;
    double own = bench_measure_us(conn_pingpong, &x, bench_iters(o, 20000), o) / 2;
    emit("mpi conn 8 B one-way latency", own, "MPI_Send/MPI_Recv 8 B", raw);
    if (local && rank == 0) {
        double l = bench_measure_us(local_pingpong, &x, bench_iters(o, 20000), o) / 2;
        emit("mpi conn 8 B one-way latency, same host", own, "mp_pipe 8 B one-way", l);
    }
    x.len = 64 * MIB;
    if ((rc = mp_tensor_empty_shared(MP_UINT8, 1, &n, &x.t)) != 0)
        die("tensor", rc);
    raw = bench_measure_us(raw_bandwidth, &x, bench_iters(o, 10), o);
    own = bench_measure_us(conn_bandwidth, &x, bench_iters(o, 10), o);
    emit(local ? "mpi conn 64 MiB tensor, same host" : "mpi conn 64 MiB tensor transfer", own,
         "MPI_Send/MPI_Recv 64 MiB", raw);
    if (local && rank == 0) {
        double l = bench_measure_us(local_bandwidth, &x, bench_iters(o, 10), o);
        emit("mpi conn 64 MiB handoff, same host", own, "mp_pipe 64 MiB handoff", l);
    }
    if (rank == 0)
        fprintf(stderr, "bench_mpi (%s): 64 MiB: raw MPI %.0f MiB/s, mproc conn %.0f MiB/s\n",
                variant, 64e6 / raw / 1.048576, 64e6 / own / 1.048576);
    mp_conn_release(x.lc);
    if (acker > 0)
        waitpid(acker, NULL, 0);
    mp_tensor_release(x.t);
    mp_mpi_conn_destroy(x.c);
    free(x.buf);
    return 0;
}

/* Not under mpirun: run both variants under it, 2 ranks each. */
static int launch(char **argv, bool quick)
{
    static const char *const variants[][6] = {
        {"-x", "MPROC_MPI_LOCAL=1", "-x", "MPROC_BENCH_VARIANT=shm", NULL},
        {"-x", "MPROC_MPI_LOCAL=0", "-x", "MPROC_BENCH_VARIANT=tcp", "--mca", "btl"},
    };
    for (int v = 0; v < 2; v++) {
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
        if (getuid() == 0)
            args[n++] = "--allow-run-as-root";
        for (int k = 0; k < 6 && variants[v][k]; k++)
            args[n++] = variants[v][k];
        if (v == 1)
            args[n++] = "self,tcp";
        args[n++] = "/proc/self/exe";
        char self[4096];
        ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
        if (len <= 0)
            return 1;
        self[len] = 0;
        args[n - 1] = self;
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
    (void)argv;
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
        return launch(argv, o.quick);
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
