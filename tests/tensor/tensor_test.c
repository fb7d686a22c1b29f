/* Tensors: dtypes, creation, geometry checks, views, copies, grad, DLPack. */
#include "mp_test.h"
#include "tensor/tensor_internal.h"

#include <stdlib.h>
#include <string.h>

static void test_dtypes(void **state)
{
    static const size_t sizes[MP_DTYPE_COUNT] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8};
    for (int i = 0; i < MP_DTYPE_COUNT; i++) {
        mp_dtype back;
        DLDataType dl = mp_dtype_to_dlpack((mp_dtype)i);
        assert_int_equal(mp_dtype_size((mp_dtype)i), sizes[i]);
        assert_int_equal(dl.bits, sizes[i] * 8);
        assert_int_equal(dl.lanes, 1);
        assert_mp_ok(mp_dtype_from_dlpack(dl, &back));
        assert_int_equal(back, i);
    }
    assert_int_equal(mp_dtype_to_dlpack(MP_BOOL).code, 6);
    assert_int_equal(mp_dtype_to_dlpack(MP_BFLOAT16).code, kDLBfloat);
    assert_string_equal(mp_dtype_name(MP_FLOAT32), "float32");
    assert_string_equal(mp_dtype_name(MP_BFLOAT16), "bfloat16");
    assert_string_equal(mp_dtype_name((mp_dtype)99), "?");
    assert_int_equal(mp_dtype_size((mp_dtype)-1), 0);
    mp_dtype d;
    assert_mp_err(mp_dtype_from_dlpack((DLDataType){kDLFloat, 32, 4}, &d), MP_EINVAL);
    assert_mp_err(mp_dtype_from_dlpack((DLDataType){kDLComplex, 64, 1}, &d), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "lanes"));
}

static void test_empty_properties(void **state)
{
    int64_t shape[3] = {2, 3, 4};
    mp_tensor *t, *s;
    assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 3, shape, &t));
    assert_int_equal(mp_tensor_dtype(t), MP_FLOAT32);
    assert_int_equal(mp_tensor_ndim(t), 3);
    assert_int_equal(mp_tensor_numel(t), 24);
    assert_int_equal(mp_tensor_nbytes(t), 96);
    assert_int_equal(mp_tensor_element_size(t), 4);
    assert_int_equal(mp_tensor_storage_nbytes(t), 96);
    assert_int_equal(mp_tensor_strides(t)[0], 12);
    assert_int_equal(mp_tensor_strides(t)[1], 4);
    assert_int_equal(mp_tensor_strides(t)[2], 1);
    assert_int_equal(mp_tensor_size(t, -1), 4);
    assert_int_equal(mp_tensor_size(t, 0), 2);
    assert_int_equal(mp_tensor_size(t, 3), -1);
    assert_int_equal(mp_tensor_byte_offset(t), 0);
    assert_true(mp_tensor_is_contiguous(t));
    assert_false(mp_tensor_is_shared(t));
    assert_null(mp_tensor_sharing_strategy(t));
    assert_int_equal(mp_tensor_device(t).device_type, kDLCPU);
    assert_int_equal((uintptr_t)mp_tensor_data(t) % 64, 0);
    for (int i = 0; i < 24; i++) /* zeroed */
        assert_true(((float *)mp_tensor_data(t))[i] == 0.0f);
    assert_null(mp_tensor_grad(t));
    /* 0-d: one element; a zero-size dim: none */
    assert_mp_ok(mp_tensor_empty(MP_INT64, 0, NULL, &s));
    assert_int_equal(mp_tensor_numel(s), 1);
    assert_int_equal(mp_tensor_nbytes(s), 8);
    assert_true(mp_tensor_is_contiguous(s));
    mp_tensor_release(s);
    shape[1] = 0;
    assert_mp_ok(mp_tensor_empty(MP_UINT8, 3, shape, &s));
    assert_int_equal(mp_tensor_numel(s), 0);
    assert_true(mp_tensor_is_contiguous(s));
    mp_tensor_release(s);
    /* 16 dims */
    int64_t many[MP_MAX_NDIM];
    for (int i = 0; i < MP_MAX_NDIM; i++)
        many[i] = 2;
    assert_mp_ok(mp_tensor_empty(MP_BOOL, MP_MAX_NDIM, many, &s));
    assert_int_equal(mp_tensor_numel(s), 65536);
    mp_tensor_release(s);
    assert_ptr_equal(mp_tensor_retain(t), t);
    mp_tensor_release(t);
    mp_tensor_release(t);
    mp_tensor_release(NULL);
    assert_null(mp_tensor_retain(NULL));
}

static void test_create_errors(void **state)
{
    int64_t shape[2] = {2, -1}, huge[3] = {INT64_MAX / 2, 4, 1};
    int64_t many[MP_MAX_NDIM + 1] = {0};
    mp_tensor *t = (mp_tensor *)0x1;
    assert_mp_err(mp_tensor_empty(MP_FLOAT32, 2, shape, &t), MP_EINVAL);
    assert_null(t);
    assert_non_null(strstr(mp_last_error(), "negative"));
    assert_mp_err(mp_tensor_empty((mp_dtype)42, 1, huge + 2, &t), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "dtype"));
    assert_mp_err(mp_tensor_empty((mp_dtype)-3, 1, huge + 2, &t), MP_EINVAL);
    assert_mp_err(mp_tensor_empty(MP_FLOAT32, -1, shape, &t), MP_EINVAL);
    assert_mp_err(mp_tensor_empty(MP_FLOAT32, MP_MAX_NDIM + 1, many, &t), MP_EINVAL);
    assert_mp_err(mp_tensor_empty(MP_FLOAT32, 2, NULL, &t), MP_EINVAL);
    assert_mp_err(mp_tensor_empty(MP_FLOAT32, 1, shape, NULL), MP_EINVAL);
    /* element count fits, bytes overflow; element count overflows */
    assert_mp_err(mp_tensor_empty(MP_FLOAT64, 1, huge, &t), MP_EOVERFLOW);
    assert_mp_err(mp_tensor_empty(MP_UINT8, 2, huge, &t), MP_EOVERFLOW);
    assert_non_null(strstr(mp_last_error(), "overflow"));
    assert_mp_err(mp_tensor_empty_shared(MP_FLOAT64, 1, huge, &t), MP_EOVERFLOW);
    assert_mp_err(mp_tensor_empty_shared(MP_FLOAT64, 2, shape, &t), MP_EINVAL);
#ifndef __SANITIZE_ADDRESS__ /* ASan aborts on impossible sizes instead */
    /* too big to allocate at all */
    int64_t big = INT64_MAX / 8;
    assert_mp_err(mp_tensor_empty(MP_INT64, 1, &big, &t), MP_ENOMEM);
#endif
}

static int released;
static void on_release(void *data, void *ctx)
{
    assert_ptr_equal(ctx, &released);
    released++;
    free(data);
}

static void test_from_blob(void **state)
{
    float *buf = malloc(12 * sizeof(float));
    int64_t shape[2] = {3, 4}, strides[2] = {1, 3}, bad[2] = {5, 1};
    mp_tensor *t, *v;
    for (int i = 0; i < 12; i++)
        buf[i] = (float)i;
    released = 0;
    /* failures: release not called, nothing retained */
    assert_mp_err(
        mp_tensor_from_blob(buf, 48, MP_FLOAT32, 2, shape, bad, on_release, &released, &t),
        MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "storage"));
    assert_mp_err(
        mp_tensor_from_blob(buf, 44, MP_FLOAT32, 2, shape, NULL, on_release, &released, &t),
        MP_EINVAL);
    assert_mp_err(mp_tensor_from_blob(NULL, 48, MP_FLOAT32, 2, shape, NULL, NULL, NULL, &t),
                  MP_EINVAL);
    assert_int_equal(released, 0);
    /* column-major */
    assert_mp_ok(
        mp_tensor_from_blob(buf, 48, MP_FLOAT32, 2, shape, strides, on_release, &released, &t));
    assert_ptr_equal(mp_tensor_data(t), buf);
    assert_false(mp_tensor_is_contiguous(t));
    assert_mp_ok(mp_tensor_transpose(t, 0, 1, &v));
    assert_true(mp_tensor_is_contiguous(v));
    mp_tensor_release(t);
    assert_int_equal(released, 0); /* the view keeps the storage alive */
    mp_tensor_release(v);
    assert_int_equal(released, 1);
}

static void fill_iota(mp_tensor *t)
{
    int32_t *p = mp_tensor_data(t);
    for (int64_t i = 0; i < mp_tensor_numel(t); i++)
        p[i] = (int32_t)i;
}

static int32_t at2(const mp_tensor *t, int64_t i, int64_t j)
{
    const int64_t *st = mp_tensor_strides(t);
    return ((int32_t *)mp_tensor_data(t))[i * st[0] + j * st[1]];
}

static void test_views(void **state)
{
    int64_t shape[2] = {4, 6};
    mp_tensor *t, *v, *w;
    assert_mp_ok(mp_tensor_empty(MP_INT32, 2, shape, &t));
    fill_iota(t);

    assert_mp_ok(mp_tensor_narrow(t, 1, 2, 3, &v));
    assert_int_equal(mp_tensor_size(v, 1), 3);
    assert_int_equal(at2(v, 1, 0), 8);
    assert_true(mp_tensor_same_storage(t, v));
    assert_false(mp_tensor_is_contiguous(v));
    assert_int_equal(mp_tensor_byte_offset(v), 8);
    mp_tensor_release(v);
    assert_mp_err(mp_tensor_narrow(t, 1, 4, 3, &v), MP_EINVAL);
    assert_mp_err(mp_tensor_narrow(t, 1, -1, 1, &v), MP_EINVAL);
    assert_mp_err(mp_tensor_narrow(t, 2, 0, 1, &v), MP_EINVAL);
    assert_mp_ok(mp_tensor_narrow(t, -1, 6, 0, &v)); /* empty at the end */
    assert_int_equal(mp_tensor_numel(v), 0);
    mp_tensor_release(v);

    assert_mp_ok(mp_tensor_slice(t, 1, 1, 100, 2, &v)); /* 1,3,5 */
    assert_int_equal(mp_tensor_size(v, 1), 3);
    assert_int_equal(at2(v, 2, 2), 17);
    mp_tensor_release(v);
    assert_mp_ok(mp_tensor_slice(t, 0, -2, 4, 1, &v));
    assert_int_equal(mp_tensor_size(v, 0), 2);
    assert_int_equal(at2(v, 0, 0), 12);
    mp_tensor_release(v);
    assert_mp_ok(mp_tensor_slice(t, 0, 3, 1, 1, &v));
    assert_int_equal(mp_tensor_numel(v), 0);
    mp_tensor_release(v);
    assert_mp_err(mp_tensor_slice(t, 0, 0, 4, 0, &v), MP_EINVAL);

    assert_mp_ok(mp_tensor_select(t, 0, -1, &v));
    assert_int_equal(mp_tensor_ndim(v), 1);
    assert_int_equal(((int32_t *)mp_tensor_data(v))[5], 23);
    assert_mp_ok(mp_tensor_select(v, 0, 2, &w)); /* 0-d */
    assert_int_equal(mp_tensor_ndim(w), 0);
    assert_int_equal(*(int32_t *)mp_tensor_data(w), 20);
    mp_tensor_release(w);
    mp_tensor_release(v);
    assert_mp_err(mp_tensor_select(t, 0, 4, &v), MP_EINVAL);
    assert_mp_err(mp_tensor_select(t, 0, -5, &v), MP_EINVAL);

    assert_mp_ok(mp_tensor_transpose(t, 0, -1, &v));
    assert_int_equal(mp_tensor_size(v, 0), 6);
    assert_int_equal(at2(v, 5, 3), 23);
    int64_t flat = -1;
    assert_mp_err(mp_tensor_reshape(v, 1, &flat, &w), MP_EINVAL); /* not contiguous */
    assert_non_null(strstr(mp_last_error(), "contiguous"));
    assert_mp_ok(mp_tensor_clone(v, &w));
    assert_true(mp_tensor_is_contiguous(w));
    assert_false(mp_tensor_same_storage(v, w));
    assert_int_equal(((int32_t *)mp_tensor_data(w))[1], 6);
    mp_tensor_release(w);
    mp_tensor_release(v);

    int perm[2] = {1, 0}, bad[2] = {0, 0};
    assert_mp_ok(mp_tensor_permute(t, perm, &v));
    assert_int_equal(at2(v, 1, 1), 7);
    mp_tensor_release(v);
    assert_mp_err(mp_tensor_permute(t, bad, &v), MP_EINVAL);

    int64_t r3[3] = {2, -1, 3}, r_bad[2] = {5, 5}, r_two[2] = {-1, -1};
    assert_mp_ok(mp_tensor_reshape(t, 3, r3, &v));
    assert_int_equal(mp_tensor_size(v, 1), 4);
    assert_true(mp_tensor_same_storage(t, v));
    mp_tensor_release(v);
    assert_mp_ok(mp_tensor_reshape(t, 1, &flat, &v));
    assert_int_equal(mp_tensor_size(v, 0), 24);
    mp_tensor_release(v);
    assert_mp_err(mp_tensor_reshape(t, 2, r_bad, &v), MP_EINVAL);
    assert_mp_err(mp_tensor_reshape(t, 2, r_two, &v), MP_EINVAL);
    mp_tensor_release(t);
}

static void test_as_strided(void **state)
{
    int64_t n = 10, shape[2] = {3, 4}, st_zero[2] = {0, 1}, st_neg[2] = {-3, 1};
    int64_t st_out[2] = {4, 1}, st_big[2] = {INT64_MAX, 1};
    mp_tensor *t, *v;
    assert_mp_ok(mp_tensor_empty(MP_INT32, 1, &n, &t));
    fill_iota(t);
    /* zero stride: broadcast row */
    assert_mp_ok(mp_tensor_as_strided(t, 2, shape, st_zero, 4, &v));
    assert_int_equal(at2(v, 2, 3), 4);
    mp_tensor_release(v);
    /* negative stride: rows backwards from element 6 */
    assert_mp_ok(mp_tensor_as_strided(t, 2, shape, st_neg, 24, &v));
    assert_int_equal(at2(v, 0, 0), 6);
    assert_int_equal(at2(v, 2, 3), 3);
    assert_false(mp_tensor_is_contiguous(v));
    mp_tensor_release(v);
    /* before the start, past the end, overflow */
    assert_mp_err(mp_tensor_as_strided(t, 2, shape, st_neg, 20, &v), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "before the start"));
    assert_mp_err(mp_tensor_as_strided(t, 2, shape, st_out, 0, &v), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "byte 48 of a 40-byte"));
    assert_mp_err(mp_tensor_as_strided(t, 2, shape, st_big, 0, &v), MP_EOVERFLOW);
    assert_non_null(strstr(mp_last_error(), "mp_tensor_as_strided: dim 0's stride"));
    assert_mp_err(mp_tensor_as_strided(t, 2, shape, NULL, 0, &v), MP_EINVAL);
    assert_string_equal(mp_last_error(), "mp_tensor_as_strided: strides is NULL for ndim 2");
    assert_null(v);
    assert_mp_err(mp_tensor_as_strided(t, 1, &n, st_zero + 1, 4, &v), MP_EINVAL);
    assert_mp_err(mp_tensor_as_strided(t, 1, &n, st_zero + 1, UINT64_MAX, &v), MP_EOVERFLOW);
    /* an empty view may sit at the very end */
    int64_t zero = 0;
    assert_mp_ok(mp_tensor_as_strided(t, 1, &zero, st_zero + 1, 40, &v));
    mp_tensor_release(v);
    assert_mp_err(mp_tensor_as_strided(t, 1, &zero, st_zero + 1, 41, &v), MP_EINVAL);
    /* internal check used by the wire decoder */
    assert_mp_ok(mp__tensor_check_geometry("decoding", MP_INT32, 2, shape, st_out, 0, 48));
    assert_mp_err(mp__tensor_check_geometry("decoding", MP_INT32, 2, shape, st_out, 4, 48),
                  MP_EINVAL);
    assert_string_equal(mp_last_error(), "decoding: strides reach byte 52 of a 48-byte storage");
    mp_tensor_release(t);
}

static void test_copy(void **state)
{
    int64_t shape[2] = {3, 5};
    mp_tensor *a, *b, *at, *bt, *c;
    assert_mp_ok(mp_tensor_empty(MP_INT32, 2, shape, &a));
    fill_iota(a);
    assert_mp_ok(mp_tensor_empty(MP_INT32, 2, shape, &b));
    assert_mp_ok(mp_tensor_copy_(b, a));
    assert_memory_equal(mp_tensor_data(a), mp_tensor_data(b), 60);
    /* strided to strided: b^T = a^T */
    assert_mp_ok(mp_tensor_transpose(a, 0, 1, &at));
    assert_mp_ok(mp_tensor_transpose(b, 0, 1, &bt));
    memset(mp_tensor_data(b), 0, 60);
    assert_mp_ok(mp_tensor_copy_(bt, at));
    assert_memory_equal(mp_tensor_data(a), mp_tensor_data(b), 60);
    /* overlapping views of one storage: goes through a copy */
    assert_mp_ok(mp_tensor_slice(a, 1, 0, 5, 1, &c));
    assert_mp_err(mp_tensor_copy_(at, a), MP_EINVAL); /* shapes differ */
    assert_string_equal(mp_last_error(), "mp_tensor_copy_: dst has shape [5, 3], src [3, 5]; "
                                         "copy between tensors of one shape");
    assert_mp_err(mp_tensor_copy_(a, NULL), MP_EINVAL);
    mp_tensor_release(c);
    int64_t s1 = 15;
    mp_tensor *f;
    assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 1, &s1, &f));
    assert_mp_ok(mp_tensor_reshape(f, 2, shape, &c));
    assert_mp_err(mp_tensor_copy_(c, a), MP_EINVAL); /* dtypes differ */
    assert_non_null(strstr(mp_last_error(), "dst is float32, src int32"));
    mp_tensor_release(c);
    mp_tensor_release(f);
    /* reverse a row in place through a negative-stride view */
    int64_t n = 5, neg = -1;
    mp_tensor *row, *rev;
    assert_mp_ok(mp_tensor_select(a, 0, 0, &row));
    assert_mp_ok(mp_tensor_as_strided(a, 1, &n, &neg, 16, &rev));
    assert_mp_ok(mp_tensor_copy_(row, rev));
    assert_int_equal(((int32_t *)mp_tensor_data(a))[0], 4);
    assert_int_equal(((int32_t *)mp_tensor_data(a))[4], 0);
    mp_tensor_release(row);
    mp_tensor_release(rev);
    mp_tensor_release(at);
    mp_tensor_release(bt);
    mp_tensor_release(a);
    mp_tensor_release(b);
}

static void test_grad(void **state)
{
    int64_t shape[1] = {4}, other[1] = {5};
    mp_tensor *t, *g, *g2, *bad;
    assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 1, shape, &t));
    assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 1, shape, &g));
    assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 1, other, &bad));
    assert_mp_err(mp_tensor_set_grad(t, t), MP_EINVAL);
    assert_mp_err(mp_tensor_set_grad(t, bad), MP_EINVAL);
    assert_mp_err(mp_tensor_set_grad(NULL, g), MP_EINVAL);
    assert_mp_ok(mp_tensor_set_grad(t, g));
    assert_ptr_equal(mp_tensor_grad(t), g);
    assert_mp_err(mp_tensor_set_grad(g, t), MP_EINVAL); /* a cycle */
    mp_tensor_release(g);                               /* t holds it */
    ((float *)mp_tensor_data(mp_tensor_grad(t)))[0] = 2.5f;
    assert_mp_ok(mp_tensor_empty(MP_FLOAT32, 1, shape, &g2));
    assert_mp_ok(mp_tensor_set_grad(t, g2));
    mp_tensor_release(g2);
    assert_mp_ok(mp_tensor_set_grad(t, NULL));
    assert_null(mp_tensor_grad(t));
    mp_tensor_release(bad);
    mp_tensor_release(t);
}

/* ---- DLPack ---------------------------------------------------------------- */

static void test_dlpack_roundtrip(void **state)
{
    int64_t shape[2] = {3, 4};
    mp_tensor *t, *v, *back;
    DLManagedTensor *m;
    assert_mp_ok(mp_tensor_empty(MP_INT32, 2, shape, &t));
    fill_iota(t);
    assert_mp_ok(mp_tensor_slice(t, 1, 1, 4, 2, &v));
    assert_mp_ok(mp_tensor_to_dlpack(v, &m));
    assert_int_equal(m->dl_tensor.ndim, 2);
    assert_int_equal(m->dl_tensor.shape[1], 2);
    assert_int_equal(m->dl_tensor.strides[1], 2);
    assert_int_equal(m->dl_tensor.byte_offset, 4);
    assert_int_equal(m->dl_tensor.dtype.code, kDLInt);
    assert_int_equal(m->dl_tensor.device.device_type, kDLCPU);
    mp_tensor_release(v);
    /* while exported, memory cannot move */
    assert_mp_err(mp_tensor_share_memory_(t), MP_ESTATE);
    assert_false(mp_tensor_is_shared(t));
    assert_mp_ok(mp_tensor_from_dlpack(m, &back));
    assert_int_equal(mp_tensor_size(back, 1), 2);
    assert_int_equal(at2(back, 2, 1), 11);
    assert_ptr_equal(mp_tensor_data(back), (int32_t *)mp_tensor_data(t) + 1);
    mp_tensor_release(back); /* calls m's deleter, which drops its reference */
    assert_mp_ok(mp_tensor_share_memory_(t));
    assert_true(mp_tensor_is_shared(t));
    mp_tensor_release(t);
}

typedef struct foreign {
    DLManagedTensor m;
    int64_t shape[1], strides[1];
    double data[8];
    int deleted;
} foreign;

static void foreign_deleter(DLManagedTensor *m)
{
    ((foreign *)m->manager_ctx)->deleted++;
}

static void test_dlpack_import_shares(void **state)
{
    foreign f = {0};
    mp_tensor *t;
    for (int i = 0; i < 8; i++)
        f.data[i] = i;
    f.shape[0] = 4;
    f.strides[0] = -2; /* elements 6, 4, 2, 0 */
    f.m.dl_tensor.data = f.data;
    f.m.dl_tensor.byte_offset = 6 * sizeof(double);
    f.m.dl_tensor.device.device_type = kDLCPU;
    f.m.dl_tensor.ndim = 1;
    f.m.dl_tensor.dtype = (DLDataType){kDLFloat, 64, 1};
    f.m.dl_tensor.shape = f.shape;
    f.m.dl_tensor.strides = f.strides;
    f.m.manager_ctx = &f;
    f.m.deleter = foreign_deleter;
    assert_mp_ok(mp_tensor_from_dlpack(&f.m, &t));
    assert_ptr_equal(mp_tensor_data(t), &f.data[6]);
    ((double *)mp_tensor_data(t))[-2] = 42.0; /* element 1 */
    assert_true(f.data[4] == 42.0);           /* shared, not copied */
    assert_int_equal(f.deleted, 0);
    mp_tensor_release(t);
    assert_int_equal(f.deleted, 1);
    /* bad imports leave m with the caller */
    f.m.dl_tensor.dtype.lanes = 2;
    assert_mp_err(mp_tensor_from_dlpack(&f.m, &t), MP_EINVAL);
    f.m.dl_tensor.dtype.lanes = 1;
    f.m.dl_tensor.ndim = 17;
    assert_mp_err(mp_tensor_from_dlpack(&f.m, &t), MP_EINVAL);
    assert_mp_err(mp_tensor_from_dlpack(NULL, &t), MP_EINVAL);
    f.m.dl_tensor.ndim = 1;
    f.strides[0] = INT64_MAX / 2;
    assert_mp_err(mp_tensor_from_dlpack(&f.m, &t), MP_EOVERFLOW);
    f.strides[0] = -2;
    /* devices mproc cannot read, copy or send */
    f.m.dl_tensor.device = (DLDevice){kDLOpenCL, 1};
    assert_mp_err(mp_tensor_from_dlpack(&f.m, &t), MP_ENOTSUP);
    assert_non_null(strstr(mp_last_error(), "the tensor is on opencl:1"));
    f.m.dl_tensor.device = (DLDevice){(DLDeviceType)99, 0};
    assert_mp_err(mp_tensor_from_dlpack(&f.m, &t), MP_ENOTSUP);
    assert_non_null(strstr(mp_last_error(), "on DLPack device type 99;"));
    f.m.dl_tensor.device = (DLDevice){kDLCUDA, -1};
    assert_mp_err(mp_tensor_from_dlpack(&f.m, &t), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "negative device id -1"));
    assert_null(t);
    f.m.dl_tensor.device = (DLDevice){kDLCPU, 0};
    assert_int_equal(f.deleted, 1);
    /* NULL strides: compact row-major */
    f.m.dl_tensor.ndim = 1;
    f.m.dl_tensor.strides = NULL;
    f.m.dl_tensor.byte_offset = 0;
    assert_mp_ok(mp_tensor_from_dlpack(&f.m, &t));
    assert_int_equal(mp_tensor_strides(t)[0], 1);
    assert_int_equal(mp_tensor_storage_nbytes(t), 32);
    /* share_memory_ copies it out and hands the memory back at once */
    assert_mp_ok(mp_tensor_share_memory_(t));
    assert_int_equal(f.deleted, 2);
    assert_true(((double *)mp_tensor_data(t))[3] == 3.0);
    mp_tensor_release(t);
    assert_int_equal(f.deleted, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_dtypes, mp_test_setup, mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_empty_properties, mp_test_setup, mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_create_errors, mp_test_setup, mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_from_blob, mp_test_setup, mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_views, mp_test_setup, mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_as_strided, mp_test_setup, mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_copy, mp_test_setup, mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_grad, mp_test_setup, mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_dlpack_roundtrip, mp_test_setup, mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_dlpack_import_shares, mp_test_setup, mp_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
