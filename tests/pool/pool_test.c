/* src/pool: the seed tutorial's scenarios (sleeps scaled down), chunking,
 * callbacks, imap, the typed path and the close/terminate/join lifecycle.
 * Timing is checked through the intervals the tasks report, never through
 * wall-clock bounds. Worker failures and start methods: workers_test.c. */
#include "helpers.h"

/* ---- the tutorial's scenarios ------------------------------------------------- */

static void test_apply_serial_async_parallel(void **state)
{
    mp_pool *p = pool_new(2, 0);
    mp_async_result *r[3];
    mp_msg *in = msg_i64(150);
    const mp_msg *out;
    span s[3];

    /* apply blocks: two calls never overlap */
    s[0] = apply_span(p, "nap_ms", 150);
    s[1] = apply_span(p, "nap_ms", 150);
    assert_true(s[1].start >= s[0].end);

    /* apply_async twice: both run at once, on two workers */
    for (int i = 0; i < 2; i++)
        assert_mp_ok(mp_pool_apply_async(p, "nap_ms", in, NULL, &r[i]));
    for (int i = 0; i < 2; i++) {
        assert_mp_ok(mp_async_result_get(r[i], 10, &out));
        assert_int_equal(mp_async_result_ready(r[i]), 1);
        assert_int_equal(mp_async_result_successful(r[i]), 1);
        s[i] = out_span(out);
    }
    assert_true(overlap(s[0], s[1]));
    assert_int_not_equal(s[0].pid, s[1].pid);
    mp_async_result_release(r[0]);
    mp_async_result_release(r[1]);

    /* three tasks on two workers take two rounds */
    for (int i = 0; i < 3; i++)
        assert_mp_ok(mp_pool_apply_async(p, "nap_ms", in, NULL, &r[i]));
    for (int i = 0; i < 3; i++) {
        assert_mp_ok(mp_async_result_get(r[i], 10, &out));
        s[i] = out_span(out);
        mp_async_result_release(r[i]);
    }
    /* two ran together, and no instant had all three running */
    assert_true(overlap(s[0], s[1]) || overlap(s[0], s[2]) || overlap(s[1], s[2]));
    assert_true(fmax(fmax(s[0].start, s[1].start), s[2].start) >=
                fmin(fmin(s[0].end, s[1].end), s[2].end));
    mp_msg_destroy(in);
    assert_mp_ok(mp_pool_close(p));
    assert_mp_ok(mp_pool_join(p));
    mp_pool_destroy(p);
}

static void test_map_chunksizes(void **state)
{
    mp_pool *p = pool_new(2, 0);
    check_map(p, 1);
    check_map(p, 5);
    check_map(p, 0);
    check_map(p, 100);
    assert_int_equal(mp__pool_chunksize(p, 10, 0, 0), 2);    /* ceil(10 / 8) */
    assert_int_equal(mp__pool_chunksize(p, 1000, 0, 0), 125);
    assert_int_equal(mp__pool_chunksize(p, 3, 0, 0), 1);
    assert_int_equal(mp__pool_chunksize(p, 10, 7, 0), 7);
    assert_int_equal(mp__pool_chunksize(p, 10, 7, 8), 7);
    /* small items: capped so that a chunk travels inline */
    size_t cap = MP__POOL_INLINE_BUDGET / (sizeof(mp__pack_entry) + 8);
    assert_int_equal(mp__pool_chunksize(p, 100000, 0, 8), cap);
    assert_int_equal(mp__pool_chunksize(p, 1000, 0, 8), 125); /* under the cap */
    /* larger items: Python's rule (the cap would leave too few per chunk) */
    assert_int_equal(mp__pool_chunksize(p, 100000, 0, 4096), 12500);
    assert_mp_ok(mp_pool_map(p, "square", NULL, 0, 0, NULL)); /* empty: fine */
    mp_pool_destroy(p);
}

/* A map's results are made in blocks of messages (one allocation each):
 * every one is still the caller's own, destroyed alone, in any order and
 * from any thread, and one may outlive the pool and the other results and
 * be changed like any message. */
typedef struct {
    mp_msg **out;
    size_t from, to;
} drop_range;

static void *drop_odd(void *arg)
{
    drop_range *d = arg;
    for (size_t i = d->from; i < d->to; i += 2)
        mp_msg_destroy(d->out[i]);
    return NULL;
}

static void test_map_results_are_independent(void **state)
{
    enum { N = 2000 };
    static const size_t chunks[] = {0, 300, 7};
    mp_pool *p = pool_new(2, 0);
    mp_msg *in[N], *out[N], *kept = NULL;
    mp_tensor *t;
    int64_t shape[1] = {4};
    char big[40];
    for (int i = 0; i < N; i++)
        in[i] = msg_i64(i);
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        pthread_t th;
        drop_range odd = {out, 1, N};
        assert_mp_ok(mp_pool_map(p, "square", (const mp_msg *const *)in, N, chunks[c], out));
        for (int i = 0; i < N; i++)
            assert_int_equal(in_i64(out[i]), (int64_t)i * i);
        assert_int_equal(pthread_create(&th, NULL, drop_odd, &odd), 0);
        for (int i = N - 2; i >= 0; i -= 2) /* the evens backwards, one kept */
            if (i != 1000 || kept)
                mp_msg_destroy(out[i]);
            else
                kept = out[i];
        assert_int_equal(pthread_join(th, NULL), 0);
    }
    mp_pool_destroy(p);
    assert_int_equal(in_i64(kept), 1000 * 1000);
    memset(big, 'x', sizeof big);
    assert_mp_ok(mp_msg_set_payload(kept, big, sizeof big)); /* outgrows the inline bytes */
    assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 1, shape, &t));
    assert_mp_ok(mp_msg_add_tensor(kept, "t", t));
    mp_tensor_release(t);
    assert_int_equal(mp_msg_count(kept), 1);
    mp_msg_destroy(kept);
    for (int i = 0; i < N; i++)
        mp_msg_destroy(in[i]);
}

static void test_starmap(void **state)
{
    enum { N = 6, K = 3 };
    mp_pool *p = pool_new(2, 0);
    mp_msg *args[N * K], *out[N];
    for (int i = 0; i < N * K; i++)
        args[i] = msg_i64(i % 10);
    assert_mp_ok(mp_pool_starmap(p, "star_sum", (const mp_msg *const *)args, N, K, 2, out));
    for (int i = 0; i < N; i++) {
        int64_t want = 0;
        for (int j = 0; j < K; j++)
            want = want * 10 + (i * K + j) % 10;
        assert_int_equal(in_i64(out[i]), want);
        mp_msg_destroy(out[i]);
    }
    assert_mp_err(mp_pool_starmap(p, "star_sum", (const mp_msg *const *)args, N, 0, 1, out),
                  MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_pool_starmap: nargs = 0, want 1..1024");
    assert_mp_err(mp_pool_starmap(p, "star_sum", (const mp_msg *const *)args, SIZE_MAX, 2, 1,
                                  out), MP_EOVERFLOW);
    assert_non_null(strstr(mp_last_error(), "items of 2 arguments overflow a size_t"));
    for (int i = 0; i < N * K; i++)
        mp_msg_destroy(args[i]);
    /* a starmap task handed a plain message */
    mp_msg *in = msg_i64(1), *o = NULL;
    assert_mp_err(mp_pool_apply(p, "star_sum", in, &o), MP_EINVAL);
    assert_null(o);
    assert_mp_err(mp_task_arg(in, 0, &o), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "mp_task_arg: the message is not a starmap item"));
    mp_msg_destroy(in);
    mp_pool_destroy(p);
}

/* ---- callbacks ------------------------------------------------------------------ */

static struct {
    atomic_int ok, bad, odd;
    pthread_t thread;
    atomic_int threads_seen; /* distinct handler threads, should be 1 */
} cbs;

static void note_thread(void)
{
    pthread_t self = pthread_self();
    if (atomic_fetch_add(&cbs.threads_seen, 0) == 0) {
        cbs.thread = self;
        atomic_store(&cbs.threads_seen, 1);
    } else if (!pthread_equal(self, cbs.thread)) {
        atomic_store(&cbs.threads_seen, 2);
    }
}

static void on_ok(mp_async_result *r, void *user)
{
    note_thread();
    if (mp_async_result_ready(r) != 1 || mp_async_result_successful(r) != 1)
        atomic_fetch_add(&cbs.odd, 1); /* no cmocka asserts off the test thread */
    atomic_fetch_add(&cbs.ok, 1);
    (void)user;
}

static void on_bad(mp_async_result *r, void *user)
{
    note_thread();
    if (!strstr(mp_async_result_error(r), "not welcome"))
        atomic_fetch_add(&cbs.odd, 1);
    atomic_fetch_add(&cbs.bad, 1);
}

static void test_callbacks(void **state)
{
    enum { N = 8 };
    mp_pool *p = pool_new(2, 0);
    mp_pool_callbacks cb = {sizeof cb, on_ok, on_bad, NULL};
    mp_async_result *r[N + 2];
    mp_msg *in = msg_i64(7);
    memset(&cbs, 0, sizeof cbs);
    for (int i = 0; i < N; i++)
        assert_mp_ok(mp_pool_apply_async(p, "square", in, &cb, &r[i]));
    assert_mp_ok(mp_pool_apply_async(p, "refuse", in, &cb, &r[N]));
    mp_msg *ins[3] = {in, in, in};
    assert_mp_ok(mp_pool_map_async(p, "square", (const mp_msg *const *)ins, 3, 1, &cb,
                                   &r[N + 1]));
    assert_mp_ok(mp_pool_close(p));
    assert_mp_ok(mp_pool_join(p)); /* every callback has run when join returns */
    assert_int_equal(atomic_load(&cbs.ok), N + 1); /* the map's callback runs once */
    assert_int_equal(atomic_load(&cbs.bad), 1);
    assert_int_equal(atomic_load(&cbs.threads_seen), 1);
    assert_int_equal(atomic_load(&cbs.odd), 0);
    assert_mp_err(mp_async_result_get(r[N], 0, NULL), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "not welcome"));
    assert_int_equal(mp_async_result_successful(r[N]), 0);
    for (int i = 0; i < N + 2; i++)
        mp_async_result_release(r[i]);
    mp_msg_destroy(in);
    mp_pool_destroy(p);
}

static void test_terminate_in_flight(void **state)
{
    mp_pool *p = pool_new(2, 0);
    mp_async_result *r[4];
    mp_msg *in = msg_i64(20000); /* 20 s: never finishes */
    for (int i = 0; i < 4; i++)
        assert_mp_ok(mp_pool_apply_async(p, "nap_ms", in, NULL, &r[i]));
    assert_mp_err(mp_pool_join(p), MP_ESTATE); /* neither closed nor terminated */
    assert_mp_ok(mp_pool_terminate(p));
    assert_mp_ok(mp_pool_join(p));
    for (int i = 0; i < 4; i++) {
        assert_mp_err(mp_async_result_get(r[i], 5, NULL), MP_ECLOSED);
        assert_non_null(strstr(mp_last_error(), "terminated"));
    }
    mp_async_result *late = NULL;
    assert_mp_err(mp_pool_apply_async(p, "square", in, NULL, &late), MP_ESTATE);
    assert_string_equal(mp_last_error(), "mp_pool_apply_async: the pool was terminated "
                                         "(mp_pool_terminate); submit work before that, or "
                                         "create a new pool");
    assert_null(late);
    mp_pool_destroy(p);
    /* results outlive the pool */
    for (int i = 0; i < 4; i++) {
        assert_int_equal(mp_async_result_successful(r[i]), 0);
        mp_async_result_release(r[i]);
    }
    mp_msg_destroy(in);
}

static void test_close_lets_work_finish(void **state)
{
    mp_pool *p = pool_new(2, 0);
    mp_async_result *r;
    mp_msg *ins[6];
    const mp_msg *o;
    for (int i = 0; i < 6; i++)
        ins[i] = msg_i64(30);
    assert_mp_ok(mp_pool_map_async(p, "nap_ms", (const mp_msg *const *)ins, 6, 1, NULL, &r));
    assert_mp_ok(mp_pool_close(p));
    assert_mp_ok(mp_pool_close(p)); /* twice is fine */
    assert_mp_err(mp_pool_apply(p, "square", ins[0], (mp_msg **)&o), MP_ESTATE);
    assert_non_null(strstr(mp_last_error(), "mp_pool_apply: the pool was closed (mp_pool_close)"));
    assert_mp_ok(mp_pool_join(p));
    assert_int_equal(mp_async_result_ready(r), 1);
    assert_int_equal(mp_async_result_count(r), 6);
    for (size_t i = 0; i < 6; i++) {
        assert_mp_ok(mp_async_result_item(r, i, &o));
        assert_int_equal(out_span(o).value, 30);
    }
    assert_mp_err(mp_async_result_item(r, 6, &o), MP_EINVAL);
    mp_async_result_release(r);
    for (int i = 0; i < 6; i++)
        mp_msg_destroy(ins[i]);
    mp_pool_destroy(p);
}

/* Item v of a mixed chunk: fails when v % 3 == 1; else answers v repeated
 * v % 4 + 1 times (payloads inline and not), with a tensor holding v when
 * v % 5 == 0 (attachments between items). */
MP_TASK(mixed)
{
    int64_t v = in_i64(in), rep[4], n = 1;
    mp_tensor *t;
    int rc;
    if (v % 3 == 1)
        return mp__error(MP_EINVAL, "mixed: %lld refused", (long long)v);
    for (int i = 0; i < 4; i++)
        rep[i] = v;
    rc = mp_msg_set_payload(out, rep, (size_t)(v % 4 + 1) * sizeof v);
    if (rc || v % 5)
        return rc;
    if ((rc = mp_tensor_empty_shared(MP_INT64, 1, &n, &t)) != 0)
        return rc;
    *(int64_t *)mp_tensor_data(t) = v;
    rc = mp_msg_add_tensor(out, "v", t);
    mp_tensor_release(t);
    return rc;
}

static void check_mixed(const mp_msg *m, int64_t v)
{
    size_t len;
    const int64_t *p = mp_msg_payload(m, &len);
    mp_tensor *t;
    assert_int_equal(len, (size_t)(v % 4 + 1) * sizeof v);
    for (size_t i = 0; i < len / sizeof v; i++)
        assert_int_equal(p[i], v);
    assert_int_equal(mp_msg_count(m), v % 5 ? 0 : 1);
    if (v % 5 == 0) {
        assert_mp_ok(mp_msg_get_tensor(m, 0, &t));
        assert_int_equal(*(int64_t *)mp_tensor_data(t), v);
        mp_tensor_release(t);
    }
}

/* A chunk's answer stays whole in the result and its items become messages
 * when taken: in order (map, imap), out of order (items borrowed backwards,
 * imap_unordered), across failed items and attachments. */
static void test_chunk_answers(void **state)
{
    enum { N = 20, CH = 6 };
    mp_pool *p = pool_new(2, 0);
    mp_msg *in[N], *out[N], *m;
    const mp_msg *o, *o2;
    mp_async_result *r;
    mp_imap *it;
    size_t idx;
    bool seen[N] = {0};
    for (int i = 0; i < N; i++)
        in[i] = msg_i64(i);

    assert_mp_ok(mp_pool_map_async(p, "mixed", (const mp_msg *const *)in, N, CH, NULL, &r));
    assert_mp_ok(mp_async_result_wait(r, 30));
    for (int i = N - 1; i >= 0; i--) {
        if (i % 3 == 1) {
            assert_mp_err(mp_async_result_item(r, (size_t)i, &o), MP_EINVAL);
            assert_non_null(strstr(mp_last_error(), "refused"));
            continue;
        }
        assert_mp_ok(mp_async_result_item(r, (size_t)i, &o));
        check_mixed(o, i);
        assert_mp_ok(mp_async_result_item(r, (size_t)i, &o2));
        assert_ptr_equal(o, o2); /* built once */
    }
    assert_non_null(o);
    assert_mp_err(mp_async_result_get(r, 0, &o), MP_EINVAL);
    assert_null(o); /* not item 0's, still valid but not what get answered */
    assert_non_null(strstr(mp_last_error(), "item 1: "));
    mp_async_result_release(r);

    assert_mp_ok(mp_pool_imap(p, "mixed", (const mp_msg *const *)in, N, CH, &it));
    for (size_t i = 0; i < N; i++) {
        int rc = mp_imap_next(it, 30, &m, &idx);
        assert_int_equal(idx, i);
        if (i % 3 == 1) {
            assert_int_equal(rc, MP_EINVAL);
            assert_null(m);
        } else {
            assert_mp_ok(rc);
            check_mixed(m, (int64_t)i);
            mp_msg_destroy(m);
        }
    }
    mp_imap_destroy(it);

    assert_mp_ok(mp_pool_imap_unordered(p, "mixed", (const mp_msg *const *)in, N, CH, &it));
    for (size_t i = 0; i < N; i++) {
        int rc = mp_imap_next(it, 30, &m, &idx);
        assert_false(seen[idx]);
        seen[idx] = true;
        if (rc == 0)
            check_mixed(m, (int64_t)idx);
        else
            assert_int_equal(idx % 3, 1);
        mp_msg_destroy(m);
    }
    mp_imap_destroy(it);

    /* blocking map: every item built in order, or none handed out */
    assert_mp_err(mp_pool_map(p, "mixed", (const mp_msg *const *)in, N, CH, out), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "mp_pool_map: item 1: "));
    for (int i = 0; i < N; i++)
        mp_msg_destroy(in[i]);
    for (int i = 0; i < N; i++)
        in[i] = msg_i64(i / 2 * 3 + i % 2 * 2); /* 0, 2, 3, 5, 6, ...: none refused */
    assert_mp_ok(mp_pool_map(p, "mixed", (const mp_msg *const *)in, N, CH, out));
    for (int i = 0; i < N; i++) {
        check_mixed(out[i], i / 2 * 3 + i % 2 * 2);
        mp_msg_destroy(out[i]);
        mp_msg_destroy(in[i]);
    }
    mp_pool_destroy(p);
}

/* ---- imap and the typed path ---------------------------------------------------- */

static void test_imap(void **state)
{
    enum { N = 12 };
    mp_pool *p = pool_new(2, 0);
    mp_msg *in[N], *out;
    mp_imap *it;
    size_t idx;
    bool seen[N] = {0};
    for (int i = 0; i < N; i++)
        in[i] = msg_i64((i * 7) % 5 * 10); /* uneven sleeps: completion order shuffles */

    assert_mp_ok(mp_pool_imap(p, "nap_ms", (const mp_msg *const *)in, N, 1, &it));
    for (size_t i = 0; i < N; i++) {
        assert_mp_ok(mp_imap_next(it, 10, &out, &idx));
        assert_int_equal(idx, i); /* input order */
        assert_int_equal(out_span(out).value, (int64_t)((i * 7) % 5 * 10));
        mp_msg_destroy(out);
    }
    assert_mp_err(mp_imap_next(it, 0, &out, &idx), MP_ECLOSED);
    mp_imap_destroy(it);

    assert_mp_ok(mp_pool_imap_unordered(p, "nap_ms", (const mp_msg *const *)in, N, 1, &it));
    for (size_t i = 0; i < N; i++) {
        assert_mp_ok(mp_imap_next(it, 10, &out, &idx));
        assert_true(idx < N && !seen[idx]);
        seen[idx] = true;
        assert_int_equal(out_span(out).value, (int64_t)((idx * 7) % 5 * 10));
        mp_msg_destroy(out);
    }
    assert_mp_err(mp_imap_next(it, 0, &out, &idx), MP_ECLOSED);
    mp_imap_destroy(it);

    /* dropped half-way: the rest is computed and discarded */
    assert_mp_ok(mp_pool_imap(p, "nap_ms", (const mp_msg *const *)in, N, 1, &it));
    assert_mp_ok(mp_imap_next(it, 10, &out, NULL));
    mp_msg_destroy(out);
    mp_imap_destroy(it);
    for (int i = 0; i < N; i++)
        mp_msg_destroy(in[i]);
    mp_pool_close(p);
    mp_pool_join(p);
    mp_pool_destroy(p);
}

static void test_map_array(void **state)
{
    enum { N = 1000 };
    mp_pool *p = pool_new(2, 0);
    double *in = malloc(N * sizeof *in), *out = calloc(N, sizeof *out);
    for (int i = 0; i < N; i++)
        in[i] = i * 0.5;
    assert_mp_ok(mp_pool_map_array(p, "twice_double", in, N, sizeof *in, out, sizeof *out, 0));
    for (int i = 0; i < N; i++)
        assert_true(out[i] == i * 1.0);
    /* an item size the task does not honour */
    assert_mp_err(mp_pool_map_array(p, "twice_double", in, 4, sizeof *in, out, 4, 1),
                  MP_EPROTO);
    assert_non_null(strstr(mp_last_error(), "8-byte result"));
    assert_mp_err(mp_pool_map_array(p, "twice_double", in, 4, 0, out, 8, 1), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_pool_map_array: in_size is 0; give each item's "
                                         "size in bytes");
    assert_mp_err(mp_pool_map_array(p, "twice_double", in, 4, 8, NULL, 8, 1), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_pool_map_array: out is NULL for 4 items");
    assert_mp_err(mp_pool_map_array(p, "twice_double", in, SIZE_MAX / 4, 8, out, 8, 1),
                  MP_EOVERFLOW);
    assert_non_null(strstr(mp_last_error(), "overflow a size_t"));
    free(in);
    free(out);
    mp_pool_destroy(p);
}

/* Tensors cross both ways as handles: the worker writes the caller's
 * shared pages in place, and its answer's pages are mapped here. */
static void test_tensors_zero_copy(void **state)
{
    mp_pool *p = pool_new(2, 0);
    int64_t n = 1000;
    mp_tensor *x, *y;
    mp_msg *in, *out;
    assert_mp_ok(mp_tensor_empty_shared(MP_FLOAT32, 1, &n, &x));
    float *xs = mp_tensor_data(x);
    for (int i = 0; i < n; i++)
        xs[i] = (float)i;
    assert_mp_ok(mp_msg_create(&in));
    assert_mp_ok(mp_msg_add_tensor(in, "x", x));
    assert_mp_ok(mp_pool_apply(p, "tensor_inc", in, &out));
    assert_mp_ok(mp_msg_find_tensor(out, "y", &y));
    const float *ys = mp_tensor_data(y);
    for (int i = 0; i < n; i++) {
        assert_true(xs[i] == 2.0f * i);      /* written in place by the worker */
        assert_true(ys[i] == 2.0f * i + 1); /* its result, no copy on the way */
    }
    mp_tensor_release(y);
    mp_msg_destroy(out);
    mp_tensor_release(x);

    /* a private tensor moves to shared memory at submission, in this thread */
    assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 1, &n, &x));
    mp_msg_destroy(in);
    assert_mp_ok(mp_msg_create(&in));
    assert_mp_ok(mp_msg_add_tensor(in, "x", x));
    mp_async_result *r;
    assert_mp_ok(mp_pool_apply_async(p, "tensor_inc", in, NULL, &r));
    assert_true(mp_tensor_is_shared(x));
    assert_mp_ok(mp_async_result_get(r, 10, NULL));
    mp_async_result_release(r);
    mp_msg_destroy(in);
    mp_tensor_release(x);
    mp_pool_destroy(p);
}

/* ---- a process started from inside a task ------------------------------------- */

MP_ENTRY(raise_in_child)
{
    (void)rank;
    (void)args;
    mp_raise("raised in the grandchild");
}

/* Forks a child whose entry raises; answers its exit code and message. */
MP_TASK(fork_raiser)
{
    mp_process_options o;
    mp_process *c = NULL;
    mp_child_error e = {.size = sizeof e};
    int32_t res[2] = {-100, 0};
    (void)in;
    mp_process_options_init(&o);
    o.start_method = "fork";
    int rc = mp_process_create("raise_in_child", NULL, &o, &c);
    if (!rc)
        rc = mp_process_start(c);
    if (!rc)
        rc = mp_process_join(c, 10);
    if (rc) {
        mp_process_kill(c);
        mp_process_join(c, -1);
    } else if (mp_process_error(c, &e) == 0) {
        res[0] = e.exitcode;
        res[1] = strcmp(e.message, "raised in the grandchild") == 0;
    }
    mp_process_destroy(c);
    return rc ? rc : mp_msg_set_payload(out, res, sizeof res);
}

static void test_raise_in_process_started_by_task(void **state)
{
    mp_pool *p = pool_new(1, 0);
    mp_msg *in = msg_i64(0), *out = NULL;
    const int32_t *res;
    size_t len;
    /* The child's mp_raise must end the child (exit code 1, message kept),
     * not jump back into the worker's task that it was forked from. */
    assert_mp_ok(mp_pool_apply(p, "fork_raiser", in, &out));
    res = mp_msg_payload(out, &len);
    assert_int_equal(len, 2 * sizeof(int32_t));
    assert_int_equal(res[0], 1);
    assert_int_equal(res[1], 1);
    mp_msg_destroy(out);
    mp_msg_destroy(in);
    assert_mp_ok(mp_pool_close(p));
    assert_mp_ok(mp_pool_join(p));
    mp_pool_destroy(p);
}

static void test_arguments(void **state)
{
    mp_pool_options o;
    mp_pool *p = NULL;
    assert_mp_err(mp_pool_create(-1, NULL, &p), MP_EINVAL);
    assert_mp_err(mp_pool_create(1, NULL, NULL), MP_EINVAL);
    mp_pool_options_init(&o);
    o.size = 0; /* not initialized */
    assert_mp_err(mp_pool_create(1, &o, &p), MP_EINVAL);
    assert_mp_err(mp_register_task("square", NULL), MP_EINVAL);
    assert_mp_err(mp_register_task("", (mp_task_fn)1), MP_EINVAL);
    assert_mp_err(mp_pool_close(NULL), MP_EINVAL);
    assert_mp_err(mp_pool_join(NULL), MP_EINVAL);
    /* every sentence names the call made, not the one it goes through */
    mp_msg *in = msg_i64(1), *out = NULL;
    assert_mp_err(mp_pool_apply(NULL, "square", in, &out), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_pool_apply: pool is NULL");
    assert_mp_err(mp_pool_apply(NULL, "square", NULL, &out), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_pool_apply: in is NULL");
    const mp_msg *two[2] = {in, NULL};
    mp_msg *outs[2];
    assert_mp_err(mp_pool_map(NULL, "square", two, 2, 0, outs), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_pool_map: in[1] is NULL");
    mp_imap *it = NULL;
    assert_mp_err(mp_pool_imap(NULL, "square", two, 1, 0, &it), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_pool_imap: pool is NULL");
    mp_pool_callbacks cb = {0};
    mp_async_result *r = NULL;
    assert_mp_err(mp_pool_map_async(NULL, "square", two, 1, 0, &cb, &r), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_pool_map_async: pool is NULL");
    mp_msg_destroy(in);
    mp_pool_destroy(NULL);
    mp_async_result_release(NULL);
    mp_imap_destroy(NULL);
    assert_null(p);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_apply_serial_async_parallel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_map_chunksizes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_map_results_are_independent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_starmap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_callbacks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_terminate_in_flight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_lets_work_finish, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chunk_answers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_imap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_map_array, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tensors_zero_copy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_raise_in_process_started_by_task, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_arguments, setup, teardown),
    };
    if (pool_tests_begin(&argc, &argv) != 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
