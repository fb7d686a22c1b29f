/* The compact record (src/wire/compact.c): a one-tensor message whose
 * storage the receiving end pinned. Every view, name and payload that
 * qualifies comes back exactly as sent, over the same bytes; every message
 * that does not qualify is left to the frame; every malformed record fails
 * with MP_EPROTO and a sentence, and gives its pin's in-flight count back.
 * This process plays both sides of one end's pin table. */
#include <stdint.h>
#include <string.h>

#include "ipc/ring.h"
#include "mp_test.h"
#include "tensor/tensor_internal.h"
#include "wire/frame.h"

typedef struct side {
    mp__rx rx;       /* the end's receive side, here in private memory */
    mp_tensor *base; /* a shared tensor the end pinned */
    unsigned slot;
} side;

static side S;

static int setup(void **state)
{
    int64_t n = 4096;
    mp__segment *seg;
    int rc = mp_test_setup_fd(state);
    if (rc)
        return rc;
    memset(&S, 0, sizeof S);
    mp__pins_init(&S.rx.pins);
    if (mp__pins_attach(&S.rx.pins) || mp_tensor_empty_shared(MP_UINT8, 1, &n, &S.base))
        return -1;
    /* the second arrival by fd pins it */
    seg = mp__storage_segment(mp__tensor_storage(S.base));
    mp__pins_received(&S.rx.pins, seg);
    mp__pins_received(&S.rx.pins, seg);
    for (S.slot = 0; S.slot < MP__PIN_SLOTS; S.slot++)
        if (atomic_load(&S.rx.pins.slot[S.slot].state) & MP__PIN_LIVE)
            break;
    return S.slot < MP__PIN_SLOTS ? 0 : -1;
}

static int teardown(void **state)
{
    mp_tensor_release(S.base);
    mp__pins_detach(&S.rx.pins);
    return mp_test_teardown(state);
}

/* Messages naming the pin and not yet received. */
static uint32_t in_flight(void)
{
    uint64_t st = atomic_load(&S.rx.pins.slot[S.slot].state);
    return (uint32_t)(st & MP__PIN_SENT) - atomic_load(&S.rx.pins.done[S.slot]);
}

static mp_msg *message(mp_tensor *t, const char *name, const void *payload, size_t len)
{
    mp_msg *m = NULL;
    assert_mp_ok(mp_msg_create(&m));
    assert_mp_ok(mp_msg_set_payload(m, payload, len));
    if (t)
        assert_mp_ok(mp_msg_add_tensor(m, name, t));
    return m;
}

/* Encodes m compactly (it must qualify), decodes it and checks it is m. */
static void round_trip(mp_msg *m)
{
    unsigned char buf[MP__RING_DATA];
    size_t len = 0, plen = 0, qlen = 0;
    mp__pin_ref ref;
    mp_msg *out = NULL;
    mp_tensor *a = NULL, *b = NULL;
    assert_int_equal(mp__compact_encode(m, &S.rx.pins, buf, sizeof buf, &len, &ref), 1);
    assert_int_equal(in_flight(), 1);
    assert_mp_ok(mp__compact_decode(&S.rx.pins, buf, len, &out));
    assert_int_equal(in_flight(), 0);
    assert_int_equal(mp_msg_count(out), 1);
    const void *p = mp_msg_payload(m, &plen), *q = mp_msg_payload(out, &qlen);
    assert_int_equal(plen, qlen);
    if (plen)
        assert_memory_equal(p, q, plen);
    if (mp_msg_name(m, 0))
        assert_string_equal(mp_msg_name(m, 0), mp_msg_name(out, 0));
    else
        assert_null(mp_msg_name(out, 0));
    assert_mp_ok(mp_msg_get_tensor(m, 0, &a));
    assert_mp_ok(mp_msg_get_tensor(out, 0, &b));
    assert_int_equal(mp_tensor_dtype(a), mp_tensor_dtype(b));
    assert_int_equal(mp_tensor_ndim(a), mp_tensor_ndim(b));
    assert_int_equal(mp_tensor_byte_offset(a), mp_tensor_byte_offset(b));
    for (int i = 0; i < mp_tensor_ndim(a); i++) {
        assert_int_equal(mp_tensor_shape(a)[i], mp_tensor_shape(b)[i]);
        assert_int_equal(mp_tensor_strides(a)[i], mp_tensor_strides(b)[i]);
    }
    assert_ptr_equal(mp_tensor_data(a), mp_tensor_data(b)); /* one mapping, one storage */
    mp_tensor_release(a);
    mp_tensor_release(b);
    mp_msg_destroy(out);
    mp_msg_destroy(m);
}

/* A view of the pinned storage (dtype and geometry as given). */
static mp_tensor *view(mp_dtype dtype, int ndim, const int64_t *shape, const int64_t *strides,
                       uint64_t offset)
{
    int64_t contiguous[MP_MAX_NDIM];
    mp_tensor *v = NULL;
    if (!strides) {
        mp__contiguous_strides(ndim, shape, contiguous);
        strides = contiguous;
    }
    assert_mp_ok(mp__tensor_make("test", mp__tensor_storage(S.base), dtype, ndim, shape,
                                 strides, offset, &v));
    return v;
}

static void test_views_names_payloads(void **state)
{
    int64_t shape3[3] = {3, 4, 5}, strides3[3] = {1, 15, 3}, shape2[2] = {8, 16};
    char name200[201];
    unsigned char payload[100];
    mp_tensor *v;
    (void)state;
    memset(name200, 'n', 200);
    name200[200] = '\0';
    memset(payload, 7, sizeof payload);
    round_trip(message(S.base, "t", "abcd", 4));          /* the common case */
    round_trip(message(S.base, NULL, NULL, 0));           /* no name, no payload */
    round_trip(message(S.base, "fifteen_chars__", payload, 16)); /* inline name, payload */
    round_trip(message(S.base, "sixteen_chars___", payload, 17)); /* both allocated */
    round_trip(message(S.base, "x", payload, sizeof payload));
    round_trip(message(S.base, name200, NULL, 0)); /* a long name fits beside little else */
    /* a permuted view with an offset: strides and offset travel */
    round_trip(message(v = view(MP_INT32, 3, shape3, strides3, 64), "v", NULL, 0));
    mp_tensor_release(v);
    round_trip(message(v = view(MP_FLOAT64, 2, shape2, NULL, 8), "offset", "p", 1));
    mp_tensor_release(v);
    round_trip(message(v = view(MP_INT64, 0, NULL, NULL, 0), "scalar", NULL, 0));
    mp_tensor_release(v);
}

/* Sends m compactly and returns the tensor received (the message is gone). */
static mp_tensor *pass(mp_msg *m)
{
    unsigned char buf[MP__RING_DATA];
    size_t len = 0;
    mp__pin_ref ref;
    mp_msg *out = NULL;
    mp_tensor *t = NULL;
    assert_int_equal(mp__compact_encode(m, &S.rx.pins, buf, sizeof buf, &len, &ref), 1);
    assert_mp_ok(mp__compact_decode(&S.rx.pins, buf, len, &out));
    assert_mp_ok(mp_msg_get_tensor(out, 0, &t));
    mp_msg_destroy(out);
    return t;
}

/* The receiver hands the tensor it built out again only while nobody else
 * holds it and it is the same view with no grad. */
static void test_tensor_reused_only_when_free(void **state)
{
    int64_t shape[2] = {16, 16};
    mp_msg *m = message(S.base, "t", NULL, 0);
    mp_tensor *a, *b, *c, *g = NULL, *v;
    mp_tensor_stats st0 = {.size = sizeof st0}, st1 = {.size = sizeof st1};
    (void)state;
    assert_mp_ok(mp_tensor_stats_get(&st0));
    for (int i = 0; i < 10; i++) /* kept and handed out again: counted all the same */
        mp_tensor_release(pass(m));
    assert_mp_ok(mp_tensor_stats_get(&st1));
    assert_int_equal(st1.segments_received - st0.segments_received, 10);
    assert_int_equal(st1.segments_received_by_pin - st0.segments_received_by_pin, 10);
    a = pass(m);
    b = pass(m); /* a is still held: a new tensor */
    assert_ptr_not_equal(a, b);
    mp_tensor_release(a);
    mp_tensor_release(b);
    a = pass(m); /* b was kept, and nobody holds it */
    assert_ptr_equal(a, b);
    assert_mp_ok(mp_tensor_empty_shared(MP_UINT8, 1, &(int64_t){4096}, &g));
    assert_mp_ok(mp_tensor_set_grad(a, g));
    mp_tensor_release(a);
    b = pass(m); /* a has a grad now: not handed out again */
    assert_ptr_not_equal(a, b);
    assert_null(mp_tensor_grad(b));
    mp_tensor_release(b);
    mp_tensor_release(g);
    mp_msg_destroy(m);
    m = message(v = view(MP_UINT8, 2, shape, NULL, 0), "t", NULL, 0);
    c = pass(m); /* another view of the same storage: a new tensor */
    assert_int_equal(mp_tensor_ndim(c), 2);
    assert_ptr_not_equal(c, b);
    mp_tensor_release(c);
    mp_tensor_release(v);
    mp_msg_destroy(m);
}

/* Encodes m and expects it left to the frame, with no count taken. */
static void not_compact(mp_msg *m, size_t cap)
{
    unsigned char buf[MP__RING_DATA];
    size_t len = 0;
    mp__pin_ref ref;
    assert_int_equal(mp__compact_encode(m, &S.rx.pins, buf, cap, &len, &ref), 0);
    assert_int_equal(in_flight(), 0);
    mp_msg_destroy(m);
}

static void test_what_goes_as_a_frame(void **state)
{
    int64_t n = 64;
    mp_tensor *priv = NULL, *other = NULL, *grad = NULL;
    unsigned char payload[MP__RING_DATA];
    mp_msg *m;
    (void)state;
    memset(payload, 1, sizeof payload);
    not_compact(message(NULL, NULL, "p", 1), MP__RING_DATA);   /* no tensor */
    m = message(S.base, "a", NULL, 0);
    assert_mp_ok(mp_msg_add_tensor(m, "b", S.base));
    not_compact(m, MP__RING_DATA);                             /* two */
    assert_mp_ok(mp_tensor_empty(MP_UINT8, 1, &n, &priv));
    not_compact(message(priv, "t", NULL, 0), MP__RING_DATA);    /* private */
    assert_mp_ok(mp_tensor_empty_shared(MP_UINT8, 1, &n, &other));
    not_compact(message(other, "t", NULL, 0), MP__RING_DATA);   /* not pinned */
    not_compact(message(S.base, "t", payload, 220), MP__RING_DATA); /* too big */
    not_compact(message(S.base, "t", NULL, 0), 40);                       /* tiny buffer */
    assert_mp_ok(mp_tensor_empty_shared(MP_UINT8, 1, &(int64_t){4096}, &grad));
    assert_mp_ok(mp_tensor_set_grad(S.base, grad));
    not_compact(message(S.base, "t", NULL, 0), MP__RING_DATA);  /* a grad */
    assert_mp_ok(mp_tensor_set_grad(S.base, NULL));
    mp_tensor_release(grad);
    mp_tensor_release(priv);
    mp_tensor_release(other);
}

/* A good record of base named "t", then broken by the caller. */
typedef struct rec {
    unsigned char b[MP__RING_DATA];
    size_t len;
} rec;

static rec good(void)
{
    rec r;
    mp__pin_ref ref;
    mp_msg *m = message(S.base, "t", "pl", 2);
    assert_int_equal(mp__compact_encode(m, &S.rx.pins, r.b, sizeof r.b, &r.len, &ref), 1);
    mp_msg_destroy(m);
    return r;
}

static mp__compact *fixed(rec *r) { return (mp__compact *)(void *)r->b; }

static void expect_eproto(rec *r, const char *needle)
{
    mp_msg *m = NULL;
    assert_int_equal(in_flight(), 1);
    assert_mp_err(mp__compact_decode(&S.rx.pins, r->b, r->len, &m), MP_EPROTO);
    assert_null(m);
    if (!strstr(mp_last_error(), needle))
        fail_msg("error \"%s\" does not mention \"%s\"", mp_last_error(), needle);
    assert_int_equal(in_flight(), 0); /* given back: the pin can be let go */
}

static void test_malformed(void **state)
{
    rec r;
    (void)state;
    r = good(), fixed(&r)->dtype = 99, expect_eproto(&r, "unknown dtype 99");
    r = good(), fixed(&r)->ndim = 17, expect_eproto(&r, "ndim 17");
    r = good(), fixed(&r)->flags = 0x80, expect_eproto(&r, "unknown flags");
    r = good(), fixed(&r)->size = 0, expect_eproto(&r, "outside [1, 2^40]");
    r = good(), fixed(&r)->name_len = 300, expect_eproto(&r, "name of 300 bytes");
    r = good(), r.len--, expect_eproto(&r, "fields add up to");
    r = good(), fixed(&r)->payload_len = 1000, expect_eproto(&r, "fields add up to");
    r = good(), r.b[sizeof(mp__compact) + 8] = '\0', expect_eproto(&r, "NUL");
    /* shape 4096 of 4096 bytes is the whole storage; 4097 reaches past it */
    r = good(), memcpy(r.b + sizeof(mp__compact), &(int64_t){4097}, 8);
    expect_eproto(&r, "4096-byte storage");
    r = good(), fixed(&r)->size = 1 << 20, expect_eproto(&r, "claims 1048576 bytes");
    {
        /* a shape whose contiguous strides overflow */
        int64_t shape[2] = {64, 64}, huge[2] = {INT64_C(1) << 40, INT64_C(1) << 40};
        mp_tensor *v = view(MP_UINT8, 2, shape, NULL, 0);
        mp__pin_ref ref;
        mp_msg *m = message(v, "t", NULL, 0);
        assert_int_equal(mp__compact_encode(m, &S.rx.pins, r.b, sizeof r.b, &r.len, &ref), 1);
        memcpy(r.b + sizeof(mp__compact), huge, sizeof huge);
        expect_eproto(&r, "overflows");
        mp_msg_destroy(m);
        mp_tensor_release(v);
    }
    /* a slot out of range names no pin: there is no count to give back */
    r = good(), fixed(&r)->pin_slot = MP__PIN_SLOTS;
    assert_mp_err(mp__compact_decode(&S.rx.pins, r.b, r.len, &(mp_msg *){NULL}), MP_EPROTO);
    assert_non_null(strstr(mp_last_error(), "out of range"));
    mp__pins_unreserve(&S.rx.pins, &(mp__pin_ref){.slot = S.slot,
                       .gen = fixed(&r)->pin_gen});
    /* too short to name a pin: nothing is given back */
    r = good(), r.len = 8;
    assert_mp_err(mp__compact_decode(&S.rx.pins, r.b, r.len, &(mp_msg *){NULL}), MP_EPROTO);
    assert_non_null(strstr(mp_last_error(), "shorter than its fixed part"));
    mp__pins_unreserve(&S.rx.pins, &(mp__pin_ref){.slot = S.slot,
                       .gen = fixed(&r)->pin_gen});
    assert_int_equal(in_flight(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_views_names_payloads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tensor_reused_only_when_free, setup, teardown),
        cmocka_unit_test_setup_teardown(test_what_goes_as_a_frame, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
