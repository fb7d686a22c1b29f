/* The per-process mapping cache: one mp__segment per (st_dev, st_ino), so a
 * segment received many times is mapped once. A chained hash table under a
 * mutex; the mutex is taken only on lookups, inserts and last releases. */
#include "shm/shm_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static mp__segment **buckets;
static mp__segment **names; /* FS segments by name: as many buckets, same growth */
static size_t nbuckets; /* a power of two, or 0 before the first insert */
static int count;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* A fork while another thread holds the lock would leave the child's copy
 * locked forever: hold it across fork, release it on both sides. */
static void before_fork(void)
{
    pthread_mutex_lock(&lock);
}
static void after_fork(void)
{
    pthread_mutex_unlock(&lock);
}
static void init(void)
{
    static const mp__fork_handlers h = {before_fork, after_fork, after_fork};
    mp__atfork_register(MP__FORK_SHM_CACHE, &h);
}

static size_t slot(dev_t dev, ino_t ino, size_t n)
{
    uint64_t h = ((uint64_t)dev * 0x9e3779b97f4a7c15ull) ^ (uint64_t)ino;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return (size_t)h & (n - 1);
}

/* Retains s unless its last reference is already gone (being destroyed). */
static bool retain_live(mp__segment *s)
{
    long r = atomic_load(&s->refs);
    while (r > 0)
        if (atomic_compare_exchange_weak(&s->refs, &r, r + 1))
            return true;
    return false;
}

static mp__segment *find(dev_t dev, ino_t ino)
{
    if (!nbuckets)
        return NULL;
    for (mp__segment *s = buckets[slot(dev, ino, nbuckets)]; s; s = s->next)
        if (s->dev == dev && s->ino == ino && retain_live(s))
            return s;
    return NULL;
}

uint64_t mp__shm_name_hash(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *name; name++)
        h = (h ^ (unsigned char)*name) * 0x100000001b3ull;
    return h;
}

static size_t name_slot(const char *name, size_t n)
{
    uint64_t h = mp__shm_name_hash(name);
    return (size_t)(h ^ (h >> 32)) & (n - 1);
}

static bool named(const mp__segment *s)
{
    return s->strategy == MP__STRATEGY_FS && s->name[0];
}

mp__segment *mp__cache_lookup_name(const char *name)
{
    mp__segment *s, *found = NULL;
    pthread_once(&once, init);
    pthread_mutex_lock(&lock);
    if (names)
        for (s = names[name_slot(name, nbuckets)]; s && !found; s = s->name_next)
            if (strcmp(s->name, name) == 0 && retain_live(s))
                found = s;
    pthread_mutex_unlock(&lock);
    return found;
}

mp__segment *mp__cache_lookup(dev_t dev, ino_t ino)
{
    mp__segment *s;
    pthread_once(&once, init);
    pthread_mutex_lock(&lock);
    s = find(dev, ino);
    pthread_mutex_unlock(&lock);
    return s;
}

/* Doubles the table; on allocation failure keeps the old one (chains just
 * get longer). */
static void grow(void)
{
    size_t n = nbuckets ? nbuckets * 2 : 64;
    mp__segment **b = calloc(n, sizeof *b), **nb = calloc(n, sizeof *nb);
    if (!b || !nb) {
        free(b);
        free(nb);
        return;
    }
    for (size_t i = 0; i < nbuckets; i++) {
        mp__segment *s = buckets[i], *next;
        for (; s; s = next) {
            size_t j = slot(s->dev, s->ino, n);
            next = s->next;
            s->next = b[j];
            b[j] = s;
            if (named(s)) {
                j = name_slot(s->name, n);
                s->name_next = nb[j];
                nb[j] = s;
            }
        }
    }
    free(buckets);
    free(names);
    buckets = b;
    names = nb;
    nbuckets = n;
}

mp__segment *mp__cache_insert(mp__segment *s)
{
    mp__segment *old;
    size_t i;
    pthread_once(&once, init);
    pthread_mutex_lock(&lock);
    old = find(s->dev, s->ino);
    if (old) {
        pthread_mutex_unlock(&lock);
        return old;
    }
    if ((size_t)count >= nbuckets)
        grow();
    if (nbuckets) {
        i = slot(s->dev, s->ino, nbuckets);
        s->next = buckets[i];
        buckets[i] = s;
        count++;
        if (named(s)) {
            i = name_slot(s->name, nbuckets);
            s->name_next = names[i];
            names[i] = s;
        }
    }
    /* else: no table at all (out of memory); s works, merely uncached */
    pthread_mutex_unlock(&lock);
    return s;
}

void mp__cache_remove(mp__segment *s)
{
    pthread_once(&once, init);
    pthread_mutex_lock(&lock);
    if (nbuckets) {
        mp__segment **p = &buckets[slot(s->dev, s->ino, nbuckets)];
        for (; *p; p = &(*p)->next) {
            if (*p == s) {
                *p = s->next;
                count--;
                break;
            }
        }
        if (named(s))
            for (p = &names[name_slot(s->name, nbuckets)]; *p; p = &(*p)->name_next)
                if (*p == s) {
                    *p = s->name_next;
                    break;
                }
    }
    pthread_mutex_unlock(&lock);
}

static bool own_live_alias(mp__segment *base)
{
    mp__segment *a = base->alias;
    return a && a->ref_pid == mp__pid() && retain_live(a);
}

mp__segment *mp__cache_alias_find(mp__segment *base)
{
    mp__segment *found = NULL;
    pthread_once(&once, init);
    pthread_mutex_lock(&lock);
    if (own_live_alias(base))
        found = base->alias;
    pthread_mutex_unlock(&lock);
    return found;
}

mp__segment *mp__cache_alias_set(mp__segment *base, mp__segment *a)
{
    pthread_once(&once, init);
    pthread_mutex_lock(&lock);
    if (own_live_alias(base))
        a = base->alias;
    else
        base->alias = a;
    pthread_mutex_unlock(&lock);
    return a;
}

void mp__cache_alias_clear(mp__segment *base, const mp__segment *a)
{
    pthread_once(&once, init);
    pthread_mutex_lock(&lock);
    if (base->alias == a)
        base->alias = NULL;
    pthread_mutex_unlock(&lock);
}
