/* Producer-side state of CUDA IPC: the own reference segment, the table of
 * shared allocations by slot, the pending-free list and the exit warning. */
#include "cuda/gpu.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OWN_SLOTS 4096u
#define OWN_REFS 65536u

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static mp__refseg *own;
static mp__cuda_alloc **owned;  /* by slot: shared allocations, live or pending */
static mp__pending pending;

void mp__cuda_lock(void) { pthread_mutex_lock(&lock); }
void mp__cuda_unlock(void) { pthread_mutex_unlock(&lock); }

/* Drops the producer bookkeeping without touching device memory: at exit,
 * or in a forked child that inherited its parent's (not its own to free). */
static void forget_state(void)
{
    for (size_t i = 0; i < pending.n; i++) {
        mp__cuda_alloc *a = pending.v[i].alloc;
        mp__refseg_release(a->seg);
        free(a);
    }
    mp__pending_clear(&pending);
    free(owned);
    owned = NULL;
    mp__refseg_release(own);
    own = NULL;
}

/* At exit the producer cannot keep its memory alive any longer: say how many
 * allocations other processes still use, and mark the segment so that they
 * fail with a clear error instead of touching freed memory unawares. */
static void at_exit(void)
{
    if (pthread_mutex_trylock(&lock) != 0)
        return; /* another thread is inside mproc: do not wait at exit */
    if (own && mp__refseg_is_owner(own) && mp__refseg_scan(own, NULL) == 0) {
        uint32_t n = mp__refseg_referenced_slots(own);
        if (n > 0)
            mp__log(MP_LOG_WARN, "mproc: process %d is exiting while %u CUDA allocation%s "
                                 "still shared with other processes; their consumers get "
                                 "MP_ECLOSED on next use (release received CUDA tensors "
                                 "before the producer exits)",
                    (int)getpid(), n, n == 1 ? " is" : "s are");
        mp__refseg_mark_exited(own);
        /* The device memory goes with the process (the driver reclaims
         * it); give back the bookkeeping too, so leak checkers stay quiet. */
        forget_state();
    }
    pthread_mutex_unlock(&lock);
}

int mp__cuda_own_segment(mp__refseg **out)
{
    static bool registered;
    int rc;
    if (own && !mp__refseg_is_owner(own)) {
        /* A forked child inherited its parent's: not ours to count in. */
        forget_state();
    }
    if (!own) {
        mp__cuda_alloc **table = calloc(OWN_SLOTS, sizeof *table);
        if (!table)
            return mp__error(MP_ENOMEM, "sharing a CUDA tensor: out of memory");
        if ((rc = mp__refseg_create(OWN_SLOTS, OWN_REFS, &own)) < 0) {
            free(table);
            return rc;
        }
        owned = table;
        if (!registered && atexit(at_exit) == 0) {
            mp__cuda_set_exit_hook(at_exit); /* for children that leave by _exit */
            registered = true;
        }
    }
    *out = own;
    return 0;
}

int mp__cuda_alloc_share(mp__cuda_alloc *a)
{
    mp__refseg *seg;
    int rc;
    if (a->shared)
        return 0;
    if ((rc = mp__cuda_own_segment(&seg)) < 0 ||
        (rc = mp__refseg_slot_alloc(seg, &a->slot, &a->gen)) < 0)
        return rc;
    a->seg = mp__refseg_retain(seg);
    a->shared = true;
    owned[a->slot] = a;
    return 0;
}

mp__cuda_alloc *mp__cuda_owned_lookup(uint32_t slot, uint32_t gen)
{
    if (!owned || slot >= OWN_SLOTS || !owned[slot] || owned[slot]->gen != gen)
        return NULL;
    return owned[slot];
}

/* Really frees an owned allocation (pending or never shared). */
static int free_owned(void *p)
{
    mp__cuda_alloc *a = p;
    int prev, rc;
    if ((rc = mp__cuda_device_enter(a->device, &prev, "freeing a CUDA tensor")) < 0)
        return rc;
    cudaError_t e = mp__cuda.Free(a->base);
    if (e == cudaSuccess && a->has_event)
        mp__cuda.EventDestroy(a->event);
    mp__cuda_device_leave(prev);
    if (e != cudaSuccess)
        return mp__cuda_fail(e, "freeing a CUDA tensor: cudaFree of %zu bytes on device %d",
                             a->nbytes, a->device);
    if (a->shared && owned && owned[a->slot] == a)
        owned[a->slot] = NULL;
    mp__refseg_release(a->seg);
    free(a);
    return 0;
}

int mp__cuda_collect_locked(size_t *freed)
{
    if (freed)
        *freed = 0;
    if (!own || mp__pending_count(&pending) == 0)
        return 0;
    return mp__pending_collect(&pending, own, free_owned, freed);
}

void mp__cuda_owned_release(void *data, void *ctx)
{
    mp__cuda_alloc *a = ctx;
    int rc, rc2 = 0;
    mp__cuda_lock();
    if (a->shared) {
        rc = mp__pending_free(&pending, a->seg, a->slot, a, free_owned, NULL);
    } else {
        rc = free_owned(a);
        rc2 = mp__cuda_collect_locked(NULL);
    }
    mp__cuda_unlock();
    if (rc < 0 || rc2 < 0)
        mp__log(MP_LOG_WARN, "mproc: %s", mp_last_error());
}

int mp_cuda_ipc_collect(size_t *freed)
{
    int rc;
    if (freed)
        *freed = 0;
    if ((rc = mp__cuda_load("mp_cuda_ipc_collect")) < 0)
        return rc;
    mp__cuda_lock();
    rc = mp__cuda_collect_locked(freed);
    mp__cuda_unlock();
    return rc;
}

int mp_cuda_ipc_pending(size_t *count)
{
    int rc;
    if (count)
        *count = 0;
    if ((rc = mp__cuda_load("mp_cuda_ipc_pending")) < 0)
        return rc;
    if (!count)
        return mp__error(MP_EINVAL, "mp_cuda_ipc_pending: count is NULL");
    mp__cuda_lock();
    *count = own && mp__refseg_is_owner(own) ? mp__pending_count(&pending) : 0;
    mp__cuda_unlock();
    return 0;
}

mp__cuda_alloc *mp__cuda_tensor_alloc(const mp_tensor *t, const char *caller)
{
    if (!t) {
        mp__error(MP_EINVAL, "%s: tensor is NULL", caller);
        return NULL;
    }
    mp__storage *s = mp__tensor_storage(t);
    mp__cuda_alloc *a = mp__storage_user(s);
    if (mp__storage_device(s).device_type != kDLCUDA) {
        char dev[48];
        mp__error(MP_EINVAL, "%s: the tensor is on %s, not on a CUDA device", caller,
                  mp__device_label(mp__storage_device(s), dev, sizeof dev));
        return NULL;
    }
    if (!a || a->magic != MP__CUDA_ALLOC_MAGIC) {
        mp__error(MP_EINVAL, "%s: this CUDA tensor's memory was not allocated by mproc (a "
                             "DLPack import?); copy it with mp_tensor_to_cuda first", caller);
        return NULL;
    }
    return a;
}

int mp__cuda_storage(mp__cuda_alloc *a, mp_release_fn release, mp__storage **out)
{
    DLDevice dev = {.device_type = kDLCUDA, .device_id = a->device};
    int rc = mp__storage_wrap(a->base, a->nbytes, dev, release, a, out);
    if (rc == 0)
        mp__storage_set_user(*out, a);
    return rc;
}

int mp_tensor_cuda_share_count(const mp_tensor *t, int *count)
{
    const char *who = "mp_tensor_cuda_share_count";
    int rc;
    if (count)
        *count = 0;
    if ((rc = mp__cuda_load(who)) < 0)
        return rc;
    if (!count)
        return mp__error(MP_EINVAL, "%s: count is NULL", who);
    mp__cuda_alloc *a = mp__cuda_tensor_alloc(t, who);
    if (!a)
        return MP_EINVAL;
    mp__cuda_lock();
    if (a->imported || a->shared) {
        if ((rc = mp__refseg_check_producer(a->seg, who)) == 0)
            *count = mp__refseg_count(a->seg, a->slot, a->gen);
    }
    mp__cuda_unlock();
    return rc;
}
