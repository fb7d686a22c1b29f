/* Reader for the idx format of (Fashion-)MNIST, gzip-compressed (zlib).
 *
 * An idx file is a 4-byte magic (0, 0, type, ndim), ndim big-endian uint32
 * sizes, then the elements row-major. Only type 0x08 (uint8) is accepted,
 * which is what MNIST and Fashion-MNIST use. The reader trusts nothing: a
 * wrong magic, a zero or huge size, or data shorter or longer than the header
 * says is an error with a sentence naming the file and what is wrong.
 */
#ifndef HOGWILD_IDX_H
#define HOGWILD_IDX_H

#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

#define IDX_MAX_NDIM 4
/* Refuse headers that promise more than this (a corrupt size, not data). */
#define IDX_MAX_BYTES ((size_t)1 << 31)

typedef struct idx_file {
    gzFile gz;
    int ndim;
    int64_t dims[IDX_MAX_NDIM];
    size_t nbytes; /* product of dims: the bytes idx_read_data() fills */
    char path[512];
} idx_file;

/* Opens path and validates its header. Returns 0, or -1 with a sentence in
 * err (cap bytes): missing file (with errno text), not gzip data, bad magic,
 * bad ndim, zero or oversized dims. On failure nothing stays open. */
int idx_open(const char *path, idx_file *f, char *err, size_t cap);

/* Reads the f->nbytes data bytes into dst and checks that the file ends
 * there. Returns 0, or -1 with a sentence (truncated data, trailing bytes,
 * gzip CRC error). Does not close f. */
int idx_read_data(idx_file *f, void *dst, char *err, size_t cap);

/* Closes f; safe on a closed or failed file. */
void idx_close(idx_file *f);

#endif
