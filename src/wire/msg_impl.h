/* The inside of an mp_msg, shared by msg.c and the frame encoder/decoder. */
#ifndef MPROC_WIRE_MSG_IMPL_H
#define MPROC_WIRE_MSG_IMPL_H

#include "wire/wire.h"

typedef struct mp__attach {
    int kind;          /* mp_attach_kind */
    char *name;        /* NULL when unnamed */
    union {
        mp_tensor *tensor;   /* MP_ATTACH_TENSOR */
        void *obj;           /* any kind listed in kinds.c */
    } u;
} mp__attach;

struct mp_msg {
    unsigned char *payload;
    size_t len;
    mp__attach *att;
    size_t count;
    size_t cap;
};

/* Appends an attachment that already holds its reference (decoder's path:
 * the reference is handed over, not retained again). name is copied. */
int mp__msg_push(mp_msg *m, int kind, const char *name, size_t name_len, void *ref);

#endif
