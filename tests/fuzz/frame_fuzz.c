/* libFuzzer target for the frame decoder and the compact record decoder.
 * Input: byte 0 picks how many fds arrive with the frame (low 2 bits) and
 * their kind (bit 2: sealed memfds of 4096 bytes, else unsealed); the rest
 * is the record. Bit 3 makes the rest a compact record (a ring slot's
 * bytes) received on an end whose pin table pins one 4096-byte segment,
 * with one message naming that pin in flight; bit 4 then writes that pin's
 * slot and generation into the record first (they vary from run to run).
 * The decoders must never crash, never leak memory (ASan) and never leak
 * an fd: the lowest free fd number is the same before and after every
 * input, and the pin's in-flight count is given back. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stddef.h>
#include <string.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ipc/kinds.h"
#include "tensor/tensor_internal.h"
#include "wire/frame.h"
#include "wire/wire.h"

static int lowest_free_fd(void)
{
    int fd = dup(0);
    close(fd);
    return fd;
}

static int make_fd(int sealed)
{
    int fd = memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        abort();
    if (ftruncate(fd, 4096) != 0)
        abort();
    if (sealed)
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
    return fd;
}

/* The end the compact records arrive at, and the storage it pins. */
static mp__rx end;
static mp_tensor *pinned;

static void pin_once(void)
{
    int64_t n = 4096;
    mp__segment *seg;
    if (pinned)
        return;
    mp__pins_init(&end.pins);
    if (mp__pins_attach(&end.pins) != 0 || mp_tensor_empty_shared(MP_UINT8, 1, &n, &pinned))
        abort();
    seg = mp__storage_segment(mp__tensor_storage(pinned));
    mp__pins_received(&end.pins, seg); /* the second arrival pins it */
    mp__pins_received(&end.pins, seg);
    if (mp__pins_held() != 1)
        abort();
}

static void touch(mp_msg *m)
{
    for (size_t i = 0; i < mp_msg_count(m); i++) {
        mp_tensor *t = NULL;
        if (mp_msg_get_tensor(m, i, &t) == 0 && mp_tensor_numel(t) > 0) {
            volatile uint8_t b = *(volatile uint8_t *)mp_tensor_data(t);
            (void)b;
        }
        mp_tensor_release(t);
    }
    mp_msg_destroy(m);
}

/* A compact record, with a message naming the pin in flight (taken as a
 * sender takes it), which decoding must give back whatever the record
 * says; giving back again after it is a no-op. */
static void compact(const uint8_t *data, size_t size, bool name_the_pin)
{
    unsigned char rec[512];
    mp__pin_ref ref;
    mp_msg *m = NULL;
    if (!mp__pins_reserve(&end.pins, mp__storage_segment(mp__tensor_storage(pinned)), &ref))
        abort();
    if (size > sizeof rec)
        size = sizeof rec;
    memcpy(rec, data, size);
    if (name_the_pin && size >= sizeof(mp__compact)) {
        uint16_t slot = (uint16_t)ref.slot;
        memcpy(rec + offsetof(mp__compact, pin_gen), &ref.gen, sizeof ref.gen);
        memcpy(rec + offsetof(mp__compact, pin_slot), &slot, sizeof slot);
    }
    if (mp__compact_decode(&end.pins, rec, size, &m) == 0)
        touch(m);
    mp__pins_unreserve(&end.pins, &ref);
    uint64_t st = atomic_load(&end.pins.slot[ref.slot].state);
    if ((uint32_t)(st & MP__PIN_SENT) != atomic_load(&end.pins.done[ref.slot]))
        abort(); /* a count neither given back nor left to give back */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fds[4], nfds, before;
    mp_msg *m = NULL;
    if (size < 1)
        return 0;
    /* As every receive path does, so that object kinds are decoded too. */
    if (mp__objkinds_ensure("frame_fuzz") != 0)
        abort();
    if (data[0] & 8)
        pin_once(); /* its fd and mapping stay for the whole run */
    before = lowest_free_fd();
    if (data[0] & 8) {
        compact(data + 1, size - 1, data[0] & 16);
        if (lowest_free_fd() != before)
            abort();
        return 0;
    }
    nfds = data[0] & 3;
    for (int i = 0; i < nfds; i++)
        fds[i] = make_fd(data[0] & 4);
    if (mp__wire_decode(data + 1, size - 1, fds, nfds, &m) == 0)
        touch(m); /* as a receiver would */
    if (lowest_free_fd() != before)
        abort();   /* an fd leaked */
    return 0;
}
