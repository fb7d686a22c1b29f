/* mproc — error model, version and logging.
 *
 * Every call that can fail returns int: 0 on success (or, where its comment
 * says so, a non-negative count or flag) or a negative mp_error code.
 * Objects come back through out-parameters. After a failure,
 * mp_last_error() returns a thread-local sentence naming the failing call,
 * the system's errno text and, where one is known, the fix;
 * mp_last_errno() returns that errno.
 *
 * Calls that cannot fail return no code, and are the only exceptions:
 *  - _retain (returns its argument), _release, _destroy of objects whose
 *    destroy cannot fail, and _options_init (void);
 *  - getters of a valid object's properties (pointers, sizes, counts,
 *    bools: mp_tensor_shape, mp_msg_count, mp_queue_qsize, mp_process_pid,
 *    mp_queue_empty, ...);
 *  - name and text lookups (mp_strerror, mp_err_name, mp_last_error,
 *    mp_version, mp_dtype_name, mp_get_start_method, ...) and
 *    mp_set_log_hook / mp_set_fork_refuse_threads (setters with no failure).
 * Each header marks them: their comment says what they return.
 * Codes are stable forever: never renumbered, only appended
 * (docs/api-stability.md).
 */
#ifndef MPROC_ERROR_H
#define MPROC_ERROR_H

#include <stdarg.h>
#include <stddef.h>

/* Marks every public function: the library is built with
 * -fvisibility=hidden, so only what carries MP_API leaves libmproc.so.
 * A program may define MP_API itself before including mproc.h (for
 * example empty, for a static build with its own visibility rules). */
#ifndef MP_API
#define MP_API __attribute__((visibility("default")))
#endif

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

/* Every code, its value, name and text, in one list: the enum below, and
 * mp_strerror / mp_err_name in the library, are generated from it, so the
 * three can never drift apart. Values are stable forever: a new code is
 * appended at the end with the next free value, and MP_ERROR_LAST moves to
 * it; no code is ever renumbered or reused.
 *   X(name, value, "text")                                                 */
#define MP_ERROR_MAP(X)                                                                            \
    X(MP_OK, 0, "success")                                                                         \
    X(MP_EINVAL, -1, "invalid argument")                                                           \
    X(MP_ENOMEM, -2, "out of memory")                                                              \
    X(MP_ESYS, -3, "system call failed")                                                           \
    X(MP_ETIMEDOUT, -4, "timed out")                                                               \
    X(MP_ECLOSED, -5, "closed")                                                                    \
    X(MP_EPROTO, -6, "protocol error")                                                             \
    X(MP_EMFILE, -7, "too many open files")                                                        \
    X(MP_ENOSPC, -8, "no space left in shared memory")                                             \
    X(MP_ENOTSUP, -9, "not supported")                                                             \
    X(MP_EAGAIN, -10, "resource temporarily unavailable")                                          \
    X(MP_ECHILD, -11, "child process failed")                                                      \
    X(MP_EOWNERDEAD, -12, "previous owner died holding the lock")                                  \
    X(MP_ESTATE, -13, "invalid in the current state")                                              \
    X(MP_ENOENT, -14, "no such name")                                                              \
    X(MP_EBROKEN, -15, "broken")                                                                   \
    X(MP_EPERM, -16, "permission denied")                                                          \
    X(MP_EOVERFLOW, -17, "value too large")                                                        \
    X(MP_ETOOMANYREFS, -18, "too many file descriptors in flight")

typedef enum mp_error {
#define MP__ERROR_ENUM(name, value, text) name = value,
    MP_ERROR_MAP(MP__ERROR_ENUM)
#undef MP__ERROR_ENUM
} mp_error;

/* The most negative code of this version. A code c is known when
 * MP_ERROR_LAST <= c <= 0; a newer library may append codes below it, so
 * treat an unknown negative value as a failure too. */
#define MP_ERROR_LAST MP_ETOOMANYREFS

/* The errno of the last failure in this thread when it was a system call's
 * (MP_ESYS, and every code mapped from an errno: MP_EMFILE, MP_ENOSPC, ...);
 * 0 when the last failure did not come from errno. Thread-local, reset by
 * every failure the library records. */
MP_API int mp_last_errno(void);

/* Short human text for a code, e.g. "invalid argument". Never NULL. */
MP_API const char *mp_strerror(int code);

/* The code's name, e.g. "MP_EINVAL". Never NULL ("MP_E?" for unknown). */
MP_API const char *mp_err_name(int code);

/* Thread-local detail of the last failure in this thread: the failing call,
 * the errno text and the fix where known. "" when none. Valid until the next
 * mproc call in the same thread. */
MP_API const char *mp_last_error(void);

/* Library version, "MAJOR.MINOR.PATCH", of the linked library: the
 * MP_VERSION_* above (the one place the version is written), which is also
 * the CMake package's, mproc.pc's and the Debian packages' version. */
MP_API const char *mp_version(void);

/* Log hook: the library never prints; when a hook is set, warnings (for
 * example leaked shared CUDA allocations at exit) go to it. level is one of
 * MP_LOG_*. NULL restores silence. Not thread-safe against concurrent logging. */
enum { MP_LOG_ERROR = 0, MP_LOG_WARN = 1, MP_LOG_INFO = 2, MP_LOG_DEBUG = 3 };
typedef void (*mp_log_fn)(int level, const char *line, void *user);
MP_API void mp_set_log_hook(mp_log_fn fn, void *user);

#ifdef __cplusplus
}
#endif
#endif
