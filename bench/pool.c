/* bench_pool: per-task cost of the pool beside one raw request/response
 * round trip over a socketpair to a forked child, in the same run.
 *
 *   pool map, 100k trivial tasks, chunksize 1        vs socketpair round trip
 *   pool map, 100k trivial tasks, default chunksize  vs socketpair round trip
 *   pool map_array, 100k int64, default chunksize    vs socketpair round trip
 *
 * The ratio is the pool's time per task over one raw round trip. */
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

typedef struct ctx {
    mp_pool *pool;
    mp_msg **in, **out;
    int64_t *ain, *aout;
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

    bench_opts few = o; /* 100k tasks a repetition: three are plenty */
    if (few.reps > 3)
        few.reps = 3;
    double raw = bench_measure_us(run_raw, &c, c.n, &few);
    bench_unpin();
    c.chunksize = 1;
    double m1 = bench_measure_us(run_map, &c, c.n, &few);
    c.chunksize = 0;
    double md = bench_measure_us(run_map, &c, c.n, &few);
    double ma = bench_measure_us(run_array, &c, c.n, &few);
    if (raw < 0 || m1 < 0 || md < 0 || ma < 0)
        return 1;
    bench_emit("pool map, trivial task, chunksize 1", m1, "socketpair round trip", raw);
    bench_emit("pool map, trivial task, default chunksize", md, "socketpair round trip", raw);
    bench_emit("pool map_array int64, default chunksize", ma, "socketpair round trip", raw);
    fprintf(stderr, "per task: chunksize 1 %.2f us, default %.3f us, map_array %.3f us; "
            "raw round trip %.2f us (2 workers, %zu tasks)\n", m1, md, ma, raw, c.n);

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
