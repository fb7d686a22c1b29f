/* MP_ATTACH_CUDA_TENSOR: sending and receiving CUDA tensors (see frame.h for
 * the bytes). The sender records an IPC event on its default stream and
 * takes one reference in the producer's segment for the message in flight;
 * the receiver adopts that reference, opens the allocation's IPC handle once
 * per process (cache below), and waits on the event before any later work.
 * A sender whose stream is idle sends no event (see needs_event). */
#include "cuda/frame.h"
#include "cuda/gpu.h"
#include "wire/wire.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static mp__cuda_alloc *imports; /* under mp__cuda_lock */

/* On the current device: whether the receiver must wait for work we queued.
 * Not when the legacy default stream is idle: then everything queued before,
 * on it and on the blocking streams it synchronises with, has finished (what
 * an event recorded on it would wait for). The event is what costs: on an
 * idle H100 the receiver's cudaStreamWaitEvent made a repeated handoff take
 * 270 us instead of 20 (docs/cuda.md, "Events"). */
static int needs_event(bool *needed, const char *who)
{
    cudaError_t e = mp__cuda.StreamQuery(0);
    if (e != cudaSuccess && e != cudaErrorNotReady)
        return mp__cuda_fail(e, "%s: cudaStreamQuery", who);
    *needed = e == cudaErrorNotReady;
    return 0;
}

/* Under the lock: makes sure a has an IPC event, and records it on the
 * current device's default stream so the receiver waits for our writes. */
static int record_event(mp__cuda_alloc *a, const char *who)
{
    cudaError_t e;
    if (!a->has_event) {
        e = mp__cuda.EventCreateWithFlags(&a->event,
                                          cudaEventInterprocess | cudaEventDisableTiming);
        if (e != cudaSuccess)
            return mp__cuda_fail(e, "%s: cudaEventCreateWithFlags(interprocess)", who);
        if ((e = mp__cuda.IpcGetEventHandle(&a->event_handle, a->event)) != cudaSuccess) {
            mp__cuda.EventDestroy(a->event);
            return mp__cuda_fail(e, "%s: cudaIpcGetEventHandle", who);
        }
        a->has_event = true;
        mp__cuda_event_files_remove_at_exit();
    }
    if ((e = mp__cuda.EventRecord(a->event, 0)) != cudaSuccess)
        return mp__cuda_fail(e, "%s: cudaEventRecord", who);
    return 0;
}

/* Under the lock, on a's device: the handle, slot and (when our stream has
 * work queued) event for a send; *with_event says whether it has one. */
static int prepare_send(mp__cuda_alloc *a, bool *with_event, const char *who)
{
    int rc;
    cudaError_t e;
    if (a->imported) {
        if ((rc = mp__refseg_check_producer(a->seg, who)) < 0)
            return rc;
    } else {
        if ((rc = mp__cuda_alloc_share(a)) < 0)
            return rc;
        if (!a->has_handle) {
            if ((e = mp__cuda.IpcGetMemHandle(&a->handle, a->base)) != cudaSuccess)
                return mp__cuda_fail(e, "%s: cudaIpcGetMemHandle", who);
            a->has_handle = true;
        }
    }
    if ((rc = needs_event(with_event, who)) < 0 || !*with_event)
        return rc;
    return record_event(a, who);
}

static void fill_frame(const mp_tensor *t, const mp__cuda_alloc *a, bool with_event,
                       mp__cuda_frame *f)
{
    memset(f, 0, sizeof *f);
    f->device = a->device;
    f->dtype = (int32_t)mp_tensor_dtype(t);
    f->ndim = mp_tensor_ndim(t);
    f->producer_pid = mp__refseg_producer_pid(a->seg);
    f->slot = a->slot;
    f->gen = a->gen;
    f->alloc_nbytes = a->nbytes;
    f->byte_offset = mp_tensor_byte_offset(t);
    f->has_event = with_event;
    memcpy(f->mem_handle, &a->handle, MP__CUDA_HANDLE_BYTES);
    if (with_event)
        memcpy(f->event_handle, &a->event_handle, MP__CUDA_HANDLE_BYTES);
    memcpy(f->shape, mp_tensor_shape(t), sizeof(int64_t) * (size_t)f->ndim);
    memcpy(f->strides, mp_tensor_strides(t), sizeof(int64_t) * (size_t)f->ndim);
}

static int encode(void *obj, void *buf, size_t cap, size_t *len, int *fds, int maxfds,
                  int *nfds)
{
    const char *who = "sending a CUDA tensor";
    mp_tensor *t = obj;
    mp__cuda_frame f;
    bool with_event = false;
    int prev, rc;
    if ((rc = mp__cuda_load(who)) < 0)
        return rc;
    mp__cuda_alloc *a = mp__cuda_tensor_alloc(t, who);
    if (!a)
        return MP_EINVAL;
    if (maxfds < 1)
        return mp__error(MP_EOVERFLOW, "%s: no room for its fd in the message", who);
    if ((rc = mp__cuda_device_enter(a->device, &prev, who)) < 0)
        return rc;
    mp__cuda_lock();
    if ((rc = prepare_send(a, &with_event, who)) < 0)
        goto out_unlock;
    fill_frame(t, a, with_event, &f);
    rc = mp__refseg_ref_add(a->seg, a->slot, a->gen, (uint32_t)mp__pid(), &f.ref, &f.ref_word);
    if (rc < 0)
        goto out_unlock;
    if ((rc = mp__cuda_frame_encode(&f, buf, cap, len)) < 0) {
        mp__refseg_ref_drop(a->seg, f.ref, f.ref_word);
        goto out_unlock;
    }
    fds[0] = mp__refseg_fd(a->seg);
    *nfds = 1;
out_unlock:
    mp__cuda_unlock();
    mp__cuda_device_leave(prev);
    return rc;
}

/* Release of a received storage: the last one over a mapping closes it and
 * drops this process's reference. */
static void import_release(void *data, void *ctx)
{
    mp__cuda_alloc *a = ctx;
    int prev = -1, rc = 0;
    mp__cuda_lock();
    if (--a->users > 0) {
        mp__cuda_unlock();
        return;
    }
    for (mp__cuda_alloc **p = &imports; *p; p = &(*p)->next) {
        if (*p == a) {
            *p = a->next;
            break;
        }
    }
    if (mp__cuda_device_enter(a->device, &prev, "releasing a received CUDA tensor") == 0) {
        cudaError_t e = a->self ? cudaSuccess : mp__cuda.IpcCloseMemHandle(a->base);
        if (a->has_event)
            mp__cuda.EventDestroy(a->event);
        mp__cuda_device_leave(prev);
        if (e != cudaSuccess)
            rc = mp__cuda_fail(e, "releasing a received CUDA tensor: cudaIpcCloseMemHandle");
    }
    mp__refseg_ref_drop(a->seg, a->ref, a->ref_word);
    if (a->self && rc == 0)
        rc = mp__cuda_collect_locked(NULL); /* ours may be pending on that reference */
    mp__cuda_unlock();
    if (rc < 0)
        mp__log(MP_LOG_WARN, "mproc: %s", mp_last_error());
    mp__refseg_release(a->seg);
    free(a);
}

/* Under the lock, on f's device: a new mapping of f's allocation, holding
 * the adopted reference. Takes over seg's reference on success. */
static int import_open(const mp__cuda_frame *f, mp__refseg *seg, mp__cuda_alloc **out)
{
    const char *who = "receiving a CUDA tensor";
    mp__cuda_alloc *a = calloc(1, sizeof *a);
    cudaIpcMemHandle_t h;
    int rc;
    if (!a)
        return mp__error(MP_ENOMEM, "%s: out of memory", who);
    *a = (mp__cuda_alloc){.magic = MP__CUDA_ALLOC_MAGIC, .imported = true, .device = f->device,
                          .nbytes = (size_t)f->alloc_nbytes, .seg = seg, .shared = true,
                          .slot = f->slot, .gen = f->gen, .has_handle = true, .users = 1};
    memcpy(&a->handle, f->mem_handle, sizeof h);
    if ((rc = mp__refseg_ref_adopt(seg, f->ref, f->ref_word, (uint32_t)mp__pid(),
                                   &a->ref_word)) < 0)
        goto out_free;
    a->ref = f->ref;
    if (mp__refseg_is_owner(seg)) {
        /* Our own allocation came back: no IPC open (CUDA refuses it). */
        mp__cuda_alloc *own = mp__cuda_owned_lookup(f->slot, f->gen);
        if (!own || own->device != f->device || own->nbytes != a->nbytes) {
            rc = mp__error(MP_EPROTO, "%s: slot %u names no allocation of this process", who,
                           f->slot);
            goto out_drop;
        }
        a->self = true;
        a->base = own->base;
    } else {
        /* Its memory went with it: say so, rather than CUDA's "invalid
         * resource handle". */
        if ((rc = mp__refseg_check_producer(seg, who)) < 0)
            goto out_drop;
        memcpy(&h, f->mem_handle, sizeof h);
        cudaError_t e = mp__cuda.IpcOpenMemHandle(&a->base, h, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
            rc = mp__cuda_fail(e, "%s: cudaIpcOpenMemHandle on device %d (producer pid %u)",
                               who, f->device, f->producer_pid);
            goto out_drop;
        }
    }
    a->next = imports;
    imports = a;
    *out = a;
    return 0;
out_drop:
    mp__refseg_ref_drop(seg, a->ref, a->ref_word);
out_free:
    free(a);
    return rc;
}

/* Under the lock: the mapping of f's allocation, opened once per process. */
static int import_get(const mp__cuda_frame *f, mp__refseg *seg, mp__cuda_alloc **out)
{
    for (mp__cuda_alloc *a = imports; a; a = a->next) {
        if (a->seg == seg && a->slot == f->slot && a->gen == f->gen &&
            a->device == f->device) {
            /* The mapping's own reference keeps the memory: the message's
             * is not needed (already reclaimed is fine too). */
            uint64_t w = f->ref_word;
            mp__refseg_ref_drop(seg, f->ref, w);
            mp__error_clear();
            a->users++;
            mp__refseg_release(seg);
            *out = a;
            return 0;
        }
    }
    return import_open(f, seg, out);
}

/* Orders this process's default stream after the sender's recorded work. */
static int wait_event(const mp__cuda_frame *f, bool self)
{
    cudaIpcEventHandle_t h;
    cudaEvent_t ev;
    if (!f->has_event)
        return 0;
    memcpy(&h, f->event_handle, sizeof h);
    cudaError_t e = mp__cuda.IpcOpenEventHandle(&ev, h);
    if (e != cudaSuccess) {
        /* Our own event cannot be opened here, and needs no waiting: our
         * stream already runs after what we queued. */
        if (self)
            return 0;
        return mp__cuda_fail(e, "receiving a CUDA tensor: cudaIpcOpenEventHandle");
    }
    e = mp__cuda.StreamWaitEvent(0, ev, 0);
    mp__cuda.EventDestroy(ev);
    if (e != cudaSuccess)
        return mp__cuda_fail(e, "receiving a CUDA tensor: cudaStreamWaitEvent");
    return 0;
}

static int decode(const void *buf, size_t len, int *fds, int nfds, void **obj)
{
    const char *who = "receiving a CUDA tensor";
    mp__cuda_frame f;
    mp__refseg *seg = NULL;
    mp__cuda_alloc *a = NULL;
    mp__storage *s = NULL;
    int prev, rc;
    if ((rc = mp__cuda_load(who)) < 0) {
        for (int i = 0; i < nfds; i++)
            mp__close(fds[i]);
        return rc;
    }
    if (nfds != 1) {
        for (int i = 0; i < nfds; i++)
            mp__close(fds[i]);
        return mp__error(MP_EPROTO, "%s: %d fds, expected 1", who, nfds);
    }
    if ((rc = mp__cuda_frame_decode(buf, len, &f)) < 0) {
        mp__close(fds[0]);
        return rc;
    }
    if ((rc = mp__refseg_open(fds[0], &seg)) < 0)
        return rc;
    if (mp__refseg_producer_pid(seg) != f.producer_pid) {
        mp__refseg_release(seg);
        return mp__error(MP_EPROTO, "%s: producer pid %u does not match its segment's %u", who,
                         f.producer_pid, mp__refseg_producer_pid(seg));
    }
    if ((rc = mp__cuda_device_enter(f.device, &prev, who)) < 0) {
        mp__refseg_release(seg);
        return rc;
    }
    mp__cuda_lock();
    rc = import_get(&f, seg, &a); /* takes over seg on success */
    mp__cuda_unlock();
    if (rc < 0) {
        mp__refseg_release(seg);
        mp__cuda_device_leave(prev);
        return rc;
    }
    rc = wait_event(&f, a->self);
    mp__cuda_device_leave(prev);
    if (rc == 0 && (rc = mp__cuda_storage(a, import_release, &s)) == 0) {
        rc = mp__tensor_make(who, s, (mp_dtype)f.dtype, f.ndim, f.shape, f.strides,
                             f.byte_offset, (mp_tensor **)obj);
        mp__storage_release(s); /* the tensor holds it; on failure this closes */
        return rc;
    }
    import_release(a->base, a); /* no storage took a's use */
    return rc;
}

static void *kind_retain(void *obj) { return mp_tensor_retain(obj); }
static void kind_release(void *obj) { mp_tensor_release(obj); }

const mp__objkind mp__cuda_tensor_kind = {
    .kind = MP_ATTACH_CUDA_TENSOR,
    .name = "CUDA tensor",
    .retain = kind_retain,
    .release = kind_release,
    .encode = encode,
    .decode = decode,
};

int mp__cuda_kinds_register(void)
{
    return mp__objkind_register(&mp__cuda_tensor_kind);
}

int mp__cuda_import_count(void)
{
    int n = 0;
    mp__cuda_lock();
    for (mp__cuda_alloc *a = imports; a; a = a->next)
        n++;
    mp__cuda_unlock();
    return n;
}
