/* Internals of the process layer: entry registry, start methods, the child
 * runtime, launchers, the forkserver client and the per-child status
 * channel. */
#ifndef MPROC_PROCESS_INTERNAL_H
#define MPROC_PROCESS_INTERNAL_H

#include "mproc/process.h"
#include "os/os.h"

#include <stdint.h>

typedef enum mp__method {
    MP__FORK = 0,
    MP__SPAWN = 1,
    MP__FORKSERVER = 2,
    MP__METHOD_COUNT
} mp__method;

struct mp_context {
    mp__method method;
    const char *name;
};

/* ---- registry / start methods (registry.c) ------------------------------ */

/* One registry of named functions for MP_ENTRY (entries), MP_TASK (pool
 * tasks) and MP_ARRAY_TASK (pool array tasks): same limits (MP_REGISTRY_MAX
 * slots, MP_ENTRY_NAME_MAX names), lock-free lookups (safe in a forked
 * child). A name is unique among entries, and unique among tasks and array
 * tasks together (one name space: a pool task name is one or the other). */
typedef enum mp__reg_kind {
    MP__REG_ENTRY = 0,
    MP__REG_TASK = 1,
    MP__REG_ARRAY_TASK = 2
} mp__reg_kind;
/* MP_EINVAL (bad or duplicate name, NULL fn), MP_EOVERFLOW (full); call
 * names the public function in the sentence. */
int mp__registry_add(mp__reg_kind kind, const char *name, void (*fn)(void), const char *call);
void (*mp__registry_find(mp__reg_kind kind, const char *name))(void);
/* As add, from a constructor: a failure is kept (the first one) instead of
 * returned, for mp__registry_check. */
void mp__registry_add_at_load(mp__reg_kind kind, const char *name, void (*fn)(void));
/* 0, or the kept load-time failure with its sentence, prefixed by call:
 * mp_setup and every start call it, so the failure is never silent. */
int mp__registry_check(const char *call);
mp_entry_fn mp__entry_lookup(const char *name);
/* MP_EINVAL for a NULL, empty or too long name; what: "entry", "task", ... */
int mp__registry_name_check(const char *name, const char *what, const char *call);
/* As name_check, then MP_ENOENT when no entry of that name is registered;
 * what names the argument: "entry", or the role it plays ("initializer"). */
int mp__entry_check(const char *entry, const char *what, const char *call);
/* MP_EINVAL with a sentence for an unknown name. */
int mp__method_parse(const char *name, mp__method *out, const char *fn);
mp__method mp__method_default(void);
const char *mp__method_name(mp__method m);
/* A child's default start method is the one it was started with (Python's
 * spawn and forkserver children report theirs): set by the child runtime. */
void mp__method_inherit(mp__method m);
/* MP_ESTATE when fork is refused in a threaded process. */
int mp__fork_check(const char *call);
/* MP_ESTATE when SIGCHLD is ignored (SIG_IGN or SA_NOCLDWAIT): the kernel
 * then reaps every child at its exit and its exit status is lost. */
int mp__sigchld_check(const char *call);

/* ---- the status channel ----------------------------------------------------
 * Each child holds one end of a SOCK_SEQPACKET pair; the parent polls the
 * other. Parent -> child: the boot record, then the argument message.
 * Child -> parent: records that start with MP__REC_MARK and a type byte;
 * after MP__REC_SIGNAL come MP__REC_FRAME records, one per stack frame
 * ("PC BASE PATH" in hex: the address, the load address of the file it is
 * in, that file), then MP__REC_END; the parent symbolizes them (backtrace.c). */
#define MP__REC_MARK '\001'
#define MP__REC_RAISE 'R'
#define MP__REC_SIGNAL 'S'
#define MP__REC_FRAME 'F'
#define MP__REC_END 'E'
#define MP__FRAMES_MAX 48
#define MP__FRAME_PATH_MAX 1024
#define MP__BOOT_MAGIC 0x6d70626fu /* "mpbo" */
#define MP__MESSAGE_MAX 2048
/* The most send-buffer space what a child writes on its channel can take:
 * one raise record, or a signal record, MP__FRAMES_MAX frames and an end
 * record, each under 4 KiB with the kernel's per-record overhead. A child
 * end whose SO_SNDBUF holds this never blocks, so its parent need not read
 * the channel while it waits for the exit. */
#define MP__STATUS_BYTES_MAX ((MP__FRAMES_MAX + 2) * 4096)

/* Set by mp__catch_raise: mp_raise first calls it with the formatted text;
 * the hook does not return (it longjmps back to its caller). NULL: no
 * catcher. */
extern _Thread_local void (*mp__raise_hook)(const char *text);

/* Runs call(ctx) on this thread with mp_raise caught (a pool worker fails
 * one task and serves on; an MPI rank reports its entry's failure): call's
 * return, or MP_ECHILD with *raised set and mp_raise's text in text (cap
 * bytes). Like an exception, it unwinds nothing: what call allocated is
 * lost. A catcher already set on this thread is set again afterwards. */
int mp__catch_raise(int (*call)(void *), void *ctx, char *text, size_t cap, bool *raised);
#define MP__BACKTRACE_MAX 8192

typedef struct mp__boot {
    uint32_t magic;
    int32_t rank;
    int32_t method;   /* the mp__method that started the child */
    int32_t has_args; /* 0: no argument message follows (the entry gets an empty one) */
    char entry[MP_ENTRY_NAME_MAX + 1];
} mp__boot;

/* One raw frame from a dying child, until the parent symbolizes it. */
typedef struct mp__frame {
    uintptr_t pc, base;
    char *path; /* malloc'd; NULL when the address is in no file */
} mp__frame;

/* What the parent learned from a child's status channel. */
typedef struct mp__status {
    char message[MP__MESSAGE_MAX];
    char *backtrace; /* malloc'd, NUL-terminated; NULL until a line came */
    size_t bt_len;
    mp__frame *frames; /* raw frames not yet symbolized */
    int nframes;
    bool in_backtrace;
    bool failed; /* a raise or signal record arrived */
    bool eof;
} mp__status;

/* Reads every record waiting on chan without blocking. Sets st->eof at EOF
 * or on an error of the socket. */
void mp__status_drain(int chan, mp__status *st);
void mp__status_free(mp__status *st);
/* Appends one line (a newline is added) to st->backtrace. */
void mp__status_append(mp__status *st, const char *line, size_t len);

/* ---- fatal-signal backtraces (backtrace.c) --------------------------------
 * Child, inside its fatal-signal handler (async-signal-safe): sends one
 * MP__REC_FRAME per frame from fault_pc (the interrupted instruction; 0 if
 * unknown) outwards. */
void mp__backtrace_send(int chan, uintptr_t fault_pc);
/* Parent: keeps one frame record (without its two-byte header). */
void mp__backtrace_add_frame(mp__status *st, const char *rec, size_t len);
/* Parent (mp_process_error, lazily): symbolizes the frames kept so far, all
 * that arrived even if the child died before its end record, with libdw
 * into st->backtrace,
 * one "#N  function at file:line (module+0xoffset)" line each (parts libdw
 * cannot resolve are left out); no-op without frames. */
void mp__backtrace_finish(mp__status *st);
void mp__backtrace_free(mp__status *st);

/* ---- child side (child.c) --------------------------------------------------
 * Runs the child: reads the boot record and args from chan, runs the entry,
 * exits. Never returns. */
_Noreturn void mp__child_run(int chan);
/* PR_SET_PDEATHSIG(SIGKILL), then exits at once if the parent (expected)
 * already died: closes the race between fork and prctl. */
void mp__child_die_with_parent(pid_t expected_parent);
/* Makes the first backtrace() call of this process (it loads libgcc_s), so
 * that children forked afterwards do not each load it again. Idempotent. */
void mp__backtrace_prime(void);
/* mp__backtrace_prime, and the first calls of the functions a forked child
 * makes before its entry (see child.c). In the parent, before any fork. */
void mp__child_prime(void);
/* argv saved by mp_setup; NULL before. */
char *const *mp__saved_argv(void);
/* MP_ESTATE, with call's sentence saying to call mp_setup, before mp_setup. */
int mp__setup_check(const char *call);

/* ---- launchers (launch.c) ------------------------------------------------ */
/* Path exec'd by spawn and the forkserver; tests point it elsewhere to
 * check that an exec failure is reported. */
extern const char *mp__exec_path;
/* fork(): the child closes parent_end and runs mp__child_run(chan). */
int mp__launch_fork(int chan, int parent_end, pid_t *pid, int *pidfd);
/* vfork + exec of mp__exec_path with the saved argv and the environment
 * plus VAR=3,<pid>; chan becomes fd 3 in the new program, every other fd
 * but 0-2 is closed. An exec failure comes back through an O_CLOEXEC pipe.
 * pdeathsig: arm PR_SET_PDEATHSIG before the exec. call begins the error
 * sentences: what the user asked for (a process start, the forkserver's). */
int mp__launch_exec(int chan, const char *var, bool pdeathsig, pid_t *pid, int *pidfd,
                    const char *call);
/* Python's exitcode from a wait status. */
int mp__exitcode(int wstatus);
/* pidfd_send_signal; 0 when the process is already gone. */
int mp__pidfd_signal(int pidfd, int sig, const char *call);
/* "SIGSEGV" into buf. */
const char *mp__signal_name(int sig, char *buf, size_t cap);

/* ---- forkserver client (forkserver.c) ------------------------------------ */
/* Asks the server to fork a child running mp__child_run on chan. The child
 * becomes this process's own (see forkserver.c): waited for with waitpid. */
int mp__forkserver_launch(int chan, pid_t *pid, int *pidfd);
/* Server main for a program started with MPROC_FORKSERVER by parent.
 * Never returns. */
_Noreturn void mp__forkserver_main(int ctl, pid_t parent);

/* ---- processes (process.c), used by mp_spawn ----------------------------- */
int mp__process_create(const char *entry, mp_msg *args, const mp_process_options *opts, int rank,
                       mp_process **out);
int mp__process_pidfd(const mp_process *p);
/* For mp_wait: the pidfd to poll, -1 once reaped (ready); MP_EINVAL before
 * start or in another process than the starter. */
int mp__process_wait_fd(const mp_process *p, int *fd, const char *call);
int mp__process_chan(const mp_process *p);
bool mp__process_reaped(const mp_process *p);
/* Reads the status channel; true once the child reported a failure. */
bool mp__process_poll_status(mp_process *p);
/* Reaps if exited (block: wait for it). 1 when reaped, 0 still running. */
int mp__process_reap(mp_process *p, bool block);
/* torch's shutdown after a failure: waits up to grace seconds for every
 * child to exit on its own, then SIGTERMs the running ones but except (which
 * is dying on its own), waits up to kill_timeout, SIGKILLs and reaps the
 * rest. */
void mp__process_stop_all(mp_process **ps, int n, int except, double grace,
                          double kill_timeout);
/* Runs fn at normal exit before the exit handler joins the children, as
 * Python runs its finalizers (a Pool's terminate) before joining them; the
 * last registered runs first. A higher layer's children may only end when
 * fn stops them. Register each hook once (pthread_once); at most 4. */
void mp__process_on_exit(void (*fn)(void));

#endif
