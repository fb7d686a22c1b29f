/* The one internal porting header: everything above src/os/ reaches Linux
 * through these wrappers, and every system call that can fail in an
 * interesting way goes through mp__sys, a table that tests swap to inject
 * EMFILE, ENOSPC, EINTR, ENOMEM on demand (as SQLite's os layer does). */
#ifndef MPROC_OS_H
#define MPROC_OS_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <poll.h>
#include <spawn.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

#include "mproc/error.h"

struct msghdr;
struct stat;

/* ---- error reporting (src/os/error.c) ---------------------------------- */

/* Records the thread-local sentence and returns code, so callers can
 * `return mp__error(MP_EINVAL, "mp_tensor_view: dim %d out of range", d);` */
int mp__error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Like mp__error, appends ": <strerror(err)>" and maps err to a code:
 * EMFILE/ENFILE -> MP_EMFILE (with the fix: raise the open-files limit or
 * switch to the file_system strategy), ENOSPC -> MP_ENOSPC, ENOMEM ->
 * MP_ENOMEM, ETIMEDOUT -> MP_ETIMEDOUT, EPIPE/ECONNRESET -> MP_ECLOSED,
 * EAGAIN -> MP_EAGAIN, EPERM/EACCES -> MP_EPERM, ENOENT -> MP_ENOENT,
 * everything else -> MP_ESYS. */
int mp__errno_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* mp__errno_error for a failed fork, vfork or clone: EAGAIN gets the fix for
 * a limit on processes (RLIMIT_NPROC's value, pid_max, pids.max). */
int mp__fork_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Clears the thread-local sentence (successful calls need not call it). */
void mp__error_clear(void);
/* The calling thread's mp_last_error() sentence and errno, kept aside and
 * put back: for work inside a library call (the shm manager client's
 * reports) whose own failures must not replace the call's. */
typedef struct mp__error_saved {
    char text[512];
    int err;
    int last_errno;
} mp__error_saved;
void mp__error_save(mp__error_saved *s);
void mp__error_restore(const mp__error_saved *s);
/* Sends a line to the log hook, if one is set; false when none is. */
bool mp__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- strict number parsing (src/os/parse.c) -----------------------------
 * One rule for every number a person types: command-line options and
 * environment variables. The whole string must be one decimal number inside
 * [min, max]; empty strings, junk after the digits, overflow, NaN, inf and
 * hex are refused with MP_EINVAL and a sentence that names what (an option
 * such as "--tensors" or a variable such as "MPROC_SHM_MANAGER_GRACE"), the
 * text given, what is wrong and the accepted range. */
int mp__parse_ll(const char *what, const char *text, long long min, long long max,
                 long long *out);
int mp__parse_double(const char *what, const char *text, double min, double max, double *out);
/* The same for $name: 0 leaves *out alone when it is unset or empty (the
 * caller's default holds), 1 when it was set and valid, MP_EINVAL (with the
 * variable named, and "unset it" in the fix) when it was set but bad. */
int mp__env_ll(const char *name, long long min, long long max, long long *out);
int mp__env_double(const char *name, double min, double max, double *out);

/* ---- live lists ------------------------------------------------------------ */

/* A link in a layer's list of its live objects (children, pools) that an
 * exit handler walks; the caller holds the list's lock. */
typedef struct mp__link {
    struct mp__link *prev, *next;
    void *self; /* the object the link is part of */
} mp__link;

static inline void mp__link_push(mp__link **head, mp__link *l, void *self)
{
    l->self = self;
    l->prev = NULL;
    l->next = *head;
    if (*head)
        (*head)->prev = l;
    *head = l;
}

/* A link not in the list (never pushed, or removed) is left as it is. */
static inline void mp__link_remove(mp__link **head, mp__link *l)
{
    if (l->prev)
        l->prev->next = l->next;
    else if (*head == l)
        *head = l->next;
    if (l->next)
        l->next->prev = l->prev;
    l->prev = l->next = NULL;
}

/* ---- extensible structs (src/os/extstruct.c) ---------------------------- */

/* Every public options, callbacks or record struct starts with
 * `size_t size`, set by the caller (its _init function, or sizeof). The
 * struct only ever grows at its end, and a new field's zero value means the
 * behaviour from before it existed (docs/api-stability.md). */
#define MP__STRUCT_SIZE_MAX 4096

/* Copies the caller's struct src into the library's dst (dst_size bytes):
 * an older, smaller struct is zero-filled up to dst_size; a newer, larger
 * one is accepted when every byte past dst_size is zero (MP_ENOTSUP naming
 * the byte otherwise). MP_EINVAL for a size below sizeof(size_t) or above
 * MP__STRUCT_SIZE_MAX (not initialized). dst's size becomes dst_size. */
int mp__struct_in(void *dst, size_t dst_size, const void *src, const char *call,
                  const char *type);
/* Writes the library's record src (src_size bytes) into the caller's dst,
 * whose size field says how much room it has: at most that much is written,
 * a larger caller's tail is zeroed, dst's size field is left as it was. */
int mp__struct_out(void *dst, const void *src, size_t src_size, const char *call,
                   const char *type);

/* ---- the one fork handler (src/os/atfork.c) ---------------------------- */

/* The locks mproc holds across fork, in the order prepare takes them
 * (outermost first); code that holds two of them at once takes them in
 * this order too. parent and child release in reverse. A new lock gets a
 * level here, placed by what it is held around. */
typedef enum mp__fork_level {
    MP__FORK_POOL_LIST,    /* pool/exit.c live_lock: the running pools; held
                            * with no other lock */
    MP__FORK_FORKSERVER,   /* forkserver.c fs.lock: held while sending a start
                            * request, whose message shares tensors (below) */
    MP__FORK_PROCESS_LIST, /* process.c list_lock: the live children */
    MP__FORK_STORAGE_USER, /* tensor/storage.c user_lock: segment -> storage */
    MP__FORK_SHM_PINS,     /* shm/pins.c lock: pins, which hold segments */
    MP__FORK_SHM_CACHE,    /* shm/cache.c lock: the mapping cache */
    MP__FORK_SHM_RECYCLE,  /* shm/recycle.c lock: the pool of reusable segments */
    MP__FORK_SHM_MANAGER,  /* shm/manager_client.c lock: daemon reports */
    MP__FORK_IDS,          /* os/ids.c: no lock; the child forgets cached ids */
    MP__FORK_LEVELS
} mp__fork_level;
typedef struct mp__fork_handlers {
    void (*prepare)(void);
    void (*parent)(void);
    void (*child)(void);
} mp__fork_handlers;
/* Installs h (static storage; any member may be NULL) at level, replacing
 * what was there. The first call installs the one pthread_atfork handler. */
void mp__atfork_register(mp__fork_level level, const mp__fork_handlers *h);

/* ---- fork hazards and child-exit work (src/os/hazard.c) ---------------- */

/* 0 when forking is safe for the registering layer, else a negative code
 * with a sentence naming call and the fix. */
typedef int (*mp__fork_hazard_fn)(const char *call);
/* A layer above registers these when it becomes a hazard / gets exit work
 * (idempotent; up to 8 of each; MP_EOVERFLOW past that). */
int mp__fork_hazard_register(mp__fork_hazard_fn fn);
int mp__child_exit_register(void (*fn)(void));
/* The process layer: before a fork-method start, and before an mproc
 * child's _exit (which skips atexit). */
int mp__fork_hazards_check(const char *call);
void mp__child_exit_run(void);

/* ---- swappable system calls (src/os/sys.c) ----------------------------- */

/* Each member has the libc signature and errno convention, except
 * posix_fallocate and posix_spawn, which return the error number (they do
 * not set errno). */
typedef struct mp__sys_table {
    int (*memfd_create)(const char *name, unsigned int flags);
    int (*shm_open)(const char *name, int oflag, mode_t mode);
    int (*shm_unlink)(const char *name);
    int (*ftruncate)(int fd, off_t length);
    int (*posix_fallocate)(int fd, off_t offset, off_t len);
    void *(*mmap)(void *addr, size_t length, int prot, int flags, int fd, off_t off);
    int (*munmap)(void *addr, size_t length);
    int (*madvise)(void *addr, size_t length, int advice);
    ssize_t (*pwritev)(int fd, const struct iovec *iov, int n, off_t off);
    ssize_t (*sendmsg)(int fd, const struct msghdr *msg, int flags);
    ssize_t (*recvmsg)(int fd, struct msghdr *msg, int flags);
    int (*socketpair)(int domain, int type, int protocol, int sv[2]);
    int (*fcntl)(int fd, int cmd, int arg);
    int (*fstat)(int fd, struct stat *st);
    int (*close)(int fd);
    int (*dup)(int fd);
    ssize_t (*read)(int fd, void *buf, size_t n);
    /* The shm-manager client's connection to its daemon. */
    int (*socket)(int domain, int type, int protocol);
    int (*connect)(int fd, const struct sockaddr *addr, socklen_t len);
    ssize_t (*send)(int fd, const void *buf, size_t n, int flags);
    ssize_t (*recv)(int fd, void *buf, size_t n, int flags);
    int (*poll)(struct pollfd *fds, nfds_t n, int timeout);
    int (*mkdir)(const char *path, mode_t mode);
    int (*open)(const char *path, int flags, mode_t mode);
    int (*lstat)(const char *path, struct stat *st);
    /* Naming a foreign fd (/proc/self/fd/N) when adopting or receiving it. */
    ssize_t (*readlink)(const char *path, char *buf, size_t n);
    int (*setsockopt)(int fd, int level, int name, const void *val, socklen_t len);
    /* Starting the daemon; posix_spawn returns the error number. */
    int (*posix_spawn)(pid_t *pid, const char *path, const posix_spawn_file_actions_t *acts,
                       const posix_spawnattr_t *attr, char *const argv[], char *const envp[]);
    pid_t (*waitpid)(pid_t pid, int *status, int options);
    int (*kill)(pid_t pid, int sig);
} mp__sys_table;

/* The live table. Library code calls mp__sys.mmap(...), never mmap(...). */
extern mp__sys_table mp__sys;
/* The real calls, to restore after a test. */
extern const mp__sys_table mp__sys_real;

/* Fault injection for tests: the next `count` calls of the named member
 * ("mmap", "sendmsg", ...) fail with errno `err` (for posix_fallocate: return
 * it), after `skip` successful calls. Returns MP_ENOENT for an unknown name.
 * mp__sys_fault_reset() restores every member. Not thread-safe: tests only. */
int mp__sys_fault(const char *call, int err, int skip, int count);
void mp__sys_fault_reset(void);

/* ---- small helpers (src/os/) -------------------------------------------- */

/* Watches fd for up to seconds without sleeping, yielding the CPU between
 * looks: true once it is readable (or in error), false when the time is
 * up. For a reply due in microseconds, whose sleeping wait would cost a
 * cross-CPU wake-up of 15-35 us on a VM. */
bool mp__spin_readable(int fd, double seconds);

/* A zeroed block of n bytes, for objects made and freed once per message:
 * glibc's calloc skips its per-thread cache, so a calloc'd block freed
 * again fills that cache and later frees fall through to the slow path. */
void *mp__zalloc(size_t n);

/* Monotonic clock in seconds. */
double mp__now(void);
/* Milliseconds left until deadline (absolute mp__now() seconds) for poll():
 * -1 when deadline < 0 (forever), 0 when passed. */
int mp__poll_ms(double deadline);
/* Deadline from a timeout in seconds: -1 (forever) for a negative one and
 * for one over 1e9 s (+inf); NaN stays NaN (mp__check_timeout refuses it). */
double mp__deadline(double timeout);
/* MP_EINVAL with a sentence for a NaN timeout (call: the public call's name).
 * Inline: every put and get of a queue or pipe runs it. */
int mp__nan_timeout_error(const char *call);
static inline int mp__check_timeout(double timeout, const char *call)
{
    return timeout != timeout ? mp__nan_timeout_error(call) : 0;
}
/* A deadline (>= 0) as an absolute CLOCK_MONOTONIC timespec, for futexes,
 * pthread_mutex_clocklock and condition variables on that clock. */
struct timespec mp__deadline_timespec(double deadline);

/* The calling process's and thread's ids, cached; right after fork too
 * (src/os/ids.c). */
pid_t mp__pid(void);
pid_t mp__tid(void);

/* Closes fd if >= 0, preserving errno; returns -1 for `fd = mp__close(fd)`. */
int mp__close(int fd);
/* Sets or clears FD_CLOEXEC. */
int mp__set_cloexec(int fd, bool on);

/* futex wait/wake on a 32-bit word in (possibly shared) memory. wait returns
 * 0 when woken, interrupted or the value differed (recheck and loop),
 * MP_ETIMEDOUT at the deadline (absolute mp__now() seconds, < 0 forever).
 * wake returns how many waiters it woke. shared: false for a word only this
 * process maps (FUTEX_PRIVATE_FLAG), true for one in shared memory. */
int mp__futex_wait(uint32_t *addr, uint32_t expected, double deadline, bool shared);
int mp__futex_wake(uint32_t *addr, int count, bool shared);

/* pidfd_open(2); -1 with errno on failure (ENOSYS on old kernels). */
int mp__pidfd_open(pid_t pid);
/* pidfd_send_signal(2) with no siginfo (src/os/pidfd.c); -1 with errno
 * (ESRCH once the process has exited). */
int mp__pidfd_send_signal(int pidfd, int sig);

/* Sends len bytes plus nfds fds as one record (SOCK_SEQPACKET) on sock,
 * retrying EINTR, waiting for writability until deadline (< 0 forever; 0
 * try once; no room by then -> MP_ETIMEDOUT). len must be >= 1 (a
 * zero-byte record reads as EOF) and nfds 0..253 (SCM_MAX_FD). The fds are
 * borrowed (the kernel dups them). A closed peer is MP_ECLOSED (no SIGPIPE).
 * One sendmsg in the common case, blocking when deadline < 0; poll only
 * after EAGAIN. */
/* Room for every fd the kernel can attach to one record (SCM_MAX_FD), so
 * MSG_CTRUNC can only mean that installing the fds failed (the open-files
 * limit), never that the buffer was short. */
#define MP__MAX_FDS 253
typedef union mp__fd_cmsg {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * MP__MAX_FDS)];
} mp__fd_cmsg;
/* Waits for `events` on fd until deadline (< 0 forever; 0 polls; not ready
 * by then -> MP_ETIMEDOUT; the sentences start with what). 0 when ready, or
 * on an error or hang-up that the next call reports. */
int mp__wait_fd(int fd, short events, double deadline, const char *what);
/* The SCM_RIGHTS fds the kernel installed for msg: counts them all, copies
 * the first cap to out (may be NULL), or closes them all. Read in place
 * from the control buffer. */
int mp__received_fds(struct msghdr *msg, int *out, int cap, bool close_them);

int mp__send_record(int sock, const void *buf, size_t len, const int *fds, int nfds,
                    double deadline);
/* Receives one record of at most cap bytes and at most maxfds fds (deadline
 * as for send; MP_ETIMEDOUT). On success
 * *len and *nfds are set and the received fds are O_CLOEXEC and owned by the
 * caller. A record or fd list that was truncated by the kernel yields
 * MP_EPROTO with every received fd closed. An orderly EOF yields MP_ECLOSED.
 * On failure *nfds is not set and fds[] may hold closed numbers: trust nfds.
 * MSG_CTRUNC caused by the open-files limit yields MP_EMFILE. */
int mp__recv_record(int sock, void *buf, size_t cap, size_t *len, int *fds, int maxfds,
                    int *nfds, double deadline);

/* A function pointer that survives exec (src/os/coderef.c): the loaded
 * object that holds it and its offset there, plus its first code bytes as a
 * check. Plain data: it lives in shared memory. */
typedef struct mp__coderef {
    uint32_t set; /* 0: no function */
    uint32_t reserved;
    uint64_t offset;
    unsigned char code[16];
    char module[256]; /* dl_iterate_phdr's name; "" for the main program */
} mp__coderef;
/* MP_EINVAL when fn is not in the code of a loaded object. */
int mp__coderef_make(void (*fn)(void), mp__coderef *ref, const char *call);
/* *fn = the function in this process (NULL when ref is unset); MP_ENOENT
 * when its object is not loaded here or holds other code at that offset. */
int mp__coderef_resolve(const mp__coderef *ref, void (**fn)(void), const char *call);

/* Counts this process's open fds (/proc/self/fd), for leak checks and doctor. */
int mp__count_open_fds(void);

/* memmove for the short copies of a per-item path: 8 to 16 bytes as two
 * fixed-size moves (loads first: overlap-safe) instead of a library call. */
static inline void mp__copy_short(void *dst, const void *src, size_t len)
{
    if (len >= 8 && len <= 16) {
        uint64_t a, b;
        __builtin_memcpy(&a, src, 8);
        __builtin_memcpy(&b, (const char *)src + len - 8, 8);
        __builtin_memcpy(dst, &a, 8);
        __builtin_memcpy((char *)dst + len - 8, &b, 8);
    } else if (len) {
        __builtin_memmove(dst, src, len);
    }
}

#endif
