/* How processes start: exec failures, a killed forkserver, the start
 * methods and contexts, fork beside threads, threads starting processes at
 * once, daemon children at exit; each test once. The children's entries
 * are process_common.c's. */
#include "process/process_internal.h"
#include "process_common.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The first child of ours found in /proc, or 0. */
static pid_t find_child(void)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t found = 0;
    while (d && !found && (e = readdir(d))) {
        char path[300], buf[512];
        int ppid = 0;
        FILE *f;
        if (atoi(e->d_name) <= 0)
            continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        if (!(f = fopen(path, "r")))
            continue;
        if (fgets(buf, sizeof buf, f)) {
            char *p = strrchr(buf, ')');
            if (p && sscanf(p + 2, "%*c %d", &ppid) == 1 && ppid == getpid())
                found = atoi(e->d_name);
        }
        fclose(f);
    }
    if (d)
        closedir(d);
    return found;
}

/* A forkserver that died (killed) is replaced on the next start. */
static void test_forkserver_restart(void **state)
{
    mp_process *p;
    pid_t server;
    int st;
    assert_mp_ok(mp_forkserver_start());
    assert_mp_ok(mp_forkserver_start()); /* idempotent */
    server = find_child();
    assert_true(server > 0);
    assert_int_equal(kill(server, SIGKILL), 0);
    assert_int_equal(waitpid(server, &st, 0), server); /* as a careless test would */
    p = run_op("forkserver", (targ){OP_RETURN, 6, 0, 0});
    assert_int_equal(exitcode_of(p), 6);
    assert_mp_ok(mp_process_destroy(p));
    assert_mp_ok(mp_forkserver_stop());
    assert_mp_ok(mp_forkserver_stop()); /* no-op */
}

static void test_exec_failure(void **state)
{
    mp_process_options o;
    mp_process *p = NULL;
    const char *saved = mp__exec_path;
    mp_process_options_init(&o);
    o.start_method = "spawn";
    assert_mp_ok(mp_process_create("t_op", NULL, &o, &p));
    mp__exec_path = "/nonexistent/mproc-test";
    assert_mp_err(mp_process_start(p), MP_ENOENT);
    mp__exec_path = saved;
    assert_non_null(strstr(mp_last_error(), "exec of /nonexistent/mproc-test failed"));
    assert_mp_ok(mp_process_destroy(p));
}

static void test_start_methods(void **state)
{
    const char *const *all = mp_get_all_start_methods();
    mp_context *ctx = NULL;
    assert_string_equal(all[0], "fork");
    assert_string_equal(all[1], "spawn");
    assert_string_equal(all[2], "forkserver");
    assert_null(all[3]);
    assert_mp_ok(mp_set_start_method(NULL, true));
    assert_mp_ok(mp_set_start_method("spawn", false));
    assert_mp_err(mp_set_start_method("fork", false), MP_ESTATE);
    assert_string_equal(mp_get_start_method(), "spawn");
    assert_mp_ok(mp_set_start_method("forkserver", true));
    assert_mp_ok(mp_get_context(NULL, &ctx));
    assert_string_equal(mp_context_start_method(ctx), "forkserver");
    assert_mp_ok(mp_get_context("spawn", &ctx));
    assert_string_equal(mp_context_start_method(ctx), "spawn");
    assert_mp_err(mp_get_context("thread", &ctx), MP_EINVAL);
    assert_mp_err(mp_set_start_method("thread", true), MP_EINVAL);
    assert_mp_ok(mp_set_start_method(NULL, true));
    assert_string_equal(mp_get_start_method(), "fork"); /* the default, now fixed */
    assert_mp_err(mp_set_start_method("spawn", false), MP_ESTATE);
}

static void test_context_and_default(void **state)
{
    mp_process_options o;
    mp_process *p = NULL;
    mp_context *ctx = NULL;
    mp_msg *m = make_args((targ){OP_FD_CLOSED, 0, 0, 0});
    int fd0 = open("/dev/null", O_RDONLY), fd = fcntl(fd0, F_DUPFD, 20);
    targ a = {OP_FD_CLOSED, fd, 0, 0};
    close(fd0);
    assert_mp_ok(mp_msg_set_payload(m, &a, sizeof a));
    assert_mp_ok(mp_get_context("spawn", &ctx));
    mp_process_options_init(&o);
    o.context = ctx; /* spawn through the context: fd not inherited -> 0 */
    assert_mp_ok(mp_process_create("t_op", m, &o, &p));
    assert_mp_ok(mp_process_start(p));
    assert_mp_ok(mp_process_join(p, 20));
    assert_int_equal(exitcode_of(p), 0);
    assert_mp_ok(mp_process_destroy(p));
    assert_mp_ok(mp_process_create("t_op", m, NULL, &p)); /* default: fork */
    assert_mp_ok(mp_process_start(p));
    assert_mp_ok(mp_process_join(p, 20));
    assert_int_equal(exitcode_of(p), 3);
    assert_mp_ok(mp_process_destroy(p));
    mp_msg_destroy(m);
    close(fd);
}

static void *sleeper(void *arg)
{
    int fd = *(int *)arg;
    char c;
    (void)!read(fd, &c, 1);
    return NULL;
}

static void test_fork_hazard(void **state)
{
    bool hazard = true;
    int n = 0, pfd[2];
    pthread_t th;
    mp_process_options o;
    mp_process *p = NULL;
    assert_mp_ok(mp_fork_hazard(&hazard, &n));
    assert_false(hazard);
    assert_int_equal(n, 1);
    assert_int_equal(pipe2(pfd, O_CLOEXEC), 0);
    assert_int_equal(pthread_create(&th, NULL, sleeper, &pfd[0]), 0);
    assert_mp_ok(mp_fork_hazard(&hazard, &n));
    assert_true(hazard);
    assert_int_equal(n, 2);
    mp_set_fork_refuse_threads(true);
    mp_process_options_init(&o);
    o.start_method = "fork";
    assert_mp_ok(mp_process_create("t_op", NULL, &o, &p));
    assert_mp_err(mp_process_start(p), MP_ESTATE);
    assert_non_null(strstr(mp_last_error(), "spawn"));
    assert_mp_ok(mp_process_destroy(p));
    o.start_method = "spawn"; /* the safe method still works */
    assert_mp_ok(mp_process_create("t_op", NULL, &o, &p));
    assert_mp_ok(mp_process_start(p));
    assert_mp_ok(mp_process_join(p, 20));
    assert_int_equal(exitcode_of(p), 1); /* empty payload: t_op raises */
    assert_mp_ok(mp_process_destroy(p));
    mp_set_fork_refuse_threads(false);
    close(pfd[1]);
    pthread_join(th, NULL);
    close(pfd[0]);
}

/* Several threads start and join processes at once: the forkserver
 * connection, its relayed exit statuses and the live list are shared. */
typedef struct thread_job {
    const char *method;
    int base;
    int bad; /* exit codes that came back wrong */
    char why[256];
} thread_job;

static void *start_many(void *arg)
{
    thread_job *j = arg;
    mp_process_options o;
    mp_process_options_init(&o);
    o.start_method = j->method;
    for (int i = 0; i < 5; i++) {
        targ a = {OP_RETURN, j->base + i, 0, 0};
        mp_msg *m = NULL;
        mp_process *p = NULL;
        int code = -1;
        if (mp_msg_create(&m) || mp_msg_set_payload(m, &a, sizeof a) ||
            mp_process_create("t_op", m, &o, &p) || mp_process_start(p) || mp_process_join(p, 20) ||
            mp_process_exitcode(p, &code) || code != j->base + i) {
            if (!j->bad++)
                snprintf(j->why, sizeof j->why, "%s: exit %d: %s", j->method, code,
                         mp_last_error());
        }
        mp_process_destroy(p);
        mp_msg_destroy(m);
    }
    return NULL;
}

static void test_threads(void **state)
{
    thread_job jobs[4] = {{"fork", 10, 0, ""},
                          {"spawn", 20, 0, ""},
                          {"forkserver", 30, 0, ""},
                          {"forkserver", 40, 0, ""}};
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, start_many, &jobs[i]), 0);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        if (jobs[i].bad)
            fail_msg("%d failures, first: %s", jobs[i].bad, jobs[i].why);
    }
}

/* At normal exit, a daemon child gets SIGTERM (not the PDEATHSIG SIGKILL). */
static int daemon_fd = -1;
static void on_term(int sig)
{
    (void)!write(daemon_fd, "t", 1);
    _exit(42);
}

MP_ENTRY(t_daemon)
{
    size_t len;
    const int *fd = mp_msg_payload(args, &len);
    daemon_fd = *fd;
    signal(SIGTERM, on_term);
    if (write(*fd, "r", 1) != 1)
        return 2;
    for (;;)
        pause();
}

static void test_daemon_at_exit(void **state)
{
    int pfd[2];
    char c;
    pid_t mid;
    assert_int_equal(pipe(pfd), 0);
    mid = fork();
    if (mid == 0) {
        mp_process_options o;
        mp_process *p = NULL;
        mp_msg *m = NULL;
        mp_process_options_init(&o);
        o.start_method = "fork";
        o.daemon = true;
        close(pfd[0]);
        if (mp_msg_create(&m) || mp_msg_set_payload(m, &pfd[1], sizeof pfd[1]) ||
            mp_process_create("t_daemon", m, &o, &p) || mp_process_start(p))
            _exit(1);
        mp_msg_destroy(m);
        close(pfd[1]);
        sleep_ms(100);
        exit(0); /* the exit handler terminates and reaps the daemon */
    }
    close(pfd[1]);
    assert_int_equal(read(pfd[0], &c, 1), 1);
    assert_int_equal(c, 'r');
    assert_int_equal(read(pfd[0], &c, 1), 1);
    assert_int_equal(c, 't');
    {
        int st = 0;
        assert_int_equal(waitpid(mid, &st, 0), mid);
        /* exited normally (under LSan the status may be its leak report's) */
        assert_true(WIFEXITED(st));
    }
    close(pfd[0]);
}

#define ONCE(t) MP_TEST_ON(t, "fork")

enum { LIMIT_OK = 0, LIMIT_SKIP = 77, LIMIT_STARTED = 3, LIMIT_WRONG = 4 };

/* Starting under method fails with MP_EAGAIN, a sentence with where and
 * the fix, and leaves no child and no fd behind. */
static int limit_refuses(const char *method, const char *where)
{
    mp_process_options o;
    mp_process *p = NULL;
    int fds = mp_test_count_fds(), rc;
    mp_process_options_init(&o);
    o.start_method = method;
    if (mp_process_create("t_op", NULL, &o, &p) != 0)
        return LIMIT_WRONG;
    rc = mp_process_start(p);
    if (rc == 0)
        return LIMIT_STARTED;
    if (rc != MP_EAGAIN || !strstr(mp_last_error(), where) ||
        !strstr(mp_last_error(), "RLIMIT_NPROC, `ulimit -u`, is 1 here") ||
        !strstr(mp_last_error(), "raise the limit") || strstr(mp_last_error(), "mp__")) {
        fprintf(stderr, "%s: %s: %s\n", method, mp_err_name(rc), mp_last_error());
        return LIMIT_WRONG;
    }
    mp_process_destroy(p);
    return mp_test_count_fds() == fds ? LIMIT_OK : LIMIT_WRONG;
}

/* As nobody (root is exempt from RLIMIT_NPROC) at a limit of 1 process,
 * which this one already is: fork and spawn fail in this process, and
 * forkserver in the server, made to the same limit after it started. */
MP_ENTRY(nproc_child)
{
    struct rlimit one = {1, 1};
    pid_t server;
    int rc;
    (void)rank;
    (void)args;
    if (geteuid() == 0 && (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 ||
                           setresuid(65534, 65534, 65534) < 0))
        return LIMIT_SKIP;
    if (mp_forkserver_start() != 0 || (server = find_child()) <= 0)
        return LIMIT_SKIP; /* nobody cannot run this program (a private folder above it) */
    if (setrlimit(RLIMIT_NPROC, &one) < 0 || prlimit(server, RLIMIT_NPROC, &one, NULL) < 0)
        return LIMIT_SKIP;
    if ((rc = limit_refuses("fork", "mp_process_start: fork: ")) != LIMIT_OK ||
        (rc = limit_refuses("spawn", "mp_process_start: vfork: ")) != LIMIT_OK ||
        (rc = limit_refuses("forkserver", "the forkserver could not fork: ")) != LIMIT_OK)
        return rc;
    if (find_child() != server)
        return LIMIT_STARTED;
    /* the server itself cannot start again: the sentence names that start,
     * whether mp_forkserver_start or a process start asked for it */
    if (mp_forkserver_stop() != 0)
        return LIMIT_WRONG;
    if ((rc = mp_forkserver_start()) == 0)
        return LIMIT_STARTED;
    if (rc != MP_EAGAIN || !strstr(mp_last_error(), "starting the forkserver: vfork: ") ||
        !strstr(mp_last_error(), "RLIMIT_NPROC, `ulimit -u`, is 1 here")) {
        fprintf(stderr, "mp_forkserver_start: %s: %s\n", mp_err_name(rc), mp_last_error());
        return LIMIT_WRONG;
    }
    return limit_refuses("forkserver", "starting the forkserver: vfork: ");
}

/* EAGAIN from fork is a limit on processes, not "try again": the sentence
 * says which limit and its value. */
static void test_process_limit(void **state)
{
    mp_process *p = NULL;
    int code;
    assert_mp_ok(mp_process_create("nproc_child", NULL, NULL, &p));
    assert_mp_ok(mp_process_start(p));
    assert_mp_ok(mp_process_join(p, 60));
    code = exitcode_of(p);
    assert_mp_ok(mp_process_destroy(p));
    if (code == LIMIT_SKIP)
        skip();
    assert_int_equal(code, LIMIT_OK);
}

static void on_sigchld(int sig)
{
    (void)sig;
}

/* Each call that starts children refuses, in its own name, with the
 * disposition that caused it and the fix; nothing is started or left. */
static void refuses_with_sigchld_ignored(const char *how)
{
    mp_process *p = NULL;
    mp_pool *pool = NULL;
    mp_spawn_context *ctx = NULL;
    int fds = mp_test_count_fds();
    assert_mp_ok(mp_process_create("t_op", NULL, NULL, &p));
    assert_mp_err(mp_process_start(p), MP_ESTATE);
    assert_non_null(strstr(mp_last_error(), "mp_process_start: SIGCHLD is ignored"));
    assert_non_null(strstr(mp_last_error(), how));
    assert_non_null(strstr(mp_last_error(), "signal(SIGCHLD, SIG_DFL)"));
    assert_mp_ok(mp_process_destroy(p));
    assert_mp_err(mp_spawn("t_op", NULL, 2, false, false, NULL, &ctx), MP_ESTATE);
    assert_non_null(strstr(mp_last_error(), "mp_spawn: SIGCHLD is ignored"));
    assert_null(ctx);
    assert_mp_err(mp_pool_create(2, NULL, &pool), MP_ESTATE);
    assert_non_null(strstr(mp_last_error(), "mp_pool_create: SIGCHLD is ignored"));
    assert_null(pool);
    assert_int_equal(mp_test_count_children(), 0);
    assert_int_equal(mp_test_count_fds(), fds);
}

/* With SIGCHLD ignored the kernel reaps every child at its exit, and its
 * exit status is lost: every child used to look killed by SIGKILL (exit
 * code -9), and mp_spawn said so of a rank that had returned 0. */
static void test_sigchld_ignored(void **state)
{
    struct sigaction ign = {.sa_handler = SIG_IGN}, nowait = {.sa_handler = on_sigchld,
                                                              .sa_flags = SA_NOCLDWAIT},
                     old;
    mp_process *p = NULL;
    assert_int_equal(sigaction(SIGCHLD, &ign, &old), 0);
    refuses_with_sigchld_ignored("(SIG_IGN)");
    assert_int_equal(sigaction(SIGCHLD, &nowait, NULL), 0);
    refuses_with_sigchld_ignored("(SA_NOCLDWAIT)");
    /* a handler without SA_NOCLDWAIT leaves the status to be waited for */
    nowait.sa_flags = 0;
    assert_int_equal(sigaction(SIGCHLD, &nowait, NULL), 0);
    p = run_op("fork", (targ){.op = OP_RETURN, .value = 7});
    assert_int_equal(exitcode_of(p), 7);
    assert_mp_ok(mp_process_destroy(p));
    assert_int_equal(sigaction(SIGCHLD, &old, NULL), 0);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        ONCE(test_exec_failure),        ONCE(test_forkserver_restart), ONCE(test_start_methods),
        ONCE(test_context_and_default), ONCE(test_fork_hazard),        ONCE(test_threads),
        ONCE(test_daemon_at_exit),      ONCE(test_process_limit),      ONCE(test_sigchld_ignored),
    };
    if (mp_setup(&argc, &argv) != 0)
        return 1;
    {
        /* glibc caches a joined thread's stack: map it now, not in a test */
        int pfd[2];
        pthread_t th;
        if (pipe2(pfd, O_CLOEXEC) || pthread_create(&th, NULL, sleeper, &pfd[0]))
            return 1;
        close(pfd[1]);
        pthread_join(th, NULL);
        close(pfd[0]);
    }
    warm_up();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
