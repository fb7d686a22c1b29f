/* The only place the binding calls libmproc's internals (src/), which is
 * why it links the static library: the shared one exports mp_* only.
 * - The wire encoder/decoder turns a message into bytes plus fds, so mproc
 *   handles can ride on Python's own channels (spawn's pickled arguments,
 *   Pool's pipes) through multiprocessing.reduction.DupFd.
 * - A connection's socket, for Connection.fileno() and
 *   multiprocessing.connection.wait().
 * - SimpleQueue's put and get with a timeout, for Ctrl-C (mpy_wait).
 * - A large pickle as a message's payload without a copy.
 * - The storages kept pinned for handoffs without an fd (tests).
 * - A shared tensor written from several buffers (a message's arena). */
#include "mpy.h"

#include "ipc/ipc.h"
#include "ipc/kinds.h"
#include "tensor/tensor_internal.h"
#include "wire/objects.h"
#include "wire/wire.h"

int mpy_wire_encode(const mp_msg *m, void **buf, size_t *len, int *fds, int *nfds, int maxfds)
{
    int tmp[MP__WIRE_MAX_FDS];
    int rc = mp__wire_encode(m, buf, len, tmp, nfds);
    if (rc < 0)
        return rc;
    if (*nfds > maxfds) {
        free(*buf);
        *buf = NULL;
        return MP_EOVERFLOW;
    }
    memcpy(fds, tmp, sizeof(int) * (size_t)*nfds);
    return 0;
}

int mpy_wire_decode(const void *buf, size_t len, int *fds, int nfds, mp_msg **out)
{
    int rc = mp__objkinds_ensure("decode");
    if (rc < 0) {
        for (int i = 0; i < nfds; i++)
            mp__close(fds[i]);
        return rc;
    }
    return mp__wire_decode(buf, len, fds, nfds, out);
}

int mpy_conn_fileno(const mp_conn *c)
{
    return mp__conn_fd(c);
}

void mpy_msg_borrow_payload(mp_msg *m, const void *data, size_t len)
{
    mp__msg_borrow_payload(m, data, len);
}

int mpy_simple_queue_put(mp_simple_queue *q, const mp_msg *m, double timeout)
{
    return mp__queue_put((mp__queue *)q, m, mp__ipc_deadline(timeout), "mp_simple_queue_put");
}

int mpy_simple_queue_get(mp_simple_queue *q, mp_msg **out, double timeout)
{
    return mp__queue_get((mp__queue *)q, out, mp__ipc_deadline(timeout), "mp_simple_queue_get");
}

int mpy_pins_held(void)
{
    return mp__pins_held();
}

_Static_assert(sizeof(mpy_part) == sizeof(mp__segment_part) &&
                   offsetof(mpy_part, off) == offsetof(mp__segment_part, off) &&
                   offsetof(mpy_part, src) == offsetof(mp__segment_part, src) &&
                   offsetof(mpy_part, nbytes) == offsetof(mp__segment_part, nbytes),
               "mpy_part mirrors mp__segment_part");

int mpy_tensor_filled(size_t nbytes, const mpy_part *parts, int nparts, mp_tensor **out)
{
    return mp__tensor_shared_filled(nbytes, (const mp__segment_part *)parts, nparts, out);
}
