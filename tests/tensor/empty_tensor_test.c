/* Tensors with no elements ([0], [3, 0], [0, 5], any dtype; private and
 * shared storages; a 0-element view of a non-empty storage) travel like any
 * other: through a pipe and a queue, to and from a child started by fork,
 * spawn and forkserver, under both sharing strategies. The decoder stays
 * strict about storages of no bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mp_test.h"
#include "wire/frame.h"
#include "wire/wire.h"

typedef struct spec {
    const char *name;
    mp_dtype dtype;
    int ndim;
    int64_t shape[2];
} spec;

static const spec specs[] = {
    {"a", MP_FLOAT32, 1, {0, 0}}, {"b", MP_INT64, 2, {3, 0}}, {"c", MP_UINT8, 2, {0, 5}},
    {"d", MP_FLOAT64, 1, {0, 0}}, /* shared from the start */
};
enum { NSPEC = sizeof specs / sizeof specs[0] };

/* The message both sides send: every spec, a 0-element view "v" of a
 * 4-float storage, and a normal tensor "n" = {1, 2}. */
static int build(mp_msg **out)
{
    mp_msg *m = NULL;
    mp_tensor *t = NULL, *v = NULL;
    int64_t four = 4;
    int rc = mp_msg_create(&m);
    for (int i = 0; i < NSPEC && !rc; i++) {
        rc = (i == 3 ? mp_tensor_empty_shared : mp_tensor_empty)(specs[i].dtype, specs[i].ndim,
                                                                  specs[i].shape, &t);
        if (!rc)
            rc = mp_msg_add_tensor(m, specs[i].name, t);
        mp_tensor_release(t);
        t = NULL;
    }
    if (!rc)
        rc = mp_tensor_empty(MP_FLOAT32, 1, &four, &t);
    if (!rc) {
        ((float *)mp_tensor_data(t))[0] = 1;
        ((float *)mp_tensor_data(t))[1] = 2;
        rc = mp_tensor_narrow(t, 0, 2, 0, &v);
    }
    if (!rc)
        rc = mp_msg_add_tensor(m, "v", v);
    if (!rc)
        rc = mp_msg_add_tensor(m, "n", t);
    mp_tensor_release(v);
    mp_tensor_release(t);
    if (rc) {
        mp_msg_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* 0 when m holds what build() made; else a line number. */
static int check(const mp_msg *m)
{
    mp_tensor *t = NULL;
    int bad = 0;
    for (int i = 0; i < NSPEC && !bad; i++) {
        if (mp_msg_find_tensor(m, specs[i].name, &t) != 0)
            return __LINE__;
        if (mp_tensor_dtype(t) != specs[i].dtype || mp_tensor_ndim(t) != specs[i].ndim ||
            mp_tensor_numel(t) != 0 || !mp_tensor_data(t))
            bad = __LINE__;
        for (int d = 0; d < specs[i].ndim && !bad; d++)
            if (mp_tensor_shape(t)[d] != specs[i].shape[d])
                bad = __LINE__;
        mp_tensor_release(t);
    }
    if (bad)
        return bad;
    if (mp_msg_find_tensor(m, "v", &t) != 0)
        return __LINE__;
    bad = mp_tensor_numel(t) != 0 ? __LINE__ : 0;
    mp_tensor_release(t);
    if (bad || mp_msg_find_tensor(m, "n", &t) != 0)
        return __LINE__;
    bad = ((float *)mp_tensor_data(t))[1] != 2 ? __LINE__ : 0;
    mp_tensor_release(t);
    return bad;
}

/* Receives on the queue, answers on the pipe; then the other way round. */
MP_ENTRY(empty_echo)
{
    mp_queue *q = NULL;
    mp_conn *c = NULL;
    mp_msg *m = NULL;
    size_t len;
    const char *strategy = mp_msg_payload(args, &len);
    int line;
    if (mp_set_sharing_strategy(strategy) != 0 || mp_msg_get_queue(args, 0, &q) != 0 ||
        mp_msg_get_conn(args, 1, &c) != 0)
        mp_raise("empty_echo: arguments: %s", mp_last_error());
    for (int round = 0; round < 2; round++) {
        int rc = round ? mp_conn_recv(c, &m, 20) : mp_queue_get(q, &m, 20);
        if (rc)
            mp_raise("empty_echo: receive %d: %s", round, mp_last_error());
        if ((line = check(m)))
            mp_raise("empty_echo: message %d is wrong (check line %d)", round, line);
        mp_msg_destroy(m);
        /* back through the other channel: a queue's put is not taken back
         * by its own sender's get */
        if (build(&m) || (round ? mp_queue_put(q, m, 20) : mp_conn_send(c, m, 20)))
            mp_raise("empty_echo: send %d: %s", round, mp_last_error());
        mp_msg_destroy(m);
    }
    mp_queue_release(q);
    mp_conn_release(c);
    return 0;
}

static int setup(void **state) { return mp_test_setup(state); }
static int teardown(void **state)
{
    mp_set_sharing_strategy("file_descriptor");
    mp_forkserver_stop(); /* the server is a child too */
    return mp_test_teardown(state);
}

static void run(const char *method, const char *strategy)
{
    mp_queue *q = NULL;
    mp_conn *a = NULL, *b = NULL;
    mp_msg *args = NULL, *m = NULL, *back = NULL;
    mp_process_options o;
    mp_process *p = NULL;
    mp_child_error e = {.size = sizeof e};
    assert_mp_ok(mp_set_sharing_strategy(strategy));
    assert_mp_ok(mp_queue_create(0, &q));
    assert_mp_ok(mp_pipe(true, &a, &b));
    assert_mp_ok(mp_msg_create(&args));
    assert_mp_ok(mp_msg_set_payload(args, strategy, strlen(strategy) + 1));
    assert_mp_ok(mp_msg_add_queue(args, "q", q));
    assert_mp_ok(mp_msg_add_conn(args, "c", b));
    mp_process_options_init(&o);
    o.start_method = method;
    assert_mp_ok(mp_process_create("empty_echo", args, &o, &p));
    assert_mp_ok(mp_process_start(p));
    assert_mp_ok(build(&m));
    assert_mp_ok(mp_queue_put(q, m, 20));
    for (int round = 0; round < 2; round++) {
        if (round)
            assert_mp_ok(mp_conn_send(a, m, 20));
        if ((round ? mp_queue_get(q, &back, 20) : mp_conn_recv(a, &back, 20)) != 0) {
            char why[512];
            snprintf(why, sizeof why, "%s", mp_last_error());
            mp_process_join(p, 5);
            mp_process_kill(p);
            mp_process_join(p, 5);
            mp_process_error(p, &e);
            fail_msg("round %d: %s; the child: %s", round, why, e.message);
        }
        assert_int_equal(check(back), 0);
        mp_msg_destroy(back);
    }
    assert_mp_ok(mp_process_join(p, 20));
    assert_mp_ok(mp_process_error(p, &e));
    if (e.exitcode)
        fail_msg("child: %s", e.message);
    assert_mp_ok(mp_process_destroy(p));
    mp_msg_destroy(m);
    mp_msg_destroy(args);
    mp_queue_release(q);
    mp_conn_release(a);
    mp_conn_release(b);
}

#define BOTH(method)                                                                              \
    static void test_##method##_fd(void **s) { run(#method, "file_descriptor"); }                 \
    static void test_##method##_fs(void **s) { run(#method, "file_system"); }
BOTH(fork)
BOTH(spawn)
BOTH(forkserver)

/* An empty storage costs no fd; the decoder refuses one that claims bytes
 * or an fd, and still refuses a segment of 0 bytes. */
static void test_decoder_strict(void **state)
{
    mp_msg *m = NULL, *out = NULL;
    mp_tensor *t = NULL;
    int64_t zero = 0;
    void *buf = NULL;
    size_t len = 0;
    int fds[MP__WIRE_MAX_FDS], nfds = -1;
    mp__frame_storage fs;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 1, &zero, &t));
    assert_mp_ok(mp_msg_add_tensor(m, "z", t));
    assert_mp_ok(mp__wire_encode(m, &buf, &len, fds, &nfds));
    assert_int_equal(nfds, 0);
    assert_false(mp_tensor_is_shared(t)); /* nothing was moved */
    memcpy(&fs, (char *)buf + sizeof(mp__frame_header), sizeof fs);
    assert_int_equal(fs.strategy, MP__FRAME_STORAGE_EMPTY);
    assert_mp_ok(mp__wire_decode(buf, len, NULL, 0, &out));
    mp_msg_destroy(out);
    fs.size = 8;
    memcpy((char *)buf + sizeof(mp__frame_header), &fs, sizeof fs);
    assert_mp_err(mp__wire_decode(buf, len, NULL, 0, &out), MP_EPROTO);
    assert_non_null(strstr(mp_last_error(), "both must be 0"));
    fs.size = 0;
    fs.ref = 1;
    memcpy((char *)buf + sizeof(mp__frame_header), &fs, sizeof fs);
    assert_mp_err(mp__wire_decode(buf, len, NULL, 0, &out), MP_EPROTO);
    fs.ref = 0;
    fs.strategy = 0; /* file_descriptor with 0 bytes */
    memcpy((char *)buf + sizeof(mp__frame_header), &fs, sizeof fs);
    assert_mp_err(mp__wire_decode(buf, len, NULL, 0, &out), MP_EPROTO);
    assert_non_null(strstr(mp_last_error(), "outside [1, 2^40]"));
    free(buf);
    mp_tensor_release(t);
    mp_msg_destroy(m);
}

#define T(t) cmocka_unit_test_setup_teardown(t, setup, teardown)

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        T(test_decoder_strict), T(test_fork_fd),       T(test_fork_fs),
        T(test_spawn_fd),       T(test_spawn_fs),      T(test_forkserver_fd),
        T(test_forkserver_fs),
    };
    if (mp_setup(&argc, &argv) != 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
