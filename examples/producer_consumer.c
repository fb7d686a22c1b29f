/* Many producers, many consumers, one mp_queue; each message carries one
 * fresh tensor of --size bytes whose checksum travels in the payload.
 *
 *   producer_consumer --producers P --consumers C --count N --size BYTES
 *                     --strategy file_descriptor|file_system
 *                     --start-method fork|spawn|forkserver
 *
 * Consumers verify every checksum and mark every message in a shared table;
 * the program prints messages/s and GB/s and exits non-zero on any loss,
 * duplicate or corruption. Producers and consumers are mproc processes
 * (--start-method fork|spawn|forkserver, default fork), so they die with
 * the parent: killing it leaves no consumer waiting on the queue. */
#include <getopt.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mproc.h>

typedef struct header {
    uint32_t producer;
    uint32_t seq;
    uint64_t checksum;
} header;

static uint64_t fill(uint8_t *p, size_t n, uint64_t seed)
{
    uint64_t sum = 1469598103934665603ull, x = seed * 0x9e3779b97f4a7c15ull + 1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        memcpy(p + i, &x, 8);
        sum = (sum ^ x) * 1099511628211ull;
    }
    for (; i < n; i++) {
        p[i] = (uint8_t)(seed + i);
        sum = (sum ^ p[i]) * 1099511628211ull;
    }
    return sum;
}

static uint64_t checksum(const uint8_t *p, size_t n)
{
    uint64_t sum = 1469598103934665603ull, x;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&x, p + i, 8);
        sum = (sum ^ x) * 1099511628211ull;
    }
    for (; i < n; i++)
        sum = (sum ^ p[i]) * 1099511628211ull;
    return sum;
}

/* What every producer and consumer gets: the run's shape (payload), the
 * queue and the shared table of seen messages (attachments). */
typedef struct params {
    long per;
    int producers;
    size_t size;
    char strategy[32];
} params;

static int produce(mp_queue *q, uint32_t id, long n, size_t size)
{
    int64_t shape[1] = {(int64_t)size};
    for (long i = 0; i < n; i++) {
        mp_tensor *t = NULL;
        mp_msg *m = NULL;
        header h = {id, (uint32_t)i, 0};
        int rc = mp_tensor_empty(MP_UINT8, 1, shape, &t);
        if (rc == 0) {
            h.checksum = fill(mp_tensor_data(t), size, ((uint64_t)id << 32) | (uint64_t)i);
            rc = mp_msg_create(&m);
        }
        if (rc == 0 && (rc = mp_msg_set_payload(m, &h, sizeof h)) == 0 &&
            (rc = mp_msg_add_tensor(m, NULL, t)) == 0)
            rc = mp_queue_put(q, m, 60);
        mp_msg_destroy(m);
        mp_tensor_release(t);
        if (rc) {
            fprintf(stderr, "producer %u: %s: %s\n", id, mp_err_name(rc), mp_last_error());
            return 1;
        }
    }
    return 0;
}

static int consume(mp_queue *q, _Atomic uint8_t *seen, long per, int producers, size_t size)
{
    for (;;) {
        mp_msg *m = NULL;
        mp_tensor *t = NULL;
        header h;
        size_t len = 0;
        const void *p;
        int rc = mp_queue_get(q, &m, 60);
        if (rc == MP_ECLOSED)
            return 0;
        if (rc) {
            fprintf(stderr, "consumer: %s: %s\n", mp_err_name(rc), mp_last_error());
            return 1;
        }
        p = mp_msg_payload(m, &len);
        if (len != sizeof h || mp_msg_get_tensor(m, 0, &t) != 0) {
            fprintf(stderr, "consumer: malformed message\n");
            return 2;
        }
        memcpy(&h, p, sizeof h);
        if (h.producer >= (uint32_t)producers || h.seq >= per ||
            mp_tensor_nbytes(t) != size || checksum(mp_tensor_data(t), size) != h.checksum) {
            fprintf(stderr, "consumer: corrupted message %u/%u\n", h.producer, h.seq);
            return 3;
        }
        atomic_fetch_add(&seen[(size_t)h.producer * (size_t)per + h.seq], 1);
        mp_tensor_release(t);
        mp_msg_destroy(m);
    }
}

/* Unpacks the arguments; fails the child (mp_raise) when they are wrong. */
static void open_args(mp_msg *args, params *pa, mp_queue **q, mp_tensor **seen)
{
    size_t len = 0;
    const void *p = mp_msg_payload(args, &len);
    int rc;
    if (len != sizeof *pa)
        mp_raise("producer_consumer: bad argument message");
    memcpy(pa, p, sizeof *pa);
    pa->strategy[sizeof pa->strategy - 1] = '\0';
    /* a spawned child starts with the default strategy: use the parent's */
    if ((rc = mp_set_sharing_strategy(pa->strategy)) || (rc = mp_msg_get_queue(args, 0, q)) ||
        (rc = mp_msg_get_tensor(args, 1, seen)))
        mp_raise("producer_consumer: arguments: %s (%s)", mp_last_error(), mp_err_name(rc));
}

/* rank: the producer's id. */
MP_ENTRY(producer)
{
    params pa;
    mp_queue *q = NULL;
    mp_tensor *seen = NULL;
    open_args(args, &pa, &q, &seen);
    int rc = produce(q, (uint32_t)rank, pa.per, pa.size);
    mp_tensor_release(seen);
    mp_queue_release(q);
    return rc;
}

MP_ENTRY(consumer)
{
    params pa;
    mp_queue *q = NULL;
    mp_tensor *seen = NULL;
    open_args(args, &pa, &q, &seen);
    int rc = consume(q, mp_tensor_data(seen), pa.per, pa.producers, pa.size);
    mp_tensor_release(seen);
    mp_queue_release(q);
    return rc;
}

static int start_all(const char *entry, int n, mp_msg *args, const char *method,
                     mp_spawn_context **ctx)
{
    mp_spawn_options o;
    int rc;
    mp_spawn_options_init(&o);
    o.nprocs = n;
    o.join = false;
    o.start_method = method;
    rc = mp_spawn_ex(entry, args, &o, ctx);
    if (rc)
        fprintf(stderr, "starting %s processes: %s: %s\n", entry, mp_err_name(rc),
                mp_last_error());
    return rc;
}

static int join_all(mp_spawn_context *ctx, const char *what)
{
    int rc = mp_spawn_context_join(ctx, -1);
    if (rc) {
        mp_child_error e = {.size = sizeof e};
        if (mp_spawn_context_error(ctx, &e) == 0)
            fprintf(stderr, "%s %d failed (exit code %d%s%s)\n", what, e.rank, e.exitcode,
                    e.message[0] ? ": " : "", e.message);
        else
            fprintf(stderr, "%s: %s: %s\n", what, mp_err_name(rc), mp_last_error());
    }
    mp_spawn_context_destroy(ctx);
    return rc ? 1 : 0;
}

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [--producers P] [--consumers C] [--count N]\n"
            "         [--size BYTES] [--strategy file_descriptor|file_system]\n"
            "         [--start-method fork|spawn|forkserver]\n"
            "  P and C from 1 to 256 (default 2 each), N messages in all, at least P\n"
            "  (default 100000), BYTES per tensor (default 4096)\n",
            argv0);
}

int main(int argc, char **argv)
{
    int producers = 2, consumers = 2, bad, opt;
    long count = 100000, lost = 0, dups = 0;
    size_t size = 4096;
    const char *strategy = "file_descriptor", *method = "fork";
    static const struct option opts[] = {
        {"producers", 1, 0, 'p'}, {"consumers", 1, 0, 'c'}, {"count", 1, 0, 'n'},
        {"size", 1, 0, 's'}, {"strategy", 1, 0, 'S'}, {"start-method", 1, 0, 'm'},
        {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    /* spawned producers and consumers run their entry from here */
    if (mp_setup(&argc, &argv) != 0) {
        fprintf(stderr, "%s\n", mp_last_error());
        return 1;
    }
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'p': producers = atoi(optarg); break;
        case 'c': consumers = atoi(optarg); break;
        case 'n': count = atol(optarg); break;
        case 's': size = (size_t)atol(optarg); break;
        case 'S': strategy = optarg; break;
        case 'm': method = optarg; break;
        case 'h': usage(stdout, argv[0]); return 0;
        default: usage(stderr, argv[0]); return 2;
        }
    }
    if (optind < argc || producers < 1 || consumers < 1 || count < producers || size < 1 ||
        producers > 256 || consumers > 256 || strlen(strategy) >= sizeof ((params *)0)->strategy) {
        usage(stderr, argv[0]);
        return 2;
    }
    if (mp_set_sharing_strategy(strategy) != 0) {
        fprintf(stderr, "%s\n", mp_last_error());
        return 2;
    }
    params pa = {.per = count / producers, .producers = producers, .size = size};
    snprintf(pa.strategy, sizeof pa.strategy, "%s", strategy);
    size_t cells = (size_t)pa.per * (size_t)producers;
    int64_t ncells = (int64_t)cells;
    mp_tensor *seen_t = NULL;
    mp_queue *q = NULL;
    mp_msg *args = NULL;
    mp_spawn_context *cons = NULL, *prod = NULL;
    struct timespec t0, t1;
    if (mp_tensor_empty_shared(MP_UINT8, 1, &ncells, &seen_t) != 0 ||
        mp_queue_create(1024, &q) != 0 || mp_msg_create(&args) != 0 ||
        mp_msg_set_payload(args, &pa, sizeof pa) != 0 || mp_msg_add_queue(args, "q", q) != 0 ||
        mp_msg_add_tensor(args, "seen", seen_t) != 0) {
        fprintf(stderr, "setup failed: %s\n", mp_last_error());
        return 1;
    }
    _Atomic uint8_t *seen = mp_tensor_data(seen_t);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (start_all("consumer", consumers, args, method, &cons))
        return 1;
    if (start_all("producer", producers, args, method, &prod)) {
        mp_spawn_context_destroy(cons);
        return 1;
    }
    mp_msg_destroy(args);
    bad = join_all(prod, "producer");
    mp_queue_close(q);
    bad |= join_all(cons, "consumer");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (size_t i = 0; i < cells; i++) {
        lost += seen[i] == 0;
        dups += seen[i] > 1;
    }
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("%s: %d producers, %d consumers, %zu messages of %zu bytes\n"
           "  in %.3f s: %.0f messages/s, %.3f GB/s; lost %ld, duplicated %ld\n",
           strategy, producers, consumers, cells, size, s, (double)cells / s,
           (double)cells * (double)size / s / 1e9, lost, dups);
    mp_tensor_release(seen_t);
    mp_queue_release(q);
    return bad || lost || dups ? 1 : 0;
}
