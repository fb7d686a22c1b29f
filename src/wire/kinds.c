/* The registry of object kinds that can travel as message attachments.
 * Each layer above wire registers its own descriptors (src/ipc/kinds.c
 * makes sure all of them are in before any message is decoded), so wire
 * names no layer above it. A message built in this process carries each
 * attachment's descriptor itself; only the decoder, which starts from the
 * kind id on the wire, looks kinds up here.
 *
 * The table is indexed by kind id and its slots are claimed with a
 * compare-exchange: registering and looking up take no lock, so both are
 * safe from any thread and in a child forked at any moment. */
#include "wire/wire.h"

#include <stdio.h>
#include <string.h>

static const mp__objkind *_Atomic table[MP__OBJKIND_MAX];

/* The first refused registration, kept for every later mp__objkind_check:
 * a registration runs where nobody may look at its result (a once-function),
 * and a refused kind would otherwise only show up as "unknown kind" on some
 * later receive. claimed is taken by the one writer of sentence. */
static atomic_int kept_rc, claimed;
static char kept_sentence[256];

static void keep(int rc)
{
    int no = 0;
    if (!atomic_compare_exchange_strong(&claimed, &no, 1))
        return;
    snprintf(kept_sentence, sizeof kept_sentence, "%s", mp_last_error());
    atomic_store_explicit(&kept_rc, rc, memory_order_release);
}

int mp__objkind_register(const mp__objkind *k)
{
    const mp__objkind *cur = NULL;
    int rc;
    if (!k || !k->name || !k->retain || !k->release || !k->encode || !k->decode)
        rc = mp__error(MP_EINVAL,
                       "mp__objkind_register: descriptor %s is incomplete (it "
                       "needs a name and all four callbacks)",
                       k && k->name ? k->name : "(unnamed)");
    else if (k->kind <= MP_ATTACH_TENSOR || k->kind >= MP__OBJKIND_MAX)
        rc = mp__error(MP_EINVAL,
                       "mp__objkind_register: %s has kind id %d, outside the "
                       "object kinds 2..%d (1 is the tensor)",
                       k->name, k->kind, MP__OBJKIND_MAX - 1);
    else if (atomic_compare_exchange_strong_explicit(&table[k->kind], &cur, k, memory_order_acq_rel,
                                                     memory_order_acquire) ||
             cur == k)
        return 0;
    else
        rc = mp__error(MP_EINVAL,
                       "mp__objkind_register: %s cannot take kind id %d: %s holds "
                       "it already (ids are mp_attach_kind in mproc/msg.h)",
                       k->name, k->kind, cur->name);
    keep(rc);
    return rc;
}

int mp__objkind_register_all(const mp__objkind *const *kinds, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int rc = mp__objkind_register(kinds[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

const mp__objkind *mp__objkind_lookup(int kind)
{
    if (kind <= MP_ATTACH_TENSOR || kind >= MP__OBJKIND_MAX)
        return NULL;
    return atomic_load_explicit(&table[kind], memory_order_acquire);
}

int mp__objkind_check(const char *call)
{
    int rc = atomic_load_explicit(&kept_rc, memory_order_acquire);
    if (!rc)
        return 0;
    return mp__error(rc, "%s: an attachment kind was refused at registration: %s", call,
                     kept_sentence);
}

size_t mp__objkind_list(char *buf, size_t cap)
{
    size_t n = 0;
    if (cap)
        buf[0] = '\0';
    for (int id = MP_ATTACH_TENSOR + 1; id < MP__OBJKIND_MAX; id++) {
        const mp__objkind *k = mp__objkind_lookup(id);
        int w;
        if (!k || n >= cap)
            continue;
        w = snprintf(buf + n, cap - n, "%s%d (%s)", n ? ", " : "", id, k->name);
        n = w < 0 ? n : (size_t)w >= cap - n ? cap - 1 : n + (size_t)w;
    }
    return n;
}
