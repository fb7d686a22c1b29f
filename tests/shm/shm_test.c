/* src/shm: strategies, segment create/seal/map, handles and the mapping
 * cache, hooks, fault injection and a real ENOSPC. */
#include "mp_test.h"
#include "shm/shm.h"
#include "tensor/tensor_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

static int setup(void **state)
{
    mp_set_sharing_strategy("file_descriptor");
    return mp_test_setup(state);
}

static int teardown(void **state)
{
    mp__sys_fault_reset();
    mp__shm_set_hooks(NULL);
    assert_int_equal(mp__segment_count(), 0);
    return mp_test_teardown(state);
}

static void test_strategies(void **state)
{
    const char *const *names = mp_get_all_sharing_strategies();
    assert_string_equal(names[0], "file_descriptor");
    assert_string_equal(names[1], "file_system");
    assert_null(names[2]);
    assert_string_equal(mp_get_sharing_strategy(), "file_descriptor");
    assert_mp_err(mp_set_sharing_strategy("file_sistem"), MP_ENOENT);
    assert_non_null(strstr(mp_last_error(), "file_sistem"));
    assert_non_null(strstr(mp_last_error(), "\"file_descriptor\", \"file_system\""));
    assert_mp_err(mp_set_sharing_strategy(NULL), MP_EINVAL);
    assert_string_equal(mp_get_sharing_strategy(), "file_descriptor");
    assert_mp_ok(mp_set_sharing_strategy("file_system"));
    assert_string_equal(mp_get_sharing_strategy(), "file_system");
    assert_int_equal(mp__shm_strategy(), MP__STRATEGY_FS);
    assert_mp_ok(mp_set_sharing_strategy("file_descriptor"));
}

static void test_fd_segment(void **state)
{
    mp__segment *s;
    int seals, fd;
    assert_mp_ok(mp__segment_create(10000, MP__STRATEGY_FD, &s));
    assert_int_equal(mp__segment_count(), 1);
    assert_int_equal(mp__segment_size(s), 10000);
    assert_int_equal(mp__segment_strategy(s), MP__STRATEGY_FD);
    assert_null(mp__segment_name(s));
    fd = mp__segment_fd(s);
    assert_true(fd >= 0);
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    seals = fcntl(fd, F_GET_SEALS);
    assert_int_equal(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
                     F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    assert_int_equal(ftruncate(fd, 4096), -1); /* no peer can shrink it */
    assert_int_equal(errno, EPERM);
    for (int i = 0; i < 10000; i++)
        assert_int_equal(((unsigned char *)mp__segment_data(s))[i], 0);
    memset(mp__segment_data(s), 0xab, 10000);
    assert_ptr_equal(mp__segment_retain(s), s);
    mp__segment_release(s);
    assert_int_equal(mp__segment_count(), 1);
    mp__segment_release(s);
    mp__segment_release(NULL);
    /* zero bytes still make a valid segment */
    assert_mp_ok(mp__segment_create(0, MP__STRATEGY_FD, &s));
    assert_non_null(mp__segment_data(s));
    mp__segment_release(s);
    assert_mp_err(mp__segment_create(1, 7, &s), MP_EINVAL);
    assert_mp_err(mp__segment_create(SIZE_MAX - 10, MP__STRATEGY_FD, &s), MP_EOVERFLOW);
}

static void test_fs_segment(void **state)
{
    mp__segment *s;
    mp__fs_header *h;
    struct stat st;
    char path[128], want[32];
    int base = mp_test_count_shm();
    assert_mp_ok(mp__segment_create(5000, MP__STRATEGY_FS, &s));
    assert_int_equal(mp__segment_fd(s), -1);
    const char *name = mp__segment_name(s);
    snprintf(want, sizeof want, "/mproc-%d-", (int)getpid());
    assert_int_equal(strncmp(name, want, strlen(want)), 0);
    assert_int_equal(strlen(name), strlen(want) + 16);
    snprintf(path, sizeof path, "/dev/shm%s", name);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(mp_test_count_shm(), base + 1);
    h = (mp__fs_header *)((char *)mp__segment_data(s) - MP__FS_HEADER_SIZE);
    assert_true(h->magic == MP__FS_MAGIC);
    assert_int_equal(h->version, MP__FS_VERSION);
    assert_int_equal(h->size, 5000);
    assert_int_equal(h->refcount, 1);
    assert_int_equal(h->creator_pid, getpid());
    assert_int_equal((uintptr_t)mp__segment_data(s) % 4096, 0);
    mp__segment_release(s); /* the last user unlinks */
    assert_int_equal(stat(path, &st), -1);
    assert_int_equal(mp_test_count_shm(), base);
}

static void test_handles_fd(void **state)
{
    mp__segment *s, *o;
    mp__segment_handle h;
    assert_mp_ok(mp__segment_create(100, MP__STRATEGY_FD, &s));
    assert_mp_ok(mp__segment_export(s, &h));
    assert_int_equal(h.fd, mp__segment_fd(s));
    assert_int_equal(h.size, 100);
    h.fd = dup(h.fd); /* what SCM_RIGHTS delivers */
    assert_mp_ok(mp__segment_open(&h, &o));
    assert_ptr_equal(o, s); /* cache hit: one mapping per process */
    assert_int_equal(h.fd, -1);
    assert_int_equal(mp__segment_count(), 1);
    mp__segment_release(o);
    /* the segment's own fd handed back as if received: never closed */
    assert_mp_ok(mp__segment_export(s, &h));
    assert_mp_ok(mp__segment_open(&h, &o));
    assert_ptr_equal(o, s);
    assert_true(fcntl(mp__segment_fd(s), F_GETFD) >= 0);
    mp__segment_release(o);
    /* a handle claiming more than the file holds */
    assert_mp_ok(mp__segment_export(s, &h));
    h.fd = dup(h.fd);
    h.size = 1 << 20;
    assert_mp_err(mp__segment_open(&h, &o), MP_EPROTO);
    /* an undelivered handle: the sender's fd is borrowed, nothing to close */
    assert_mp_ok(mp__segment_export(s, &h));
    mp__segment_handle_drop(&h, false);
    assert_true(fcntl(mp__segment_fd(s), F_GETFD) >= 0);
    mp__segment_release(s);
    /* a received fd that is not a sealed memfd */
    int p[2];
    assert_int_equal(pipe(p), 0);
    h = (mp__segment_handle){.strategy = MP__STRATEGY_FD, .fd = p[0], .size = 1};
    assert_mp_err(mp__segment_open(&h, &o), MP_EPROTO);
    mp__close(p[1]);
    int m = memfd_create("x", MFD_CLOEXEC);
    assert_int_equal(ftruncate(m, 4096), 0);
    h = (mp__segment_handle){.strategy = MP__STRATEGY_FD, .fd = m, .size = 1};
    assert_mp_err(mp__segment_open(&h, &o), MP_EPROTO);
    assert_non_null(strstr(mp_last_error(), "sealed"));
    h = (mp__segment_handle){.strategy = 9, .fd = dup(0), .size = 1};
    assert_mp_err(mp__segment_open(&h, &o), MP_EPROTO);
    h = (mp__segment_handle){.strategy = MP__STRATEGY_FD, .fd = dup(0), .size = 1};
    mp__segment_handle_drop(&h, true); /* closes the received fd */
    assert_int_equal(h.fd, -1);
}

static int events[6];
static char order[64]; /* one letter per event: c o C u s r, ( ) for a batch */
static void note(char c)
{
    size_t n = strlen(order);
    if (n + 1 < sizeof order) {
        order[n] = c;
        order[n + 1] = '\0';
    }
}
static void ev_created(const char *n, uint64_t size)
{
    events[0]++;
    note('c');
}
static void ev_opened(const char *n)
{
    events[1]++;
    note('o');
}
static void ev_closed(const char *n)
{
    events[2]++;
    note('C');
}
static void ev_unlinked(const char *n)
{
    events[3]++;
    note('u');
}
static void ev_sent(const char *n)
{
    events[4]++;
    note('s');
}
static void ev_received(const char *n)
{
    events[5]++;
    note('r');
}

static void ev_batch(bool begin) { note(begin ? '(' : ')'); }

static void test_handles_fs_and_hooks(void **state)
{
    mp__shm_hooks hooks = {.created = ev_created, .opened = ev_opened, .closed = ev_closed,
                           .unlinked = ev_unlinked, .sent = ev_sent, .received = ev_received,
                           .batch = ev_batch};
    mp__segment *s, *o;
    mp__segment_handle h, h2;
    mp__fs_header *hd;
    int base = mp_test_count_shm();
    memset(events, 0, sizeof events);
    order[0] = '\0';
    mp__shm_set_hooks(&hooks);
    assert_mp_ok(mp__segment_create(64, MP__STRATEGY_FS, &s));
    assert_int_equal(events[0], 1);
    hd = (mp__fs_header *)((char *)mp__segment_data(s) - MP__FS_HEADER_SIZE);
    assert_mp_ok(mp__segment_export(s, &h));
    assert_int_equal(h.fd, -1);
    assert_string_equal(h.name, mp__segment_name(s));
    assert_int_equal(hd->refcount, 2); /* the message in flight holds one */
    assert_int_equal(events[4], 1);
    assert_mp_ok(mp__segment_open(&h, &o));
    assert_ptr_equal(o, s);
    assert_int_equal(hd->refcount, 1); /* adopted into this process's own */
    assert_int_equal(events[5], 1);
    mp__segment_release(o);
    /* an undelivered message gives its reference back */
    assert_mp_ok(mp__segment_export(s, &h2));
    assert_int_equal(hd->refcount, 2);
    mp__segment_handle_drop(&h2, false);
    assert_int_equal(hd->refcount, 1);
    mp__segment_handle_drop(&h2, false); /* twice: a no-op */
    assert_int_equal(hd->refcount, 1);
    /* a message outliving its sender keeps the name alive */
    assert_mp_ok(mp__segment_export(s, &h2));
    mp__segment_release(s);
    assert_int_equal(events[2], 1); /* closed */
    assert_int_equal(events[3], 0); /* not unlinked */
    assert_int_equal(mp_test_count_shm(), base + 1);
    assert_mp_ok(mp__segment_open(&h2, &o));
    assert_int_equal(events[1], 1); /* opened (a fresh mapping) */
    assert_int_equal(mp__segment_size(o), 64);
    mp__segment_release(o);
    assert_int_equal(events[3], 1);
    assert_int_equal(mp_test_count_shm(), base);
    /* create, send+receive (adopted), send+drop, send, closed, open, closed+unlinked;
     * what one call reports together is bracketed as a batch */
    assert_string_equal(order, "cs(r)ss(C)(or)(Cu)");
    /* a received message that cannot be delivered gives its reference back */
    assert_mp_ok(mp__segment_create(64, MP__STRATEGY_FS, &s));
    assert_mp_ok(mp__segment_export(s, &h2));
    mp__segment_release(s);
    assert_int_equal(mp_test_count_shm(), base + 1);
    mp__segment_handle_drop(&h2, true);
    assert_int_equal(mp_test_count_shm(), base);
    /* FD segments have no names and call no hooks */
    memset(events, 0, sizeof events);
    assert_mp_ok(mp__segment_create(64, MP__STRATEGY_FD, &s));
    mp__segment_release(s);
    for (int i = 0; i < 6; i++)
        assert_int_equal(events[i], 0);
}

static void test_fs_open_errors(void **state)
{
    mp__segment *o;
    mp__segment_handle h = {.strategy = MP__STRATEGY_FS, .fd = -1, .size = 8};
    char name[MP__SHM_NAME_MAX];
    strcpy(h.name, "/etc/passwd");
    assert_mp_err(mp__segment_open(&h, &o), MP_EPROTO);
    strcpy(h.name, "/mproc-1-../x");
    assert_mp_err(mp__segment_open(&h, &o), MP_EPROTO);
    snprintf(h.name, sizeof h.name, "/mproc-%d-0000000000000000", (int)getpid());
    assert_mp_err(mp__segment_open(&h, &o), MP_ENOENT);
    /* a segment with our prefix but not our header */
    snprintf(name, sizeof name, "/mproc-%d-deadbeefdeadbeef", (int)getpid());
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 8192), 0);
    mp__close(fd);
    strcpy(h.name, name);
    assert_mp_err(mp__segment_open(&h, &o), MP_EPROTO);
    assert_non_null(strstr(mp_last_error(), "header"));
    h.size = 1 << 20;
    strcpy(h.name, name);
    assert_mp_err(mp__segment_open(&h, &o), MP_EPROTO);
    shm_unlink(name);
}

/* ---- faults: the right code and message, nothing leaked ------------------- */

static void expect_fault(const char *call, int err, int strategy, int code, const char *text)
{
    mp__segment *s = (mp__segment *)0x1;
    int base = mp_test_count_shm();
    assert_mp_ok(mp__sys_fault(call, err, 0, 1));
    assert_mp_err(mp__segment_create(1 << 16, strategy, &s), code);
    if (text && !strstr(mp_last_error(), text))
        fail_msg("%s: \"%s\" lacks \"%s\"", call, mp_last_error(), text);
    assert_null(s);
    mp__sys_fault_reset();
    assert_int_equal(mp__segment_count(), 0);
    assert_int_equal(mp_test_count_shm(), base);
}

static void test_create_faults(void **state)
{
    const int fd = MP__STRATEGY_FD, fs = MP__STRATEGY_FS;
    expect_fault("memfd_create", EMFILE, fd, MP_EMFILE, "ulimit");
    expect_fault("memfd_create", ENOMEM, fd, MP_ENOMEM, "memfd_create");
    expect_fault("ftruncate", ENOSPC, fd, MP_ENOSPC, "/dev/shm has");
    expect_fault("ftruncate", EIO, fd, MP_ESYS, "ftruncate");
    expect_fault("madvise", EFAULT, fd, MP_ENOSPC, "needs 65536 bytes");
    expect_fault("madvise", ENOMEM, fd, MP_ENOMEM, "/dev/shm has");
    expect_fault("fcntl", EBUSY, fd, MP_ESYS, "F_ADD_SEALS");
    expect_fault("mmap", ENOMEM, fd, MP_ENOMEM, "mmap");
    expect_fault("fstat", EIO, fd, MP_ESYS, "fstat");
    expect_fault("shm_open", EMFILE, fs, MP_EMFILE, "file_system");
    expect_fault("shm_open", EACCES, fs, MP_EPERM, "shm_open");
    expect_fault("ftruncate", ENOSPC, fs, MP_ENOSPC, "free");
    expect_fault("madvise", EFAULT, fs, MP_ENOSPC, "needs");
    expect_fault("madvise", EIO, fs, MP_ESYS, "MADV_POPULATE_WRITE");
    expect_fault("mmap", ENOMEM, fs, MP_ENOMEM, "mmap");
}

/* Without memfd (old kernels, seccomp) the fd strategy falls back to an
 * immediately unlinked POSIX segment, which a receiver accepts. */
static void test_memfd_fallback(void **state)
{
    mp__segment *s, *o;
    mp__segment_handle h;
    struct stat st;
    int base = mp_test_count_shm();
    assert_mp_ok(mp__sys_fault("memfd_create", ENOSYS, 0, 1));
    assert_mp_ok(mp__segment_create(4096, MP__STRATEGY_FD, &s));
    assert_int_equal(mp_test_count_shm(), base);
    assert_int_equal(fstat(mp__segment_fd(s), &st), 0);
    assert_int_equal(st.st_nlink, 0);
    assert_false(fcntl(mp__segment_fd(s), F_GET_SEALS) & F_SEAL_SHRINK);
    assert_mp_ok(mp__segment_export(s, &h));
    h.fd = dup(h.fd);
    mp__segment_release(s);
    assert_mp_ok(mp__segment_open(&h, &o)); /* a fresh mapping (cache miss) */
    mp__segment_release(o);
}

static void test_open_faults(void **state)
{
    mp__segment *s, *o;
    mp__segment_handle h;
    int base = mp_test_count_shm();
    assert_mp_ok(mp__segment_create(4096, MP__STRATEGY_FD, &s));
    assert_mp_ok(mp__segment_export(s, &h));
    h.fd = dup(h.fd);
    mp__segment_release(s); /* so the open below misses the cache */
    assert_mp_ok(mp__sys_fault("mmap", ENOMEM, 0, 1));
    assert_mp_err(mp__segment_open(&h, &o), MP_ENOMEM);
    assert_int_equal(h.fd, -1); /* closed */

    assert_mp_ok(mp__segment_create(4096, MP__STRATEGY_FS, &s));
    assert_mp_ok(mp__segment_export(s, &h));
    mp__segment_release(s);
    assert_int_equal(mp_test_count_shm(), base + 1); /* held by the handle */
    assert_mp_ok(mp__sys_fault("mmap", ENOMEM, 0, 1));
    assert_mp_err(mp__segment_open(&h, &o), MP_ENOMEM);
    assert_non_null(strstr(mp_last_error(), "mmap"));
    assert_int_equal(mp_test_count_shm(), base); /* the failed open gave it back */
}

/* A name this process maps already is found by name, without shm_open; a
 * name it does not map still goes through shm_open. */
static void test_fs_open_by_name(void **state)
{
    mp__segment *s, *o;
    mp__segment_handle h;
    mp__fs_header *hd;
    int base = mp_test_count_shm();
    assert_mp_ok(mp__segment_create(4096, MP__STRATEGY_FS, &s));
    hd = (mp__fs_header *)((char *)mp__segment_data(s) - MP__FS_HEADER_SIZE);
    for (int i = 0; i < 3; i++) {
        assert_mp_ok(mp__segment_export(s, &h));
        assert_mp_ok(mp__sys_fault("shm_open", EACCES, 0, 1)); /* would fail the open */
        assert_mp_ok(mp__segment_open(&h, &o));
        mp__sys_fault_reset();
        assert_ptr_equal(o, s);
        assert_int_equal(hd->refcount, 1); /* the in-flight reference folded in */
        mp__segment_release(o);
    }
    /* a handle claiming more than the mapped segment holds */
    assert_mp_ok(mp__segment_export(s, &h));
    h.size = 8192;
    assert_mp_err(mp__segment_open(&h, &o), MP_EPROTO);
    assert_non_null(strstr(mp_last_error(), "4096-byte"));
    mp__segment_handle_drop(&h, true);
    assert_int_equal(hd->refcount, 1);
    /* not mapped here any more: shm_open runs (and its failure shows) */
    assert_mp_ok(mp__segment_export(s, &h));
    mp__segment_release(s);
    assert_mp_ok(mp__sys_fault("shm_open", EACCES, 0, 1));
    assert_mp_err(mp__segment_open(&h, &o), MP_EPERM);
    mp__sys_fault_reset();
    assert_int_equal(mp_test_count_shm(), base);
}

/* A request larger than /dev/shm's free space: MP_ENOSPC naming both sizes,
 * under each strategy, before any memory is touched. */
static void test_real_enospc(void **state)
{
    struct statvfs v;
    mp_tensor *t = NULL;
    int base = mp_test_count_shm();
    assert_int_equal(statvfs("/dev/shm", &v), 0);
    int64_t n = (int64_t)(v.f_bavail * v.f_frsize) + (1 << 20);
    for (int i = 0; i < 2; i++) {
        assert_mp_ok(mp_set_sharing_strategy(i ? "file_system" : "file_descriptor"));
        assert_mp_err(mp_tensor_empty_shared(MP_UINT8, 1, &n, &t), MP_ENOSPC);
        assert_null(t);
        const char *needs = strstr(mp_last_error(), "needs ");
        long long need = 0, avail = -1;
        if (!needs ||
            sscanf(needs, "needs %lld bytes, /dev/shm has %lld free", &need, &avail) != 2 ||
            need < n || avail < 0 || avail >= need)
            fail_msg("bad sentence: \"%s\"", mp_last_error());
        assert_int_equal(mp_test_count_shm(), base);
    }
    mp_set_sharing_strategy("file_descriptor");
}

static void test_share_fault_keeps_tensor(void **state)
{
    int64_t n = 1000;
    mp_tensor *t;
    assert_mp_ok(mp_tensor_empty(MP_INT32, 1, &n, &t));
    ((int32_t *)mp_tensor_data(t))[999] = 7;
    uint64_t copies = mp_test_tensor_stats().shared_copies;
    assert_mp_ok(mp__sys_fault("pwritev", ENOSPC, 0, 1));
    assert_mp_err(mp_tensor_share_memory_(t), MP_ENOSPC);
    assert_false(mp_tensor_is_shared(t));
    assert_int_equal(((int32_t *)mp_tensor_data(t))[999], 7);
    assert_int_equal(mp_test_tensor_stats().shared_copies, copies);
    assert_mp_ok(mp_tensor_share_memory_(t));
    assert_true(mp_tensor_is_shared(t));
    assert_int_equal(((int32_t *)mp_tensor_data(t))[999], 7);
    mp_tensor_release(t);
}

/* Threads opening and releasing one segment through the cache at once: one
 * mapping throughout, every reference returned. */
static mp__segment *shared_seg;

static void *open_release_loop(void *arg)
{
    for (int i = 0; i < 300; i++) {
        mp__segment_handle h;
        mp__segment *o;
        if (mp__segment_export(shared_seg, &h) != 0)
            return (void *)1;
        if (h.fd >= 0)
            h.fd = dup(h.fd);
        if (mp__segment_open(&h, &o) != 0 || o != shared_seg)
            return (void *)2;
        mp__segment_release(o);
    }
    return NULL;
}

static void test_cache_threads(void **state)
{
    pthread_t th[4];
    for (int k = 0; k < 2; k++) {
        assert_mp_ok(mp__segment_create(4096, k ? MP__STRATEGY_FS : MP__STRATEGY_FD, &shared_seg));
        for (int i = 0; i < 4; i++)
            assert_int_equal(pthread_create(&th[i], NULL, open_release_loop, NULL), 0);
        for (int i = 0; i < 4; i++) {
            void *r;
            pthread_join(th[i], &r);
            assert_null(r);
        }
        assert_int_equal(mp__segment_count(), 1);
        if (k)
            assert_int_equal(
                ((mp__fs_header *)((char *)mp__segment_data(shared_seg) - MP__FS_HEADER_SIZE))
                    ->refcount,
                1);
        mp__segment_release(shared_seg);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_strategies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fd_segment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fs_segment, setup, teardown),
        cmocka_unit_test_setup_teardown(test_handles_fd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_handles_fs_and_hooks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fs_open_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_create_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memfd_fallback, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_faults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fs_open_by_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_real_enospc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_share_fault_keeps_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cache_threads, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
