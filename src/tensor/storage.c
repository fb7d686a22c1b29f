/* Refcounted storage: private memory, wrapped foreign memory, or a shared
 * segment. Views reach bytes through the storage, so moving a storage into
 * shared memory moves every view of it at once. */
#include "tensor/tensor_priv.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Guards segment->user, the link from a segment to its one storage. */
static pthread_mutex_t user_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void before_fork(void)
{
    pthread_mutex_lock(&user_lock);
}
static void after_fork(void)
{
    pthread_mutex_unlock(&user_lock);
}
static void init(void)
{
    static const mp__fork_handlers h = {before_fork, after_fork, after_fork};
    mp__atfork_register(MP__FORK_STORAGE_USER, &h);
}

static mp__storage *storage_new(void *data, size_t nbytes, int kind)
{
    mp__storage *s = mp__zalloc(sizeof *s);
    if (!s)
        return NULL;
    atomic_init(&s->refs, 1);
    s->kind = kind;
    s->data = data;
    s->nbytes = nbytes;
    s->dev.device_type = kDLCPU;
    return s;
}

int mp__storage_alloc(size_t nbytes, mp__storage **out)
{
    /* calloc, not posix_memalign + memset: large blocks come zeroed from
     * mmap, so an empty tensor costs no page touches until it is written.
     * The 64-byte alignment is made by hand; ctx keeps the block. */
    void *raw = nbytes <= SIZE_MAX - 64 ? calloc(1, nbytes + 64) : NULL, *data;
    if (!raw)
        return mp__error(MP_ENOMEM, "mp_tensor_empty: cannot allocate %zu bytes", nbytes);
    data = (void *)(((uintptr_t)raw + 63) & ~(uintptr_t)63);
    *out = storage_new(data, nbytes, MP__ST_PRIVATE);
    if (!*out) {
        free(raw);
        return mp__error(MP_ENOMEM, "mp_tensor_empty: out of memory");
    }
    (*out)->ctx = raw;
    return 0;
}

int mp__storage_wrap(void *data, size_t nbytes, DLDevice dev, mp_release_fn release, void *ctx,
                     mp__storage **out)
{
    mp__storage *s;
    if (!out || (!data && nbytes))
        return mp__error(MP_EINVAL, "mp__storage_wrap: NULL data of %zu bytes or NULL out", nbytes);
    s = storage_new(data, nbytes, MP__ST_WRAPPED);
    if (!s)
        return mp__error(MP_ENOMEM, "mp__storage_wrap: out of memory");
    s->dev = dev;
    s->release = release;
    s->ctx = ctx;
    *out = s;
    return 0;
}

mp__storage *mp__storage_retain(mp__storage *s)
{
    if (s)
        atomic_fetch_add(&s->refs, 1);
    return s;
}

/* The memory a storage stops using: freed, or handed back to its owner. */
static void drop_memory(mp__storage *s)
{
    if (s->kind == MP__ST_PRIVATE)
        free(s->ctx);
    else if (s->kind == MP__ST_WRAPPED && s->release)
        s->release(s->data, s->ctx);
    s->release = NULL;
}

void mp__storage_release(mp__storage *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    if (s->seg) {
        pthread_once(&once, init);
        pthread_mutex_lock(&user_lock);
        if (mp__segment_user(s->seg) == s)
            mp__segment_set_user(s->seg, NULL);
        pthread_mutex_unlock(&user_lock);
        mp__segment_release(s->seg);
    } else {
        drop_memory(s);
    }
    free(s);
}

mp__storage *mp__tensor_storage(const mp_tensor *t)
{
    return t->storage;
}
void *mp__storage_data(const mp__storage *s)
{
    return s->data;
}
size_t mp__storage_nbytes(const mp__storage *s)
{
    return s->nbytes;
}
DLDevice mp__storage_device(const mp__storage *s)
{
    return s->dev;
}
mp__segment *mp__storage_segment(const mp__storage *s)
{
    return s->seg;
}
void *mp__storage_user(const mp__storage *s)
{
    return s->user;
}
void mp__storage_set_user(mp__storage *s, void *user)
{
    s->user = user;
}

int mp__storage_share(mp__storage *s)
{
    mp__segment_part part;
    mp__segment *seg;
    int rc;
    if (!s)
        return mp__error(MP_EINVAL, "mp_tensor_share_memory_: NULL storage");
    if (s->seg)
        return 0;
    if (s->dev.device_type != kDLCPU) {
        char dev[48];
        return mp__error(MP_ENOTSUP,
                         "mp_tensor_share_memory_: the tensor is on %s and stays there; "
                         "send a CUDA tensor with mp_msg_add_cuda_tensor (CUDA IPC)",
                         mp__device_label(s->dev, dev, sizeof dev));
    }
    if (atomic_load(&s->exports) > 0)
        return mp__error(MP_ESTATE, "mp_tensor_share_memory_: the storage is exported through "
                                    "DLPack and its memory cannot move; share before exporting");
    /* written before mapping: no zeroing pass, no page faults */
    part = (mp__segment_part){0, s->data, s->nbytes};
    rc = mp__segment_create_filled(s->nbytes, mp__shm_strategy(), &part, 1, &seg);
    if (rc < 0)
        return rc;
    drop_memory(s);
    s->data = mp__segment_data(seg);
    s->kind = MP__ST_SEGMENT;
    pthread_once(&once, init);
    pthread_mutex_lock(&user_lock);
    s->seg = seg;
    mp__segment_set_user(seg, s);
    pthread_mutex_unlock(&user_lock);
    mp__tensor_stats_copied(s->nbytes);
    mp__tensor_stats_linked(false, true);
    return 0;
}

/* The one storage over seg (see mp__storage_from_segment); from_message:
 * whether seg came in a message, for the counters. */
static int from_segment(mp__segment *seg, bool from_message, mp__storage **out)
{
    mp__storage *s;
    bool new_mapping;
    pthread_once(&once, init);
    pthread_mutex_lock(&user_lock);
    new_mapping = !mp__segment_had_user(seg);
    s = mp__segment_user(seg);
    if (s) {
        /* retain unless its last reference is already on its way out */
        long r = atomic_load(&s->refs);
        while (r > 0 && !atomic_compare_exchange_weak(&s->refs, &r, r + 1))
            ;
        if (r > 0) {
            pthread_mutex_unlock(&user_lock);
            mp__tensor_stats_linked(from_message, false);
            *out = s;
            return 0;
        }
    }
    s = storage_new(mp__segment_data(seg), mp__segment_size(seg), MP__ST_SEGMENT);
    if (!s) {
        pthread_mutex_unlock(&user_lock);
        return mp__error(MP_ENOMEM, "mp__storage_from_segment: out of memory");
    }
    s->seg = mp__segment_retain(seg);
    mp__segment_set_user(seg, s);
    pthread_mutex_unlock(&user_lock);
    mp__tensor_stats_linked(from_message, new_mapping);
    *out = s;
    return 0;
}

int mp__storage_from_segment(mp__segment *seg, mp__storage **out)
{
    if (!seg || !out)
        return mp__error(MP_EINVAL, "mp__storage_from_segment: NULL segment or out");
    return from_segment(seg, true, out);
}

int mp__storage_shared_new(size_t nbytes, mp__storage **out)
{
    return mp__storage_shared_filled(nbytes, NULL, 0, out);
}

int mp__storage_shared_filled(size_t nbytes, const mp__segment_part *parts, int nparts,
                              mp__storage **out)
{
    mp__segment *seg;
    int strategy = mp__shm_strategy();
    int rc = parts ? mp__segment_create_filled(nbytes, strategy, parts, nparts, &seg)
                   : mp__segment_create(nbytes, strategy, &seg);
    if (rc < 0)
        return rc;
    rc = from_segment(seg, false, out);
    mp__segment_release(seg); /* the storage holds its own */
    return rc;
}
