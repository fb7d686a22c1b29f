/* Error codes, their names and texts, and the thread-local detail sentence. */
#include "os/os.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

static _Thread_local char last_error[512];
static mp_log_fn log_hook;
static void *log_user;

static _Thread_local int last_errno;

static const struct {
    int code;
    const char *name;
    const char *text;
} codes[] = {
#define ROW(name, value, text) {name, #name, text},
    MP_ERROR_MAP(ROW)
#undef ROW
};

_Static_assert(sizeof codes / sizeof codes[0] == 1 - MP_ERROR_LAST,
               "MP_ERROR_LAST is the last code and codes are dense");

/* Codes are dense from 0 down to MP_ERROR_LAST: the row is -code. */
static int find(int code)
{
    return code > 0 || code < MP_ERROR_LAST ? -1 : -code;
}

const char *mp_strerror(int code)
{
    int i = find(code);
    return i < 0 ? "unknown error code" : codes[i].text;
}

const char *mp_err_name(int code)
{
    int i = find(code);
    return i < 0 ? "MP_E?" : codes[i].name;
}

const char *mp_last_error(void) { return last_error; }

int mp_last_errno(void) { return last_errno; }

const char *mp_version(void) { return MP_VERSION_STRING; }

void mp_set_log_hook(mp_log_fn fn, void *user)
{
    log_hook = fn;
    log_user = user;
}

bool mp__log(int level, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    if (!log_hook)
        return false;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    log_hook(level, line, log_user);
    return true;
}

void mp__error_clear(void)
{
    last_error[0] = '\0';
    last_errno = 0;
}

void mp__error_save(mp__error_saved *s)
{
    _Static_assert(sizeof s->text == sizeof last_error, "one size");
    memcpy(s->text, last_error, sizeof last_error);
    s->err = errno;
    s->last_errno = last_errno;
}

void mp__error_restore(const mp__error_saved *s)
{
    memcpy(last_error, s->text, sizeof last_error);
    errno = s->err;
    last_errno = s->last_errno;
}

int mp__error(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    last_errno = 0;
    return code;
}

static int mp__errno_code(int err)
{
    switch (err) {
    case EMFILE:
    case ENFILE: return MP_EMFILE;
    case ENOSPC: return MP_ENOSPC;
    case ENOMEM: return MP_ENOMEM;
    case ETIMEDOUT: return MP_ETIMEDOUT;
    case EPIPE:
    case ECONNRESET:
    case ECONNREFUSED: return MP_ECLOSED;
    case EAGAIN: return MP_EAGAIN;
    case EPERM:
    case EACCES: return MP_EPERM;
    case ENOENT: return MP_ENOENT;
    case ENOSYS:
    case EOPNOTSUPP: return MP_ENOTSUP;
    case EOVERFLOW:
    case EFBIG: return MP_EOVERFLOW;
    case ETOOMANYREFS: return MP_ETOOMANYREFS;
    default: return MP_ESYS;
    }
}

static const char *fix_for(int err)
{
    switch (err) {
    case EMFILE:
        return " (raise the open-files limit with `ulimit -n` / setrlimit(RLIMIT_NOFILE), "
               "or switch to the file_system sharing strategy)";
    case ENFILE: return " (the system-wide file table is full: raise fs.file-max)";
    case ENOSPC:
        return " (free space in /dev/shm or enlarge it, e.g. `mount -o remount,size=8G "
               "/dev/shm`, or docker's --shm-size)";
    default: return "";
    }
}

/* Linux refuses to queue more fds on Unix sockets once the fds a user has
 * sent and nobody has received yet exceed the sender's RLIMIT_NOFILE
 * (unix_inflight, too_many_unix_fds); root with CAP_SYS_RESOURCE is exempt. */
static void fix_toomanyrefs(char *buf, size_t cap)
{
    struct rlimit rl = {0, 0};
    getrlimit(RLIMIT_NOFILE, &rl);
    snprintf(buf, cap, " (the kernel caps the fds a user has sent over Unix sockets and not "
             "yet received at the sender's open-files limit, RLIMIT_NOFILE = %llu here: keep "
             "fewer tensors in flight, use the file_system sharing strategy (it sends names, "
             "not fds), or raise the limit with `ulimit -n` / setrlimit)",
             (unsigned long long)rl.rlim_cur);
}

/* fork's EAGAIN is no "try again": a limit on processes is reached. */
static void fix_fork_limit(char *buf, size_t cap)
{
    struct rlimit rl = {RLIM_INFINITY, RLIM_INFINITY};
    char limit[32] = "unlimited";
    getrlimit(RLIMIT_NPROC, &rl);
    if (rl.rlim_cur != RLIM_INFINITY)
        snprintf(limit, sizeof limit, "%llu", (unsigned long long)rl.rlim_cur);
    snprintf(buf, cap, " (a limit on processes is reached: this user's RLIMIT_NPROC, `ulimit -u`, "
             "is %s here; or kernel.pid_max, kernel.threads-max or a cgroup's pids.max: let "
             "processes exit, start fewer, or raise the limit)", limit);
}

static int errno_error(int err, bool forking, const char *fmt, va_list ap)
{
    char fix[320];
    size_t n;
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    if (err == ETOOMANYREFS)
        fix_toomanyrefs(fix, sizeof fix);
    else if (err == EAGAIN && forking)
        fix_fork_limit(fix, sizeof fix);
    else
        snprintf(fix, sizeof fix, "%s", fix_for(err));
    last_errno = err;
    n = strlen(last_error);
    if (n < sizeof last_error)
        snprintf(last_error + n, sizeof last_error - n, ": %s%s", strerror(err), fix);
    return mp__errno_code(err);
}

int mp__errno_error(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = errno_error(err, false, fmt, ap);
    va_end(ap);
    return rc;
}

int mp__fork_error(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = errno_error(err, true, fmt, ap);
    va_end(ap);
    return rc;
}
