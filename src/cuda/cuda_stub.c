/* The public CUDA calls in a build without the CUDA headers (MPROC_CUDA=OFF
 * or no toolkit found at build time): each says how to get CUDA. Decision:
 * the CUDA code is compiled only against the toolkit's own headers, not
 * against types and prototypes copied into mproc, so the table's types are
 * checked against the real ones (cudart.c); a build without them gets this.
 * The CPU-side parts (reference segment, pending list, frame, fork guard)
 * are built anyway; only what needs the CUDA runtime is replaced here. */
#include "cuda/cuda_internal.h"
#include "mproc/cuda.h"
#include "os/os.h"
#include "wire/wire.h"

#define HOW " needs CUDA, and this mproc was built without the CUDA headers: rebuild " \
            "with -DMPROC_CUDA=ON and the CUDA toolkit's headers installed (the CUDA " \
            "runtime itself is loaded at run time, never linked)"

static int no_cuda(const char *call) { return mp__error(MP_ENOTSUP, "%s" HOW, call); }

bool mp_cuda_is_available(void) { return false; }

int mp_cuda_device_count(int *count)
{
    if (count)
        *count = 0;
    return no_cuda("mp_cuda_device_count");
}

int mp_cuda_synchronize(int device) { return no_cuda("mp_cuda_synchronize"); }

int mp_tensor_empty_cuda(int device, mp_dtype dtype, int ndim, const int64_t *shape,
                         mp_tensor **out)
{
    if (out)
        *out = NULL;
    return no_cuda("mp_tensor_empty_cuda");
}

int mp_tensor_to_cuda(const mp_tensor *src, int device, mp_tensor **out)
{
    if (out)
        *out = NULL;
    return no_cuda("mp_tensor_to_cuda");
}

int mp_tensor_to_cpu(const mp_tensor *src, mp_tensor **out)
{
    if (out)
        *out = NULL;
    return no_cuda("mp_tensor_to_cpu");
}

int mp_tensor_copy_cuda_(mp_tensor *dst, const mp_tensor *src)
{
    return no_cuda("mp_tensor_copy_cuda_");
}

int mp_msg_add_cuda_tensor(mp_msg *m, const char *name, mp_tensor *t)
{
    return no_cuda("mp_msg_add_cuda_tensor");
}

int mp_msg_get_cuda_tensor(const mp_msg *m, size_t index, mp_tensor **out)
{
    if (out)
        *out = NULL;
    return no_cuda("mp_msg_get_cuda_tensor");
}

int mp_cuda_ipc_collect(size_t *freed)
{
    if (freed)
        *freed = 0;
    return no_cuda("mp_cuda_ipc_collect");
}

int mp_cuda_ipc_pending(size_t *count)
{
    if (count)
        *count = 0;
    return no_cuda("mp_cuda_ipc_pending");
}

int mp_tensor_cuda_share_count(const mp_tensor *t, int *count)
{
    if (count)
        *count = 0;
    return no_cuda("mp_tensor_cuda_share_count");
}

/* A CUDA tensor sent by a CUDA build reaches this one as an attachment it
 * cannot map: refuse it cleanly, closing its fds. */
static int stub_encode(void *obj, void *buf, size_t cap, size_t *len, int *fds, int maxfds,
                       int *nfds)
{
    return no_cuda("sending a CUDA tensor");
}

static int stub_decode(const void *buf, size_t len, int *fds, int nfds, void **obj)
{
    for (int i = 0; i < nfds; i++)
        mp__close(fds[i]);
    return no_cuda("receiving a CUDA tensor");
}

static void *stub_retain(void *obj) { return mp_tensor_retain(obj); }
static void stub_release(void *obj) { mp_tensor_release(obj); }

const mp__objkind mp__cuda_tensor_kind = {
    .kind = MP_ATTACH_CUDA_TENSOR,
    .name = "CUDA tensor",
    .retain = stub_retain,
    .release = stub_release,
    .encode = stub_encode,
    .decode = stub_decode,
};

int mp__cuda_kinds_register(void)
{
    return mp__objkind_register(&mp__cuda_tensor_kind);
}
