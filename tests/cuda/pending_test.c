/* The producer's pending-free list (no GPU needed): allocations freed while
 * shared wait for their count to reach zero, checked on later frees and by
 * collect; dead consumers' references do not hold them. */
#include "mp_test.h"
#include "cuda/pending.h"

#include <errno.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int teardown(void **state)
{
    assert_int_equal(mp__refseg_open_count(), 0);
    return mp_test_teardown(state);
}

/* A fake allocation: freeing it records the fact; fail makes the free fail. */
typedef struct fake {
    int freed;
    bool fail;
} fake;

static int fake_free(void *p)
{
    fake *f = p;
    if (f->fail)
        return mp__error(MP_ESYS, "fake cudaFree failed");
    f->freed++;
    return 0;
}

static uint32_t self(void) { return (uint32_t)getpid(); }

static void test_unshared_frees_now(void **state)
{
    mp__refseg *seg = NULL;
    mp__pending p = {0};
    fake a = {0};
    uint32_t slot, gen;
    bool now = false;
    assert_mp_ok(mp__refseg_create(8, 64, &seg));
    assert_mp_ok(mp__refseg_slot_alloc(seg, &slot, &gen));
    assert_mp_ok(mp__pending_free(&p, seg, slot, &a, fake_free, &now));
    assert_true(now);
    assert_int_equal(a.freed, 1);
    assert_int_equal(mp__pending_count(&p), 0);
    assert_int_equal(mp__refseg_slots_in_use(seg), 0);
    assert_mp_err(mp__pending_free(&p, seg, 99, &a, fake_free, &now), MP_EINVAL);
    assert_mp_err(mp__pending_collect(NULL, seg, fake_free, NULL), MP_EINVAL);
    mp__pending_clear(&p);
    mp__refseg_release(seg);
}

static void test_shared_waits_for_zero(void **state)
{
    mp__refseg *seg = NULL;
    mp__pending p = {0};
    fake a = {0}, b = {0};
    uint32_t sa, ga, sb, gb, r;
    uint64_t w;
    size_t freed = 99;
    bool now = true;
    assert_mp_ok(mp__refseg_create(8, 64, &seg));
    assert_mp_ok(mp__refseg_slot_alloc(seg, &sa, &ga));
    assert_mp_ok(mp__refseg_slot_alloc(seg, &sb, &gb));
    assert_mp_ok(mp__refseg_ref_add(seg, sa, ga, self(), &r, &w));
    /* Freed while a consumer holds it: parked, memory untouched. */
    assert_mp_ok(mp__pending_free(&p, seg, sa, &a, fake_free, &now));
    assert_false(now);
    assert_int_equal(a.freed, 0);
    assert_int_equal(mp__pending_count(&p), 1);
    assert_mp_ok(mp__pending_collect(&p, seg, fake_free, &freed));
    assert_int_equal(freed, 0);
    assert_int_equal(mp__pending_count(&p), 1);
    /* The consumer lets go; the next free of anything collects it too. */
    assert_mp_ok(mp__refseg_ref_drop(seg, r, w));
    assert_mp_ok(mp__pending_free(&p, seg, sb, &b, fake_free, &now));
    assert_true(now);
    assert_int_equal(a.freed, 1);
    assert_int_equal(b.freed, 1);
    assert_int_equal(mp__pending_count(&p), 0);
    assert_int_equal(mp__refseg_slots_in_use(seg), 0);
    mp__pending_clear(&p);
    mp__refseg_release(seg);
}

static void test_collect_explicit_and_failure(void **state)
{
    mp__refseg *seg = NULL;
    mp__pending p = {0};
    fake a = {.fail = true};
    uint32_t s, g, r;
    uint64_t w;
    size_t freed = 0;
    assert_mp_ok(mp__refseg_create(8, 64, &seg));
    assert_mp_ok(mp__refseg_slot_alloc(seg, &s, &g));
    assert_mp_ok(mp__refseg_ref_add(seg, s, g, self(), &r, &w));
    assert_mp_ok(mp__pending_free(&p, seg, s, &a, fake_free, NULL));
    assert_mp_ok(mp__refseg_ref_drop(seg, r, w));
    /* The device refuses the free: the entry stays, the error says why. */
    assert_mp_err(mp__pending_collect(&p, seg, fake_free, &freed), MP_ESYS);
    assert_non_null(strstr(mp_last_error(), "fake cudaFree"));
    assert_int_equal(freed, 0);
    assert_int_equal(mp__pending_count(&p), 1);
    assert_int_equal(mp__refseg_slots_in_use(seg), 1);
    a.fail = false;
    assert_mp_ok(mp__pending_collect(&p, seg, fake_free, &freed));
    assert_int_equal(freed, 1);
    assert_int_equal(mp__pending_count(&p), 0);
    assert_int_equal(mp__refseg_slots_in_use(seg), 0);
    mp__pending_clear(&p);
    mp__refseg_release(seg);
}

/* A consumer dies holding references: collect reclaims and frees. */
static void test_dead_consumer_frees(void **state)
{
    mp__refseg *seg = NULL;
    mp__pending p = {0};
    fake a = {0};
    uint32_t s, g;
    size_t freed = 0;
    assert_mp_ok(mp__refseg_create(8, 64, &seg));
    assert_mp_ok(mp__refseg_slot_alloc(seg, &s, &g));
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        uint32_t r;
        uint64_t w;
        _exit(mp__refseg_ref_add(seg, s, g, (uint32_t)getpid(), &r, &w) == 0 ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(mp__refseg_count(seg, s, g), 0); /* dead: counts for nothing */
    assert_mp_ok(mp__pending_free(&p, seg, s, &a, fake_free, NULL));
    assert_int_equal(a.freed, 1);
    assert_mp_ok(mp__pending_collect(&p, seg, fake_free, &freed));
    assert_int_equal(freed, 0);
    mp__pending_clear(&p);
    mp__refseg_release(seg);
}

/* 1000 allocations freed while shared, released in any order: all freed,
 * the list back to empty, every slot reusable. */
static void test_thousand(void **state)
{
    enum { N = 1000 };
    mp__refseg *seg = NULL;
    mp__pending p = {0};
    static fake a[N];
    static uint32_t slot[N], ref[N];
    static uint64_t word[N];
    uint32_t gen;
    size_t freed = 0;
    memset(a, 0, sizeof a);
    assert_mp_ok(mp__refseg_create(N, 2 * N, &seg));
    for (int i = 0; i < N; i++) {
        assert_mp_ok(mp__refseg_slot_alloc(seg, &slot[i], &gen));
        assert_mp_ok(mp__refseg_ref_add(seg, slot[i], gen, self(), &ref[i], &word[i]));
        assert_mp_ok(mp__pending_free(&p, seg, slot[i], &a[i], fake_free, NULL));
    }
    assert_int_equal(mp__pending_count(&p), N);
    for (int i = 0; i < N; i += 2)
        assert_mp_ok(mp__refseg_ref_drop(seg, ref[i], word[i]));
    assert_mp_ok(mp__pending_collect(&p, seg, fake_free, &freed));
    assert_int_equal(freed, N / 2);
    for (int i = 1; i < N; i += 2)
        assert_mp_ok(mp__refseg_ref_drop(seg, ref[i], word[i]));
    assert_mp_ok(mp__pending_collect(&p, seg, fake_free, &freed));
    assert_int_equal(freed, N / 2);
    assert_int_equal(mp__pending_count(&p), 0);
    for (int i = 0; i < N; i++)
        assert_int_equal(a[i].freed, 1);
    assert_int_equal(mp__refseg_slots_in_use(seg), 0);
    mp__pending_clear(&p);
    mp__refseg_release(seg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unshared_frees_now, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_shared_waits_for_zero, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_collect_explicit_and_failure, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_dead_consumer_frees, mp_test_setup, teardown),
        cmocka_unit_test_setup_teardown(test_thousand, mp_test_setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
