/* The child runtime (mp_setup, mp_raise, the fatal-signal handler) and both
 * ends of the per-child status channel. */
#include "ipc/kinds.h"
#include "process/process_internal.h"
#include "wire/wire.h"

#include <errno.h>
#include <execinfo.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <ucontext.h>
#include <unistd.h>

/* The status channel of this process when it is an mproc child, and the
 * pid it belongs to (a grandchild forked by the entry is not the child). */
static int child_chan = -1;
static pid_t child_owner;
static char **saved_argv;

char *const *mp__saved_argv(void)
{
    return saved_argv;
}

int mp__setup_check(const char *call)
{
    if (saved_argv)
        return 0;
    return mp__error(MP_ESTATE, "%s: the spawn and forkserver start methods re-execute the "
                     "program: call mp_setup(&argc, &argv) first in main", call);
}

static bool is_child(void)
{
    return child_chan >= 0 && getpid() == child_owner;
}

/* ---- child side ---------------------------------------------------------- */

void mp__child_die_with_parent(pid_t expected_parent)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* The parent may have died between fork and prctl: then nobody would
     * signal us, so check once after arming. */
    if (getppid() != expected_parent)
        _exit(1);
}

static void send_record(char type, const char *text, size_t len)
{
    char buf[MP__MESSAGE_MAX + 2];
    if (len > MP__MESSAGE_MAX)
        len = MP__MESSAGE_MAX;
    buf[0] = MP__REC_MARK;
    buf[1] = type;
    memcpy(buf + 2, text, len);
    /* Blocking send: the parent may be slow to read, never lose the text. */
    while (send(child_chan, buf, len + 2, MSG_NOSIGNAL) < 0 && errno == EINTR)
        ;
}

_Thread_local void (*mp__raise_hook)(const char *text);

static _Thread_local sigjmp_buf *catch_jmp;
static _Thread_local char *catch_text;
static _Thread_local size_t catch_cap;

static void catch_raise(const char *text)
{
    snprintf(catch_text, catch_cap, "%s", text);
    siglongjmp(*catch_jmp, 1);
}

int mp__catch_raise(int (*call)(void *), void *ctx, char *text, size_t cap, bool *raised)
{
    /* Set before sigsetjmp and never changed after it: valid after a jump. */
    void (*outer_hook)(const char *) = mp__raise_hook;
    sigjmp_buf jb, *outer_jmp = catch_jmp;
    char *outer_text = catch_text;
    size_t outer_cap = catch_cap;
    int rc;
    *raised = false;
    if (sigsetjmp(jb, 0)) {
        *raised = true;
        rc = MP_ECHILD;
    } else {
        catch_jmp = &jb;
        catch_text = text;
        catch_cap = cap;
        mp__raise_hook = catch_raise;
        rc = call(ctx);
    }
    mp__raise_hook = outer_hook;
    catch_jmp = outer_jmp;
    catch_text = outer_text;
    catch_cap = outer_cap;
    return rc;
}

static _Noreturn void child_vfail(const char *fmt, va_list ap)
{
    char text[MP__MESSAGE_MAX];
    int n = vsnprintf(text, sizeof text, fmt, ap);
    if (n < 0)
        n = 0;
    if ((size_t)n >= sizeof text)
        n = (int)sizeof text - 1;
    if (mp__raise_hook)
        mp__raise_hook(text);
    if (is_child()) {
        send_record(MP__REC_RAISE, text, (size_t)n);
        fflush(NULL);
        /* _exit: atexit handlers inherited through fork belong to the parent. */
        _exit(1);
    }
    fprintf(stderr, "mp_raise: %s\n", text);
    exit(1);
}

_Noreturn void mp_raise(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    child_vfail(fmt ? fmt : "(null)", ap);
}

/* The interrupted instruction, to cut the handler's frames off the trace. */
static uintptr_t fault_pc(const void *uctx)
{
    const ucontext_t *uc = uctx;
#if defined(__x86_64__)
    return (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    return (uintptr_t)uc->uc_mcontext.pc;
#else
    (void)uc;
    return 0;
#endif
}

static void on_fatal_signal(int sig, siginfo_t *info, void *uctx)
{
    int saved = errno;
    (void)info;
    if (is_child()) {
        char hdr[16];
        int n = snprintf(hdr, sizeof hdr, "%c%c%d", MP__REC_MARK, MP__REC_SIGNAL, sig);
        send(child_chan, hdr, (size_t)n, MSG_NOSIGNAL);
        mp__backtrace_send(child_chan, fault_pc(uctx));
        hdr[1] = MP__REC_END;
        send(child_chan, hdr, 2, MSG_NOSIGNAL);
    }
    /* SA_RESETHAND restored the default: die of the same signal. */
    raise(sig);
    errno = saved;
}

void mp__backtrace_prime(void)
{
    static _Atomic bool primed;
    void *frame;
    if (!atomic_exchange(&primed, true))
        backtrace(&frame, 1);
}

void mp__child_prime(void)
{
    stack_t ss;
    struct sigaction sa;
    int sig;
    mp__backtrace_prime();
    /* Lazy binding resolves a libc function at its first call through the
     * PLT and writes the result into the GOT: a forked child making that
     * first call pays a symbol lookup and a copied page on every start.
     * Calling the child path's functions once here, as harmless queries,
     * resolves them in the parent for all its children. */
    prctl(PR_GET_PDEATHSIG, &sig);
    (void)getppid();
    sigaltstack(NULL, &ss);
    sigaction(SIGSEGV, NULL, &sa);
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGPIPE);
}

static void install_fatal_handlers(void)
{
    static char altstack[64 * 1024];
    static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack};
    struct sigaction sa;

    /* The first backtrace() loads libgcc_s (malloc, dlopen): do it now, not
     * inside the handler where neither is safe. A forked child usually
     * inherits it loaded (mp__backtrace_prime ran before the fork). */
    mp__backtrace_prime();
    sigaltstack(&ss, NULL); /* stack overflows too */
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGPIPE);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &sa, NULL);
}

static int exit_status(int rc)
{
    if (rc == 0)
        return 0;
    return (rc & 0xff) ? (rc & 0xff) : 1;
}

/* _exit, called through a pointer the loader filled in at start: a call
 * through the PLT would be resolved lazily in every child, since no parent
 * ever calls _exit before it forks. */
static void (*volatile const child_exit)(int) = _exit;

_Noreturn void mp__child_run(int chan)
{
    mp__boot boot;
    mp_msg *args = NULL;
    mp_entry_fn fn;
    size_t len = 0;
    int nfds = 0, rc;

    child_chan = chan;
    child_owner = getpid();
    /* A fork from inside a pool task inherits the worker's catcher: an
     * mp_raise here would jump back into the copied task and make this
     * child serve the pool's socket. The child's raise ends the child. */
    mp__raise_hook = NULL;
    install_fatal_handlers();
    /* The parent wrote both records before it started us. */
    rc = mp__recv_record(chan, &boot, sizeof boot, &len, NULL, 0, &nfds, mp__deadline(30));
    if (rc < 0 || len != sizeof boot || boot.magic != MP__BOOT_MAGIC)
        mp_raise("mproc child: no valid start record from the parent (%s)",
                 rc < 0 ? mp_last_error() : "bad size or magic");
    boot.entry[MP_ENTRY_NAME_MAX] = '\0';
    mp__method_inherit((mp__method)boot.method);
    fn = mp__entry_lookup(boot.entry);
    if (!fn)
        mp_raise("mproc child: no entry called '%s' is registered in this program; "
                 "register it with MP_ENTRY at file scope so that every start method "
                 "finds it",
                 boot.entry);
    if ((rc = mp__objkinds_ensure("mproc child")) == 0)
        rc = boot.has_args ? mp__wire_recv(chan, &args, mp__deadline(30)) : mp_msg_create(&args);
    if (rc < 0)
        mp_raise("mproc child: receiving the argument message failed: %s", mp_last_error());
    rc = fn(boot.rank, args);
    mp_msg_destroy(args);
    mp__child_exit_run(); /* _exit skips atexit: e.g. the CUDA producer's warning */
    fflush(NULL);
    child_exit(exit_status(rc));
    __builtin_unreachable();
}

/* ---- mp_setup ------------------------------------------------------------- */

static int save_argv(int argc, char **argv)
{
    char **copy;
    if (saved_argv)
        return 0;
    copy = calloc((size_t)argc + 1, sizeof *copy);
    if (!copy)
        return mp__error(MP_ENOMEM, "mp_setup: out of memory");
    for (int i = 0; i < argc; i++) {
        copy[i] = strdup(argv[i] ? argv[i] : "");
        if (!copy[i]) {
            while (i-- > 0)
                free(copy[i]);
            free(copy);
            return mp__error(MP_ENOMEM, "mp_setup: out of memory");
        }
    }
    saved_argv = copy;
    return 0;
}

/* "FD,PPID" from var: 1 when set (and unset now), 0 when absent, MP_EINVAL
 * when malformed: mproc sets it for the programs it starts, so a bad value
 * is a stray variable the user should unset, not a reason to guess. */
static int parse_boot_var(const char *var, int *fd, pid_t *ppid)
{
    const char *v = getenv(var), *comma;
    char what[64], text[32], why[512];
    long long f, p;
    if (!v)
        return 0;
    comma = strchr(v, ',');
    if (!comma || (size_t)(comma - v) >= sizeof text)
        return mp__error(MP_EINVAL, "mp_setup: environment variable %s=\"%s\" is not FD,PPID; "
                         "mproc sets it only in the children it starts: unset it", var, v);
    memcpy(text, v, (size_t)(comma - v));
    text[comma - v] = '\0';
    snprintf(what, sizeof what, "%s (its FD part)", var);
    if (mp__parse_ll(what, text, 0, INT_MAX, &f) == 0) {
        snprintf(what, sizeof what, "%s (its PPID part)", var);
        if (mp__parse_ll(what, comma + 1, 1, INT_MAX, &p) == 0) {
            *fd = (int)f;
            *ppid = (pid_t)p;
            unsetenv(var); /* grandchildren started by the entry are not ours */
            return 1;
        }
    }
    snprintf(why, sizeof why, "%s", mp_last_error());
    return mp__error(MP_EINVAL, "mp_setup: environment variable %s; mproc sets it only in the "
                     "children it starts: unset it", why);
}

int mp_setup(int *argc, char ***argv)
{
    int fd, rc;
    pid_t ppid;
    if (!argc || !argv || !*argv || *argc < 1)
        return mp__error(MP_EINVAL, "mp_setup: pass &argc and &argv from main");
    if ((rc = mp__registry_check("mp_setup")) < 0 ||
        (rc = mp__objkinds_ensure("mp_setup")) < 0)
        return rc;
    rc = save_argv(*argc, *argv);
    if (rc < 0)
        return rc;
    if ((rc = parse_boot_var("MPROC_SPAWN", &fd, &ppid)) < 0)
        return rc;
    if (rc > 0) {
        mp__child_die_with_parent(ppid);
        mp__child_run(fd);
    }
    if ((rc = parse_boot_var("MPROC_FORKSERVER", &fd, &ppid)) < 0)
        return rc;
    if (rc > 0) {
        /* No PDEATHSIG (see forkserver.c): EOF on fd says the parent died. */
        if (getppid() != ppid)
            _exit(1);
        mp__forkserver_main(fd, ppid);
    }
    return 0;
}

/* ---- parent side --------------------------------------------------------- */

void mp__status_append(mp__status *st, const char *line, size_t len)
{
    char *bt;
    if (st->bt_len + len + 2 > MP__BACKTRACE_MAX)
        return;
    bt = realloc(st->backtrace, st->bt_len + len + 2);
    if (!bt)
        return;
    memcpy(bt + st->bt_len, line, len);
    st->bt_len += len;
    if (len == 0 || line[len - 1] != '\n')
        bt[st->bt_len++] = '\n';
    bt[st->bt_len] = '\0';
    st->backtrace = bt;
}

static void handle_record(mp__status *st, const char *rec, size_t len)
{
    if (len >= 2 && rec[0] == MP__REC_MARK) {
        switch (rec[1]) {
        case MP__REC_RAISE:
            if (!st->failed) {
                size_t n = len - 2 < sizeof st->message - 1 ? len - 2 : sizeof st->message - 1;
                memcpy(st->message, rec + 2, n);
                st->message[n] = '\0';
            }
            st->failed = true;
            return;
        case MP__REC_SIGNAL: /* the signal itself comes with the exit status */
            st->in_backtrace = true;
            st->failed = true;
            return;
        case MP__REC_FRAME:
            mp__backtrace_add_frame(st, rec + 2, len - 2);
            return;
        case MP__REC_END:
            st->in_backtrace = false;
            return;
        default:
            break;
        }
    }
    if (st->in_backtrace)
        mp__status_append(st, rec, len);
}

void mp__status_drain(int chan, mp__status *st)
{
    char rec[MP__MESSAGE_MAX + 8];
    int reset = 0;
    while (chan >= 0 && !st->eof) {
        ssize_t n = recv(chan, rec, sizeof rec, MSG_DONTWAIT);
        if (n > 0) {
            handle_record(st, rec, (size_t)n);
            continue;
        }
        /* ECONNRESET: the child died with records of ours unread; the
         * kernel reports that once, and its own records still follow. */
        if (n < 0 && (errno == EINTR || (errno == ECONNRESET && !reset++)))
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        st->eof = true; /* 0: the child's end is closed; < 0: reset */
    }
}

void mp__status_free(mp__status *st)
{
    free(st->backtrace);
    st->backtrace = NULL;
    st->bt_len = 0;
    mp__backtrace_free(st);
}
