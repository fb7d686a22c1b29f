/* Many producers, many consumers, one Queue, under each strategy: every
 * message carries a fresh private tensor whose bytes encode who sent it;
 * consumers check the bytes and mark a shared table, and the parent checks
 * that each message arrived exactly once, and FIFO per producer as seen by
 * each consumer. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mp_test.h"

#define P 4
#define C 4
#define ELEMS 16
#define MPMC_DEFAULT 50000 /* per strategy; MP_MPMC_COUNT=100000 for the full run */

static int total_messages(void)
{
    const char *s = getenv("MP_MPMC_COUNT");
    return s ? atoi(s) : MPMC_DEFAULT;
}

static int setup(void **state) { return mp_test_setup(state); }
static int teardown(void **state)
{
    mp_set_sharing_strategy("file_descriptor");
    return mp_test_teardown(state);
}

static int produce(mp_queue *q, uint32_t p, int n)
{
    int64_t shape[1] = {ELEMS};
    for (int i = 0; i < n; i++) {
        mp_tensor *t = NULL;
        uint32_t *d;
        if (mp_tensor_empty(MP_UINT32, 1, shape, &t))
            return 1;
        d = mp_tensor_data(t);
        for (int k = 0; k < ELEMS; k++)
            d[k] = p * 0x9e3779b9u ^ (uint32_t)i * 31u ^ (uint32_t)k;
        d[0] = p;
        d[1] = (uint32_t)i;
        if (mp_queue_put_tensor(q, t, 30))
            return 2;
        mp_tensor_release(t);
    }
    return 0;
}

static int consume(mp_queue *q, _Atomic uint8_t *seen, int per_producer)
{
    int last[P];
    for (int p = 0; p < P; p++)
        last[p] = -1;
    for (;;) {
        mp_tensor *t = NULL;
        const uint32_t *d;
        int rc = mp_queue_get_tensor(q, &t, 30);
        if (rc == MP_ECLOSED)
            return 0;
        if (rc)
            return 3;
        d = mp_tensor_data(t);
        if (mp_tensor_numel(t) != ELEMS || d[0] >= P || d[1] >= (uint32_t)per_producer)
            return 4;
        for (int k = 2; k < ELEMS; k++)
            if (d[k] != (d[0] * 0x9e3779b9u ^ d[1] * 31u ^ (uint32_t)k))
                return 5;   /* corrupted */
        if ((int)d[1] <= last[d[0]])
            return 6;       /* out of order for this producer */
        last[d[0]] = (int)d[1];
        atomic_fetch_add(&seen[d[0] * (uint32_t)per_producer + d[1]], 1);
        mp_tensor_release(t);
    }
}

static void run_mpmc(const char *strategy)
{
    int n = total_messages() / P, status;
    size_t bytes = (size_t)P * (size_t)n;
    _Atomic uint8_t *seen = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pid_t prod[P], cons[C];
    mp_queue *q = NULL;
    assert_true(seen != MAP_FAILED);
    assert_mp_ok(mp_set_sharing_strategy(strategy));
    assert_mp_ok(mp_queue_create(256, &q));
    for (int c = 0; c < C; c++)
        if ((cons[c] = fork()) == 0)
            _exit(consume(q, seen, n));
    for (int p = 0; p < P; p++)
        if ((prod[p] = fork()) == 0)
            _exit(produce(q, (uint32_t)p, n));
    for (int p = 0; p < P; p++) {
        assert_int_equal(waitpid(prod[p], &status, 0), prod[p]);
        if (status != 0)
            fail_msg("producer %d: status 0x%x", p, status);
    }
    assert_mp_ok(mp_queue_close(q));
    for (int c = 0; c < C; c++) {
        assert_int_equal(waitpid(cons[c], &status, 0), cons[c]);
        if (status != 0)
            fail_msg("consumer %d: status 0x%x", c, status);
    }
    for (size_t i = 0; i < bytes; i++)
        if (seen[i] != 1)
            fail_msg("message %zu of producer %zu arrived %u times", i % (size_t)n,
                     i / (size_t)n, (unsigned)seen[i]);
    munmap((void *)seen, bytes);
    mp_queue_release(q);
}

static void test_mpmc_fd(void **state) { (void)state; run_mpmc("file_descriptor"); }
static void test_mpmc_fs(void **state) { (void)state; run_mpmc("file_system"); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_mpmc_fd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mpmc_fs, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
