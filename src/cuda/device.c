/* Device inspection that needs no CUDA runtime, built in every configuration. */
#include "mproc/cuda.h"

bool mp_tensor_is_cuda(const mp_tensor *t)
{
    return t && mp_tensor_device(t).device_type == kDLCUDA;
}
