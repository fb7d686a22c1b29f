/* mproc — processes, start methods, contexts and mp_spawn.
 *
 * Entry functions are registered by name at load time with MP_ENTRY, so a
 * child started by exec (spawn) or by the forkserver finds them. Call
 * mp_setup(&argc, &argv) at the top of main: in a child started by exec it
 * runs the entry and exits, never returning; in the parent it returns 0 at
 * once. Code above mp_setup runs in every spawned child too (as Python code
 * above `if __name__ == '__main__':` does).
 *
 * Start methods: "fork" (the default; the child runs the entry in a copy of
 * the parent), "spawn" (vfork + exec of /proc/self/exe with the same argv,
 * environment and cwd; only the argument message crosses) and "forkserver"
 * (a single-threaded server, exec'd on first use, forks children on
 * request; they become the parent's own children, re-parented to it as a
 * child subreaper, so they outlive the server and report their real exit
 * code). Every child dies with its parent (PR_SET_PDEATHSIG), reports a
 * failure through its own status channel (mp_raise text, fatal-signal
 * backtrace) and is reaped by mproc, never left a zombie.
 * docs/processes.md explains the choice of default and each call.
 */
#ifndef MPROC_PROCESS_H
#define MPROC_PROCESS_H

#include <stdbool.h>
#include <sys/types.h>

#include "mproc/error.h"
#include "mproc/msg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An entry: rank is the child's index under mp_spawn and 0 for a plain
 * mp_process. args is the argument message (owned by the runtime; retain
 * what you keep). Returning non-zero fails the child with that exit code. */
typedef int (*mp_entry_fn)(int rank, mp_msg *args);

/* Longest entry or task name, bytes without the NUL. */
#define MP_ENTRY_NAME_MAX 127
/* How many entries and pool tasks one program can register, together: one
 * registry holds both (a name is unique among its kind). */
#define MP_REGISTRY_MAX 1024

/* Registers fn under name. MP_EINVAL on a duplicate, empty or too long
 * name or a NULL fn; MP_EOVERFLOW when MP_REGISTRY_MAX functions are
 * registered. Thread-safe. */
MP_API int mp_register_entry(const char *name, mp_entry_fn fn);
/* What MP_ENTRY calls from its constructor, before main: registers as
 * mp_register_entry, but a constructor has nobody to return a failure to,
 * so the first failure (a duplicate name, a full registry) is kept and
 * returned, with its sentence naming the entry, by mp_setup and by every
 * mp_process_start, mp_spawn and mp_pool_create. */
MP_API void mp_register_entry_at_load(const char *name, mp_entry_fn fn);

/* Defines and registers an entry called NAME:
 *   MP_ENTRY(worker) { ... use rank, args ...; return 0; } */
#define MP_ENTRY(NAME)                                                                             \
    static int NAME(int rank, mp_msg *args);                                                       \
    __attribute__((constructor)) static void mp__register_entry_##NAME(void)                       \
    {                                                                                              \
        mp_register_entry_at_load(#NAME, NAME);                                                    \
    }                                                                                              \
    static int NAME(int rank, mp_msg *args)

/* See the file comment. Returns 0 in the parent; never returns in a child
 * started by exec (spawn) nor in the forkserver. Fails with the kept error
 * when an MP_ENTRY or MP_TASK could not be registered (see
 * mp_register_entry_at_load). Saves argv for spawn,
 * which re-executes the program with it: spawn and forkserver fail with
 * MP_ESTATE until mp_setup has run. Call it once, from main, first.
 * MP_EINVAL when MPROC_SPAWN or MPROC_FORKSERVER (set by mproc in the
 * children it starts) is in the environment but malformed: unset it. */
MP_API int mp_setup(int *argc, char ***argv);

/* Fails the current unit of work with a message; never returns to its
 * caller. Where it goes depends on what is running:
 *  - in a pool task (mp_pool_*, on the task's thread): the item fails with
 *    the message (MP_ECHILD in its result) and control jumps back to the
 *    worker's loop, which serves on; like an exception it unwinds nothing,
 *    so memory the task allocated before raising is lost;
 *  - in a child started by mp_process or mp_spawn: the message reaches the
 *    parent's error record, then the child exits with status 1 (stdio
 *    flushed, atexit handlers not run);
 *  - in any other process: the message goes to stderr and it exits 1.
 * (GNU attribute form: valid C and C++.) */
MP_API __attribute__((noreturn, format(printf, 1, 2))) void mp_raise(const char *fmt, ...);

/* ---- start methods and contexts ------------------------------------------ */

/* A start method bound to an object, as Python's multiprocessing contexts:
 * one program can start some processes with fork and others with spawn.
 * Contexts are static: never destroyed. */
typedef struct mp_context mp_context;

/* Sets the default start method: "fork", "spawn" or "forkserver". Once set
 * (or once read by mp_get_start_method or used by a start) it is fixed:
 * a second call fails with MP_ESTATE unless force is true. With force, NULL
 * unsets it (the next use picks the default, "fork"). MP_EINVAL for an
 * unknown name. Thread-safe. */
MP_API int mp_set_start_method(const char *method, bool force);
/* The default start method's name; fixes it, as Python's
 * get_start_method() does. In a child, the method it was started with.
 * Never fails. */
MP_API const char *mp_get_start_method(void);
/* NULL-terminated static list of the methods this system supports, the
 * default first. */
MP_API const char *const *mp_get_all_start_methods(void);
/* The context of method (NULL: the default method). MP_EINVAL for an
 * unknown name. *out is static; nothing to free. */
MP_API int mp_get_context(const char *method, mp_context **out);
/* The context's start method name. */
MP_API const char *mp_context_start_method(const mp_context *ctx);

/* Starts the forkserver now (idempotent) instead of on first use, e.g.
 * before creating threads or big allocations. Needs mp_setup (MP_ESTATE
 * before it). Blocks for the exec (a few ms). Thread-safe. */
MP_API int mp_forkserver_start(void);
/* Stops the forkserver: closes its connection; the server exits and is
 * reaped. Children it started are the caller's and keep running. No-op
 * when none runs. Blocks up to 2 s. Thread-safe. */
MP_API int mp_forkserver_stop(void);

/* fork() copies only the calling thread; a lock held by another thread at
 * that moment (malloc's, stdio's, a library's) stays locked forever in the
 * child. mp_fork_hazard reports whether the calling process has more than
 * one thread now (*nthreads: how many). */
MP_API int mp_fork_hazard(bool *hazard, int *nthreads);
/* With refuse true, starting a process with "fork" from a multi-threaded
 * process fails with MP_ESTATE naming spawn and forkserver; with false (the
 * default) it proceeds silently. Thread-safe. */
MP_API void mp_set_fork_refuse_threads(bool refuse);

/* ---- Process -------------------------------------------------------------
 * Thread safety: one thread at a time per process object; different objects
 * may be used from different threads at once. Fork safety: only the process
 * that started a child may wait for or signal it (MP_ESTATE in a forked
 * copy). Only start and join block (start: for a spawn exec, a few ms); the
 * getters, is_alive, terminate and kill never block. */

typedef struct mp_process mp_process;

typedef struct mp_process_options {
    size_t size;              /* sizeof(mp_process_options), set by _init */
    const char *name;         /* copied; NULL: "Process-<n>" */
    bool daemon;              /* terminated (SIGTERM) when the parent exits normally */
    const char *start_method; /* NULL: the context's, else the default */
    mp_context *context;      /* NULL: the default context */
} mp_process_options;

/* Sets every field of *opts to its default (and size); call before changing one. */
MP_API void mp_process_options_init(mp_process_options *opts);

/* A failed child's record (also filled for a successful one). The strings
 * belong to the process (or spawn context) and live as long as it. Set
 * size before the call (mp_child_error e = {.size = sizeof e};): the
 * library writes no more than that, so the record can grow. */
typedef struct mp_child_error {
    size_t size; /* sizeof(mp_child_error), set by the caller */
    int rank; /* index under mp_spawn; 0 for an mp_process */
    pid_t pid;
    int exitcode;            /* as exitcode: status, or -signal */
    int signal;              /* the signal that killed it, or 0 */
    const char *signal_name; /* "SIGSEGV", or "" */
    const char *message;     /* the mp_raise text, or "" */
    /* For a fatal signal, one line per frame, innermost first, symbolized
     * by the parent from the program's symbols and DWARF:
     * "#0  fn at file.c:42 (module+0x1a2b)"; "#N  ?? (module+0x...)" where
     * nothing resolves. "" otherwise. */
    const char *backtrace;
    const char *name;        /* the process name */
} mp_child_error;

/* Creates a process that will run the entry registered as `entry` with the
 * message args. args is borrowed: it must stay valid until
 * mp_process_start returns, which sends it (NULL: an empty message).
 * opts may be NULL. Errors: MP_EINVAL (bad argument or start method),
 * MP_ENOENT (no entry of that name is registered), MP_ENOMEM. */
MP_API int mp_process_create(const char *entry, mp_msg *args, const mp_process_options *opts,
                      mp_process **out);
/* Starts the child. Does not wait for the entry to run. With "fork",
 * stdio's buffers are flushed first (fflush(NULL), as CPython does), so
 * unflushed output is not printed again by the child. Errors: MP_ESTATE
 * (started before; fork refused in a threaded process; spawn without
 * mp_setup; SIGCHLD ignored, by SIG_IGN or SA_NOCLDWAIT, which loses every
 * child's exit status), MP_EAGAIN (a limit on processes: RLIMIT_NPROC,
 * pids.max),
 * MP_ESYS/MP_EMFILE/MP_ENOMEM (fork, exec, socket), the errors of sending
 * args (MP_ENOSPC, ...). On error no child is left. */
MP_API int mp_process_start(mp_process *p);
/* Waits until the child exits and reaps it. timeout in seconds, negative
 * waits forever. 0 when it has exited (whatever its exitcode),
 * MP_ETIMEDOUT if still running, MP_ESTATE before start or from another
 * process than the one that started it. */
MP_API int mp_process_join(mp_process *p, double timeout);
/* True from start until the child has exited. Never blocks. */
MP_API bool mp_process_is_alive(mp_process *p);
/* Python's sentinel: an fd (the child's pidfd) that becomes readable when
 * the child exits, to poll together with other fds (or use mp_wait,
 * mproc/wait.h). Owned by p; -1 before start and once the child has been
 * reaped. Never blocks. */
MP_API int mp_process_sentinel(const mp_process *p);
/* The child's pid; 0 before start. */
MP_API pid_t mp_process_pid(const mp_process *p);
MP_API const char *mp_process_name(const mp_process *p);
MP_API bool mp_process_daemon(const mp_process *p);
/* The exit code as Python gives it: 0, the exit status, or minus the signal
 * number. MP_ESTATE before start or while the child runs (Python's None). */
MP_API int mp_process_exitcode(mp_process *p, int *exitcode);
/* The record of the finished child: exit code, signal, mp_raise message,
 * backtrace. MP_ESTATE before it has finished. */
MP_API int mp_process_error(mp_process *p, mp_child_error *out);
/* SIGTERM / SIGKILL the child (through its pidfd: never a recycled pid).
 * No-op once it has exited. MP_ESTATE before start. */
MP_API int mp_process_terminate(mp_process *p);
MP_API int mp_process_kill(mp_process *p);
/* Frees p. NULL is a no-op. MP_ESTATE (and nothing freed) while the child
 * is still running: join, terminate or kill it first. */
MP_API int mp_process_destroy(mp_process *p);

/* ---- mp_spawn ------------------------------------------------------------
 * A spawn context, like a process, is used by one thread at a time and only
 * by the process that created it. */

typedef struct mp_spawn_context mp_spawn_context;

typedef struct mp_spawn_options {
    size_t size;              /* sizeof(mp_spawn_options), set by _init */
    int nprocs;               /* children, >= 1 (default 1) */
    bool join;                /* block until all finish or one fails (default true) */
    bool daemon;              /* default false */
    const char *start_method; /* NULL: the default method */
    double grace_period; /* after a failure, seconds the others get to finish on
                          * their own before SIGTERM (torch's grace_period; 0) */
    double kill_timeout; /* seconds between that SIGTERM and SIGKILL (1.0) */
} mp_spawn_options;

/* Sets every field of *opts to its default (and size); call before changing one. */
MP_API void mp_spawn_options_init(mp_spawn_options *opts);

/* torch.multiprocessing.spawn: runs entry(rank, args) in nprocs children.
 * With join it blocks until all have exited (0) or one failed (MP_ECHILD,
 * the others terminated and everything reaped); *ctx (ctx may be NULL) is
 * then NULL on success, and on MP_ECHILD the finished context holding the
 * error record, for the caller to destroy. Without join it returns at once
 * with *ctx (required) to join later. Other errors: MP_EINVAL (a bad
 * option, each named with its value), MP_ENOENT (no entry of that name is
 * registered: checked before any child starts), and those of
 * mp_process_start (MP_ESTATE for SIGCHLD ignored, refused before any
 * child starts); no child is left behind. */
MP_API int mp_spawn(const char *entry, mp_msg *args, int nprocs, bool join, bool daemon,
                    const char *start_method, mp_spawn_context **ctx);
MP_API int mp_spawn_ex(const char *entry, mp_msg *args, const mp_spawn_options *opts,
                       mp_spawn_context **ctx);

/* Waits on all children at once (pidfds and status channels in one poll).
 * 0: all exited with 0. MP_ETIMEDOUT: not done yet (timeout seconds,
 * negative forever, 0 polls). MP_ECHILD: a child failed; it is the first
 * failure seen, reported within milliseconds of its mp_raise message or
 * fatal signal; as torch does, the others got grace_period seconds to
 * finish on their own, then SIGTERM, then SIGKILL kill_timeout seconds
 * later, and all are reaped (this call blocks for that);
 * mp_spawn_context_error gives the record and mp_last_error a sentence.
 * Later calls return the same result. */
MP_API int mp_spawn_context_join(mp_spawn_context *ctx, double timeout);
/* The failing child's record: MP_ESTATE when no child has failed. */
MP_API int mp_spawn_context_error(const mp_spawn_context *ctx, mp_child_error *out);
MP_API int mp_spawn_context_nprocs(const mp_spawn_context *ctx);
/* Pid of rank; 0 for a bad rank. */
MP_API pid_t mp_spawn_context_pid(const mp_spawn_context *ctx, int rank);
/* After a child fails, the seconds the others get to finish on their own
 * before SIGTERM (>= 0; MP_EINVAL otherwise). */
MP_API int mp_spawn_context_set_grace_period(mp_spawn_context *ctx, double seconds);
/* Seconds between that SIGTERM and SIGKILL (>= 0; MP_EINVAL otherwise). */
MP_API int mp_spawn_context_set_kill_timeout(mp_spawn_context *ctx, double seconds);
/* Frees ctx. Children still running get SIGTERM at once, then SIGKILL
 * after kill_timeout, and are reaped. NULL is a no-op. Blocks at most
 * kill_timeout. */
MP_API void mp_spawn_context_destroy(mp_spawn_context *ctx);

#ifdef __cplusplus
}
#endif
#endif
