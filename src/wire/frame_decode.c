/* Frame decoder. It trusts nothing: every count, length, index, name and
 * tensor geometry is checked before anything is mapped or built, every fd
 * must be referenced exactly once, and on any error every fd received is
 * closed (file_system in-flight references are given back). Errors are
 * MP_EPROTO with a sentence saying which field of which part is wrong. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/tensor_internal.h"
#include "wire/frame.h"
#include "wire/wire.h"

#define BAD(...) mp__error(MP_EPROTO, "receiving a message: malformed frame: " __VA_ARGS__)

/* MP_EPROTO whose sentence is the formatted context followed by the sentence
 * a lower layer just recorded (copied first: mp__error writes the same buffer). */
__attribute__((format(printf, 1, 2))) static int bad_because(const char *fmt, ...)
{
    char why[256], ctx[256];
    va_list ap;
    snprintf(why, sizeof why, "%s", mp_last_error());
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    return BAD("%s: %s", ctx, why);
}

typedef struct reader {
    const unsigned char *p;
    uint64_t len;
    uint64_t off;
} reader;

/* Borrowed pointer to the next n bytes, skipping the padding after them;
 * NULL when the body ends first. */
static const unsigned char *take(reader *r, uint64_t n)
{
    const unsigned char *q = r->p + r->off;
    if (n > r->len - r->off || mp__pad8(n) > r->len - r->off)
        return NULL;
    r->off += mp__pad8(n);
    return q;
}

typedef struct dec {
    int *fds;
    int nfds;              /* fds usable by storages and objects (spill excluded) */
    unsigned char used[MP__WIRE_MAX_FDS];
    uint32_t nstorages;
    /* nstorages each, one allocation (none for a message without tensors) */
    mp__storage **storages;
    mp__segment_handle *handles;
    bool *opened;
    mp__pin_ref *pinned;   /* handles[i] PINNED: the pin it names */
    mp__pins *pins;        /* the receiving end's pins, or NULL */
    mp_msg *m;             /* NULL in the checking pass */
} dec;

static int dec_alloc(dec *d, uint32_t nstorages)
{
    size_t each = sizeof *d->storages + sizeof *d->handles + sizeof *d->pinned +
                  sizeof *d->opened;
    unsigned char *block;
    d->nstorages = nstorages;
    if (!nstorages)
        return 0;
    if (!(block = calloc(nstorages, each)))
        return mp__error(MP_ENOMEM, "receiving a message: out of memory");
    d->storages = (mp__storage **)block;
    d->handles = (mp__segment_handle *)(block + nstorages * sizeof *d->storages);
    d->pinned = (mp__pin_ref *)(block + nstorages * (sizeof *d->storages + sizeof *d->handles));
    d->opened = (bool *)(block + nstorages * (sizeof *d->storages + sizeof *d->handles +
                                              sizeof *d->pinned));
    return 0;
}

static int claim_fds(dec *d, uint64_t first, uint64_t n, const char *what, uint32_t index)
{
    if (first > (uint64_t)d->nfds || n > (uint64_t)d->nfds - first)
        return BAD("%s %u refers to fds [%llu, %llu) but only %d arrived", what, index,
                   (unsigned long long)first, (unsigned long long)(first + n), d->nfds);
    for (uint64_t i = first; i < first + n; i++) {
        if (d->used[i])
            return BAD("%s %u refers to fd %llu, which another part already uses", what,
                       index, (unsigned long long)i);
        d->used[i] = 1;
    }
    return 0;
}

static int check_shm_name(const char *name, size_t len, uint32_t index)
{
    char z[MP__SHM_NAME_MAX];
    size_t plen = strlen(MP__SHM_PREFIX);
    if (len < 2 + plen || len >= MP__SHM_NAME_MAX)
        return BAD("storage %u: segment name length %zu is outside [%zu, %d)", index, len,
                   plen + 2, MP__SHM_NAME_MAX);
    memcpy(z, name, len);
    z[len] = '\0';
    /* The rule the shm layer and the shm manager apply too. */
    if (!mp__shm_name_ok(z))
        return BAD("storage %u: segment name is not \"/%s\" followed by letters, digits, "
                   "'-' or '_'", index, MP__SHM_PREFIX);
    return 0;
}

static int parse_storages(dec *d, reader *r)
{
    for (uint32_t i = 0; i < d->nstorages; i++) {
        mp__frame_storage fs;
        const unsigned char *q = take(r, sizeof fs);
        mp__segment_handle *h = &d->handles[i];
        int rc;
        if (!q)
            return BAD("storage table ends after %u of %u entries", i, d->nstorages);
        memcpy(&fs, q, sizeof fs);
        /* A pinned entry holds an in-flight count to give back on failure
         * only once its reference was read and checked (below). */
        h->strategy = fs.strategy == MP__FRAME_STORAGE_PINNED ? (int)MP__FRAME_STORAGE_EMPTY
                                                              : (int)fs.strategy;
        h->size = fs.size;
        h->fd = -1;
        h->name[0] = '\0';
        if (fs.strategy == MP__FRAME_STORAGE_EMPTY) {
            if (fs.size || fs.ref)
                return BAD("storage %u: an empty storage with size %llu and ref %u "
                           "(both must be 0)", i, (unsigned long long)fs.size, fs.ref);
            continue;
        }
        if (fs.size == 0 || fs.size > MP__WIRE_BODY_MAX)
            return BAD("storage %u: size %llu is outside [1, 2^40]", i,
                       (unsigned long long)fs.size);
        if (fs.strategy == MP__STRATEGY_FD) {
            if ((rc = claim_fds(d, fs.ref, 1, "storage", i)) < 0)
                return rc;
            h->fd = (int)fs.ref;   /* an index until the storage is opened */
        } else if (fs.strategy == MP__STRATEGY_FS) {
            if (fs.ref >= MP__SHM_NAME_MAX || !(q = take(r, fs.ref)))
                return BAD("storage %u: name of %u bytes does not fit", i, fs.ref);
            if ((rc = check_shm_name((const char *)q, fs.ref, i)) < 0)
                return rc;
            memcpy(h->name, q, fs.ref);
            h->name[fs.ref] = '\0';
        } else if (fs.strategy == MP__FRAME_STORAGE_PINNED) {
            if (!d->pins)
                return BAD("storage %u names a pin, but it did not arrive on a pipe's or a "
                           "queue's end", i);
            if (!(q = take(r, sizeof *d->pinned)))
                return BAD("storage %u: its pin reference is truncated", i);
            memcpy(&d->pinned[i], q, sizeof *d->pinned);
            if (!mp__pins_ref_ok(&d->pinned[i]))
                return BAD("storage %u: pin slot %u is out of range", i, d->pinned[i].slot);
            h->strategy = MP__FRAME_STORAGE_PINNED;
        } else {
            return BAD("storage %u: unknown sharing strategy %u", i, fs.strategy);
        }
    }
    return 0;
}

/* One tensor record; builds the tensor in the building pass. */
static int parse_tensor(dec *d, reader *r, uint32_t index, bool grad, uint32_t *flags,
                        mp_tensor **out)
{
    mp__frame_tensor ft;
    int64_t shape[MP_MAX_NDIM], strides[MP_MAX_NDIM];
    const unsigned char *q = take(r, sizeof ft);
    int rc;
    if (!q)
        return BAD("attachment %u: tensor record truncated", index);
    memcpy(&ft, q, sizeof ft);
    if (ft.ndim > MP_MAX_NDIM)
        return BAD("attachment %u: ndim %u exceeds %d", index, ft.ndim, MP_MAX_NDIM);
    if (ft.dtype >= MP_DTYPE_COUNT)
        return BAD("attachment %u: unknown dtype %u", index, ft.dtype);
    if (ft.storage >= d->nstorages)
        return BAD("attachment %u: storage index %u but the table has %u", index, ft.storage,
                   d->nstorages);
    if (ft.flags & ~(uint32_t)MP__FRAME_TENSOR_GRAD || (grad && ft.flags))
        return BAD("attachment %u: bad tensor flags 0x%x", index, ft.flags);
    if (!(q = take(r, 16u * ft.ndim)))
        return BAD("attachment %u: shape and strides truncated", index);
    memcpy(shape, q, 8u * ft.ndim);
    memcpy(strides, q + 8u * ft.ndim, 8u * ft.ndim);
    *flags = ft.flags;
    rc = mp__tensor_check_geometry("receiving a message", (mp_dtype)ft.dtype, (int)ft.ndim,
                                   shape, strides, ft.byte_offset,
                                   (size_t)d->handles[ft.storage].size);
    if (rc < 0)
        return bad_because("attachment %u%s: the view reaches outside its %llu-byte storage "
                           "or overflows", index, grad ? " (grad)" : "",
                           (unsigned long long)d->handles[ft.storage].size);
    if (!d->m)
        return 0;
    rc = mp__tensor_make("receiving a message", d->storages[ft.storage], (mp_dtype)ft.dtype,
                         (int)ft.ndim, shape, strides, ft.byte_offset, out);
    if (rc == MP_EINVAL || rc == MP_EOVERFLOW)
        return bad_because("attachment %u", index);
    return rc;
}

static int parse_tensor_attach(dec *d, reader *r, uint32_t index, mp_tensor **out)
{
    mp_tensor *t = NULL, *g = NULL;
    uint32_t flags = 0, gflags = 0;
    int rc = parse_tensor(d, r, index, false, &flags, &t);
    if (rc == 0 && (flags & MP__FRAME_TENSOR_GRAD))
        rc = parse_tensor(d, r, index, true, &gflags, &g);
    if (rc == 0 && g)
        rc = mp_tensor_set_grad(t, g);
    if (rc == MP_EINVAL)
        rc = bad_because("a grad that does not match its tensor");
    mp_tensor_release(g);
    if (rc < 0)
        mp_tensor_release(t);
    else
        *out = t;
    return rc;
}

static int parse_object(dec *d, reader *r, uint32_t index, const mp__objkind *k, void **out)
{
    mp__frame_object fo;
    int objfds[MP__WIRE_MAX_FDS];
    uint64_t len = r->len - r->off;   /* the rest of the attachment body */
    const unsigned char *q = r->p + r->off;
    int rc;
    if (len < sizeof fo)
        return BAD("attachment %u: %s record truncated", index, k->name);
    r->off = r->len;
    memcpy(&fo, q, sizeof fo);
    if (!d->m)
        return claim_fds(d, fo.fd_first, fo.nfds, "attachment", index);
    /* The kind's decoder owns these fds from here on, success or not. */
    for (uint32_t i = 0; i < fo.nfds; i++) {
        objfds[i] = d->fds[fo.fd_first + i];
        d->fds[fo.fd_first + i] = -1;
    }
    rc = k->decode(q + sizeof fo, len - sizeof fo, objfds, (int)fo.nfds, out);
    if (rc == MP_EINVAL)
        rc = bad_because("%s", k->name);
    return rc;
}

/* A kind id this process has no descriptor for: a sender of a newer or
 * another build, most likely (a process registers every kind it was built
 * with before its first receive, src/ipc/kinds.c). */
static int unknown_kind(uint32_t index, unsigned kind)
{
    char known[256];
    mp__objkind_list(known, sizeof known);
    return mp__error(MP_EPROTO, "receiving a message: attachment %u has object kind %u, which "
                                "this build of mproc (%s) does not know (it knows %s): the "
                                "sender may be a newer or another build of mproc; link both "
                                "ends with the same mproc",
                     index, kind, MP_VERSION_STRING,
                     known[0] ? known : "none: no kind is registered");
}

static int parse_attachments(dec *d, reader *r, uint32_t nattach)
{
    for (uint32_t i = 0; i < nattach; i++) {
        mp__frame_attach fa;
        const unsigned char *q = take(r, sizeof fa), *name = NULL, *body;
        const mp__objkind *k = NULL;
        size_t name_len = 0;
        void *ref = NULL;
        reader br;
        int rc;
        if (!q)
            return BAD("the body ends after %u of %u attachments", i, nattach);
        memcpy(&fa, q, sizeof fa);
        if (fa.name_len != MP__FRAME_NO_NAME) {
            name_len = fa.name_len;
            if (name_len > MP_MSG_NAME_MAX || !(name = take(r, name_len)))
                return BAD("attachment %u: name of %zu bytes is too long or truncated", i,
                           name_len);
            if (memchr(name, '\0', name_len))
                return BAD("attachment %u: name contains a NUL byte", i);
        }
        if (!(body = take(r, fa.body_len)))
            return BAD("attachment %u: body of %u bytes is truncated", i, fa.body_len);
        br = (reader){body, fa.body_len, 0};
        if (fa.kind != MP_ATTACH_TENSOR && !(k = mp__objkind_lookup(fa.kind)))
            return unknown_kind(i, fa.kind);
        if (k)
            rc = parse_object(d, &br, i, k, &ref);
        else
            rc = parse_tensor_attach(d, &br, i, (mp_tensor **)&ref);
        if (rc == 0 && br.off != br.len)
            rc = BAD("attachment %u: %llu unexplained bytes after its record", i,
                     (unsigned long long)(br.len - br.off));
        if (rc == 0 && !d->m)
            continue;   /* checking pass */
        if (rc == 0 && (rc = mp__msg_push(d->m, k, (const char *)name, name_len,
                                          ref)) == 0)
            continue;   /* the message holds the reference now */
        if (ref && k)
            k->release(ref);
        else if (ref)
            mp_tensor_release(ref);
        return rc;
    }
    return 0;
}

static int check_header(const mp__frame_header *h, size_t len, int nfds)
{
    if (h->magic != MP__FRAME_MAGIC)
        return BAD("bad magic 0x%08x (not an mproc message)", h->magic);
    if (h->version != MP__FRAME_VERSION)
        return BAD("version %u, this library speaks version %u", h->version,
                   MP__FRAME_VERSION);
    if (h->flags & ~(unsigned)MP__FRAME_KNOWN_FLAGS)
        return BAD("unknown flags 0x%x", h->flags);
    if (h->nfds != (uint32_t)nfds)
        return BAD("the header announces %u fds but %d arrived with it", h->nfds, nfds);
    if (h->flags & MP__FRAME_CLOSED)
        return h->body_len || nfds || len != sizeof *h
                   ? BAD("an end-of-stream marker carries a body or fds")
                   : mp__error(MP_ECLOSED, "receiving a message: the queue is closed");
    /* A well-formed nudge is dropped before decoding; one that gets here is
     * either malformed or handed to the decoder by hand. */
    if (h->flags & MP__FRAME_NUDGE)
        return BAD("a wake-up record (NUDGE) is not a message%s",
                   h->body_len || nfds || len != sizeof *h ? ", and it carries a body or fds"
                                                           : "");
    if (h->flags & MP__FRAME_SPILLED) {
        if (len != sizeof *h || nfds < 1)
            return BAD("a spilled frame has %zu bytes and %d fds (wants %zu and >= 1)", len,
                       nfds, sizeof *h);
        if (h->body_len <= MP__WIRE_INLINE_MAX || h->body_len > MP__WIRE_BODY_MAX)
            return BAD("spilled body of %llu bytes is outside (%u, 2^40]",
                       (unsigned long long)h->body_len, MP__WIRE_INLINE_MAX);
    } else if (h->body_len != len - sizeof *h) {
        return BAD("the header announces a %llu-byte body but the record holds %zu",
                   (unsigned long long)h->body_len, len - sizeof *h);
    }
    if (h->nstorages > MP__WIRE_MAX_FDS)
        return BAD("%u storages (at most %d)", h->nstorages, MP__WIRE_MAX_FDS);
    if (h->nattach > h->body_len / sizeof(mp__frame_attach))
        return BAD("%u attachments cannot fit in a %llu-byte body", h->nattach,
                   (unsigned long long)h->body_len);
    return 0;
}

/* Maps the spilled body (the last fd; ownership passes to the segment). */
static int open_spill(mp__frame_header *h, int *fds, int nfds, mp__segment **spill)
{
    mp__segment_handle sh = {.strategy = MP__STRATEGY_FD, .fd = fds[nfds - 1],
                             .size = h->body_len};
    int rc;
    fds[nfds - 1] = -1;
    rc = mp__segment_open(&sh, spill);
    if (rc == MP_EPROTO)
        rc = bad_because("spill fd");
    return rc;
}

static int open_storages(dec *d)
{
    for (uint32_t i = 0; i < d->nstorages; i++) {
        mp__segment_handle *h = &d->handles[i];
        mp__segment *seg = NULL;
        int rc;
        if (h->strategy == MP__FRAME_STORAGE_EMPTY) {
            /* No bytes to map: a storage over a static byte, so that the
             * tensor's data pointer is not NULL. */
            static unsigned char no_bytes;
            DLDevice cpu = {kDLCPU, 0};
            d->opened[i] = true;
            if ((rc = mp__storage_wrap(&no_bytes, 0, cpu, NULL, NULL, &d->storages[i])) < 0)
                return rc;
            continue;
        }
        d->opened[i] = true;   /* the open owns the handle from here */
        if (h->strategy == MP__FRAME_STORAGE_PINNED) {
            if ((rc = mp__pins_open(d->pins, &d->pinned[i], h->size, &seg, NULL)) < 0)
                return rc;
        } else {
            bool by_fd = h->strategy == MP__STRATEGY_FD;
            if (by_fd) {
                int idx = h->fd;
                h->fd = d->fds[idx];
                d->fds[idx] = -1;
            }
            rc = d->pins && h->strategy == MP__STRATEGY_FS ? mp__pins_open_fs(d->pins, h, &seg)
                                                           : mp__segment_open(h, &seg);
            if (rc < 0) {
                if (rc == MP_EPROTO)
                    rc = bad_because("storage fd");
                return rc;
            }
            if (by_fd && d->pins)
                mp__pins_received(d->pins, seg);
        }
        rc = mp__storage_from_segment(seg, &d->storages[i]);
        mp__segment_release(seg);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Parses the body at r without building anything: the storages, where the
 * payload lies, the attachments (on a copy of r), and that every fd that
 * arrived is referred to. */
static int parse_body(dec *d, reader *r, const mp__frame_header *h,
                      const unsigned char **payload)
{
    reader ar;
    int rc;
    if ((rc = parse_storages(d, r)) < 0)
        return rc;
    if (!(*payload = take(r, h->payload_len)))
        return BAD("payload of %llu bytes runs past the body", (unsigned long long)h->payload_len);
    ar = *r;
    if ((rc = parse_attachments(d, &ar, h->nattach)) < 0)
        return rc;
    if (ar.off != ar.len)
        return BAD("%llu trailing bytes after the last attachment",
                   (unsigned long long)(ar.len - ar.off));
    for (int i = 0; i < d->nfds; i++)
        if (!d->used[i])
            return BAD("fd %d arrived but no storage or attachment refers to it", i);
    return 0;
}

/* Lets go of what decoding holds (d may be NULL); after a failure (rc < 0)
 * also of the references the parsed, unopened handles carried. */
static void dec_finish(dec *d, int rc)
{
    if (!d)
        return;
    for (uint32_t i = 0; i < d->nstorages; i++) {
        mp__storage_release(d->storages[i]);
        /* Every file_system entry that parsed holds the sender's reference
         * (calloc'd entries past a failure read as file_descriptor). */
        if (rc < 0 && !d->opened[i] && d->handles[i].strategy == MP__STRATEGY_FS)
            mp__segment_handle_drop(&d->handles[i], true);
        /* and every pinned one an in-flight count */
        if (rc < 0 && !d->opened[i] && d->handles[i].strategy == MP__FRAME_STORAGE_PINNED)
            mp__pins_drop(d->pins, &d->pinned[i]);
    }
    mp_msg_destroy(d->m);
    free(d->storages);
}

int mp__wire_decode(const void *buf, size_t len, int *fds, int nfds, mp_msg **out)
{
    return mp__wire_decode_rx(NULL, buf, len, fds, nfds, out);
}

int mp__wire_decode_rx(mp__rx *rx, const void *buf, size_t len, int *fds, int nfds,
                       mp_msg **out)
{
    mp__frame_header h;
    mp__segment *spill = NULL;
    dec dd, *d = NULL;
    reader r;
    const unsigned char *payload;
    void *copy = NULL;
    int rc;
    if (out)
        *out = NULL;
    if (!buf || !out || nfds < 0 || nfds > MP__WIRE_MAX_FDS || (nfds && !fds)) {
        rc = mp__error(MP_EINVAL, "mp__wire_decode: bad arguments");
        goto out_fds;
    }
    if (len < sizeof h) {
        rc = BAD("truncated: %zu bytes, the header alone is %zu", len, sizeof h);
        goto out_fds;
    }
    memcpy(&h, buf, sizeof h);
    if ((rc = check_header(&h, len, nfds)) < 0)
        goto out_fds;
    memset(&dd, 0, sizeof dd);
    if ((rc = dec_alloc(&dd, h.nstorages)) < 0)
        goto out_fds;
    d = &dd;
    d->fds = fds;
    d->nfds = nfds;
    d->pins = rx ? &rx->pins : NULL;
    r = (reader){(const unsigned char *)buf + sizeof h, h.body_len, 0};
    if (h.flags & MP__FRAME_SPILLED) {
        d->nfds = nfds - 1;
        if ((rc = open_spill(&h, fds, nfds, &spill)) < 0)
            goto out_dec;
        r.p = mp__segment_data(spill);
    }
    if ((rc = parse_body(d, &r, &h, &payload)) < 0)
        goto out_dec;
    /* Everything checks out: map, then build. */
    if ((rc = open_storages(d)) < 0 || (rc = mp_msg_create(&d->m)) < 0)
        goto out_dec;
    if (h.payload_len) {
        if (!(copy = mp__msg_buf_get(h.payload_len))) {
            rc = mp__error(MP_ENOMEM, "receiving a message: cannot allocate a %llu-byte payload",
                           (unsigned long long)h.payload_len);
            goto out_dec;
        }
        memcpy(copy, payload, h.payload_len);
        mp__msg_adopt_payload(d->m, copy, h.payload_len);
    }
    if ((rc = parse_attachments(d, &r, h.nattach)) < 0)
        goto out_dec;
    *out = d->m;
    d->m = NULL;
out_dec:
    dec_finish(d, rc);
    mp__segment_release(spill);
out_fds:
    for (int i = 0; rc < 0 && fds && i < nfds; i++)
        fds[i] = mp__close(fds[i]);
    return rc;
}
