/* The daemon's side of a client's report ring (mp__mgr_ring in
 * src/shm/manager.h): mapping the memfd a client sent, and reading the
 * lines it wrote since the last round. The client is trusted with nothing:
 * the size comes from our constant, head is checked against tail, and the
 * lines go through the same parser as datagrams. */
#include "daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define RING_LEN (sizeof(mp__mgr_ring) + MP__MGR_RING_BYTES)

mp__mgr_ring *ring_attach(int fd, pid_t pid)
{
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    mp__mgr_ring *r;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size != RING_LEN ||
        seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
        dlog("client %d: its report ring is not a sealed memfd of %zu bytes: ignored",
             (int)pid, RING_LEN);
        close(fd);
        return NULL;
    }
    r = mmap(NULL, RING_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (r == MAP_FAILED) {
        dlog("client %d: mapping its report ring: %m", (int)pid);
        return NULL;
    }
    if (r->magic != MP__MGR_RING_MAGIC || r->version != MP__MGR_RING_VERSION ||
        r->size != MP__MGR_RING_BYTES) {
        dlog("client %d: its report ring has the wrong magic, version or size: ignored",
             (int)pid);
        munmap(r, RING_LEN);
        return NULL;
    }
    /* Held until we detach or die: our death marks it for the client. */
    int err = pthread_mutex_trylock(&r->daemon);
    if (err == EOWNERDEAD)
        err = pthread_mutex_consistent(&r->daemon);
    if (err) {
        dlog("client %d: cannot hold its report ring's mutex (%s): ignored", (int)pid,
             strerror(err));
        munmap(r, RING_LEN);
        return NULL;
    }
    return r;
}

void ring_detach(mp__mgr_ring *r)
{
    if (!r)
        return;
    pthread_mutex_unlock(&r->daemon);
    munmap(r, RING_LEN);
}

/* Copies n bytes from ring offset pos (wrapping) into out. */
static void copy_out(const mp__mgr_ring *r, uint64_t pos, char *out, size_t n)
{
    size_t off = (size_t)(pos & (MP__MGR_RING_BYTES - 1)), first = MP__MGR_RING_BYTES - off;
    if (first > n)
        first = n;
    memcpy(out, r->data + off, first);
    memcpy(out + first, r->data, n - first);
}

bool ring_read(mp__mgr_ring *r, pid_t pid, void (*fn)(void *ctx, char *lines), void *ctx)
{
    static char buf[64 * 1024 + 1];
    for (;;) {
        uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
        uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
        size_t n, used;
        if (head == tail)
            return true;
        if (head - tail > MP__MGR_RING_BYTES) {
            dlog("client %d: its report ring claims %llu unread bytes (of %u): ignored from "
                 "now on", (int)pid, (unsigned long long)(head - tail), MP__MGR_RING_BYTES);
            return false;
        }
        n = (size_t)(head - tail) < sizeof buf - 1 ? (size_t)(head - tail) : sizeof buf - 1;
        copy_out(r, tail, buf, n);
        /* The client publishes whole lines only; take up to the last one. */
        for (used = n; used > 0 && buf[used - 1] != '\n';)
            used--;
        if (used == 0) {
            dlog("client %d: a report line of %zu+ bytes in its ring: ignored from now on",
                 (int)pid, n);
            return false;
        }
        buf[used] = '\0';
        atomic_store_explicit(&r->tail, tail + used, memory_order_release);
        fn(ctx, buf);
    }
}

void ring_read_pending(mp__mgr_ring *r, void (*fn)(void *ctx, char *lines), void *ctx)
{
    for (int i = 0; i < MP__MGR_PENDING; i++) {
        mp__mgr_pending *p = &r->pending[i];
        char name[MP__SHM_NAME_MAX], line[MP__SHM_NAME_MAX + 8];
        if (atomic_load_explicit(&p->state, memory_order_acquire) != MP__MGR_PENDING_SET)
            continue;
        memcpy(name, p->name, sizeof name);
        name[sizeof name - 1] = '\0';
        /* one line, whatever the client left there: the parser judges it */
        name[strcspn(name, "\n")] = '\0';
        snprintf(line, sizeof line, "R %s\n", name);
        fn(ctx, line);
    }
}
