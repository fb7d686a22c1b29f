/* Element types and their DLPack (code, bits, lanes). */
#include "tensor/tensor_internal.h"

/* DLPack 0.6 has no kDLBool; 0.8 added it as code 6 (bits 8). */
#define MP__DL_BOOL 6

static const struct {
    const char *name;
    uint8_t code, bits;
} types[MP_DTYPE_COUNT] = {
    [MP_BOOL] = {"bool", MP__DL_BOOL, 8},        [MP_INT8] = {"int8", kDLInt, 8},
    [MP_INT16] = {"int16", kDLInt, 16},          [MP_INT32] = {"int32", kDLInt, 32},
    [MP_INT64] = {"int64", kDLInt, 64},          [MP_UINT8] = {"uint8", kDLUInt, 8},
    [MP_UINT16] = {"uint16", kDLUInt, 16},       [MP_UINT32] = {"uint32", kDLUInt, 32},
    [MP_UINT64] = {"uint64", kDLUInt, 64},       [MP_FLOAT16] = {"float16", kDLFloat, 16},
    [MP_BFLOAT16] = {"bfloat16", kDLBfloat, 16}, [MP_FLOAT32] = {"float32", kDLFloat, 32},
    [MP_FLOAT64] = {"float64", kDLFloat, 64},
};

static bool known(mp_dtype d)
{
    return (unsigned)d < MP_DTYPE_COUNT;
}

size_t mp_dtype_size(mp_dtype dtype)
{
    return known(dtype) ? types[dtype].bits / 8u : 0;
}

const char *mp_dtype_name(mp_dtype dtype)
{
    return known(dtype) ? types[dtype].name : "?";
}

DLDataType mp_dtype_to_dlpack(mp_dtype dtype)
{
    DLDataType dl = {0, 0, 0};
    if (known(dtype)) {
        dl.code = types[dtype].code;
        dl.bits = types[dtype].bits;
        dl.lanes = 1;
    }
    return dl;
}

int mp_dtype_from_dlpack(DLDataType dl, mp_dtype *out)
{
    if (!out)
        return mp__error(MP_EINVAL, "mp_dtype_from_dlpack: out is NULL");
    for (int i = 0; i < MP_DTYPE_COUNT; i++) {
        if (dl.lanes == 1 && dl.code == types[i].code && dl.bits == types[i].bits) {
            *out = (mp_dtype)i;
            return 0;
        }
    }
    return mp__error(MP_EINVAL,
                     "mp_dtype_from_dlpack: no mproc dtype for DLPack code %u, "
                     "%u bits, %u lanes",
                     dl.code, dl.bits, dl.lanes);
}
