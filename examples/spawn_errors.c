/* spawn_errors: how a child's failure reaches the parent.
 *
 * Four ranks run a training-like loop. With --mode segv (the default) rank 2
 * dies of SIGSEGV; with --mode raise it calls mp_raise("bad batch %d", 7);
 * with --mode ok every rank finishes. On a failure the parent prints the
 * error record (rank, pid, exit code, signal name, message, backtrace) and
 * exits 1, within 2 s: the other ranks are terminated as soon as the
 * failure message arrives.
 *
 *   spawn_errors [--mode segv|raise|ok] [--start-method fork|spawn|forkserver]
 */
#include <mproc.h>

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

enum { MODE_OK, MODE_SEGV, MODE_RAISE };

static void nap_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* A deliberate invalid write to a low, non-NULL address (so sanitizers see a
 * plain SIGSEGV rather than a null-pointer report), read from a volatile so
 * the compiler cannot prove it wrong at build time. */
static volatile uintptr_t bad_address = 16;
static void corrupt_batch(void)
{
    *(volatile int *)bad_address = 7;
}

MP_ENTRY(worker)
{
    size_t len;
    const int *mode = mp_msg_payload(args, &len);
    if (len != sizeof *mode)
        mp_raise("worker: expected an int mode, got %zu bytes", len);
    for (int step = 0; step < 20; step++) {
        if (rank == 2 && step == 3 && *mode == MODE_SEGV)
            corrupt_batch();
        if (rank == 2 && step == 3 && *mode == MODE_RAISE)
            mp_raise("bad batch %d", 7);
        nap_ms(*mode == MODE_OK ? 5 : 100); /* the healthy ranks keep looping */
    }
    return 0;
}

/* 0, or 1 for --help, or -1 for anything it does not know. */
static int parse(int argc, char **argv, int *mode, const char **method)
{
    if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0))
        return 1;
    for (int i = 1; i < argc; i += 2) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (strcmp(argv[i], "--mode") == 0 && strcmp(v, "segv") == 0)
            *mode = MODE_SEGV;
        else if (strcmp(argv[i], "--mode") == 0 && strcmp(v, "raise") == 0)
            *mode = MODE_RAISE;
        else if (strcmp(argv[i], "--mode") == 0 && strcmp(v, "ok") == 0)
            *mode = MODE_OK;
        else if (strcmp(argv[i], "--start-method") == 0 && *v)
            *method = v;
        else
            return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int mode = MODE_SEGV, rc;
    const char *method = "spawn";
    mp_msg *args = NULL;
    mp_spawn_context *ctx = NULL;
    mp_child_error e = {.size = sizeof e};

    /* First, before anything else: in a spawned child this runs the entry. */
    if (mp_setup(&argc, &argv) != 0)
        return 2;
    if ((rc = parse(argc, argv, &mode, &method)) != 0) {
        fprintf(rc > 0 ? stdout : stderr,
                "usage: %s [--mode segv|raise|ok]\n"
                "         [--start-method fork|spawn|forkserver]\n"
                "  Spawns 4 ranks; with segv (the default) or raise, rank 2 fails and\n"
                "  the error record mp_spawn reports is printed.\n",
                argv[0]);
        return rc > 0 ? 0 : 2;
    }
    if (mp_msg_create(&args) != 0 || mp_msg_set_payload(args, &mode, sizeof mode) != 0) {
        fprintf(stderr, "spawn_errors: %s\n", mp_last_error());
        return 2;
    }
    rc = mp_spawn("worker", args, 4, true, false, method, &ctx);
    mp_msg_destroy(args);
    if (rc == 0) {
        printf("all 4 ranks finished (start method %s)\n", method);
        return 0;
    }
    if (rc != MP_ECHILD || mp_spawn_context_error(ctx, &e) != 0) {
        fprintf(stderr, "spawn_errors: %s: %s\n", mp_err_name(rc), mp_last_error());
        mp_spawn_context_destroy(ctx);
        return 2;
    }
    printf("child failed: %s\n", mp_last_error());
    printf("  rank      %d\n  pid       %d\n  exitcode  %d\n", e.rank, (int)e.pid, e.exitcode);
    if (e.signal)
        printf("  signal    %d (%s)\n", e.signal, e.signal_name);
    if (e.message[0])
        printf("  message   %s\n", e.message);
    if (e.backtrace[0])
        printf("  backtrace:\n%s", e.backtrace);
    mp_spawn_context_destroy(ctx);
    return 1;
}
