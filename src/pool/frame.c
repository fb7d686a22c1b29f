/* Packs: several messages carried as one (one wire record per chunk). */
#include "pool/pool_internal.h"
#include "wire/objects.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mp__msg_copy_attachments(const mp_msg *src, size_t from, size_t n, mp_msg *dst)
{
    for (size_t i = from; i < from + n; i++) {
        int kind = mp_msg_kind(src, i), rc;
        const char *name = mp_msg_name(src, i);
        if (kind < 0)
            return kind;
        if (kind == MP_ATTACH_TENSOR) {
            mp_tensor *t;
            rc = mp_msg_get_tensor(src, i, &t);
            if (rc)
                return rc;
            /* Move a private tensor to shared memory now, in the caller's
             * thread, rather than when the handler thread sends the chunk. */
            rc = mp_tensor_share_memory_(t);
            if (!rc)
                rc = mp_msg_add_tensor(dst, name, t);
            mp_tensor_release(t);
        } else {
            rc = mp__msg_copy_object(dst, src, i);
        }
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- building --------------------------------------------------------------- */

/* The pack is built in place, in the buffer it is sent from: the header,
 * room for cap entries, room for the name, then the data; finish closes
 * the gap left by unused entries. */
#define PACK_FIXED(p) (sizeof(mp__pack_hdr) + (size_t)(p)->cap * sizeof(mp__pack_entry) + \
                       (p)->name_len)

static mp__pack_entry *pack_entries(const mp__packer *p)
{
    return (mp__pack_entry *)(void *)(p->buf + sizeof(mp__pack_hdr));
}

static char *pack_data(const mp__packer *p)
{
    return p->buf + PACK_FIXED(p);
}

/* Resizes p's buffer for cap entries and data_cap bytes of data (never
 * below what it holds), moving the data after the entries. */
static int pack_resize(mp__packer *p, size_t cap, size_t data_cap)
{
    size_t old_fixed = PACK_FIXED(p), fixed, total;
    char *q;
    if (cap > UINT32_MAX)
        return mp__error(MP_EOVERFLOW, "pool: too many items in one chunk");
    fixed = sizeof(mp__pack_hdr) + cap * sizeof(mp__pack_entry) + p->name_len;
    if (data_cap > SIZE_MAX - fixed || cap > (SIZE_MAX - 4096) / sizeof(mp__pack_entry))
        return mp__error(MP_ENOMEM, "pool: a chunk of %zu items is too large", cap);
    total = fixed + data_cap;
    q = p->buf ? realloc(p->buf, total) : mp__msg_buf_get(total);
    if (!q)
        return mp__error(MP_ENOMEM, "pool: out of memory for a %zu-byte chunk", total);
    p->buf = q;
    if (fixed != old_fixed && p->len)
        memmove(q + fixed, q + old_fixed, p->len);
    p->cap = (uint32_t)cap;
    /* what malloc gave beyond the request is room for data too */
    p->data_cap = malloc_usable_size(q) - fixed;
    return 0;
}

static size_t grown(size_t have, size_t need)
{
    size_t c = have ? have : 8;
    while (c < need)
        c = c > SIZE_MAX / 2 ? need : c * 2;
    return c;
}

int mp__packer_init(mp__packer *p, uint32_t magic, const char *name, size_t count_hint)
{
    memset(p, 0, sizeof *p);
    p->magic = magic;
    if (name)
        snprintf(p->name, sizeof p->name, "%s", name);
    p->name_len = (uint32_t)strlen(p->name);
    /* room for small items (8 bytes each) from the start: fewer reallocs */
    size_t cap = count_hint ? count_hint : 8;
    int rc = cap <= SIZE_MAX / 8 ? pack_resize(p, cap, cap * 8)
                                 : mp__error(MP_ENOMEM, "pool: %zu items in a chunk", cap);
    if (!rc)
        rc = mp_msg_create(&p->msg);
    if (rc)
        mp__packer_drop(p); /* the buffer, for callers that only free on failure */
    return rc;
}

/* Room for one more entry and n more bytes of data. */
static int make_room(mp__packer *p, size_t n)
{
    size_t cap = p->count < p->cap ? p->cap : grown(p->cap, (size_t)p->count + 1);
    size_t dcap = p->data_cap;
    if (p->count == UINT32_MAX)
        return mp__error(MP_EOVERFLOW, "pool: too many items in one chunk");
    if (n > SIZE_MAX - p->len)
        return mp__error(MP_ENOMEM, "pool: a chunk's item of %zu bytes is too large", n);
    if (p->len + n > dcap)
        dcap = grown(dcap, p->len + n);
    return cap == p->cap && dcap == p->data_cap ? 0 : pack_resize(p, cap, dcap);
}

int mp__packer_add(mp__packer *p, const void *payload, size_t len, const mp_msg *attach,
                   int rc, const char *err)
{
    mp__pack_entry e = {rc, 0, len, err ? strlen(err) : 0};
    int r;
    if (attach && (e.nattach = (uint32_t)mp_msg_count(attach)) != 0) {
        r = mp__msg_copy_attachments(attach, 0, e.nattach, p->msg);
        if (r)
            return r;
    }
    /* the common case, one call per item of every chunk: room for it all */
    if (!(p->count < p->cap && len + e.err_len <= p->data_cap - p->len) &&
        (r = make_room(p, len + e.err_len)) != 0)
        return r;
    char *d = pack_data(p) + p->len;
    mp__copy_short(d, payload, len);
    if (e.err_len)
        memcpy(d + len, err, e.err_len);
    p->len += len + e.err_len;
    /* stored field by field: a copy of the whole from the stack waited for
     * the stores that built it (the buffer keeps entries aligned) */
    mp__pack_entry *to = pack_entries(p) + p->count++;
    to->rc = e.rc, to->nattach = e.nattach, to->len = e.len, to->err_len = e.err_len;
    return 0;
}

int mp__packer_add_star(mp__packer *p, const mp_msg *const *in, size_t k)
{
    mp__packer star;
    mp_msg *packed = NULL;
    const void *pl;
    size_t len;
    int rc = mp__packer_init(&star, MP__PACK_STAR, NULL, k);
    for (size_t j = 0; !rc && j < k; j++) {
        pl = mp_msg_payload(in[j], &len);
        rc = mp__packer_add(&star, pl, len, in[j], 0, NULL);
    }
    if (!rc)
        rc = mp__packer_finish(&star, &packed);
    else
        mp__packer_drop(&star);
    if (!rc) {
        pl = mp_msg_payload(packed, &len);
        rc = mp__packer_add(p, pl, len, packed, 0, NULL);
    }
    mp_msg_destroy(packed);
    return rc;
}

int mp__packer_finish(mp__packer *p, mp_msg **out)
{
    mp__pack_hdr h = {p->magic, p->count, p->name_len, 0};
    size_t at = sizeof h + (size_t)p->count * sizeof(mp__pack_entry);
    if (p->count < p->cap && p->len) /* close the gap of unused entries */
        memmove(p->buf + at + p->name_len, pack_data(p), p->len);
    memcpy(p->buf, &h, sizeof h);
    memcpy(p->buf + at, p->name, p->name_len);
    mp__msg_adopt_payload(p->msg, p->buf, at + p->name_len + p->len); /* sent as built */
    p->buf = NULL;
    *out = p->msg;
    p->msg = NULL;
    mp__packer_drop(p);
    return 0;
}

void mp__packer_drop(mp__packer *p)
{
    mp_msg_destroy(p->msg);
    mp__msg_buf_put(p->buf);
    memset(p, 0, sizeof *p);
}

/* ---- reading ---------------------------------------------------------------- */

/* The view's three tables in one block (entries first: the most aligned):
 * malloc'd and owned by the view, or the reusable *buf (grown as needed). */
static int open_tables(mp__pack_view *v, size_t count, void **buf, size_t *cap)
{
    size_t n = count ? count : 1;
    size_t need = n * (sizeof *v->owned + sizeof *v->payloads + sizeof *v->first_attach);
    mp__pack_entry *t;
    _Static_assert(sizeof(mp__pack_entry) % sizeof(char *) == 0 &&
                       sizeof(char *) == sizeof(size_t),
                   "the view's tables share one block");
    if (!buf) {
        t = v->owned = malloc(need);
    } else {
        if (*cap < need) {
            void *q = realloc(*buf, need);
            if (q) {
                *buf = q;
                *cap = need;
            }
        }
        t = *cap >= need ? *buf : NULL;
    }
    if (!t)
        return mp__error(MP_ENOMEM, "pool: out of memory reading a frame");
    v->entries = t;
    v->payloads = (const char **)(void *)(t + n);
    v->first_attach = (size_t *)(void *)(v->payloads + n);
    return 0;
}

int mp__pack_open_into(const mp_msg *m, mp__pack_view *v, void **buf, size_t *cap)
{
    size_t len, off, nattach = mp_msg_count(m), a = 0;
    const char *pl = mp_msg_payload(m, &len);
    mp__pack_hdr h;

    memset(v, 0, sizeof *v);
    v->msg = m;
    if (len < sizeof h)
        return mp__error(MP_EPROTO, "pool: a %zu-byte frame is too short", len);
    memcpy(&h, pl, sizeof h);
    if (h.count > (len - sizeof h) / sizeof(mp__pack_entry) || h.name_len > MP__TASK_NAME_MAX)
        return mp__error(MP_EPROTO, "pool: frame header out of range");
    v->magic = h.magic;
    v->count = h.count;
    off = sizeof h + (size_t)h.count * sizeof(mp__pack_entry);
    if (len - off < h.name_len)
        return mp__error(MP_EPROTO, "pool: frame too short for its task name");
    memcpy(v->name_buf, pl + off, h.name_len);
    v->name_buf[h.name_len] = '\0';
    v->name = v->name_buf;
    off += h.name_len;
    if (open_tables(v, h.count, buf, cap) != 0) {
        mp__pack_close(v);
        return MP_ENOMEM;
    }
    /* Read in place where aligned (a received payload is malloc'd whole),
     * else copied into the block's room for them. */
    if ((uintptr_t)(pl + sizeof h) % _Alignof(mp__pack_entry) == 0)
        v->entries = (const mp__pack_entry *)(const void *)(pl + sizeof h);
    else
        memcpy((void *)v->entries, pl + sizeof h, (size_t)h.count * sizeof(mp__pack_entry));
    for (uint32_t i = 0; i < h.count; i++) {
        const mp__pack_entry *e = &v->entries[i];
        if (e->len > len - off || e->err_len > len - off - e->len ||
            e->nattach > nattach - a) {
            mp__pack_close(v);
            return mp__error(MP_EPROTO, "pool: frame item %u overruns the frame", i);
        }
        v->payloads[i] = pl + off;
        v->first_attach[i] = a;
        off += e->len + e->err_len;
        a += e->nattach;
    }
    return 0;
}

int mp__pack_open(const mp_msg *m, mp__pack_view *v)
{
    return mp__pack_open_into(m, v, NULL, NULL);
}

void mp__pack_close(mp__pack_view *v)
{
    free(v->owned); /* the payloads and first_attach tables are in its block */
    v->owned = NULL;
    v->entries = NULL;
    v->payloads = NULL;
    v->first_attach = NULL;
}

int mp__pack_item_into(const mp__pack_view *v, uint32_t i, mp_msg *m)
{
    mp__msg_reset(m);
    int rc = mp_msg_set_payload(m, v->payloads[i], v->entries[i].len);
    if (!rc && v->entries[i].nattach)
        rc = mp__msg_copy_attachments(v->msg, v->first_attach[i], v->entries[i].nattach, m);
    return rc;
}

int mp__pack_build_into(const mp_msg *src, const void *payload, size_t len,
                        size_t first_attach, size_t nattach, mp_msg *m)
{
    int rc = mp_msg_set_payload(m, payload, len);
    if (!rc && nattach)
        rc = mp__msg_copy_attachments(src, first_attach, nattach, m);
    return rc;
}

int mp__pack_item(const mp__pack_view *v, uint32_t i, mp_msg **out)
{
    mp_msg *m;
    int rc = mp_msg_create(&m);
    if (rc)
        return rc;
    rc = mp__pack_item_into(v, i, m);
    if (rc) {
        mp_msg_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* ---- starmap arguments -------------------------------------------------------- */

int mp_task_nargs(const mp_msg *in)
{
    mp__pack_view v;
    int rc;
    if (!in)
        return mp__error(MP_EINVAL, "mp_task_nargs: in is NULL");
    rc = mp__pack_open(in, &v);
    if (rc == 0 && v.magic != MP__PACK_STAR)
        rc = MP_EINVAL;
    if (rc) {
        mp__pack_close(&v);
        return mp__error(MP_EINVAL, "mp_task_nargs: the message is not a starmap item");
    }
    rc = (int)v.count;
    mp__pack_close(&v);
    return rc;
}

int mp_task_arg(const mp_msg *in, size_t j, mp_msg **out)
{
    mp__pack_view v;
    int rc;
    if (!in || !out)
        return mp__error(MP_EINVAL, "mp_task_arg: %s is NULL", in ? "out" : "in");
    rc = mp__pack_open(in, &v);
    if (rc != 0 || v.magic != MP__PACK_STAR)
        rc = mp__error(MP_EINVAL, "mp_task_arg: the message is not a starmap item (call it "
                                  "on the in of a task run by mp_pool_starmap)");
    else if (j >= v.count)
        rc = mp__error(MP_EINVAL, "mp_task_arg: argument %zu of %u", j, v.count);
    else
        rc = mp__pack_item(&v, (uint32_t)j, out);
    mp__pack_close(&v);
    return rc;
}
