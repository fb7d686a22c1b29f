/* The entries of tests/process's children and the helpers around them
 * (process_common.h). */
#include "process_common.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int do_op(const targ *a)
{
    switch (a->op) {
    case OP_RETURN:
        return a->value;
    case OP_SIGNAL:
        raise(a->value);
        return 99;
    case OP_HANG:
        for (;;)
            pause();
    case OP_RAISE:
        mp_raise("bad batch %d", a->value);
    case OP_SEGV:
        raise(SIGSEGV);
        return 98;
    case OP_FD_CLOSED:
        return fcntl(a->value, F_GETFD) < 0 && errno == EBADF ? 0 : 3;
    case OP_SLEEP_MS:
        sleep_ms(a->value);
        return 0;
    default:
        return 97;
    }
}

MP_ENTRY(t_op)
{
    size_t len;
    const targ *a = mp_msg_payload(args, &len);
    if (len != sizeof *a)
        mp_raise("t_op: payload of %zu bytes", len);
    return do_op(a);
}

/* Under mp_spawn: rank_to_fail does op, the others hang. */
MP_ENTRY(t_rank)
{
    size_t len;
    const targ *a = mp_msg_payload(args, &len);
    targ hang = {.op = OP_HANG};
    if (len != sizeof *a)
        mp_raise("t_rank: payload of %zu bytes", len);
    if (a->rank_to_fail < 0)
        return rank == 0 ? 0 : do_op(&(targ){.op = OP_SLEEP_MS, .value = 20 * rank});
    if (a->stubborn) {
        /* "ready" (shared int32[1]): the others ignore SIGTERM before the
         * failing rank fails. */
        mp_tensor *t = NULL;
        volatile int32_t *ready;
        if (mp_msg_find_tensor(args, "ready", &t) != 0)
            mp_raise("t_rank: no ready tensor");
        ready = mp_tensor_data(t);
        if (rank != a->rank_to_fail) {
            signal(SIGTERM, SIG_IGN);
            __atomic_fetch_add(ready, 1, __ATOMIC_SEQ_CST);
        } else {
            for (int i = 0; i < 2000 && __atomic_load_n(ready, __ATOMIC_SEQ_CST) == 0; i++)
                sleep_ms(5);
        }
        mp_tensor_release(t);
    }
    return do_op(rank == a->rank_to_fail ? a : &hang);
}

/* Writes payload value + rank into element rank of the tensor "t". */
MP_ENTRY(t_tensor)
{
    size_t len;
    const int *v = mp_msg_payload(args, &len);
    mp_tensor *t = NULL;
    if (len != sizeof *v || mp_msg_find_tensor(args, "t", &t) != 0)
        mp_raise("t_tensor: bad arguments (%zu bytes): %s", len, mp_last_error());
    if (rank >= mp_tensor_numel(t))
        mp_raise("t_tensor: rank %d out of range", rank);
    ((int32_t *)mp_tensor_data(t))[rank] = *v + rank;
    mp_tensor_release(t);
    return 0;
}

mp_msg *make_args(targ a)
{
    mp_msg *m = NULL;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_set_payload(m, &a, sizeof a));
    return m;
}

/* Runs t_op with a under method to the end; returns the process. */
mp_process *run_op(const char *method, targ a)
{
    mp_process_options o;
    mp_process *p = NULL;
    mp_msg *m = make_args(a);
    mp_process_options_init(&o);
    o.start_method = method;
    assert_mp_ok(mp_process_create("t_op", m, &o, &p));
    assert_mp_ok(mp_process_start(p));
    mp_msg_destroy(m);
    assert_mp_ok(mp_process_join(p, 20));
    return p;
}

int exitcode_of(mp_process *p)
{
    int code = 12345;
    assert_mp_ok(mp_process_exitcode(p, &code));
    return code;
}

bool pid_gone(pid_t pid)
{
    char state = mp_test_proc_state(pid);
    /* unreadable: gone; Z or X: dead, waiting for init to reap it */
    return state == 0 || state == 'Z' || state == 'X';
}

/* Sanitizer allocators map size classes on first use: exercise every path
 * once before the tests, so their leak checks see only real growth. */
void warm_up(void)
{
    static const char *const methods[] = {"fork", "spawn", "forkserver"};
    for (int i = 0; i < 3; i++) {
        mp_spawn_context *ctx = NULL;
        static const int ops[] = {OP_RETURN, OP_RAISE, OP_SEGV};
        for (int k = 0; k < 3; k++) {
            targ a = {ops[k], 1, ops[k] == OP_RETURN ? -1 : 1, 0};
            mp_msg *m = NULL;
            mp_msg_create(&m);
            mp_msg_set_payload(m, &a, sizeof a);
            mp_spawn("t_rank", m, 3, true, false, methods[i], &ctx);
            mp_spawn_context_destroy(ctx);
            mp_spawn("t_rank", m, 4, false, false, methods[i], &ctx);
            mp_spawn_context_join(ctx, 0);
            mp_spawn_context_destroy(ctx);
            mp_msg_destroy(m);
        }
        mp_forkserver_stop();
    }
}
