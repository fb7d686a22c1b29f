/* The inside of an mp_msg, shared by msg.c and the frame encoder/decoder. */
#ifndef MPROC_WIRE_MSG_IMPL_H
#define MPROC_WIRE_MSG_IMPL_H

#include "wire/wire.h"

typedef struct mp__attach {
    int kind;          /* mp_attach_kind */
    uint32_t name_len; /* strlen(name); 0 when unnamed */
    const mp__objkind *ops; /* an object's descriptor; NULL for a tensor */
    char *name;        /* NULL when unnamed */
    union {
        mp_tensor *tensor;   /* MP_ATTACH_TENSOR */
        void *obj;           /* any other kind: see ops */
    } u;
} mp__attach;

/* Payloads up to this size live in the message itself: a pool map of small
 * items builds and drops a message per item, and the payload's own
 * malloc/free was a third of that. */
#define MP__MSG_INLINE 16

/* The first attachment and a short name of it live in the message too:
 * most messages that carry anything carry one tensor, and its two small
 * blocks were a third of receiving it. */
#define MP__MSG_NAME_INLINE 16

struct mp_msg {
    unsigned char *payload; /* small, malloc'd, or the caller's (borrowed) */
    size_t len;
    bool borrowed; /* payload is the caller's: never freed here */
    mp__attach *att;        /* &one, or malloc'd when more than one */
    size_t count;
    size_t cap;
    struct mp__msg_block *block; /* NULL: malloc'd alone; else made in this block */
    _Alignas(16) unsigned char small[MP__MSG_INLINE];
    mp__attach one;
    char one_name[MP__MSG_NAME_INLINE];
};

/* Appends an attachment that already holds its reference (decoder's path:
 * the reference is handed over, not retained again): an object of kind k,
 * or a tensor when k is NULL. name is copied. */
int mp__msg_push(mp_msg *m, const mp__objkind *k, const char *name, size_t name_len, void *ref);

#endif
