/* mproc — messages: payload bytes plus an ordered list of attachments.
 *
 * Attachments are tensors (with their grad) and handles of mproc objects
 * (queues, connections, locks, events, ...), each optionally named. A
 * state_dict is a message of named tensors. The message retains what it
 * attaches; getters hand the caller a new reference.
 *
 * When a message is sent, each tensor whose storage is private is moved into
 * shared memory (one copy; the sender's tensor is shared from then on) and
 * only a handle crosses: the fd itself (file_descriptor) or the segment name
 * (file_system). Attachments over one storage arrive as views of one storage.
 *
 * A message is not thread-safe; use one per thread.
 */
#ifndef MPROC_MSG_H
#define MPROC_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "mproc/error.h"
#include "mproc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_msg mp_msg;

/* Attachment kinds. Values are stable (they are on the wire). */
typedef enum mp_attach_kind {
    MP_ATTACH_TENSOR = 1,
    MP_ATTACH_QUEUE = 2,
    MP_ATTACH_CONN = 3,
    MP_ATTACH_LOCK = 4,
    MP_ATTACH_RLOCK = 5,
    MP_ATTACH_SEMAPHORE = 6,
    MP_ATTACH_EVENT = 7,
    MP_ATTACH_CONDITION = 8,
    MP_ATTACH_BARRIER = 9,
    MP_ATTACH_CUDA_TENSOR = 10,
    MP_ATTACH_SIMPLE_QUEUE = 11,
    MP_ATTACH_JOINABLE_QUEUE = 12
} mp_attach_kind;

/* Longest attachment name, bytes without the NUL. */
#define MP_MSG_NAME_MAX 255

/* A new empty message (no payload, no attachments) in *out. MP_ENOMEM. */
MP_API int mp_msg_create(mp_msg **out);
/* Drops the payload and every attachment's reference. NULL is a no-op. */
MP_API void mp_msg_destroy(mp_msg *m);

/* Replaces the payload with a copy of len bytes (len 0 clears it). */
MP_API int mp_msg_set_payload(mp_msg *m, const void *data, size_t len);
/* Borrowed view of the payload, valid until the message changes. */
MP_API const void *mp_msg_payload(const mp_msg *m, size_t *len);

/* Number of attachments, and the kind and name (NULL if unnamed) of one. */
MP_API size_t mp_msg_count(const mp_msg *m);
MP_API int mp_msg_kind(const mp_msg *m, size_t index);   /* mp_attach_kind, or MP_EINVAL */
MP_API const char *mp_msg_name(const mp_msg *m, size_t index);
/* Index of the first attachment called name: >= 0, or MP_ENOENT. */
MP_API int mp_msg_find(const mp_msg *m, const char *name);

/* Appends a tensor (retained). name may be NULL. */
MP_API int mp_msg_add_tensor(mp_msg *m, const char *name, mp_tensor *t);
/* New reference to attachment index; MP_EINVAL if it is not a tensor. */
MP_API int mp_msg_get_tensor(const mp_msg *m, size_t index, mp_tensor **out);
/* New reference to the tensor called name; MP_ENOENT if none. */
MP_API int mp_msg_find_tensor(const mp_msg *m, const char *name, mp_tensor **out);

/* A state_dict: a message of n named tensors. */
MP_API int mp_msg_from_state_dict(size_t n, const char *const *names, mp_tensor *const *tensors,
                                  mp_msg **out);

#ifdef __cplusplus
}
#endif
#endif
