/* "Send the buffers back" (PyTorch's multiprocessing best practices): a
 * worker fills a few buffers and sends them to the consumer, which uses each
 * and returns it through a second queue for the worker to refill. Only the
 * first send of each buffer copies it into shared memory; every later
 * message reuses the shared storage.
 *
 *   buffer_reuse [--buffers K] [--messages N] [--size BYTES]
 *                [--strategy file_descriptor|file_system]
 *
 * Prints how many copies into shared memory happened, and exits non-zero
 * unless that is one per buffer; then the time per message once every
 * buffer went round (both strategies keep them mapped on both sides:
 * docs/tensor.md, "Handoff without an fd" and "Kept mappings"). The worker
 * is an mproc process (started with fork, the default), so it dies with the
 * consumer. */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mproc.h>

static int fail(const char *who, int rc)
{
    fprintf(stderr, "%s: %s: %s\n", who, mp_err_name(rc), mp_last_error());
    return 1;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* This process's copies into shared memory so far (mp_tensor_stats_get). */
static uint64_t shared_copies(void)
{
    mp_tensor_stats st = {.size = sizeof st};
    return mp_tensor_stats_get(&st) == 0 ? st.shared_copies : 0;
}

/* Worker: K private buffers first, then whatever comes back on `free_q`. */
static int worker(mp_queue *full_q, mp_queue *free_q, int k, long n, int64_t elems)
{
    uint64_t copies0 = shared_copies();
    for (long i = 0; i < n; i++) {
        mp_tensor *buf = NULL;
        int rc = i < k ? mp_tensor_empty(MP_INT64, 1, &elems, &buf)
                       : mp_queue_get_tensor(free_q, &buf, 30);
        if (rc)
            return fail("worker: getting a buffer", rc);
        int64_t *d = mp_tensor_data(buf);
        for (int64_t j = 0; j < elems; j++)
            d[j] = i * 1000003 + j;
        if ((rc = mp_queue_put_tensor(full_q, buf, 30)))
            return fail("worker: put", rc);
        mp_tensor_release(buf);
    }
    uint64_t copies = shared_copies() - copies0;
    printf("worker: %ld messages over %d buffers: %llu copies into shared memory\n"
           "  (%s)\n", n, k, (unsigned long long)copies,
           copies == (uint64_t)k ? "one per buffer" : "WRONG: expected one per buffer");
    return copies == (uint64_t)k ? 0 : 1;
}

typedef struct worker_args {
    int k;
    long n;
    int64_t elems;
} worker_args;

/* The worker process: its queues and sizes come in the argument message. */
MP_ENTRY(buffer_worker)
{
    worker_args wa;
    size_t len = 0;
    const void *p = mp_msg_payload(args, &len);
    mp_queue *full_q = NULL, *free_q = NULL;
    int rc;
    if (len != sizeof wa)
        mp_raise("buffer_worker: bad argument message");
    memcpy(&wa, p, sizeof wa);
    if (mp_msg_get_queue(args, 0, &full_q) || mp_msg_get_queue(args, 1, &free_q))
        mp_raise("buffer_worker: %s", mp_last_error());
    rc = worker(full_q, free_q, wa.k, wa.n, wa.elems);
    mp_queue_release(full_q);
    mp_queue_release(free_q);
    return rc;
}

/* Starts the worker with the two queues; 0 or an error code. */
static int start_worker(mp_queue *full_q, mp_queue *free_q, worker_args wa, mp_process **out)
{
    mp_msg *args = NULL;
    int rc = mp_msg_create(&args);
    if (!rc)
        rc = mp_msg_set_payload(args, &wa, sizeof wa);
    if (!rc)
        rc = mp_msg_add_queue(args, "full", full_q);
    if (!rc)
        rc = mp_msg_add_queue(args, "free", free_q);
    if (!rc)
        rc = mp_process_create("buffer_worker", args, NULL, out);
    if (!rc && (rc = mp_process_start(*out)) != 0) {
        mp_process_destroy(*out);
        *out = NULL;
    }
    mp_msg_destroy(args);
    return rc;
}

int main(int argc, char **argv)
{
    int k = 4, opt, code = -1, bad = 0;
    mp_process *proc = NULL;
    long n = 2000;
    int64_t size = 1 << 20;
    double start = 0;
    const char *strategy = "file_descriptor";
    static const struct option opts[] = {
        {"buffers", 1, 0, 'k'}, {"messages", 1, 0, 'n'}, {"size", 1, 0, 's'},
        {"strategy", 1, 0, 'S'}, {"help", 0, 0, 'h'},    {0, 0, 0, 0}};
    const char *use = "usage: %s [--buffers K] [--messages N] [--size BYTES]\n"
                      "       [--strategy file_descriptor|file_system]\n"
                      "  K buffers in the ring (default 4), N messages, at least K (default\n"
                      "  2000), BYTES per buffer, at least 8 (default 1048576), the sharing\n"
                      "  strategy (default file_descriptor)\n";
    if (mp_setup(&argc, &argv) != 0)
        return fail("mp_setup", MP_EINVAL);
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'k': k = atoi(optarg); break;
        case 'n': n = atol(optarg); break;
        case 's': size = atol(optarg); break;
        case 'S': strategy = optarg; break;
        case 'h': printf(use, argv[0]); return 0;
        default: fprintf(stderr, use, argv[0]); return 2;
        }
    }
    if (optind < argc || k < 1 || n < k || size < 8) {
        fprintf(stderr, use, argv[0]);
        return 2;
    }
    int64_t elems = size / 8;
    if (mp_set_sharing_strategy(strategy) != 0) /* the forked worker inherits it */
        return fail("--strategy", MP_EINVAL);
    mp_queue *full_q = NULL, *free_q = NULL;
    int rc = mp_queue_create(0, &full_q);
    if (rc || (rc = mp_queue_create(0, &free_q)))
        return fail("main", rc);
    uint64_t copies0 = shared_copies();
    if ((rc = start_worker(full_q, free_q, (worker_args){k, n, elems}, &proc)))
        return fail("starting the worker", rc);
    for (long i = 0; i < n && !bad; i++) {
        mp_tensor *buf = NULL;
        if (i == 2 * k)
            start = now(); /* every buffer went round twice */
        if ((rc = mp_queue_get_tensor(full_q, &buf, 30))) {
            bad = fail("consumer: get", rc);
            break;
        }
        const int64_t *d = mp_tensor_data(buf);
        if (d[0] != i * 1000003 || d[elems - 1] != i * 1000003 + elems - 1) {
            fprintf(stderr, "consumer: message %ld has the wrong contents\n", i);
            bad = 1;
        }
        /* Give it back; the last K stay with us as the worker stops. */
        if (i + k < n && (rc = mp_queue_put_tensor(free_q, buf, 30)))
            bad = fail("consumer: returning a buffer", rc);
        mp_tensor_release(buf);
    }
    double per_message = !bad && n > 2 * k ? (now() - start) / (double)(n - 2 * k) : 0;
    if (bad)
        mp_process_terminate(proc); /* it may wait for buffers that never come */
    if (mp_process_join(proc, -1) != 0 || mp_process_exitcode(proc, &code) != 0 || code != 0)
        bad = 1;
    mp_process_destroy(proc);
    printf("consumer: %ld messages of %lld bytes checked, %llu copies into shared\n"
           "  memory here\n", n, (long long)size,
           (unsigned long long)(shared_copies() - copies0));
    if (per_message > 0)
        printf("  %.1f us per message (%s), once each buffer went round twice\n",
               per_message * 1e6, strategy);
    mp_queue_release(full_q);
    mp_queue_release(free_q);
    return bad;
}
