/* Typed message wrappers for CUDA tensor attachments (kind in gpu_ipc.c). */
#include "cuda/gpu.h"
#include "wire/wire.h"

int mp_msg_add_cuda_tensor(mp_msg *m, const char *name, mp_tensor *t)
{
    int rc;
    if ((rc = mp__cuda_load("mp_msg_add_cuda_tensor")) < 0)
        return rc;
    if (!m || !t)
        return mp__error(MP_EINVAL, "mp_msg_add_cuda_tensor: NULL message or tensor");
    if (mp_tensor_device(t).device_type == kDLCPU)
        return mp__error(MP_EINVAL, "mp_msg_add_cuda_tensor: the tensor is on cpu, not on a "
                                    "CUDA device (a CPU tensor travels with mp_msg_add_tensor)");
    if (!mp__cuda_tensor_alloc(t, "mp_msg_add_cuda_tensor"))
        return MP_EINVAL;
    return mp__msg_add_object(m, name, &mp__cuda_tensor_kind, t, "mp_msg_add_cuda_tensor");
}

int mp_msg_get_cuda_tensor(const mp_msg *m, size_t index, mp_tensor **out)
{
    int rc;
    if (out)
        *out = NULL;
    if ((rc = mp__cuda_load("mp_msg_get_cuda_tensor")) < 0)
        return rc;
    if (!m || !out)
        return mp__error(MP_EINVAL, "mp_msg_get_cuda_tensor: NULL message or out");
    return mp__msg_get_object(m, index, &mp__cuda_tensor_kind, (void **)out,
                              "mp_msg_get_cuda_tensor");
}
