/* libFuzzer target for the frame decoder. Input: byte 0 picks how many fds
 * arrive with the frame (low 2 bits) and their kind (bit 2: sealed memfds of
 * 4096 bytes, else unsealed); the rest is the record. The decoder must
 * never crash, never leak memory (ASan) and never leak an fd: the lowest
 * free fd number is the same before and after every input. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ipc/kinds.h"
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fds[4], nfds, before;
    mp_msg *m = NULL;
    if (size < 1)
        return 0;
    /* As every receive path does, so that object kinds are decoded too. */
    if (mp__objkinds_ensure("frame_fuzz") != 0)
        abort();
    before = lowest_free_fd();
    nfds = data[0] & 3;
    for (int i = 0; i < nfds; i++)
        fds[i] = make_fd(data[0] & 4);
    if (mp__wire_decode(data + 1, size - 1, fds, nfds, &m) == 0) {
        /* Touch what was decoded, as a receiver would. */
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
    if (lowest_free_fd() != before)
        abort();   /* an fd leaked */
    return 0;
}
