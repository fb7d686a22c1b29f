/* mp_tensor_adopt_fd: a tensor over a foreign shared-memory file, no copy.
 * The checks and the mapping are the shm layer's (src/shm/foreign.c); here the
 * segment becomes the one storage of its file and a byte view over it. */
#include "tensor/tensor_priv.h"

int mp_tensor_adopt_fd(int fd, uint64_t offset, size_t nbytes, mp_tensor **out)
{
    mp__segment *seg;
    mp__storage *s;
    int64_t shape;
    int rc;
    if (!out)
        return mp__error(MP_EINVAL, "mp_tensor_adopt_fd: NULL out");
    *out = NULL;
    if (nbytes > (size_t)INT64_MAX || offset > (uint64_t)INT64_MAX - nbytes)
        return mp__error(MP_EOVERFLOW, "mp_tensor_adopt_fd: offset %llu + nbytes %zu overflows",
                         (unsigned long long)offset, nbytes);
    rc = mp__segment_adopt_fd(fd, offset + nbytes, &seg);
    if (rc < 0)
        return rc;
    rc = mp__storage_from_segment(seg, &s);
    mp__segment_release(seg); /* the storage holds it now (or failed) */
    if (rc < 0)
        return rc;
    shape = (int64_t)nbytes;
    rc = mp__tensor_make("mp_tensor_adopt_fd", s, MP_UINT8, 1, &shape, (const int64_t[]){1},
                         offset, out);
    mp__storage_release(s);
    return rc;
}
