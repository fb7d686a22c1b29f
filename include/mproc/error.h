/* mproc — error model, version and logging.
 *
 * Every mproc call returns int: 0 on success or a negative mp_error code.
 * Objects come back through out-parameters. After a failure,
 * mp_last_error() returns a thread-local sentence naming the failing call,
 * the system's errno text and, where one is known, the fix.
 * Codes are stable forever: never renumber, only append.
 */
#ifndef MPROC_ERROR_H
#define MPROC_ERROR_H

#include <stdarg.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MP_VERSION_MAJOR 0
#define MP_VERSION_MINOR 1
#define MP_VERSION_PATCH 0
#define MP_VERSION_STRING "0.1.0"
/* MAJOR*10000 + MINOR*100 + PATCH, for compile-time comparisons. */
#define MP_VERSION_NUMBER \
    (MP_VERSION_MAJOR * 10000 + MP_VERSION_MINOR * 100 + MP_VERSION_PATCH)

typedef enum mp_error {
    MP_OK = 0,
    MP_EINVAL = -1,      /* invalid argument */
    MP_ENOMEM = -2,      /* out of memory */
    MP_ESYS = -3,        /* a system call failed (see mp_last_error) */
    MP_ETIMEDOUT = -4,   /* the timeout expired */
    MP_ECLOSED = -5,     /* the object or its peer is closed */
    MP_EPROTO = -6,      /* malformed or unexpected data on the wire */
    MP_EMFILE = -7,      /* too many open files */
    MP_ENOSPC = -8,      /* no space left in shared memory */
    MP_ENOTSUP = -9,     /* not supported on this build or system */
    MP_EAGAIN = -10,     /* would block (the _nowait calls) */
    MP_ECHILD = -11,     /* a child process failed */
    MP_EOWNERDEAD = -12, /* lock acquired, but its previous owner died holding it */
    MP_ESTATE = -13,     /* call not valid in the object's current state */
    MP_ENOENT = -14,     /* no such name (entry, strategy, segment, attachment) */
    MP_EBROKEN = -15,    /* barrier broken: a member died or timed out */
    MP_EPERM = -16,      /* permission denied (peer of another user, ...) */
    MP_EOVERFLOW = -17,  /* a size or count does not fit */
    MP_ETOOMANYREFS = -18 /* too many fds in flight: the kernel's per-user limit */
} mp_error;

/* Short human text for a code, e.g. "invalid argument". Never NULL. */
const char *mp_strerror(int code);

/* The code's name, e.g. "MP_EINVAL". Never NULL ("MP_E?" for unknown). */
const char *mp_err_name(int code);

/* Thread-local detail of the last failure in this thread: the failing call,
 * the errno text and the fix where known. "" when none. Valid until the next
 * mproc call in the same thread. */
const char *mp_last_error(void);

/* Library version, "MAJOR.MINOR.PATCH", of the linked library: the
 * MP_VERSION_* above (the one place the version is written), which is also
 * the CMake package's, mproc.pc's and the Debian packages' version. */
const char *mp_version(void);

/* Log hook: the library never prints; when a hook is set, warnings (for
 * example leaked shared CUDA allocations at exit) go to it. level is one of
 * MP_LOG_*. NULL restores silence. Not thread-safe against concurrent logging. */
enum { MP_LOG_ERROR = 0, MP_LOG_WARN = 1, MP_LOG_INFO = 2, MP_LOG_DEBUG = 3 };
typedef void (*mp_log_fn)(int level, const char *line, void *user);
void mp_set_log_hook(mp_log_fn fn, void *user);

#ifdef __cplusplus
}
#endif
#endif
