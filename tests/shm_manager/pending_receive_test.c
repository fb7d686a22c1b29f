/* Pending receives (src/shm/manager.h): a receive into a kept mapping is
 * reported only when something else about the name follows, a send of the
 * same name cancels it, a full set of records writes out its oldest, and
 * the daemon counts the ones a dead client left.
 * The daemon's counts are read from its LIST answer. */
#include "mgr_test.h"

/* The daemon's sent and received counts of name (LIST: "SEG name size
 * creator holders sent received kind"); false when it does not track it. */
static bool flight(const char *name, long *sent, long *received)
{
    char *reply = NULL, want[MP__SHM_NAME_MAX + 8], *p;
    bool found = false;
    if (mp__mgr_control("LIST", &reply, 2.0) != 0)
        return false;
    snprintf(want, sizeof want, "SEG %s ", name);
    if ((p = strstr(reply, want)))
        found = sscanf(p + strlen(want), "%*s %*s %*s %ld %ld", sent, received) == 2;
    free(reply);
    return found;
}

/* Waits until the daemon counts sent and received for name. */
static bool wait_flight(const char *name, long sent, long received, double timeout)
{
    double end = mgr_now() + timeout;
    long s = -1, r = -1;
    while (!flight(name, &s, &r) || s != sent || r != received) {
        if (mgr_now() > end) {
            print_error("%s: sent %ld received %ld, want %ld %ld\n", name, s, r, sent,
                        received);
            return false;
        }
        mgr_sleep(0.01);
    }
    return true;
}

/* Child: registers with the daemon (a segment of its own: a process's
 * first report is a line, whatever it is), receives the name from the
 * parent and opens it. Then, by arg:
 * 'k' keeps it until killed; 'f' sends it on (the name back to the parent),
 * releases it and waits; 'q' releases it and exits. */
static int receiver(int in, int out, void *arg)
{
    mp__segment_handle h = {.strategy = MP__STRATEGY_FS, .fd = -1, .size = 4096};
    mp__segment *s = NULL, *own;
    char how = (char)(intptr_t)arg;
    if (mp__segment_create(64, MP__STRATEGY_FS, &own) != 0 ||
        read(in, h.name, sizeof h.name) != (ssize_t)sizeof h.name)
        return 10;
    if (mp__segment_open(&h, &s) != 0 || ((char *)mp__segment_data(s))[0] != 42)
        return 11;
    if (how == 'f') {
        if (mp__segment_export(s, &h) != 0)
            return 12;
        mp__segment_release(s);
        (void)!write(out, h.name, sizeof h.name);
        mgr_get(in, 30);
        mp__segment_release(own);
        return 0;
    }
    if (how == 'k') {
        mgr_put(out, 'r');
        mgr_get(in, 30);
    }
    mp__segment_release(s);
    mp__segment_release(own);
    return 0;
}

/* Child: a live client with a segment of its own, until a byte comes. */
static int keeper_fn(int in, int out, void *arg)
{
    mp__segment *s;
    if (mp__segment_create(4096, MP__STRATEGY_FS, &s) != 0)
        return 10;
    mgr_put(out, 'r');
    mgr_get(in, 60);
    mp__segment_release(s);
    return 0;
}

/* A name in flight from a sender that was killed, with a live client
 * (keeper) so that the grace period does not start. */
static void start_flight(child *keeper, child *snd, char *name)
{
    *keeper = child_start(keeper_fn, NULL);
    assert_int_equal(mgr_get(keeper->from, 10), 'r');
    *snd = child_start(mgr_sender, NULL);
    assert_int_equal(read(snd->from, name, MP__SHM_NAME_MAX), MP__SHM_NAME_MAX);
    child_end(snd, true);
    assert_true(wait_flight(name, 1, 0, 5));
}

/* A receiver killed while its receive was pending: the daemon counts it
 * when it reads the dead client's ring, and reclaims the name at once. */
static void test_pending_counted_at_death(void **state)
{
    char name[MP__SHM_NAME_MAX];
    child keeper, snd, r;
    start_flight(&keeper, &snd, name);
    r = child_start(receiver, (void *)(intptr_t)'k');
    assert_int_equal(write(r.to, name, sizeof name), (ssize_t)sizeof name);
    assert_int_equal(mgr_get(r.from, 10), 'r');
    mgr_sleep(0.1);
    assert_true(wait_flight(name, 1, 0, 5)); /* pending: no line written */
    assert_true(mgr_exists(name));
    child_end(&r, true);
    assert_true(mgr_wait_clean(&snd.pid, 1, 2));
    child_end(&keeper, true);
}

/* A receiver that sends the name on: its receive and its send cancel out,
 * so the name stays in flight after the relay dies, until the next
 * receiver takes it. */
static void test_send_cancels_pending(void **state)
{
    char name[MP__SHM_NAME_MAX], again[MP__SHM_NAME_MAX];
    child keeper, snd, relay, r;
    start_flight(&keeper, &snd, name);
    relay = child_start(receiver, (void *)(intptr_t)'f');
    assert_int_equal(write(relay.to, name, sizeof name), (ssize_t)sizeof name);
    assert_int_equal(read(relay.from, again, sizeof again), (ssize_t)sizeof again);
    assert_string_equal(again, name);
    child_end(&relay, true);
    /* neither line was written: one message (the relay's) in flight */
    mgr_sleep(0.3);
    assert_true(wait_flight(name, 1, 0, 5));
    assert_true(mgr_exists(name));
    r = child_start(receiver, (void *)(intptr_t)'q');
    assert_int_equal(write(r.to, name, sizeof name), (ssize_t)sizeof name);
    child_end(&r, false);
    assert_true(mgr_wait_clean(&snd.pid, 1, 2));
    child_end(&keeper, true);
}

/* Child: opens the name (a pending receive in its ring), then forks a
 * child that sends the inherited segment: the grandchild's send is its
 * own report and cancels nothing of its parent's. */
static int fork_sender(int in, int out, void *arg)
{
    mp__segment_handle h = {.strategy = MP__STRATEGY_FS, .fd = -1, .size = 4096};
    mp__segment *s = NULL, *own;
    pid_t g;
    int status;
    if (mp__segment_create(64, MP__STRATEGY_FS, &own) != 0 ||
        read(in, h.name, sizeof h.name) != (ssize_t)sizeof h.name ||
        mp__segment_open(&h, &s) != 0)
        return 10;
    if ((g = fork()) == 0) { /* sends it, and drops the message unsent */
        mp__segment_handle out_h;
        if (mp__segment_export(s, &out_h) != 0)
            _exit(1);
        mp__segment_handle_drop(&out_h, false);
        _exit(0);
    }
    if (g < 0 || waitpid(g, &status, 0) != g || !WIFEXITED(status) || WEXITSTATUS(status))
        return 11;
    mgr_put(out, 'r');
    mgr_get(in, 30);
    mp__segment_release(s);
    mp__segment_release(own);
    return 0;
}

static void test_fork_child_keeps_parent_pending(void **state)
{
    char name[MP__SHM_NAME_MAX];
    child keeper, snd, f;
    start_flight(&keeper, &snd, name);
    f = child_start(fork_sender, NULL);
    assert_int_equal(write(f.to, name, sizeof name), (ssize_t)sizeof name);
    assert_int_equal(mgr_get(f.from, 10), 'r');
    /* the grandchild's send and drop are lines; f's receive is pending */
    assert_true(wait_flight(name, 2, 1, 5));
    mgr_put(f.to, 'q');
    child_end(&f, false);
    assert_true(mgr_wait_clean(&snd.pid, 1, 2));
    child_end(&keeper, true);
}

enum { MANY = MP__MGR_PENDING + 1 };

/* Child: sends MANY segments (names to the parent) and waits, holding none. */
static int many_sender(int in, int out, void *arg)
{
    for (int i = 0; i < MANY; i++) {
        mp__segment *s;
        mp__segment_handle h;
        if (mp__segment_create(4096, MP__STRATEGY_FS, &s) != 0 || mp__segment_export(s, &h) != 0)
            return 10;
        mp__segment_release(s);
        (void)!write(out, h.name, sizeof h.name);
    }
    mgr_get(in, 30);
    return 0;
}

/* Child: registers, opens the MANY names in order, says 'r', waits. */
static int many_receiver(int in, int out, void *arg)
{
    mp__segment *own, *s[MANY];
    if (mp__segment_create(64, MP__STRATEGY_FS, &own) != 0)
        return 10;
    for (int i = 0; i < MANY; i++) {
        mp__segment_handle h = {.strategy = MP__STRATEGY_FS, .fd = -1, .size = 4096};
        if (read(in, h.name, sizeof h.name) != (ssize_t)sizeof h.name ||
            mp__segment_open(&h, &s[i]) != 0)
            return 11;
    }
    mgr_put(out, 'r');
    mgr_get(in, 30);
    return 0;
}

/* One receive more than the records hold: the oldest is written out, the
 * others stay pending until their client dies. */
static void test_full_set_reports_oldest(void **state)
{
    char names[MANY][MP__SHM_NAME_MAX];
    child keeper = child_start(keeper_fn, NULL), snd, r;
    assert_int_equal(mgr_get(keeper.from, 10), 'r');
    snd = child_start(many_sender, NULL);
    r = child_start(many_receiver, NULL);
    for (int i = 0; i < MANY; i++) {
        assert_int_equal(read(snd.from, names[i], MP__SHM_NAME_MAX), MP__SHM_NAME_MAX);
        assert_int_equal(write(r.to, names[i], MP__SHM_NAME_MAX), MP__SHM_NAME_MAX);
    }
    assert_int_equal(mgr_get(r.from, 10), 'r');
    assert_true(wait_flight(names[0], 1, 1, 5));
    for (int i = 1; i < MANY; i++)
        assert_true(wait_flight(names[i], 1, 0, 5));
    child_end(&snd, true);
    child_end(&r, true);
    assert_true(mgr_wait_clean(&snd.pid, 1, 2));
    child_end(&keeper, true);
}

#define T(f) cmocka_unit_test_setup_teardown(f, mp_test_setup, mp_test_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_pending_counted_at_death),
        T(test_send_cancels_pending),
        T(test_fork_child_keeps_parent_pending),
        T(test_full_set_reports_oldest),
    };
    return mgr_run_tests(tests);
}
