/* The shared reference-count segment (see refseg.h). */
#include "cuda/refseg.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HEADER_SIZE 4096u
enum { PRODUCER_RUNNING = 1, PRODUCER_EXITED = 2 };

typedef struct refseg_header {
    uint64_t magic;
    uint32_t version;
    uint32_t producer_pid;
    uint64_t producer_start;  /* /proc starttime: a reused pid is not the producer */
    uint32_t nslots;
    uint32_t nrefs;
    _Atomic uint32_t producer_state;
    _Atomic uint32_t hwm;     /* words [0, hwm) may be in use */
} refseg_header;

struct mp__refseg {
    int fd;
    void *map;
    size_t size;
    refseg_header *hdr;
    _Atomic uint64_t *refs;
    dev_t dev;
    ino_t ino;
    int refcount;             /* under lock */
    bool owner;
    uint32_t owner_pid;
    /* owner only */
    uint16_t *gen;
    uint8_t *used;
    uint32_t *tally;
    uint32_t in_use;
    uint32_t next_slot;
    mp__refseg *next;         /* open list */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static mp__refseg *open_list;
static int open_count;

/* Field 22 of /proc/<pid>/stat (start time in clock ticks) and the state
 * letter; 0 when the process is gone. */
static uint64_t pid_start(uint32_t pid, char *state)
{
    char path[64], buf[1024];
    unsigned long long start = 0;
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* comm may hold spaces and parentheses */
    if (!p || sscanf(p + 1, " %c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d "
                            "%*d %*d %*d %llu", state, &start) != 2)
        return 0;
    return start;
}

/* Alive means running, stopped or sleeping: a zombie has unmapped
 * everything, so its references count for nothing. With one read of
 * /proc/<pid>/stat, also its start time (0 when unreadable). */
static bool pid_alive_since(uint32_t pid, uint64_t *start)
{
    char state = '?';
    *start = 0;
    if (pid == 0)
        return false;
    if (kill((pid_t)pid, 0) < 0 && errno == ESRCH)
        return false;
    if ((*start = pid_start(pid, &state)) == 0)
        return errno != ENOENT; /* unreadable /proc: trust kill() */
    return state != 'Z' && state != 'X';
}

static bool pid_alive(uint32_t pid)
{
    uint64_t start;
    return pid_alive_since(pid, &start);
}

/* Small per-scan memo, since one consumer usually holds many words. */
typedef struct pid_memo {
    uint32_t pid[16];
    bool alive[16];
    int n;
} pid_memo;

static bool memo_alive(pid_memo *m, uint32_t pid)
{
    for (int i = 0; i < m->n; i++)
        if (m->pid[i] == pid)
            return m->alive[i];
    bool alive = pid_alive(pid);
    int i = m->n < 16 ? m->n++ : (int)(pid % 16);
    m->pid[i] = pid;
    m->alive[i] = alive;
    return alive;
}

static size_t segment_size(uint32_t nrefs)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t bytes = HEADER_SIZE + (size_t)nrefs * sizeof(uint64_t);
    return (bytes + page - 1) / page * page;
}

static void destroy(mp__refseg *seg)
{
    if (seg->map)
        mp__sys.munmap(seg->map, seg->size);
    mp__close(seg->fd);
    free(seg->gen);
    free(seg->used);
    free(seg->tally);
    free(seg);
}

static int map_fd(mp__refseg *seg)
{
    seg->map = mp__sys.mmap(NULL, seg->size, PROT_READ | PROT_WRITE, MAP_SHARED, seg->fd, 0);
    if (seg->map == MAP_FAILED) {
        seg->map = NULL;
        return mp__errno_error(errno, "CUDA reference segment: mmap of %zu bytes failed",
                               seg->size);
    }
    seg->hdr = seg->map;
    seg->refs = (_Atomic uint64_t *)((char *)seg->map + HEADER_SIZE);
    return 0;
}

static int owner_arrays(mp__refseg *seg, uint32_t nslots)
{
    seg->gen = calloc(nslots, sizeof *seg->gen);
    seg->used = calloc(nslots, 1);
    seg->tally = calloc(nslots, sizeof *seg->tally);
    if (!seg->gen || !seg->used || !seg->tally)
        return mp__error(MP_ENOMEM, "CUDA reference segment: out of memory for %u slots",
                         nslots);
    return 0;
}

int mp__refseg_create(uint32_t nslots, uint32_t nrefs, mp__refseg **out)
{
    struct stat st;
    char state;
    int rc;
    if (!out || nslots == 0 || nslots > MP__REFSEG_MAX_SLOTS || nrefs == 0 ||
        nrefs > MP__REFSEG_MAX_REFS)
        return mp__error(MP_EINVAL, "mp__refseg_create: need 1..%u slots and 1..%u references",
                         MP__REFSEG_MAX_SLOTS, MP__REFSEG_MAX_REFS);
    mp__refseg *seg = calloc(1, sizeof *seg);
    if (!seg)
        return mp__error(MP_ENOMEM, "mp__refseg_create: out of memory");
    seg->fd = -1;
    seg->size = segment_size(nrefs);
    seg->owner = true;
    seg->owner_pid = (uint32_t)mp__pid();
    seg->refcount = 1;
    if ((rc = owner_arrays(seg, nslots)) < 0)
        goto out_destroy;
    seg->fd = mp__sys.memfd_create("mproc-cuda-refs", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (seg->fd < 0) {
        rc = mp__errno_error(errno, "CUDA reference segment: memfd_create failed");
        goto out_destroy;
    }
    /* Allocate now: a full /dev/shm is an error here, not a SIGBUS later. */
    if ((rc = mp__sys.posix_fallocate(seg->fd, 0, (off_t)seg->size)) != 0) {
        rc = mp__errno_error(rc, "CUDA reference segment: reserving %zu bytes failed",
                             seg->size);
        goto out_destroy;
    }
    if (mp__sys.fcntl(seg->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0 ||
        mp__sys.fstat(seg->fd, &st) < 0) {
        rc = mp__errno_error(errno, "CUDA reference segment: sealing failed");
        goto out_destroy;
    }
    seg->dev = st.st_dev;
    seg->ino = st.st_ino;
    if ((rc = map_fd(seg)) < 0)
        goto out_destroy;
    seg->hdr->magic = MP__REFSEG_MAGIC;
    seg->hdr->version = MP__REFSEG_VERSION;
    seg->hdr->producer_pid = seg->owner_pid;
    seg->hdr->producer_start = pid_start(seg->owner_pid, &state);
    seg->hdr->nslots = nslots;
    seg->hdr->nrefs = nrefs;
    atomic_store(&seg->hdr->producer_state, PRODUCER_RUNNING);
    pthread_mutex_lock(&lock);
    seg->next = open_list;
    open_list = seg;
    open_count++;
    pthread_mutex_unlock(&lock);
    *out = seg;
    return 0;
out_destroy:
    destroy(seg);
    return rc;
}

static int validate(mp__refseg *seg, const struct stat *st)
{
    int seals = mp__sys.fcntl(seg->fd, F_GET_SEALS, 0);
    if (seals < 0 || !(seals & F_SEAL_SHRINK))
        return mp__error(MP_EPROTO, "CUDA tensor attachment: the reference segment fd is not "
                                    "a memfd sealed against shrinking");
    if (st->st_size < (off_t)HEADER_SIZE)
        return mp__error(MP_EPROTO, "CUDA tensor attachment: reference segment of %lld bytes "
                                    "is too small", (long long)st->st_size);
    return 0;
}

static int validate_header(const mp__refseg *seg)
{
    const refseg_header *h = seg->hdr;
    if (h->magic != MP__REFSEG_MAGIC || h->version != MP__REFSEG_VERSION)
        return mp__error(MP_EPROTO, "CUDA tensor attachment: bad reference segment header "
                                    "(magic or version %u)", h->version);
    if (h->nslots == 0 || h->nslots > MP__REFSEG_MAX_SLOTS || h->nrefs == 0 ||
        h->nrefs > MP__REFSEG_MAX_REFS || segment_size(h->nrefs) > seg->size ||
        h->producer_pid == 0)
        return mp__error(MP_EPROTO, "CUDA tensor attachment: reference segment header "
                                    "(%u slots, %u references) does not fit its %zu bytes",
                         h->nslots, h->nrefs, seg->size);
    return 0;
}

int mp__refseg_open(int fd, mp__refseg **out)
{
    struct stat st;
    int rc;
    if (fd < 0 || !out) {
        mp__close(fd);
        return mp__error(MP_EINVAL, "mp__refseg_open: need an fd and an out pointer");
    }
    if (mp__sys.fstat(fd, &st) < 0) {
        rc = mp__errno_error(errno, "CUDA tensor attachment: fstat of the reference segment");
        mp__close(fd);
        return rc;
    }
    pthread_mutex_lock(&lock);
    for (mp__refseg *s = open_list; s; s = s->next) {
        if (s->dev == st.st_dev && s->ino == st.st_ino) {
            s->refcount++;
            pthread_mutex_unlock(&lock);
            mp__close(fd);
            *out = s;
            return 0;
        }
    }
    mp__refseg *seg = calloc(1, sizeof *seg);
    if (!seg) {
        pthread_mutex_unlock(&lock);
        mp__close(fd);
        return mp__error(MP_ENOMEM, "CUDA tensor attachment: out of memory");
    }
    seg->fd = fd;
    seg->dev = st.st_dev;
    seg->ino = st.st_ino;
    seg->size = (size_t)st.st_size;
    seg->refcount = 1;
    if ((rc = validate(seg, &st)) < 0 || (rc = map_fd(seg)) < 0 ||
        (rc = validate_header(seg)) < 0) {
        pthread_mutex_unlock(&lock);
        destroy(seg);
        return rc;
    }
    seg->next = open_list;
    open_list = seg;
    open_count++;
    pthread_mutex_unlock(&lock);
    *out = seg;
    return 0;
}

mp__refseg *mp__refseg_retain(mp__refseg *seg)
{
    if (seg) {
        pthread_mutex_lock(&lock);
        seg->refcount++;
        pthread_mutex_unlock(&lock);
    }
    return seg;
}

void mp__refseg_release(mp__refseg *seg)
{
    if (!seg)
        return;
    pthread_mutex_lock(&lock);
    if (--seg->refcount > 0) {
        pthread_mutex_unlock(&lock);
        return;
    }
    for (mp__refseg **p = &open_list; *p; p = &(*p)->next) {
        if (*p == seg) {
            *p = seg->next;
            open_count--;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    destroy(seg);
}

int mp__refseg_open_count(void)
{
    pthread_mutex_lock(&lock);
    int n = open_count;
    pthread_mutex_unlock(&lock);
    return n;
}

int mp__refseg_fd(const mp__refseg *seg) { return seg->fd; }
uint32_t mp__refseg_producer_pid(const mp__refseg *seg) { return seg->hdr->producer_pid; }
uint32_t mp__refseg_nslots(const mp__refseg *seg) { return seg->hdr->nslots; }

/* A forked child inherits the object but is not the producer. */
bool mp__refseg_is_owner(const mp__refseg *seg)
{
    return seg->owner && seg->owner_pid == (uint32_t)mp__pid();
}

bool mp__refseg_producer_alive(const mp__refseg *seg)
{
    uint64_t start;
    if (atomic_load(&seg->hdr->producer_state) != PRODUCER_RUNNING)
        return false;
    if (seg->hdr->producer_pid == (uint32_t)mp__pid())
        return true;
    if (!pid_alive_since(seg->hdr->producer_pid, &start))
        return false;
    /* the same pid, but not the same process? */
    return start == 0 || seg->hdr->producer_start == 0 || start == seg->hdr->producer_start;
}

void mp__refseg_mark_exited(mp__refseg *seg)
{
    if (seg && mp__refseg_is_owner(seg))
        atomic_store(&seg->hdr->producer_state, PRODUCER_EXITED);
}

int mp__refseg_check_producer(const mp__refseg *seg, const char *caller)
{
    if (mp__refseg_producer_alive(seg))
        return 0;
    return mp__error(MP_ECLOSED, "%s: the process that allocated this CUDA tensor (pid %u) has "
                                 "exited, so its device memory may be gone; the producer must "
                                 "outlive the consumers of its CUDA tensors (release received "
                                 "tensors before it exits)", caller, seg->hdr->producer_pid);
}

/* ---- slots (owner only) ------------------------------------------------ */

int mp__refseg_slot_alloc(mp__refseg *seg, uint32_t *slot, uint32_t *gen)
{
    uint32_t n = seg->hdr->nslots;
    if (!mp__refseg_is_owner(seg))
        return mp__error(MP_ESTATE, "mp__refseg_slot_alloc: only the producer allocates slots");
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = (seg->next_slot + k) % n;
        if (!seg->used[i]) {
            seg->used[i] = 1;
            seg->in_use++;
            seg->next_slot = (i + 1) % n;
            *slot = i;
            *gen = seg->gen[i];
            return 0;
        }
    }
    return mp__error(MP_ENOSPC, "sending a CUDA tensor: all %u shared-allocation slots of this "
                                "process are in use; consumers must release received tensors "
                                "(and the producer call mp_cuda_ipc_collect) first", n);
}

void mp__refseg_slot_free(mp__refseg *seg, uint32_t slot)
{
    if (!mp__refseg_is_owner(seg) || slot >= seg->hdr->nslots || !seg->used[slot])
        return;
    seg->used[slot] = 0;
    seg->gen[slot] = (uint16_t)(seg->gen[slot] + 1);
    seg->in_use--;
}

uint32_t mp__refseg_slots_in_use(const mp__refseg *seg) { return seg->in_use; }

/* ---- references (any process) ------------------------------------------ */

static void raise_hwm(mp__refseg *seg, uint32_t end)
{
    uint32_t cur = atomic_load(&seg->hdr->hwm);
    while (cur < end && !atomic_compare_exchange_weak(&seg->hdr->hwm, &cur, end))
        ;
}

int mp__refseg_ref_add(mp__refseg *seg, uint32_t slot, uint32_t gen, uint32_t pid,
                       uint32_t *ref, uint64_t *word)
{
    static _Atomic uint32_t hint; /* where this process last found room */
    uint32_t n = seg->hdr->nrefs;
    uint64_t w = mp__refword(pid, slot, gen);
    if (pid == 0 || slot >= seg->hdr->nslots)
        return mp__error(MP_EINVAL, "mp__refseg_ref_add: bad pid or slot %u", slot);
    uint32_t start = atomic_load(&hint) % n;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = (start + k) % n;
        uint64_t expected = 0;
        if (atomic_load_explicit(&seg->refs[i], memory_order_relaxed) != 0)
            continue;
        if (atomic_compare_exchange_strong(&seg->refs[i], &expected, w)) {
            raise_hwm(seg, i + 1);
            atomic_store(&hint, i + 1);
            *ref = i;
            *word = w;
            return 0;
        }
    }
    return mp__error(MP_ENOSPC, "sending a CUDA tensor: all %u reference entries of the "
                                "producer (pid %u) are taken; consumers must release received "
                                "tensors first", n, seg->hdr->producer_pid);
}

int mp__refseg_ref_adopt(mp__refseg *seg, uint32_t ref, uint64_t expected, uint32_t pid,
                         uint64_t *word)
{
    if (ref >= seg->hdr->nrefs)
        return mp__error(MP_EPROTO, "CUDA tensor attachment: reference %u out of range (%u)",
                         ref, seg->hdr->nrefs);
    uint64_t w = mp__refword(pid, mp__refword_slot(expected), mp__refword_gen(expected));
    if (expected == 0 || !atomic_compare_exchange_strong(&seg->refs[ref], &expected, w))
        return mp__error(MP_ECLOSED, "receiving a CUDA tensor: the reference its message "
                                     "carried was reclaimed because the sender (pid %u) exited "
                                     "before it was received", mp__refword_pid(expected));
    *word = w;
    return 0;
}

int mp__refseg_ref_drop(mp__refseg *seg, uint32_t ref, uint64_t word)
{
    if (ref >= seg->hdr->nrefs || word == 0 ||
        !atomic_compare_exchange_strong(&seg->refs[ref], &word, 0))
        return mp__error(MP_ESTATE, "releasing a CUDA tensor: reference %u was already "
                                    "reclaimed", ref);
    return 0;
}

int mp__refseg_count(mp__refseg *seg, uint32_t slot, uint32_t gen)
{
    pid_memo memo = {.n = 0};
    uint32_t hwm = atomic_load(&seg->hdr->hwm);
    int count = 0;
    if (hwm > seg->hdr->nrefs)
        hwm = seg->hdr->nrefs;
    for (uint32_t i = 0; i < hwm; i++) {
        uint64_t w = atomic_load(&seg->refs[i]);
        if (w && mp__refword_slot(w) == slot && mp__refword_gen(w) == (gen & 0xffffu) &&
            memo_alive(&memo, mp__refword_pid(w)))
            count++;
    }
    return count;
}

int mp__refseg_scan(mp__refseg *seg, size_t *reclaimed)
{
    pid_memo memo = {.n = 0};
    uint32_t hwm = atomic_load(&seg->hdr->hwm);
    size_t dead = 0;
    if (!mp__refseg_is_owner(seg))
        return mp__error(MP_ESTATE, "mp__refseg_scan: only the producer scans its segment");
    if (hwm > seg->hdr->nrefs)
        hwm = seg->hdr->nrefs;
    memset(seg->tally, 0, seg->hdr->nslots * sizeof *seg->tally);
    for (uint32_t i = 0; i < hwm; i++) {
        uint64_t w = atomic_load(&seg->refs[i]);
        if (!w)
            continue;
        uint32_t slot = mp__refword_slot(w);
        if (!memo_alive(&memo, mp__refword_pid(w))) {
            /* CAS: the word may have been dropped or adopted meanwhile. */
            dead += atomic_compare_exchange_strong(&seg->refs[i], &w, 0);
            continue;
        }
        if (slot < seg->hdr->nslots && seg->used[slot] && mp__refword_gen(w) == seg->gen[slot])
            seg->tally[slot]++;
    }
    if (reclaimed)
        *reclaimed = dead;
    return 0;
}

uint32_t mp__refseg_tally(const mp__refseg *seg, uint32_t slot)
{
    return slot < seg->hdr->nslots ? seg->tally[slot] : 0;
}

uint32_t mp__refseg_referenced_slots(const mp__refseg *seg)
{
    uint32_t n = 0;
    if (!mp__refseg_is_owner(seg))
        return 0;
    for (uint32_t i = 0; i < seg->hdr->nslots; i++)
        n += seg->used[i] && seg->tally[i] > 0;
    return n;
}
