/* The bytes of a CUDA tensor attachment (no GPU needed): round trip, and a
 * decoder that refuses every malformed field. */
#include "mp_test.h"
#include "cuda/frame.h"
#include "cuda/refseg.h"

#include <string.h>

static mp__cuda_frame sample(void)
{
    mp__cuda_frame f;
    memset(&f, 0, sizeof f);
    f.device = 1;
    f.dtype = MP_FLOAT32;
    f.ndim = 2;
    f.producer_pid = 4242;
    f.slot = 7;
    f.gen = 3;
    f.ref = 12;
    f.ref_word = mp__refword(4343, 7, 3);
    f.alloc_nbytes = 4096;
    f.byte_offset = 64; /* a view at element 16 */
    f.has_event = true;
    for (int i = 0; i < MP__CUDA_HANDLE_BYTES; i++) {
        f.mem_handle[i] = (uint8_t)i;
        f.event_handle[i] = (uint8_t)(255 - i);
    }
    f.shape[0] = 4;
    f.shape[1] = 8;
    f.strides[0] = 16; /* every other row of a 8x16 matrix, 8 columns */
    f.strides[1] = 1;
    return f;
}

static void test_round_trip(void **state)
{
    uint8_t buf[MP__CUDA_FRAME_MAX];
    size_t len = 0;
    mp__cuda_frame f = sample(), g;
    assert_mp_ok(mp__cuda_frame_encode(&f, buf, sizeof buf, &len));
    assert_int_equal(len, MP__CUDA_FRAME_FIXED + 16 * 2);
    assert_mp_ok(mp__cuda_frame_decode(buf, len, &g));
    assert_int_equal(memcmp(&f, &g, sizeof f), 0);

    /* A 0-d tensor without event: the handle bytes travel as zeros. */
    f.ndim = 0;
    f.has_event = false;
    assert_mp_ok(mp__cuda_frame_encode(&f, buf, sizeof buf, &len));
    assert_int_equal(len, MP__CUDA_FRAME_FIXED);
    assert_mp_ok(mp__cuda_frame_decode(buf, len, &g));
    assert_false(g.has_event);
    assert_int_equal(g.ndim, 0);
    for (int i = 0; i < MP__CUDA_HANDLE_BYTES; i++)
        assert_int_equal(g.event_handle[i], 0);
}

static void test_encode_refuses(void **state)
{
    uint8_t buf[MP__CUDA_FRAME_MAX];
    size_t len;
    mp__cuda_frame f = sample();
    assert_mp_err(mp__cuda_frame_encode(&f, buf, 100, &len), MP_EOVERFLOW);
    assert_mp_err(mp__cuda_frame_encode(NULL, buf, sizeof buf, &len), MP_EINVAL);
    f.ref_word = mp__refword(1, 8, 3); /* names another slot */
    assert_mp_err(mp__cuda_frame_encode(&f, buf, sizeof buf, &len), MP_EINVAL);
}

/* Offsets of fields in the encoding (see frame.h). */
enum { O_MAGIC = 0, O_VERSION = 4, O_FLAGS = 6, O_DEVICE = 8, O_DTYPE = 12, O_NDIM = 16,
       O_PID = 20, O_SLOT = 24, O_GEN = 28, O_REF = 32, O_RESERVED = 36, O_WORD = 40,
       O_ALLOC = 48, O_OFFSET = 56, O_SHAPE = MP__CUDA_FRAME_FIXED };

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void test_decode_refuses(void **state)
{
    uint8_t good[MP__CUDA_FRAME_MAX], buf[MP__CUDA_FRAME_MAX];
    size_t len;
    mp__cuda_frame f = sample(), g;
    assert_mp_ok(mp__cuda_frame_encode(&f, good, sizeof good, &len));
    struct {
        int off, bytes;
        uint64_t value;
        const char *why;
    } cases[] = {
        {O_MAGIC, 4, 0x12345678, "magic"},
        {O_VERSION, 2, 9, "version"},
        {O_FLAGS, 2, 6, "flags"},
        {O_DEVICE, 4, (uint32_t)-1, "device"},
        {O_DEVICE, 4, MP__CUDA_MAX_DEVICE, "device"},
        {O_DTYPE, 4, MP_DTYPE_COUNT, "dtype"},
        {O_NDIM, 4, MP_MAX_NDIM + 1, "ndim"},
        {O_NDIM, 4, 3, "bytes for ndim"},
        {O_PID, 4, 0, "producer pid"},
        {O_SLOT, 4, MP__REFSEG_MAX_SLOTS, "slot"},
        {O_GEN, 4, 4, "reference word"},
        {O_RESERVED, 4, 1, "reserved"},
        {O_WORD, 8, 0, "reference word"},
        {O_ALLOC, 8, 0, "allocation size"},
        {O_ALLOC, 8, 200, "does not fit"}, /* view reaches byte 288 */
        {O_OFFSET, 8, 4096, "does not fit"},
        {O_SHAPE, 8, (uint64_t)-5, "does not fit"}, /* negative size */
        {O_SHAPE + 16, 8, 1u << 20, "does not fit"}, /* huge stride */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(buf, good, len);
        if (cases[i].bytes == 2) {
            buf[cases[i].off] = (uint8_t)cases[i].value;
            buf[cases[i].off + 1] = (uint8_t)(cases[i].value >> 8);
        } else if (cases[i].bytes == 4) {
            put32(buf + cases[i].off, (uint32_t)cases[i].value);
        } else {
            put64(buf + cases[i].off, cases[i].value);
        }
        int rc = mp__cuda_frame_decode(buf, len, &g);
        if (rc != MP_EPROTO || !strstr(mp_last_error(), cases[i].why))
            fail_msg("case %zu (%s): %s: %s", i, cases[i].why, mp_err_name(rc),
                     mp_last_error());
    }
    /* Truncated and overlong frames. */
    for (size_t n = 0; n < len; n += 7)
        assert_mp_err(mp__cuda_frame_decode(good, n, &g), MP_EPROTO);
    assert_mp_err(mp__cuda_frame_decode(good, len + 1, &g), MP_EPROTO);
    assert_mp_err(mp__cuda_frame_decode(NULL, len, &g), MP_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip, mp_test_setup, mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_encode_refuses, mp_test_setup, mp_test_teardown),
        cmocka_unit_test_setup_teardown(test_decode_refuses, mp_test_setup, mp_test_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
