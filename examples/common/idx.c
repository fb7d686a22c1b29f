#include "idx.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int fail(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err && cap)
        vsnprintf(err, cap, fmt, ap);
    va_end(ap);
    return -1;
}

/* gzread's error text, or "truncated" when it just ran out of bytes. */
static const char *gz_why(gzFile gz)
{
    int code = Z_OK;
    const char *msg = gzerror(gz, &code);
    return code == Z_OK || code == Z_BUF_ERROR ? "the file ends early" : msg;
}

static int read_exact(idx_file *f, void *dst, size_t n)
{
    unsigned char *p = dst;
    while (n > 0) {
        unsigned chunk = n > (1u << 30) ? 1u << 30 : (unsigned)n;
        int got = gzread(f->gz, p, chunk);
        if (got <= 0)
            return -1;
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

int idx_open(const char *path, idx_file *f, char *err, size_t cap)
{
    unsigned char magic[4], be[4];
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    f->gz = gzopen(path, "rb");
    if (!f->gz)
        return fail(err, cap, "%s: cannot open: %s", path,
                    errno ? strerror(errno) : "out of memory");
    /* gzopen reads plain files transparently; idx data must be gzip. */
    if (gzdirect(f->gz)) {
        idx_close(f);
        return fail(err, cap, "%s: not gzip data (expected a .gz idx file)", path);
    }
    if (read_exact(f, magic, 4) != 0) {
        /* gzerror's text lives in the gz state: format before closing */
        int rc = fail(err, cap, "%s: no idx header: %s", path, gz_why(f->gz));
        idx_close(f);
        return rc;
    }
    if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08) {
        idx_close(f);
        return fail(err, cap,
                    "%s: bad idx magic %02x %02x %02x %02x (want 00 00 08 ndim: uint8 data)", path,
                    magic[0], magic[1], magic[2], magic[3]);
    }
    if (magic[3] < 1 || magic[3] > IDX_MAX_NDIM) {
        idx_close(f);
        return fail(err, cap, "%s: idx header says %d dimensions (want 1..%d)", path, magic[3],
                    IDX_MAX_NDIM);
    }
    f->ndim = magic[3];
    f->nbytes = 1;
    for (int i = 0; i < f->ndim; i++) {
        if (read_exact(f, be, 4) != 0) {
            int rc = fail(err, cap, "%s: idx header cut short at size %d: %s", path, i,
                          gz_why(f->gz));
            idx_close(f);
            return rc;
        }
        uint32_t d = (uint32_t)be[0] << 24 | (uint32_t)be[1] << 16 | (uint32_t)be[2] << 8 | be[3];
        if (d == 0 || d > IDX_MAX_BYTES / f->nbytes) {
            idx_close(f);
            return fail(err, cap, "%s: idx size %d is %u (want 1..%zu in all)", path, i, d,
                        (size_t)IDX_MAX_BYTES);
        }
        f->dims[i] = d;
        f->nbytes *= d;
    }
    return 0;
}

int idx_read_data(idx_file *f, void *dst, char *err, size_t cap)
{
    unsigned char extra;
    if (!f->gz)
        return fail(err, cap, "%s: idx_read_data on a closed file", f->path);
    if (read_exact(f, dst, f->nbytes) != 0)
        return fail(err, cap, "%s: the header promises %zu data bytes, but %s", f->path, f->nbytes,
                    gz_why(f->gz));
    if (gzread(f->gz, &extra, 1) != 0)
        return fail(err, cap, "%s: trailing bytes after the %zu data bytes the header promises",
                    f->path, f->nbytes);
    int code = Z_OK;
    const char *msg = gzerror(f->gz, &code);
    if (code != Z_OK)
        return fail(err, cap, "%s: corrupt gzip data: %s", f->path, msg);
    return 0;
}

void idx_close(idx_file *f)
{
    if (f->gz)
        gzclose(f->gz);
    f->gz = NULL;
}
