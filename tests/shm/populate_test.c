/* src/shm/segment.c: how a new segment gets its pages. mp__segment_create
 * populates the mapping (MADV_POPULATE_WRITE, posix_fallocate when the
 * kernel answers EINVAL); mp__segment_create_filled writes the data with
 * pwritev and reserves the pages no write touched. Either way every page
 * exists on success, a failure names /dev/shm and its fix, and nothing
 * (fd, mapping, segment, /dev/shm name) is left behind. */
#include "mp_test.h"
#include "shm/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define PAGE 4096

static int setup(void **state)
{
    mp_set_sharing_strategy("file_descriptor");
    return mp_test_setup(state);
}

static int teardown(void **state)
{
    mp__sys_fault_reset();
    assert_int_equal(mp__segment_count(), 0);
    return mp_test_teardown(state);
}

/* Kilobytes of the mapping at addr resident in this process (smaps Rss). */
static long rss_kb(const void *addr)
{
    char line[256], want[32];
    long kb = -1;
    bool in = false;
    FILE *f = fopen("/proc/self/smaps", "r");
    assert_non_null(f);
    snprintf(want, sizeof want, "%lx-", (unsigned long)addr);
    while (fgets(line, sizeof line, f)) {
        if (strchr(line, '-') && strchr(line, ' ') && strchr(line, '-') < strchr(line, ' '))
            in = strncmp(line, want, strlen(want)) == 0;
        else if (in && sscanf(line, "Rss: %ld kB", &kb) == 1)
            break;
    }
    fclose(f);
    return kb;
}

/* Bytes of s's file that are allocated (st_blocks), not just sized. */
static long long allocated(mp__segment *s)
{
    struct stat st;
    int fd = mp__segment_fd(s);
    if (fd < 0) {
        char name[MP__SHM_NAME_MAX + 1];
        snprintf(name, sizeof name, "%s", mp__segment_name(s));
        fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
        assert_true(fd >= 0);
        assert_int_equal(fstat(fd, &st), 0);
        close(fd);
    } else {
        assert_int_equal(fstat(fd, &st), 0);
    }
    return (long long)st.st_blocks * 512;
}

static bool all_zero(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

/* A failed create leaves this process's fds, mappings and names as they were. */
typedef struct counts {
    int fds, maps, shm;
} counts;
static counts now(void)
{
    return (counts){mp_test_count_fds(), mp_test_count_maps(), mp_test_count_shm()};
}
static void assert_same(counts a)
{
    counts b = now();
    assert_int_equal(b.fds, a.fds);
    assert_int_equal(b.maps, a.maps);
    assert_int_equal(b.shm, a.shm);
    assert_int_equal(mp__segment_count(), 0);
}

static void expect_create_fault(const char *call, int err, int strategy, int code,
                                const char *text)
{
    mp__segment *s = (mp__segment *)0x1;
    counts before = now();
    assert_mp_ok(mp__sys_fault(call, err, 0, 1));
    assert_mp_err(mp__segment_create(1 << 20, strategy, &s), code);
    if (!strstr(mp_last_error(), text))
        fail_msg("%s: \"%s\" lacks \"%s\"", call, mp_last_error(), text);
    assert_null(s);
    mp__sys_fault_reset();
    assert_same(before);
}

/* The normal path maps every page at creation: the first writes take no
 * page faults and the pages are the file's (allocated) already. */
static void test_populated(void **state)
{
    (void)state;
    for (int strategy = MP__STRATEGY_FD; strategy <= MP__STRATEGY_FS; strategy++) {
        mp__segment *s;
        assert_mp_ok(mp__segment_create(1 << 20, strategy, &s));
        void *map = (char *)mp__segment_data(s) - (strategy == MP__STRATEGY_FS ? PAGE : 0);
        long size_kb = ((1 << 20) + (strategy == MP__STRATEGY_FS ? PAGE : 0)) / 1024;
        assert_int_equal(rss_kb(map), size_kb);
        assert_true(allocated(s) >= (1 << 20));
        assert_true(all_zero(mp__segment_data(s), 1 << 20));
        mp__segment_release(s);
    }
}

/* tmpfs full (a fault's SIGBUS is EFAULT from MADV_POPULATE_WRITE) or out
 * of memory: a clear error naming /dev/shm, nothing leaked. */
static void test_populate_faults(void **state)
{
    (void)state;
    for (int strategy = MP__STRATEGY_FD; strategy <= MP__STRATEGY_FS; strategy++) {
        expect_create_fault("madvise", EFAULT, strategy, MP_ENOSPC, "/dev/shm has");
        expect_create_fault("madvise", EFAULT, strategy, MP_ENOSPC, "--shm-size");
        expect_create_fault("madvise", ENOMEM, strategy, MP_ENOMEM, "/dev/shm has");
        expect_create_fault("madvise", ENOMEM, strategy, MP_ENOMEM, "out of memory");
        expect_create_fault("madvise", EHWPOISON, strategy, MP_ESYS, "MADV_POPULATE_WRITE");
    }
}

/* Kernels before 5.14 answer EINVAL: posix_fallocate reserves the pages
 * instead (allocated, not mapped yet), and its failures read as before. */
static void test_einval_fallback(void **state)
{
    (void)state;
    for (int strategy = MP__STRATEGY_FD; strategy <= MP__STRATEGY_FS; strategy++) {
        mp__segment *s;
        counts before = now();
        assert_mp_ok(mp__sys_fault("madvise", EINVAL, 0, 1));
        assert_mp_ok(mp__segment_create(1 << 20, strategy, &s));
        mp__sys_fault_reset();
        assert_true(allocated(s) >= (1 << 20));
        void *map = (char *)mp__segment_data(s) - (strategy == MP__STRATEGY_FS ? PAGE : 0);
        /* only the FS header page, written through the mapping */
        assert_int_equal(rss_kb(map), strategy == MP__STRATEGY_FS ? PAGE / 1024 : 0);
        assert_true(all_zero(mp__segment_data(s), 1 << 20));
        mp__segment_release(s);
        assert_same(before);

        assert_mp_ok(mp__sys_fault("madvise", EINVAL, 0, 1));
        expect_create_fault("posix_fallocate", ENOSPC, strategy, MP_ENOSPC, "posix_fallocate");
        assert_mp_ok(mp__sys_fault("madvise", EINVAL, 0, 1));
        expect_create_fault("posix_fallocate", ENOSPC, strategy, MP_ENOSPC, "/dev/shm has");
        assert_mp_ok(mp__sys_fault("madvise", EINVAL, 0, 1));
        expect_create_fault("posix_fallocate", EIO, strategy, MP_ESYS, "posix_fallocate");
    }
}

/* Parts land at their offsets, gaps (small, written as zeros, and large,
 * reserved) and the tail read zero, every page is allocated. */
static void check_filled(int strategy, const mp__segment_part *parts, int n, size_t nbytes)
{
    mp__segment *s;
    size_t at = 0;
    assert_mp_ok(mp__segment_create_filled(nbytes, strategy, parts, n, &s));
    const char *d = mp__segment_data(s);
    for (int i = 0; i < n; i++) {
        assert_true(all_zero(d + at, parts[i].off - at));
        assert_memory_equal(d + parts[i].off, parts[i].src, parts[i].nbytes);
        at = parts[i].off + parts[i].nbytes;
    }
    assert_true(all_zero(d + at, nbytes - at));
    assert_true(allocated(s) >= (long long)nbytes);
    if (strategy == MP__STRATEGY_FS) { /* the header page was reserved and written */
        const mp__fs_header *hd = (const void *)(d - MP__FS_HEADER_SIZE);
        assert_int_equal(hd->magic, MP__FS_MAGIC);
        assert_int_equal(hd->size, nbytes);
    }
    mp__segment_release(s);
}

static void test_filled(void **state)
{
    enum { MANY = 300 };
    static char a[3 * PAGE + 5], b[100], many[MANY][7];
    mp__segment_part parts[MANY];
    (void)state;
    for (size_t i = 0; i < sizeof a; i++)
        a[i] = (char)(i * 7 + 1);
    memset(b, 0x5a, sizeof b);
    for (int strategy = MP__STRATEGY_FD; strategy <= MP__STRATEGY_FS; strategy++) {
        counts before = now();
        mp__segment_part one = {0, a, sizeof a};
        check_filled(strategy, &one, 1, sizeof a);
        /* a small gap, an empty part, a gap of several whole pages, a tail */
        mp__segment_part gaps[] = {
            {10, a, 1000}, {1064, b, 100}, {1164, a, 0}, {9 * PAGE + 3, a, sizeof a}};
        check_filled(strategy, gaps, 4, 20 * PAGE);
        /* more parts than one pwritev takes: several batches */
        for (int i = 0; i < MANY; i++) {
            memset(many[i], i + 1, sizeof many[i]);
            parts[i] = (mp__segment_part){(size_t)i * 64, many[i], sizeof many[i]};
        }
        check_filled(strategy, parts, MANY, MANY * 64);
        check_filled(strategy, NULL, 0, 3 * PAGE); /* no parts: zeros, still allocated */
        assert_same(before);
    }
}

static void expect_filled_fault(const char *call, int err, int skip, int strategy, int code,
                                const char *text)
{
    static char src[2 * PAGE];
    mp__segment_part parts[] = {{0, src, 100}, {5 * PAGE, src, sizeof src}};
    mp__segment *s = (mp__segment *)0x1;
    counts before = now();
    assert_mp_ok(mp__sys_fault(call, err, skip, 1));
    assert_mp_err(mp__segment_create_filled(8 * PAGE, strategy, parts, 2, &s), code);
    if (!strstr(mp_last_error(), text))
        fail_msg("%s: \"%s\" lacks \"%s\"", call, mp_last_error(), text);
    assert_null(s);
    mp__sys_fault_reset();
    assert_same(before);
}

/* A full /dev/shm met by the write or by the reservation of a gap. */
static void test_filled_faults(void **state)
{
    (void)state;
    for (int strategy = MP__STRATEGY_FD; strategy <= MP__STRATEGY_FS; strategy++) {
        expect_filled_fault("pwritev", ENOSPC, 0, strategy, MP_ENOSPC, "/dev/shm has");
        expect_filled_fault("pwritev", ENOSPC, 1, strategy, MP_ENOSPC, "--shm-size");
        expect_filled_fault("pwritev", EIO, 0, strategy, MP_ESYS, "pwritev");
        expect_filled_fault("posix_fallocate", ENOSPC, 0, strategy, MP_ENOSPC, "/dev/shm has");
        expect_filled_fault("posix_fallocate", ENOSPC, 1, strategy, MP_ENOSPC, "posix_fallocate");
    }
}

static void test_filled_arguments(void **state)
{
    static char src[64];
    mp__segment *s = (mp__segment *)0x1;
    mp__segment_part overlap[] = {{0, src, 64}, {32, src, 8}};
    mp__segment_part past[] = {{4050, src, 64}};
    mp__segment_part null_src[] = {{0, NULL, 8}};
    counts before = now();
    (void)state;
    assert_mp_err(mp__segment_create_filled(4096, MP__STRATEGY_FD, overlap, 2, &s), MP_EINVAL);
    assert_non_null(strstr(mp_last_error(), "part 1"));
    assert_null(s);
    assert_mp_err(mp__segment_create_filled(4096, MP__STRATEGY_FD, past, 1, &s), MP_EINVAL);
    assert_mp_err(mp__segment_create_filled(4096, MP__STRATEGY_FS, null_src, 1, &s), MP_EINVAL);
    assert_mp_err(mp__segment_create_filled(4096, MP__STRATEGY_FD, NULL, 1, &s), MP_EINVAL);
    assert_mp_err(mp__segment_create_filled(4096, MP__STRATEGY_FD, past, -1, &s), MP_EINVAL);
    assert_mp_err(mp__segment_create_filled(4096, 7, past, 0, &s), MP_EINVAL);
    assert_same(before);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_populated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_populate_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_einval_fallback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_filled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_filled_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_filled_arguments, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
