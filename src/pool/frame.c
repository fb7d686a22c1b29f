/* Packs: several messages carried as one (one wire record per chunk). */
#include "pool/pool_internal.h"
#include "wire/objects.h"

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

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    size_t c = *cap ? *cap : 8;
    void *q;
    if (need <= *cap)
        return 0;
    while (c < need)
        c *= 2;
    q = realloc(*p, c * elem);
    if (!q)
        return mp__error(MP_ENOMEM, "pool: out of memory building a chunk");
    *p = q;
    *cap = c;
    return 0;
}

int mp__packer_init(mp__packer *p, uint32_t magic, const char *name, size_t count_hint)
{
    memset(p, 0, sizeof *p);
    p->magic = magic;
    if (name)
        snprintf(p->name, sizeof p->name, "%s", name);
    size_t cap = 0;
    if (count_hint && grow((void **)&p->entries, &cap, count_hint, sizeof *p->entries))
        return MP_ENOMEM;
    p->cap = (uint32_t)cap;
    /* room for small items (8 bytes each) from the start: fewer reallocs */
    if (count_hint && grow((void **)&p->data, &p->data_cap, count_hint * 8, 1)) {
        mp__packer_drop(p);
        return MP_ENOMEM;
    }
    int rc = mp_msg_create(&p->msg);
    if (rc)
        mp__packer_drop(p); /* the entries, for callers that only free on failure */
    return rc;
}

static int add_bytes(mp__packer *p, const void *b, size_t n)
{
    if (grow((void **)&p->data, &p->data_cap, p->len + n, 1))
        return MP_ENOMEM;
    if (n)
        memcpy(p->data + p->len, b, n);
    p->len += n;
    return 0;
}

static int add_entry(mp__packer *p, mp__pack_entry e)
{
    size_t cap = p->cap;
    if (p->count == UINT32_MAX)
        return mp__error(MP_EOVERFLOW, "pool: too many items in one chunk");
    if (grow((void **)&p->entries, &cap, (size_t)p->count + 1, sizeof e))
        return MP_ENOMEM;
    p->cap = (uint32_t)cap;
    p->entries[p->count++] = e;
    return 0;
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
    if (p->count < p->cap && len + e.err_len <= p->data_cap - p->len) {
        if (len)
            memcpy(p->data + p->len, payload, len);
        if (e.err_len)
            memcpy(p->data + p->len + len, err, e.err_len);
        p->len += len + e.err_len;
        p->entries[p->count++] = e;
        return 0;
    }
    r = add_bytes(p, payload, len);
    if (!r)
        r = add_bytes(p, err, e.err_len);
    return r ? r : add_entry(p, e);
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
    mp__pack_hdr h = {p->magic, p->count, (uint32_t)strlen(p->name), 0};
    size_t total = sizeof h + p->count * sizeof(mp__pack_entry) + h.name_len + p->len;
    char *buf = malloc(total), *w = buf;
    if (!buf) {
        mp__packer_drop(p);
        return mp__error(MP_ENOMEM, "pool: out of memory for a %zu-byte chunk", total);
    }
    memcpy(w, &h, sizeof h);
    w += sizeof h;
    if (p->count)
        memcpy(w, p->entries, p->count * sizeof(mp__pack_entry));
    w += p->count * sizeof(mp__pack_entry);
    memcpy(w, p->name, h.name_len);
    w += h.name_len;
    if (p->len)
        memcpy(w, p->data, p->len);
    mp__msg_adopt_payload(p->msg, buf, total); /* built in place: no second copy */
    *out = p->msg;
    p->msg = NULL;
    mp__packer_drop(p);
    return 0;
}

void mp__packer_drop(mp__packer *p)
{
    mp_msg_destroy(p->msg);
    free(p->entries);
    free(p->data);
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

int mp__pack_build(const mp_msg *src, const void *payload, size_t len, size_t first_attach,
                   size_t nattach, mp_msg **out)
{
    mp_msg *m;
    int rc = mp_msg_create(&m);
    if (!rc)
        rc = mp_msg_set_payload(m, payload, len);
    if (!rc && nattach)
        rc = mp__msg_copy_attachments(src, first_attach, nattach, m);
    if (rc) {
        mp_msg_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
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
    if (rc == 0 && v.magic != MP__PACK_STAR)
        rc = mp__error(MP_EINVAL, "mp_task_arg: the message is not a starmap item");
    else if (rc == 0 && j >= v.count)
        rc = mp__error(MP_EINVAL, "mp_task_arg: argument %zu of %u", j, v.count);
    else if (rc == 0)
        rc = mp__pack_item(&v, (uint32_t)j, out);
    mp__pack_close(&v);
    return rc;
}
