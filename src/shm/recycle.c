/* The pool of reusable segments (recycle.h). A new segment of tens of MiB
 * costs far more than filling it: posix_fallocate zeroes every page, the
 * first touch faults each one in, and the last release frees them again
 * (about 55 ms for 64 MiB on a small VM, against 3 ms to write it once
 * mapped). A receiver that gets a tensor of the same size again and again
 * reuses the last one instead, as long as nothing outside this process can
 * see it.
 *
 * "Never left this process" is tracked, not guessed: a reusable segment
 * carries the fork generation it was made in (a fork bumps it, so a
 * segment mapped at fork time never comes back: the child maps it too) and
 * an exported flag that mp__segment_export and the DLPack export set. */
#include "shm/recycle.h"
#include "shm/shm_internal.h"

#include <pthread.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static mp__segment *pool[MP__RECYCLE_MAX]; /* oldest first */
static int npool;
static size_t pool_bytes;
static atomic_uint generation = 1; /* never 0: 0 marks "not reusable" */

/* Pooled segments are mapped by the child too; it must not reuse what
 * the parent reuses, so the child drops its copies. */
static void before_fork(void)
{
    pthread_mutex_lock(&lock);
    atomic_fetch_add(&generation, 1);
}
static void parent_after_fork(void)
{
    pthread_mutex_unlock(&lock);
}
/* Under the lock: empties the pool into all, returns how many. The caller
 * destroys them after unlocking (destroying unmaps: no syscall under it). */
static int take_all(mp__segment *all[MP__RECYCLE_MAX])
{
    int n = npool;
    memcpy(all, pool, (size_t)n * sizeof *pool);
    npool = 0;
    pool_bytes = 0;
    return n;
}
static void destroy_all(mp__segment *all[], int n)
{
    for (int i = 0; i < n; i++)
        mp__segment_destroy(all[i]);
}
static void child_after_fork(void)
{
    mp__segment *mine[MP__RECYCLE_MAX];
    int n = take_all(mine);
    pthread_mutex_unlock(&lock);
    destroy_all(mine, n);
}
static void init(void)
{
    static const mp__fork_handlers h = {before_fork, parent_after_fork, child_after_fork};
    mp__atfork_register(MP__FORK_SHM_RECYCLE, &h);
}

static unsigned current_generation(void)
{
    unsigned g = atomic_load(&generation);
    return g ? g : 1;
}

/* Under the lock: the pooled segment of exactly len mapped bytes, or NULL. */
static mp__segment *take(size_t len)
{
    for (int i = npool - 1; i >= 0; i--) {
        mp__segment *s = pool[i];
        if (s->map_len != len)
            continue;
        memmove(pool + i, pool + i + 1, (size_t)(npool - i - 1) * sizeof *pool);
        npool--;
        pool_bytes -= len;
        return s;
    }
    return NULL;
}

int mp__segment_create_reusable(size_t nbytes, mp__segment **out)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), len;
    mp__segment *s = NULL;
    int rc;
    if (!out)
        return mp__error(MP_EINVAL, "mp__segment_create_reusable: out is NULL");
    pthread_once(&once, init);
    len = nbytes ? (nbytes + page - 1) / page * page : page;
    if (nbytes <= MP__RECYCLE_BYTES) {
        pthread_mutex_lock(&lock);
        s = take(len);
        pthread_mutex_unlock(&lock);
    }
    if (s) {
        /* The page tail may hold an older message's bytes; a peer mapping
         * it later would see them. */
        memset((char *)s->data + nbytes, 0, len - nbytes);
        s->size = nbytes;
        s->user = NULL;
        atomic_store(&s->refs, 1);
        mp__segment *cached = mp__cache_insert(s);
        if (cached != s) /* a new inode cannot be cached twice; stay safe */
            mp__segment_release(cached);
    } else if ((rc = mp__segment_create(nbytes, MP__STRATEGY_FD, &s)) < 0) {
        return rc;
    }
    s->recycle_gen = current_generation();
    __atomic_store_n(&s->exported, false, __ATOMIC_RELAXED);
    *out = s;
    return 0;
}

void mp__segment_mark_exported(mp__segment *s)
{
    if (s)
        __atomic_store_n(&s->exported, true, __ATOMIC_RELEASE);
}

bool mp__segment_recycle(mp__segment *s)
{
    mp__segment *old[MP__RECYCLE_MAX];
    int nold = 0;
    if (!s->recycle_gen || s->strategy != MP__STRATEGY_FD || s->map_len > MP__RECYCLE_BYTES ||
        __atomic_load_n(&s->exported, __ATOMIC_ACQUIRE))
        return false;
    pthread_once(&once, init);
    pthread_mutex_lock(&lock);
    /* Compared under the lock: a fork bumps it under the same lock. */
    if (s->recycle_gen != current_generation()) {
        pthread_mutex_unlock(&lock);
        return false;
    }
    while (npool > 0 && (npool == MP__RECYCLE_MAX || pool_bytes + s->map_len >
                                                         MP__RECYCLE_BYTES)) {
        old[nold++] = pool[0];
        pool_bytes -= pool[0]->map_len;
        memmove(pool, pool + 1, (size_t)--npool * sizeof *pool);
    }
    pool[npool++] = s;
    pool_bytes += s->map_len;
    pthread_mutex_unlock(&lock);
    destroy_all(old, nold);
    return true;
}

void mp__segment_recycle_drain(void)
{
    mp__segment *all[MP__RECYCLE_MAX];
    int n;
    pthread_once(&once, init);
    pthread_mutex_lock(&lock);
    n = take_all(all);
    pthread_mutex_unlock(&lock);
    destroy_all(all, n);
}

int mp__segment_pooled(void)
{
    pthread_mutex_lock(&lock);
    int n = npool;
    pthread_mutex_unlock(&lock);
    return n;
}
