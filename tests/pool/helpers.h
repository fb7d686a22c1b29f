/* Tasks and helpers shared by the tests in tests/pool. Each test binary
 * registers the same tasks (MP_TASK runs at load time in every binary). */
#ifndef MP_POOL_TEST_HELPERS_H
#define MP_POOL_TEST_HELPERS_H

#include "mp_test.h"
#include "os/os.h"
#include "pool/pool_internal.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mproc/pool.h"

static inline int setup(void **state) { return mp_test_setup(state); }
static inline int teardown(void **state) { return mp_test_teardown(state); }

/* ---- tasks ------------------------------------------------------------------- */

typedef struct span {
    double start, end;
    int32_t pid;
    int64_t value;
} span;

static inline int64_t in_i64(const mp_msg *in)
{
    int64_t v = 0;
    size_t len;
    const void *p = mp_msg_payload(in, &len);
    if (len >= sizeof v)
        memcpy(&v, p, sizeof v);
    return v;
}

static inline mp_msg *msg_i64(int64_t v)
{
    mp_msg *m;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_set_payload(m, &v, sizeof v));
    return m;
}

static inline span out_span(const mp_msg *m)
{
    span s;
    size_t len;
    const void *p = mp_msg_payload(m, &len);
    assert_int_equal(len, sizeof s);
    memcpy(&s, p, sizeof s);
    return s;
}

MP_TASK(square)
{
    int64_t v = in_i64(in);
    v *= v;
    return mp_msg_set_payload(out, &v, sizeof v);
}

/* Sleeps `value` milliseconds and reports when and where it ran. */
MP_TASK(nap_ms)
{
    span s = {mp__now(), 0, getpid(), in_i64(in)};
    struct timespec ts = {(time_t)(s.value / 1000), (long)(s.value % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    s.end = mp__now();
    return mp_msg_set_payload(out, &s, sizeof s);
}

MP_TASK(whoami)
{
    span s = {0, 0, getpid(), in_i64(in)};
    return mp_msg_set_payload(out, &s, sizeof s);
}

MP_TASK(crash)
{
    raise((int)in_i64(in));
    return 0;
}

MP_TASK(refuse)
{
    return mp__error(MP_EINVAL, "refuse: %lld is not welcome", (long long)in_i64(in));
}

MP_TASK(star_sum)
{
    int n = mp_task_nargs(in);
    int64_t sum = 0;
    for (int j = 0; j < n; j++) {
        mp_msg *a;
        int rc = mp_task_arg(in, (size_t)j, &a);
        if (rc)
            return rc;
        sum = sum * 10 + in_i64(a);
        mp_msg_destroy(a);
    }
    return n < 0 ? n : mp_msg_set_payload(out, &sum, sizeof sum);
}

MP_TASK(raiser)
{
    mp_raise("bad input %lld", (long long)in_i64(in));
}

/* The initializer stores its argument; read_init hands it back. */
static int64_t init_value = -1; /* in a worker: set by pool_init */

MP_ENTRY(pool_init)
{
    init_value = in_i64(args) + rank * 0;
    if (init_value == 666)
        mp_raise("pool_init refuses %lld", (long long)init_value);
    return 0;
}

MP_TASK(read_init)
{
    return mp_msg_set_payload(out, &init_value, sizeof init_value);
}

/* Doubles the attached "x" in place (its shared pages) and answers with a
 * new shared tensor "y" = x + 1. */
MP_TASK(tensor_inc)
{
    mp_tensor *x, *y;
    int64_t n;
    int rc = mp_msg_find_tensor(in, "x", &x);
    if (rc)
        return rc;
    n = mp_tensor_numel(x);
    rc = mp_tensor_empty_shared(MP_FLOAT32, 1, &n, &y);
    if (!rc) {
        float *xs = mp_tensor_data(x), *ys = mp_tensor_data(y);
        for (int64_t i = 0; i < n; i++) {
            xs[i] *= 2;
            ys[i] = xs[i] + 1;
        }
        rc = mp_msg_add_tensor(out, "y", y);
        mp_tensor_release(y);
    }
    mp_tensor_release(x);
    return rc;
}

MP_TASK(twice_double)
{
    double d;
    size_t len;
    memcpy(&d, mp_msg_payload(in, &len), sizeof d);
    d *= 2;
    return mp_msg_set_payload(out, &d, sizeof d);
}

/* ---- helpers ------------------------------------------------------------------- */

static inline mp_pool *pool_new_method(int n, unsigned maxtasks, const char *method)
{
    mp_pool_options o;
    mp_pool *p;
    mp_pool_options_init(&o);
    o.maxtasksperchild = maxtasks;
    o.start_method = method;
    assert_mp_ok(mp_pool_create(n, &o, &p));
    return p;
}

static inline mp_pool *pool_new(int n, unsigned maxtasks)
{
    return pool_new_method(n, maxtasks, NULL);
}

static inline span apply_span(mp_pool *p, const char *task, int64_t v)
{
    mp_msg *in = msg_i64(v), *out;
    assert_mp_ok(mp_pool_apply(p, task, in, &out));
    span s = out_span(out);
    mp_msg_destroy(in);
    mp_msg_destroy(out);
    return s;
}

static inline bool overlap(span a, span b) { return a.start < b.end && b.start < a.end; }


static inline void check_map(mp_pool *p, size_t chunksize)
{
    enum { N = 10 };
    mp_msg *in[N], *out[N];
    for (int i = 0; i < N; i++)
        in[i] = msg_i64(i + 1);
    assert_mp_ok(mp_pool_map(p, "square", (const mp_msg *const *)in, N, chunksize, out));
    for (int i = 0; i < N; i++) {
        assert_int_equal(in_i64(out[i]), (int64_t)(i + 1) * (i + 1));
        mp_msg_destroy(out[i]);
        mp_msg_destroy(in[i]);
    }
}

static inline void check_crash(mp_pool *p, int sig, const char *name)
{
    mp_msg *in = msg_i64(sig), *out = NULL;
    int32_t before = apply_span(p, "whoami", 0).pid;
    assert_mp_err(mp_pool_apply(p, "crash", in, &out), MP_ECHILD);
    if (!strstr(mp_last_error(), name))
        fail_msg("%s", mp_last_error());
    assert_non_null(strstr(mp_last_error(), "crash"));
    assert_null(out);
    mp_msg_destroy(in);
    (void)before;
}

/* The start of each test binary's main: mp_setup (spawned workers run from
 * there), then a warm-up of what the leak snapshots would otherwise catch
 * growing: a thread stack in glibc's cache, the allocator's first regions. */
static inline int pool_tests_begin(int *argc, char ***argv)
{
    mp_pool *p;
    if (mp_setup(argc, argv) != 0)
        return 1;
    if (mp_pool_create(1, NULL, &p) == 0)
        mp_pool_destroy(p);
    return 0;
}

#endif
