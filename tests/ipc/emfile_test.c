/* RLIMIT_NOFILE lowered until a queued message's fds cannot be installed:
 * get fails with MP_EMFILE naming the limit and both fixes, no fd leaks,
 * and once the limit is raised the same message arrives whole. Also when the
 * reader was asleep in a one-call receive (src/wire/rx.c) as it came. */
#include <fcntl.h>
#include <sys/wait.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "ipc/ipc.h"
#include "mp_test.h"

static int setup(void **state) { return mp_test_setup(state); }
static int teardown(void **state) { return mp_test_teardown(state); }

#define NT 8

static int fcntl_ok(int fd) { return fcntl(fd, F_GETFD) >= 0; }

/* The limit under which exactly `free_slots` fd numbers are free. */
static int limit_with_room(int free_slots)
{
    int fd = 0;
    for (; free_slots > 0; fd++)
        if (!fcntl_ok(fd))
            free_slots--;
    return fd;
}

static void check_emfile(mp_queue *q, mp_tensor **ts)
{
    struct rlimit old, low;
    mp_msg *m = NULL;
    int before = mp_test_count_fds(), rc;
    char err[512];
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    low = old;
    low.rlim_cur = (rlim_t)limit_with_room(2);   /* room for 2 of the NT fds */
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    rc = mp_queue_get(q, &m, 1);
    snprintf(err, sizeof err, "%s", mp_last_error());
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    if (rc != MP_EMFILE)
        fail_msg("get -> %s, wanted MP_EMFILE: %s", mp_err_name(rc), err);
    assert_null(m);
    assert_non_null(strstr(err, "RLIMIT_NOFILE"));
    assert_non_null(strstr(err, "file_system"));
    assert_non_null(strstr(err, "Raise the limit"));
    assert_int_equal(mp_test_count_fds(), before);
    assert_int_equal(mp_queue_qsize(q), 1);
    /* Nothing was lost: the same message arrives whole. */
    assert_mp_ok(mp_queue_get(q, &m, 1));
    assert_int_equal(mp_msg_count(m), NT);
    for (int i = 0; i < NT; i++) {
        mp_tensor *t = NULL;
        assert_mp_ok(mp_msg_get_tensor(m, (size_t)i, &t));
        assert_true(mp_tensor_same_storage(t, ts[i]));
        assert_int_equal(((int32_t *)mp_tensor_data(t))[0], i + 1);
        mp_tensor_release(t);
    }
    mp_msg_destroy(m);
}

static void test_emfile(void **state)
{
    mp_queue *q = NULL;
    mp_tensor *ts[NT];
    mp_msg *m = NULL;
    int64_t shape[1] = {4};
    (void)state;
    assert_mp_ok(mp_queue_create(0, &q));
    assert_mp_ok(mp_msg_create(&m));
    for (int i = 0; i < NT; i++) {
        assert_mp_ok(mp_tensor_empty(MP_INT32, 1, shape, &ts[i]));
        ((int32_t *)mp_tensor_data(ts[i]))[0] = i + 1;
        assert_mp_ok(mp_msg_add_tensor(m, NULL, ts[i]));
    }
    assert_mp_ok(mp_queue_put(q, m, 1));
    /* Receive in this process: the segments are cached here, so the
     * storages must come back as the very same ones. */
    check_emfile(q, ts);
    /* The queue stays usable afterwards. */
    assert_mp_ok(mp_queue_put(q, m, 1));
    check_emfile(q, ts);
    mp_msg_destroy(m);
    for (int i = 0; i < NT; i++)
        mp_tensor_release(ts[i]);
    mp_queue_release(q);
}

/* Child: asleep in get on an empty queue, with room for 2 fds. */
static int emfile_child(mp_queue *q)
{
    struct rlimit old, low;
    mp_msg *m = NULL;
    int rc;
    if (getrlimit(RLIMIT_NOFILE, &old) != 0)
        return 10;
    low = old;
    low.rlim_cur = (rlim_t)limit_with_room(2);
    if (setrlimit(RLIMIT_NOFILE, &low) != 0)
        return 11;
    rc = mp_queue_get(q, &m, -1);
    if (rc != MP_EMFILE || strstr(mp_last_error(), "stays queued") == NULL)
        return 12;
    if (setrlimit(RLIMIT_NOFILE, &old) != 0)
        return 13;
    if (mp_queue_get(q, &m, 2) != 0)
        return 14; /* the message was lost */
    rc = mp_msg_count(m) == NT ? 0 : 15;
    mp_msg_destroy(m);
    return rc;
}

/* The first message with fds on a queue finds its reader asleep in a
 * one-call receive, which would take the record whole and lose the fds
 * that do not fit. The sender wakes it first; it peeks and keeps it. */
static void test_emfile_reader_asleep(void **state)
{
    mp_queue *q = NULL;
    mp_tensor *ts[NT];
    mp_msg *m = NULL;
    int64_t shape[1] = {4};
    double deadline = mp__deadline(10);
    int status;
    pid_t pid;
    (void)state;
    assert_mp_ok(mp_queue_create(0, &q));
    pid = fork();
    if (pid == 0)
        _exit(emfile_child(q));
    while (!atomic_load(&((mp__queue *)q)->ctl->rx.fast_inside) && mp__now() < deadline)
        usleep(1000);
    usleep(20000);
    assert_mp_ok(mp_msg_create(&m));
    for (int i = 0; i < NT; i++) {
        assert_mp_ok(mp_tensor_empty(MP_INT32, 1, shape, &ts[i]));
        assert_mp_ok(mp_msg_add_tensor(m, NULL, ts[i]));
    }
    assert_mp_ok(mp_queue_put(q, m, 5));
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    mp_msg_destroy(m);
    for (int i = 0; i < NT; i++)
        mp_tensor_release(ts[i]);
    mp_queue_release(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_emfile, setup, teardown),
        cmocka_unit_test_setup_teardown(test_emfile_reader_asleep, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
