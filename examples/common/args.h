/* Reading a child's arguments (the message its parent spawned it with), for
 * the hogwild workers and the dataloader's loaders: each helper fails the
 * process with mp_raise, naming who ("worker", "loader"), its rank and the
 * argument. */
#ifndef HOGWILD_ARGS_H
#define HOGWILD_ARGS_H

#include <stdint.h>
#include <string.h>

#include <mproc.h>

/* Copies the payload into cfg: size bytes, whose first field is a uint32_t
 * version that must equal version. */
static inline void args_cfg(mp_msg *args, const char *who, int rank, void *cfg, size_t size,
                            uint32_t version)
{
    size_t len = 0;
    const void *p = mp_msg_payload(args, &len);
    uint32_t got;
    if (len != size)
        mp_raise("%s %d: configuration of %zu bytes, want %zu", who, rank, len, size);
    memcpy(cfg, p, size);
    memcpy(&got, cfg, sizeof got);
    if (got != version)
        mp_raise("%s %d: configuration version %u, want %u", who, rank, got, version);
}

/* The tensor attachment called name (a new reference). */
static inline void args_tensor(mp_msg *args, const char *who, int rank, const char *name,
                               mp_tensor **out)
{
    if (mp_msg_find_tensor(args, name, out) != 0)
        mp_raise("%s %d: argument '%s': %s", who, rank, name, mp_last_error());
}

/* The queue attachment called name (a new reference). */
static inline void args_queue(mp_msg *args, const char *who, int rank, const char *name,
                              mp_queue **out)
{
    int i = mp_msg_find(args, name);
    if (i < 0 || mp_msg_get_queue(args, (size_t)i, out) != 0)
        mp_raise("%s %d: argument '%s': %s", who, rank, name, mp_last_error());
}

#endif
