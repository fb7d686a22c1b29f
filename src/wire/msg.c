/* mp_msg: payload bytes plus an ordered list of named attachments. The
 * message holds one reference on everything it attaches. */
#include <malloc.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/tensor_internal.h"
#include "wire/msg_impl.h"

/* What a new message needs zeroed: the first attachment's room is written
 * before it is read. */
#define MSG_CLEARED offsetof(mp_msg, one)

int mp_msg_create(mp_msg **out)
{
    mp_msg *m;
    if (!out)
        return mp__error(MP_EINVAL, "mp_msg_create: out is NULL");
    *out = NULL;
    m = malloc(sizeof *m);
    if (!m)
        return mp__error(MP_ENOMEM, "mp_msg_create: out of memory");
    memset(m, 0, MSG_CLEARED);
    *out = m;
    return 0;
}

struct mp__msg_block {
    atomic_size_t live;         /* messages of the block not destroyed yet */
    size_t cap;                 /* messages it has room for */
    struct mp__msg_block *next; /* in the cache */
    mp_msg m[];
};

/* Freed full blocks, kept for the next map: a map of 100k results takes
 * 6 MiB of messages, and freeing them each time lets glibc trim its heap,
 * so the next map pays a page fault per 4 KiB again. Bounded; taken by
 * trylock only (busy: malloc/free as usual), so a fork while another
 * thread holds it leaves the child a cache it never touches, not a lock. */
#define BLOCK_CACHE_MAX 512 /* 8 MiB */
static struct {
    atomic_flag busy;
    unsigned n;
    struct mp__msg_block *head;
} bcache = {ATOMIC_FLAG_INIT, 0, NULL};

static struct mp__msg_block *block_cached(void)
{
    struct mp__msg_block *b = NULL;
    if (atomic_flag_test_and_set_explicit(&bcache.busy, memory_order_acquire))
        return NULL;
    if ((b = bcache.head) != NULL) {
        bcache.head = b->next;
        bcache.n--;
    }
    atomic_flag_clear_explicit(&bcache.busy, memory_order_release);
    return b;
}

static void block_free(struct mp__msg_block *b)
{
    if (b->cap == MP__MSG_BLOCK &&
        !atomic_flag_test_and_set_explicit(&bcache.busy, memory_order_acquire)) {
        bool kept = bcache.n < BLOCK_CACHE_MAX;
        if (kept) {
            b->next = bcache.head;
            bcache.head = b;
            bcache.n++;
        }
        atomic_flag_clear_explicit(&bcache.busy, memory_order_release);
        if (kept)
            return;
    }
    free(b);
}

int mp__msg_create_block(size_t n, mp_msg **out)
{
    struct mp__msg_block *b = NULL;
    /* a full block when n is close to one: the cache holds only those */
    size_t cap = n > MP__MSG_BLOCK / 4 ? MP__MSG_BLOCK : n;
    if (n == 0 || n > MP__MSG_BLOCK)
        return n ? mp__error(MP_EINVAL, "mp_msg_create: %zu messages in one block, at most "
                             "%d", n, MP__MSG_BLOCK) : 0;
    if (cap == MP__MSG_BLOCK)
        b = block_cached();
    if (!b && !(b = malloc(sizeof *b + cap * sizeof(mp_msg))))
        return mp__error(MP_ENOMEM, "mp_msg_create: out of memory for %zu messages", n);
    b->cap = cap;
    atomic_init(&b->live, n);
    for (size_t i = 0; i < n; i++) {
        memset(&b->m[i], 0, MSG_CLEARED);
        b->m[i].block = b;
        out[i] = &b->m[i];
    }
    return 0;
}

/* Payload buffers of 4 KiB to 256 KiB kept for the next payloads: a pool
 * map's chunks and answers are such payloads, built or received in one
 * thread and freed in another, and glibc trimmed what they freed from its
 * heap, so every map paid a page fault per 4 KiB of them again. Bounded
 * (64 buffers, 8 MiB); taken by trylock only (busy: malloc and free as
 * usual), so a fork while another thread holds it leaves the child a cache
 * it never touches, not a lock. */
#if defined(__SANITIZE_ADDRESS__)
#define BUF_UNCACHED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BUF_UNCACHED 1
#endif
#endif

#ifdef BUF_UNCACHED
/* Every payload freed at once: AddressSanitizer sees a use after it. */
void *mp__msg_buf_get(size_t len) { return malloc(len); }
void mp__msg_buf_put(void *buf) { free(buf); }
#else
#define BUF_CACHE_MAX 64
#define BUF_CACHE_BYTES (8u * 1024u * 1024u)
#define BUF_MIN 4096u
#define BUF_BIG (256u * 1024u)
static struct {
    atomic_flag busy;
    unsigned n;
    size_t bytes;
    void *buf[BUF_CACHE_MAX];
} bufs = {ATOMIC_FLAG_INIT, 0, 0, {NULL}};

void *mp__msg_buf_get(size_t len)
{
    void *b = NULL;
    if (len < BUF_MIN || len > BUF_BIG ||
        atomic_flag_test_and_set_explicit(&bufs.busy, memory_order_acquire))
        return malloc(len);
    /* one at most twice as large: a small payload does not pin a big one */
    for (unsigned i = bufs.n; i-- > 0;) {
        size_t size = malloc_usable_size(bufs.buf[i]);
        if (size >= len && size / 2 <= len) {
            b = bufs.buf[i];
            bufs.buf[i] = bufs.buf[--bufs.n];
            bufs.bytes -= size;
            break;
        }
    }
    atomic_flag_clear_explicit(&bufs.busy, memory_order_release);
    return b ? b : malloc(len);
}

void mp__msg_buf_put(void *buf)
{
    size_t size = buf ? malloc_usable_size(buf) : 0;
    if (size >= BUF_MIN && size <= BUF_BIG &&
        !atomic_flag_test_and_set_explicit(&bufs.busy, memory_order_acquire)) {
        bool kept = bufs.n < BUF_CACHE_MAX && bufs.bytes + size <= BUF_CACHE_BYTES;
        if (kept)
            bufs.buf[bufs.n++] = buf, bufs.bytes += size;
        atomic_flag_clear_explicit(&bufs.busy, memory_order_release);
        if (kept)
            return;
    }
    free(buf);
}
#endif

static void attach_drop(mp_msg *m, mp__attach *a)
{
    if (!a->ops)
        mp_tensor_release(a->u.tensor);
    else if (a->u.obj)
        a->ops->release(a->u.obj);
    if (a->name != m->one_name)
        free(a->name);
}

void mp_msg_destroy(mp_msg *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->count; i++)
        attach_drop(m, &m->att[i]);
    if (m->att != &m->one)
        free(m->att);
    if (m->payload && m->payload != m->small && !m->borrowed)
        mp__msg_buf_put(m->payload);
    if (!m->block)
        free(m);
    else if (atomic_fetch_sub_explicit(&m->block->live, 1, memory_order_acq_rel) == 1)
        block_free(m->block);
}

void mp__msg_reset(mp_msg *m)
{
    for (size_t i = 0; i < m->count; i++)
        attach_drop(m, &m->att[i]);
    m->count = 0;
    mp__msg_adopt_payload(m, NULL, 0);
}

void mp__msg_adopt_payload(mp_msg *m, void *payload, size_t len)
{
    if (m->payload && m->payload != m->small && !m->borrowed)
        mp__msg_buf_put(m->payload);
    m->payload = payload;
    m->len = len;
    m->borrowed = false;
}

void mp__msg_borrow_payload(mp_msg *m, const void *data, size_t len)
{
    mp__msg_adopt_payload(m, (void *)data, len);
    m->borrowed = true;
}

int mp_msg_set_payload(mp_msg *m, const void *data, size_t len)
{
    void *copy = NULL;
    if (!m)
        return mp__error(MP_EINVAL, "mp_msg_set_payload: message is NULL");
    if (len && !data)
        return mp__error(MP_EINVAL, "mp_msg_set_payload: data is NULL but len is %zu", len);
    if (len && len <= MP__MSG_INLINE) {
        /* overlap-safe: data may be this message's own payload */
        mp__copy_short(m->small, data, len);
        mp__msg_adopt_payload(m, m->small, len);
        return 0;
    }
    if (len) {
        copy = mp__msg_buf_get(len);
        if (!copy)
            return mp__error(MP_ENOMEM, "mp_msg_set_payload: cannot allocate %zu bytes", len);
        memcpy(copy, data, len);
    }
    mp__msg_adopt_payload(m, copy, len);
    return 0;
}

const void *mp_msg_payload(const mp_msg *m, size_t *len)
{
    if (len)
        *len = m ? m->len : 0;
    return m ? m->payload : NULL;
}

size_t mp_msg_count(const mp_msg *m) { return m ? m->count : 0; }

/* The kind an attachment's errors name: its object kind's, or a tensor's. */
static const char *kind_name(const mp__attach *a)
{
    return a->ops ? a->ops->name : "tensor";
}

static int index_error(const mp_msg *m, size_t index, const char *fn)
{
    if (!m)
        return mp__error(MP_EINVAL, "%s: the message is NULL", fn);
    return mp__error(MP_EINVAL, "%s: index %zu is out of range: the message has %zu "
                                "attachment%s (mp_msg_count)", fn, index, m->count,
                     m->count == 1 ? "" : "s");
}

int mp_msg_kind(const mp_msg *m, size_t index)
{
    if (!m || index >= m->count)
        return index_error(m, index, "mp_msg_kind");
    return m->att[index].kind;
}

const char *mp_msg_name(const mp_msg *m, size_t index)
{
    if (!m || index >= m->count)
        return NULL;
    return m->att[index].name;
}

int mp_msg_find(const mp_msg *m, const char *name)
{
    if (!m || !name)
        return mp__error(MP_EINVAL, "mp_msg_find: %s is NULL", m ? "name" : "message");
    for (size_t i = 0; i < m->count; i++)
        if (m->att[i].name && strcmp(m->att[i].name, name) == 0)
            return (int)i;
    return mp__error(MP_ENOENT, "mp_msg_find: no attachment called \"%s\"", name);
}

static int check_name(const char *fn, const char *name, size_t *len)
{
    *len = 0;
    if (!name)
        return 0;
    *len = strnlen(name, MP_MSG_NAME_MAX + 1);
    if (*len > MP_MSG_NAME_MAX)
        return mp__error(MP_EINVAL, "%s: name longer than %d bytes", fn, MP_MSG_NAME_MAX);
    return 0;
}

/* Room for more attachments: the first lives in the message (one), the
 * rest in a malloc'd array that starts as a copy of it. */
static int grow(mp_msg *m)
{
    size_t cap = m->cap < 2 ? 4 : m->cap * 2;
    mp__attach *grown = m->att == &m->one ? malloc(cap * sizeof *grown)
                                          : realloc(m->att, cap * sizeof *grown);
    if (!grown)
        return mp__error(MP_ENOMEM, "mp_msg: cannot grow to %zu attachments", cap);
    if (m->att == &m->one)
        grown[0] = m->one;
    m->att = grown;
    m->cap = cap;
    return 0;
}

int mp__msg_push(mp_msg *m, const mp__objkind *k, const char *name, size_t name_len, void *ref)
{
    mp__attach *a;
    char *copy = NULL;
    if (!m->att) {
        m->att = &m->one;
        m->cap = 1;
    } else if (m->count == m->cap && grow(m) < 0) {
        return MP_ENOMEM;
    }
    a = &m->att[m->count];
    if (name) {
        /* only the first attachment's name lives in one_name */
        copy = m->count == 0 && name_len < MP__MSG_NAME_INLINE ? m->one_name
                                                                : malloc(name_len + 1);
        if (!copy)
            return mp__error(MP_ENOMEM, "mp_msg: cannot copy an attachment name");
        memcpy(copy, name, name_len);
        copy[name_len] = '\0';
    }
    a->kind = k ? k->kind : MP_ATTACH_TENSOR;
    a->name_len = name ? (uint32_t)name_len : 0;
    a->ops = k;
    a->name = copy;
    a->u.obj = ref;
    m->count++;
    return 0;
}

int mp_msg_add_tensor(mp_msg *m, const char *name, mp_tensor *t)
{
    size_t len;
    int rc;
    if (!m || !t)
        return mp__error(MP_EINVAL, "mp_msg_add_tensor: %s is NULL", m ? "tensor" : "message");
    if ((rc = check_name("mp_msg_add_tensor", name, &len)) < 0)
        return rc;
    if (mp__storage_device(mp__tensor_storage(t)).device_type != kDLCPU)
        return mp__error(MP_EINVAL, "mp_msg_add_tensor: tensor is not on the CPU; attach CUDA "
                                    "tensors with mp_msg_add_cuda_tensor");
    rc = mp__msg_push(m, NULL, name, len, mp_tensor_retain(t));
    if (rc < 0)
        mp_tensor_release(t);
    return rc;
}

int mp_msg_get_tensor(const mp_msg *m, size_t index, mp_tensor **out)
{
    if (!out)
        return mp__error(MP_EINVAL, "mp_msg_get_tensor: out is NULL");
    *out = NULL;
    if (!m || index >= m->count)
        return index_error(m, index, "mp_msg_get_tensor");
    if (m->att[index].kind != MP_ATTACH_TENSOR)
        return mp__error(MP_EINVAL, "mp_msg_get_tensor: attachment %zu is of kind '%s', not "
                                    "'tensor' (mp_msg_kind tells each attachment's kind)",
                         index, kind_name(&m->att[index]));
    *out = mp_tensor_retain(m->att[index].u.tensor);
    return 0;
}

int mp_msg_find_tensor(const mp_msg *m, const char *name, mp_tensor **out)
{
    int i;
    if (!out)
        return mp__error(MP_EINVAL, "mp_msg_find_tensor: out is NULL");
    *out = NULL;
    if (!m || !name)
        return mp__error(MP_EINVAL, "mp_msg_find_tensor: %s is NULL", m ? "name" : "message");
    for (i = 0; (size_t)i < m->count; i++)
        if (m->att[i].kind == MP_ATTACH_TENSOR && m->att[i].name &&
            strcmp(m->att[i].name, name) == 0)
            return mp_msg_get_tensor(m, (size_t)i, out);
    return mp__error(MP_ENOENT, "mp_msg_find_tensor: no tensor called \"%s\"", name);
}

int mp__msg_from_state_dict(size_t n, const char *const *names, mp_tensor *const *tensors,
                            mp_msg **out, const char *fn)
{
    mp_msg *m = NULL;
    int rc;
    if (!out)
        return mp__error(MP_EINVAL, "%s: out is NULL", fn);
    *out = NULL;
    if (n && (!names || !tensors))
        return mp__error(MP_EINVAL, "%s: %s is NULL", fn, names ? "tensors" : "names");
    for (size_t i = 0; i < n; i++) {
        if (!names[i] || !tensors[i])
            return mp__error(MP_EINVAL, "%s: entry %zu has a NULL %s", fn, i,
                             names[i] ? "tensor" : "name");
        for (size_t j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0)
                return mp__error(MP_EINVAL, "%s: name \"%s\" appears twice (entries %zu and "
                                 "%zu)", fn, names[i], j, i);
    }
    if ((rc = mp_msg_create(&m)) < 0)
        return rc;
    for (size_t i = 0; i < n; i++) {
        if ((rc = mp_msg_add_tensor(m, names[i], tensors[i])) < 0) {
            mp_msg_destroy(m);
            return rc;
        }
    }
    *out = m;
    return 0;
}

int mp_msg_from_state_dict(size_t n, const char *const *names, mp_tensor *const *tensors,
                           mp_msg **out)
{
    return mp__msg_from_state_dict(n, names, tensors, out, "mp_msg_from_state_dict");
}

int mp__msg_add_object(mp_msg *m, const char *name, const mp__objkind *k, void *obj,
                       const char *fn)
{
    size_t len;
    int rc;
    if (!m || !obj)
        return mp__error(MP_EINVAL, "%s: %s is NULL", fn, m ? k->name : "message");
    if ((rc = check_name(fn, name, &len)) < 0)
        return rc;
    rc = mp__msg_push(m, k, name, len, k->retain(obj));
    if (rc < 0)
        k->release(obj);
    return rc;
}

/* The object attachment at index of kind k (NULL: of any object kind). */
static int object_at(const mp_msg *m, size_t index, const mp__objkind *k, const char *fn,
                     const mp__attach **out)
{
    const mp__attach *a = NULL;
    if (!m || index >= m->count)
        return index_error(m, index, fn);
    a = &m->att[index];
    if (!a->ops || (k && a->ops != k))
        return mp__error(MP_EINVAL, "%s: attachment %zu is of kind '%s', not '%s' "
                                    "(mp_msg_kind tells each attachment's kind)", fn, index,
                         kind_name(a), k ? k->name : "an mproc object");
    *out = a;
    return 0;
}

int mp__msg_get_object(const mp_msg *m, size_t index, const mp__objkind *k, void **obj,
                       const char *fn)
{
    const mp__attach *a = NULL;
    int rc;
    if (!obj)
        return mp__error(MP_EINVAL, "%s: out is NULL", fn);
    *obj = NULL;
    if ((rc = object_at(m, index, k, fn, &a)) < 0)
        return rc;
    *obj = k->retain(a->u.obj);
    return 0;
}

int mp__msg_copy_object(mp_msg *dst, const mp_msg *src, size_t index)
{
    const mp__attach *a = NULL;
    int rc;
    if (!dst)
        return mp__error(MP_EINVAL, "mp__msg_copy_object: the destination message is NULL");
    if ((rc = object_at(src, index, NULL, "mp__msg_copy_object", &a)) < 0)
        return rc;
    return mp__msg_add_object(dst, a->name, a->ops, a->u.obj, "mp__msg_copy_object");
}
