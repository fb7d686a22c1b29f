/* bench_pool: per-task cost of the pool beside one raw request/response
 * round trip over a socketpair to a forked child, in the same run.
 *
 *   pool map, 100k trivial tasks, chunksize 1        vs socketpair round trip
 *   pool map, 100k trivial tasks, default chunksize  vs socketpair round trip
 *   pool map_array, 100k int64, default chunksize    vs socketpair round trip
 *   pool map_array of an array task (int64 squares), 10M items, 2 workers
 *                                                    vs the same loop in this process
 *
 * The ratio is the pool's time per task over one raw round trip; for the
 * array task, over the time per item of one process squaring in place
 * (memory speed: below 1 means the two workers beat one core). */
#include "bench.h"
#include "mproc.h"
#include "mproc/pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

MP_TASK(bench_noop)
{
    size_t len;
    const void *p = mp_msg_payload(in, &len);
    return mp_msg_set_payload(out, p, len);
}

MP_ARRAY_TASK(bench_squares)
{
    const int64_t *x = in;
    int64_t *y = out;
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] * x[i];
    return 0;
}

typedef struct ctx {
    mp_pool *pool;
    mp_msg **in, **out;
    int64_t *ain, *aout, *vin, *vout;
    size_t n, chunksize;
    int sock;
} ctx;

static int run_map(void *arg, size_t iters)
{
    ctx *c = arg;
    if (mp_pool_map(c->pool, "bench_noop", (const mp_msg *const *)c->in, iters, c->chunksize,
                    c->out) != 0) {
        fprintf(stderr, "bench_pool: map: %s\n", mp_last_error());
        return 1;
    }
    for (size_t i = 0; i < iters; i++)
        mp_msg_destroy(c->out[i]);
    return 0;
}

static int run_array(void *arg, size_t iters)
{
    ctx *c = arg;
    if (mp_pool_map_array(c->pool, "bench_noop", c->ain, iters, sizeof(int64_t), c->aout,
                          sizeof(int64_t), c->chunksize) != 0) {
        fprintf(stderr, "bench_pool: map_array: %s\n", mp_last_error());
        return 1;
    }
    return 0;
}

static int run_vec(void *arg, size_t iters)
{
    ctx *c = arg;
    if (mp_pool_map_array(c->pool, "bench_squares", c->vin, iters, sizeof(int64_t), c->vout,
                          sizeof(int64_t), 0) != 0) {
        fprintf(stderr, "bench_pool: map_array (array task): %s\n", mp_last_error());
        return 1;
    }
    return 0;
}

/* The primitive of the array task: one process, the same loop and arrays. */
static int run_loop(void *arg, size_t iters)
{
    ctx *c = arg;
    for (size_t i = 0; i < iters; i++)
        c->vout[i] = c->vin[i] * c->vin[i];
    __asm__ volatile("" : : "r"(c->vout) : "memory");
    return 0;
}

static int run_raw(void *arg, size_t iters)
{
    ctx *c = arg;
    int64_t v = 0;
    for (size_t i = 0; i < iters; i++) {
        if (write(c->sock, &v, sizeof v) != sizeof v || read(c->sock, &v, sizeof v) != sizeof v)
            return 1;
    }
    return 0;
}

static pid_t echo_child(int sock, int other)
{
    pid_t pid = fork();
    if (pid == 0) {
        int64_t v;
        bench_pin_cpu(1);
        close(other);
        while (read(sock, &v, sizeof v) == sizeof v)
            if (write(sock, &v, sizeof v) != sizeof v)
                break;
        _exit(0);
    }
    return pid;
}

int main(int argc, char **argv)
{
    bench_opts o;
    ctx c = {0};
    int sv[2], rc = bench_parse_args(argc, argv, "pool per-task cost vs a raw round trip", &o);
    if (rc)
        return rc < 0 ? 2 : 0;
    if (mp_setup(&argc, &argv) != 0)
        return 1;
    c.n = bench_iters(&o, 100000);
    c.in = calloc(c.n, sizeof *c.in);
    c.out = calloc(c.n, sizeof *c.out);
    c.ain = calloc(c.n, sizeof *c.ain);
    c.aout = calloc(c.n, sizeof *c.aout);
    if (!c.in || !c.out || !c.ain || !c.aout || mp_pool_create(2, NULL, &c.pool) != 0) {
        fprintf(stderr, "bench_pool: set-up failed: %s\n", mp_last_error());
        return 1;
    }
    for (size_t i = 0; i < c.n; i++) {
        int64_t v = (int64_t)i;
        c.ain[i] = v;
        if (mp_msg_create(&c.in[i]) || mp_msg_set_payload(c.in[i], &v, sizeof v))
            return 1;
    }
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return 1;
    /* Pinned for the raw round trip only, so that it always crosses cores
     * (see bench_pin_cpu); the pool's dispatcher and workers stay free. */
    if (bench_pin_cpu(0) != 0)
        fprintf(stderr, "bench_pool: not pinned (fewer than 2 CPUs)\n");
    pid_t child = echo_child(sv[1], sv[0]);
    close(sv[1]);
    c.sock = sv[0];

    /* chunksize 1: 100k round trips a repetition, three are plenty; the
     * default-chunksize rows take about 10 ms a repetition and get all of
     * them (as many as Python's side, bench/python/bench_pool_map.py) */
    bench_opts few = o;
    if (few.reps > 3)
        few.reps = 3;
    double raw = bench_measure_us(run_raw, &c, c.n, &few);
    bench_unpin();
    c.chunksize = 1;
    double m1 = bench_measure_us(run_map, &c, c.n, &few);
    c.chunksize = 0;
    double md = bench_measure_us(run_map, &c, c.n, &o);
    double ma = bench_measure_us(run_array, &c, c.n, &o);
    size_t nv = bench_iters(&o, 10000000);
    c.vin = malloc(nv * sizeof *c.vin);
    c.vout = malloc(nv * sizeof *c.vout);
    if (!c.vin || !c.vout)
        return 1;
    for (size_t i = 0; i < nv; i++)
        c.vin[i] = c.vout[i] = (int64_t)i;
    double mv = bench_measure_us(run_vec, &c, nv, &few);
    double lv = bench_measure_us(run_loop, &c, nv, &few);
    if (raw < 0 || m1 < 0 || md < 0 || ma < 0 || mv < 0 || lv < 0)
        return 1;
    bench_set_placement("pool unpinned (cpus %d-%d); its raw round trip: parent on cpu %d, echo "
                        "child on cpu %d", bench_cpu_of_slot(0), bench_cpu_of_slot(1),
                        bench_cpu_of_slot(0), bench_cpu_of_slot(1));
    bench_emit("pool map, trivial task, chunksize 1", m1, "socketpair round trip", raw);
    bench_emit("pool map, trivial task, default chunksize", md, "socketpair round trip", raw);
    bench_emit("pool map_array int64, default chunksize", ma, "socketpair round trip", raw);
    bench_set_placement("pool and the one-process loop unpinned (cpus %d-%d)", bench_cpu_of_slot(0),
                        bench_cpu_of_slot(1));
    bench_emit("pool map_array, array task int64 squares, 10M items", mv,
               "the same loop in one process", lv);
    fprintf(stderr, "per task: chunksize 1 %.2f us (%.0fk/s), default %.3f us (%.2fM/s), "
            "map_array %.3f us; raw round trip %.2f us (2 workers, %zu tasks)\n", m1,
            1e3 / m1, md, 1 / md, ma, raw, c.n);
    fprintf(stderr, "array task: %.1fM items/s; one-process loop %.1fM items/s (%zu items)\n",
            1 / mv, 1 / lv, nv);
    free(c.vin);
    free(c.vout);

    close(c.sock);
    waitpid(child, NULL, 0);
    mp_pool_destroy(c.pool);
    for (size_t i = 0; i < c.n; i++)
        mp_msg_destroy(c.in[i]);
    free(c.in);
    free(c.out);
    free(c.ain);
    free(c.aout);
    return 0;
}
