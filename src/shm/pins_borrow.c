/* A pin's segment for a receiving process that does not hold the pin: a
 * second process receiving on an end (which turned the end's pins off) takes
 * a message that named a pin before that. The owner keeps the pin while the
 * message is in flight; the segment is found in this process's mapping
 * cache (a fork child inherits its parent's), else through the owner's fd,
 * else through the sender's (src/shm/pins.c tells the whole protocol). */
#include "shm/pins.h"
#include "shm/shm_internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

/* Maps the segment behind /proc/<pid>/fd/<fd> when it is ref's (dev, ino). */
static int open_proc(pid_t pid, int fd, const mp__pin_ref *ref, uint64_t size,
                     mp__segment **out)
{
    char path[64];
    struct stat st;
    mp__segment_handle h = {.strategy = MP__STRATEGY_FD, .size = size};
    if (pid <= 0 || fd < 0)
        return MP_ENOENT;
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, fd);
    if ((h.fd = mp__sys.open(path, O_RDWR | O_CLOEXEC, 0)) < 0)
        return MP_ENOENT;
    if (mp__sys.fstat(h.fd, &st) != 0 || (uint64_t)st.st_dev != ref->dev ||
        (uint64_t)st.st_ino != ref->ino) {
        mp__close(h.fd);
        return MP_ENOENT;
    }
    return mp__segment_open(&h, out);
}

/* The segment, retained: from this process's pin (the owner's hot path,
 * which also counts the message done: *counted, and may hand out the pin's
 * keepsake instead: reuse), its mapping cache, the owner's fd or the
 * sender's. */
int mp__pins_borrow(mp__pins *p, const mp__pin_ref *given, uint64_t size, mp__segment **out)
{
    mp__pin *pin = &p->slot[given->slot];
    mp__pin_ref full = *given, *ref = &full;
    int rc;
    if (!given->dev && !given->ino) {
        /* not carried (a compact record): the pin holds them while a
         * message naming it is in flight */
        full.dev = atomic_load(&pin->dev);
        full.ino = atomic_load(&pin->ino);
    }
    *out = mp__cache_lookup((dev_t)ref->dev, (ino_t)ref->ino);
    if (*out) {
        size_t have = (*out)->map_len;
        if (size <= have)
            return 0;
        mp__segment_release(*out);
        *out = NULL;
        return mp__error(MP_EPROTO, "receiving a message: a pinned storage claims %llu bytes "
                                    "of a %zu-byte segment", (unsigned long long)size, have);
    }
    rc = open_proc(atomic_load(&p->owner) > 0 ? atomic_load(&p->owner) : 0,
                   atomic_load(&pin->fd), ref, size, out);
    if (rc == MP_ENOENT)
        rc = open_proc(ref->sender_pid, ref->sender_fd, ref, size, out);
    if (rc == MP_ENOENT)
        rc = mp__error(MP_EBROKEN, "receiving a message: it named a storage pinned by another "
                       "process receiving on this end, which has exited, and its sender "
                       "(pid %d) no longer holds it; the message was dropped. Give each "
                       "receiving process its own pipe or queue", (int)ref->sender_pid);
    return rc;
}
