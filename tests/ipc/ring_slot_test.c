/* A ring slot's seq word (src/ipc/ring_impl.h): what a consumer at head
 * reads from it (empty, ready, or a stale head whose slot holds a later
 * lap), across the wrap of the 32-bit positions, and the repair of a tail
 * left one short by a producer that died between publishing and moving it.
 * ring_test covers the same through queues and pipes, with SIGKILLs. */
#include <errno.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ipc/ring_impl.h"
#include "mp_test.h"

static void test_fresh_slots_are_empty(void **state)
{
    mp__ring_slot s = {0};
    (void)state;
    for (uint32_t p = 0; p < MP__RING_SLOTS; p++)
        assert_true(slot_empty(&s, p) && !slot_ready(&s, p));
}

/* A consumer that read head p before others took p and a producer refilled
 * its slot must look at head again, not take the ring for empty and sleep. */
static void test_a_later_lap_is_a_stale_head(void **state)
{
    mp__ring_slot s = {0};
    uint32_t p = 7;
    (void)state;
    slot_publish(&s, p);
    assert_true(slot_ready(&s, p));
    assert_int_equal(slot_lag(&s, p), 0);
    assert_true(slot_empty(&s, p + MP__RING_SLOTS)); /* the next lap: not yet */
    slot_publish(&s, p + MP__RING_SLOTS);
    assert_true(slot_lag(&s, p) > 0);
    assert_false(slot_empty(&s, p));
    assert_false(slot_ready(&s, p));
    assert_true(slot_ready(&s, p + MP__RING_SLOTS));
}

static void test_positions_wrap(void **state)
{
    mp__ring_slot s = {0};
    uint32_t last = UINT32_MAX; /* its seq is 0, as a fresh slot's */
    (void)state;
    slot_publish(&s, last - MP__RING_SLOTS);
    assert_true(slot_empty(&s, last));
    slot_publish(&s, last);
    assert_true(slot_ready(&s, last));
    assert_true(slot_lag(&s, last - MP__RING_SLOTS) > 0);
    assert_true(slot_empty(&s, last + MP__RING_SLOTS)); /* wraps to 511 */
}

/* The ring as a producer killed at MP__RING_STEP_PUBLISHED leaves it: the
 * message is visible and counted, plock is EOWNERDEAD, and whoever takes it
 * next moves tail and makes it consistent. */
static void test_tail_one_short_is_recovered(void **state)
{
    mp__ring *r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int status = 0;
    pid_t pid;
    (void)state;
    assert_true(r != MAP_FAILED);
    assert_mp_ok(mp__ring_init(r, "ring_slot_test"));
    if ((pid = fork()) == 0) { /* dies holding plock, slot 0 published */
        pthread_mutex_lock(&r->plock);
        slot_write(&r->slot[0], RING_PAYLOAD, "abc", 3);
        slot_publish(&r->slot[0], 0);
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(atomic_load(&r->tail), 0);
    assert_int_equal(mp__ring_count(r), 1);
    assert_int_equal(pthread_mutex_trylock(&r->plock), EOWNERDEAD);
    plock_recover(r);
    assert_int_equal(atomic_load(&r->tail), 1);
    assert_int_equal(mp__ring_count(r), 1);
    pthread_mutex_unlock(&r->plock);
    assert_int_equal(pthread_mutex_trylock(&r->plock), 0); /* consistent again */
    assert_int_equal(atomic_load(&r->tail), 1);
    pthread_mutex_unlock(&r->plock);
    pthread_mutex_destroy(&r->plock);
    munmap(r, sizeof *r);
}

static void test_mark_tag_round_trips(void **state)
{
    mp__ring_slot s = {0};
    uint32_t tag = 0xdeadbeefu;
    (void)state;
    slot_write(&s, RING_MARK, &tag, sizeof tag);
    assert_int_equal(slot_type(&s), RING_MARK);
    assert_int_equal(slot_tag(&s), 0xdeadbeefu);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fresh_slots_are_empty),
        cmocka_unit_test(test_a_later_lap_is_a_stale_head),
        cmocka_unit_test(test_positions_wrap),
        cmocka_unit_test(test_tail_one_short_is_recovered),
        cmocka_unit_test(test_mark_tag_round_trips),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
