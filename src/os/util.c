/* Small Linux helpers: clocks and deadlines, fds, futexes, pidfds. */
#include "os/os.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

bool mp__spin_readable(int fd, double seconds)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    double until = mp__now() + seconds;
    for (;;) {
        if (poll(&p, 1, 0) != 0)
            return true;
        if (mp__now() >= until)
            return false;
        sched_yield();
    }
}

void *mp__zalloc(size_t n)
{
    void *p = malloc(n);
    /* the compiler would make malloc + memset a calloc again */
    __asm__ volatile("" : "+r"(p) : : "memory");
    if (p)
        memset(p, 0, n);
    return p;
}

double mp__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double mp__deadline(double timeout)
{
    /* +inf, and sums no timespec can hold, are forever too (a wait of a
     * billion seconds has no deadline anyone will see) */
    return timeout < 0 || timeout > 1e9 ? -1.0 : mp__now() + timeout;
}

int mp__nan_timeout_error(const char *call)
{
    return mp__error(MP_EINVAL, "%s: timeout is NaN (negative waits forever)", call);
}

int mp__poll_ms(double deadline)
{
    double left;
    if (deadline < 0)
        return -1;
    left = deadline - mp__now();
    if (left <= 0)
        return 0;
    /* round up, so poll never wakes a hair before the deadline and spins */
    left = ceil(left * 1000.0);
    return left >= (double)INT_MAX ? INT_MAX : (int)left;
}

int mp__close(int fd)
{
    if (fd >= 0) {
        int err = errno;
        mp__sys.close(fd);
        errno = err;
    }
    return -1;
}

int mp__set_cloexec(int fd, bool on)
{
    int flags = mp__sys.fcntl(fd, F_GETFD, 0);
    if (flags < 0)
        return mp__errno_error(errno, "fcntl(%d, F_GETFD)", fd);
    flags = on ? flags | FD_CLOEXEC : flags & ~FD_CLOEXEC;
    if (mp__sys.fcntl(fd, F_SETFD, flags) < 0)
        return mp__errno_error(errno, "fcntl(%d, F_SETFD)", fd);
    return 0;
}

struct timespec mp__deadline_timespec(double deadline)
{
    struct timespec ts;
    double s = floor(deadline);
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((deadline - s) * 1e9);
    if (ts.tv_nsec >= 1000000000L)
        ts.tv_nsec = 999999999L;
    return ts;
}

int mp__futex_wait(uint32_t *addr, uint32_t expected, double deadline, bool shared)
{
    struct timespec ts, *tsp = NULL;
    int op = FUTEX_WAIT_BITSET | (shared ? 0 : FUTEX_PRIVATE_FLAG);
    if (deadline >= 0) {
        /* FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC time, the
         * clock of mp__now(), so a retried wait never stretches the wait. */
        ts = mp__deadline_timespec(deadline);
        tsp = &ts;
    }
    if (syscall(SYS_futex, addr, op, expected, tsp, NULL, FUTEX_BITSET_MATCH_ANY) == 0)
        return 0;
    switch (errno) {
    case EAGAIN:
    case EINTR:
        return 0; /* value changed or spurious: the caller rechecks */
    case ETIMEDOUT:
        return mp__error(MP_ETIMEDOUT, "futex wait: deadline passed");
    default:
        return mp__errno_error(errno, "futex(FUTEX_WAIT_BITSET)");
    }
}

int mp__futex_wake(uint32_t *addr, int count, bool shared)
{
    int op = FUTEX_WAKE | (shared ? 0 : FUTEX_PRIVATE_FLAG);
    long n = syscall(SYS_futex, addr, op, count, NULL, NULL, 0);
    if (n < 0)
        return mp__errno_error(errno, "futex(FUTEX_WAKE)");
    return (int)n;
}

int mp__pidfd_open(pid_t pid)
{
    return (int)syscall(SYS_pidfd_open, pid, 0);
}

int mp__count_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;
    if (!d)
        return mp__errno_error(errno, "opendir(/proc/self/fd)");
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory's own fd */
}
