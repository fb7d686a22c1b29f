/* Handoff without an fd.
 *
 * Sending a file_descriptor storage costs an fd passed with SCM_RIGHTS: the
 * socket path, and an fstat and close at the receiver even when it maps the
 * segment already. When a process sends the same storage to the same end
 * again and again (a reused batch buffer, a ring of them, a state_dict sent
 * every step), the receiving end pins it instead, and senders name the pin.
 *
 * The table. Each receiving end has a table of MP__PIN_SLOTS pins in its
 * control segment, beside its reader lock. One process owns a table: the
 * first that pins into it. A pin is (dev, ino) of a segment the owner keeps
 * mapped (a reference and its fd held in this file's local entry), a
 * state word (a generation, a LIVE bit and the count of messages sent that
 * name the pin), and the count of those received, done[], on another cache
 * line: senders write one, receivers the other, so a handoff moves no line
 * between them but the ring's. In flight = sent - done. A segment is
 * pinned when it arrives by fd for the
 * second time, so a stream of new storages never pins (nothing extra stays
 * mapped for it); slots are found by hashing (dev, ino).
 *
 * Lifetime. A sender that finds its segment's (dev, ino) in a LIVE pin
 * counts its message sent by a compare-and-swap of the exact state it read
 * (so the owner cannot have let go of the pin meanwhile) and sends (slot,
 * gen) with no fd. The receiver maps the segment from its own pin and then
 * counts it done. The owner unpins only by a compare-and-swap of the state
 * it read, when done equals its sent count (done only grows, up to sent):
 * a pin named by a message in flight is never let
 * go, so the segment outlives every message naming it, as an fd in flight
 * would keep it. Every field is read with sequentially consistent loads
 * between the state's load and its compare-and-swap, so a sender never
 * names a pin whose fields it read half old and half new.
 *
 * Several receivers. A sender does not know which process takes its
 * message. Pins are for the ends that one process receives on; a second
 * process that takes a message naming a pin, or that receives a storage by
 * fd, turns the table off for good (owner = MP__PINS_OFF), and later sends
 * carry fds again. A message named a pin before that still resolves: from
 * the second process's own mapping cache (a fork child inherits its
 * parent's), else through /proc/<owner>/fd/<fd> (the owner keeps the pin
 * while the message is in flight), else through the sender's fd, which the
 * message names too. Only when the owner died and the sender no longer holds
 * the storage is the message lost, with MP_EBROKEN.
 *
 * Crashes. A sender killed between taking a count and publishing its
 * message leaves the count: that pin is never let go, and stays mapped in
 * the owner until it releases its last handle of the end. A receiver killed
 * after taking a message and before giving its count back: the same. A
 * killed owner leaves its pins to nobody; a later process that receives
 * there turns the table off.
 *
 * Idle pins. A pin no message named in the last IDLE_RECEIVES receives of
 * its end is let go at the next sweep, so a stream that moves on to other
 * storages does not keep old ones mapped; the owner's last handle of the
 * end lets go of all of them.
 *
 * Kept mappings. A file_system storage needs no fd, but a receiver that
 * lets go of it between arrivals maps it again each time; its end keeps a
 * mapping of it in a slot of the same table (pins_keep.c), which senders
 * never name, let go idle, dead or with the end as a pin is.
 *
 * Keepsakes. The owner may leave an object of a layer above with a pin (the
 * compact decoder's tensor over it, handed out again while nobody holds
 * it); it is released when the pin is let go, once this file's lock is.
 *
 * Locking. This file's lock guards the list of entries and every entry,
 * except on the owner's path of a compact record: its caller holds the
 * end's reader lock, under which every change to that end's entry is made
 * too (receives pin, sweep and take), but for its last release (when no
 * receive can run on it) and a fork child's disowning (whose entry shows
 * its parent's pid). That path takes no lock: it finds its entry by the
 * one this thread used last, unless an entry was freed since. */
#include "shm/pins_local.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define IDLE_RECEIVES 1024u /* a pin unnamed this long is let go */
#define SWEEP_EVERY 64u

typedef mp__pins_local local;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static local *locals;
static int held;
/* Keepsakes of pins let go under lock, released once it is let go: their
 * release takes locks that come before this one (tensor storages). One
 * locked section lets go of at most the pins of one table, twice over. */
typedef struct keepsake {
    void *obj;
    void (*release)(void *);
} keepsake;
static keepsake doomed[2 * MP__PIN_SLOTS];
static unsigned ndoomed;
/* Storages received by a pin: by the pins of ends let go (locals freed),
 * and by any other way (a second receiver's); each live local counts its
 * own. */
static uint64_t by_own_pin, reused_retired;
static atomic_ullong by_pin;
/* The owner's path without this file's lock (mp__pins_open): the table and
 * entry this thread last took a pin of, good while no entry was freed
 * since (epoch, bumped under lock before a free). */
static atomic_ullong epoch;
static _Thread_local struct {
    mp__pins *table;
    local *l;
    unsigned long long epoch;
} hot;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void before_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork(void) { pthread_mutex_unlock(&lock); }
static void init(void)
{
    static const mp__fork_handlers h = {before_fork, after_fork, after_fork};
    mp__atfork_register(MP__FORK_SHM_PINS, &h);
}

void mp__pins_lock(void)
{
    pthread_once(&once, init);
    pthread_mutex_lock(&lock);
}

static void doom(void *obj, void (*release)(void *))
{
    if (obj && ndoomed < sizeof doomed / sizeof doomed[0])
        doomed[ndoomed++] = (keepsake){obj, release};
}

/* Lets go of lock, then releases what the section doomed. */
void mp__pins_unlock(void)
{
    keepsake d[sizeof doomed / sizeof doomed[0]];
    unsigned n = ndoomed;
    if (n == 0) {
        pthread_mutex_unlock(&lock);
        return;
    }
    memcpy(d, doomed, n * sizeof d[0]);
    ndoomed = 0;
    pthread_mutex_unlock(&lock);
    for (unsigned i = 0; i < n; i++)
        d[i].release(d[i].obj);
}

static uint32_t gen_of(uint64_t state) { return (uint32_t)(state >> 32); }

unsigned mp__pins_home(uint64_t dev, uint64_t ino)
{
    uint64_t h = (dev * 0x9e3779b97f4a7c15ull) ^ (ino * 0xc2b2ae3d27d4eb4full);
    return (unsigned)(h >> 40) & (MP__PIN_SLOTS - 1);
}

void mp__pins_init(mp__pins *p)
{
    atomic_init(&p->owner, 0);
    for (unsigned i = 0; i < MP__PIN_SLOTS; i++) {
        atomic_init(&p->done[i], 0);
        atomic_init(&p->slot[i].state, 0);
        atomic_init(&p->slot[i].dev, 0);
        atomic_init(&p->slot[i].ino, 0);
        atomic_init(&p->slot[i].fd, -1);
    }
}

/* ---- senders ----------------------------------------------------------------- */

bool mp__pins_reserve(mp__pins *p, const mp__segment *s, mp__pin_ref *ref)
{
    uint64_t dev = (uint64_t)s->dev, ino = (uint64_t)s->ino;
    unsigned h = mp__pins_home(dev, ino);
    if (s->strategy != MP__STRATEGY_FD ||
        atomic_load_explicit(&p->owner, memory_order_relaxed) <= 0)
        return false;
    for (unsigned k = 0; k < MP__PINS_PROBE; k++) {
        mp__pin *pin = &p->slot[(h + k) & (MP__PIN_SLOTS - 1)];
        uint64_t st = atomic_load(&pin->state);
        while ((st & MP__PIN_LIVE) && (st & MP__PIN_SENT) < MP__PIN_SENT &&
               atomic_load(&pin->dev) == dev && atomic_load(&pin->ino) == ino) {
            if (atomic_compare_exchange_weak(&pin->state, &st, st + 1)) {
                *ref = (mp__pin_ref){.slot = (h + k) & (MP__PIN_SLOTS - 1),
                                     .gen = gen_of(st), .sender_pid = mp__pid(),
                                     .sender_fd = s->fd, .dev = dev, .ino = ino};
                return true;
            }
        }
    }
    return false;
}

/* Counts one message naming ref as done, if ref still names the pin with a
 * message in flight. */
static bool give_back(mp__pins *p, const mp__pin_ref *ref)
{
    uint64_t st = atomic_load(&p->slot[ref->slot].state);
    _Atomic uint32_t *done = &p->done[ref->slot];
    uint32_t d = atomic_load(done);
    while (gen_of(st) == ref->gen && (st & MP__PIN_LIVE) && (st & MP__PIN_SENT) > d)
        if (atomic_compare_exchange_weak(done, &d, d + 1))
            return true;
    return false;
}

void mp__pins_unreserve(mp__pins *p, const mp__pin_ref *ref)
{
    (void)give_back(p, ref);
}

/* ---- this process's entries (under lock) ------------------------------------ */

static local *find(mp__pins *p)
{
    for (local *l = locals; l; l = l->next)
        if (l->table == p)
            return l;
    return NULL;
}

/* Lets go of slot i's pin: false when a message in flight names it. */
static bool unpin(local *l, unsigned i, bool owner)
{
    mp__pin *pin = &l->table->slot[i];
    bool clean = true;
    if (!l->seg[i])
        return true;
    if (owner) {
        /* state first: done only grows, up to what state counts as sent,
         * and the exchange fails if a send came in between */
        uint64_t st = atomic_load(&pin->state);
        clean = (st & MP__PIN_LIVE) && (st & MP__PIN_SENT) == atomic_load(&l->table->done[i]) &&
                atomic_compare_exchange_strong(&pin->state, &st, st & ~MP__PIN_LIVE);
    }
    if (!clean)
        return false;
    doom(l->kept[i], l->kept_release[i]);
    l->kept[i] = NULL;
    mp__segment_release(l->seg[i]);
    l->seg[i] = NULL;
    held--;
    return true;
}

/* A fork child's inherited entry: the references are its own to drop, the
 * pins its parent's. */
static void disown(local *l)
{
    for (unsigned i = 0; i < MP__PIN_SLOTS; i++)
        (void)unpin(l, i, false);
    l->pid = mp__pid();
    l->seen_next = 0;
    memset(l->seen_ino, 0, sizeof l->seen_ino);
}

local *mp__pins_find_own(mp__pins *p)
{
    local *l = find(p);
    if (l && l->pid != mp__pid())
        disown(l);
    return l;
}

int mp__pins_attach(mp__pins *p)
{
    local *l;
    mp__pins_lock();
    if (!(l = mp__pins_find_own(p))) {
        if (!(l = calloc(1, sizeof *l))) {
            mp__pins_unlock();
            return mp__error(MP_ENOMEM, "receiving end: out of memory");
        }
        l->table = p;
        l->pid = mp__pid();
        l->next = locals;
        locals = l;
    }
    l->users++;
    mp__pins_unlock();
    return 0;
}

void mp__pins_detach(mp__pins *p)
{
    local *l, **pp;
    bool owner, stuck = false;
    mp__pins_lock();
    if (!(l = mp__pins_find_own(p)) || --l->users > 0) {
        mp__pins_unlock();
        return;
    }
    owner = atomic_load(&p->owner) == l->pid;
    for (unsigned i = 0; i < MP__PIN_SLOTS; i++)
        if (!unpin(l, i, owner)) {
            stuck = true; /* a message in flight names it: never reuse the table */
            (void)unpin(l, i, false);
        }
    if (owner)
        atomic_store(&p->owner, stuck ? MP__PINS_OFF : 0);
    for (pp = &locals; *pp != l; pp = &(*pp)->next)
        ;
    *pp = l->next;
    by_own_pin += atomic_load(&l->received);
    reused_retired += atomic_load(&l->reused);
    atomic_fetch_add(&epoch, 1);
    mp__pins_unlock();
    free(l);
}

int mp__pins_held(void)
{
    int n;
    mp__pins_lock();
    n = held;
    mp__pins_unlock();
    return n;
}

void mp__pins_counts(uint64_t *received, uint64_t *reused)
{
    mp__pins_lock();
    *received = by_own_pin;
    *reused = reused_retired;
    for (local *l = locals; l; l = l->next) {
        *received += atomic_load_explicit(&l->received, memory_order_relaxed);
        *reused += atomic_load_explicit(&l->reused, memory_order_relaxed);
    }
    mp__pins_unlock();
    *received += atomic_load_explicit(&by_pin, memory_order_relaxed);
}

/* One more on a counter only one thread at a time writes (the end's reader
 * lock's holder), which others read: no locked instruction. */
static void bump(_Atomic uint64_t *c)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

/* ---- receivers ---------------------------------------------------------------- */

/* Whether this process owns p's table, claiming it when nobody does; a
 * second receiving process turns it off. */
bool mp__pins_own(mp__pins *p, bool claim)
{
    int32_t self = (int32_t)mp__pid(), o = atomic_load(&p->owner);
    if (o == self)
        return true;
    if (o == 0 && claim && atomic_compare_exchange_strong(&p->owner, &o, self))
        return true;
    if (o != MP__PINS_OFF && o != 0)
        atomic_store(&p->owner, MP__PINS_OFF);
    return false;
}

/* A kept file_system base whose every user let go: its name is gone, no
 * message can name it again, and its pages wait only for this mapping. */
static bool dead(const mp__segment *s)
{
    return s->strategy == MP__STRATEGY_FS &&
           __atomic_load_n(&((const mp__fs_header *)s->map)->refcount, __ATOMIC_ACQUIRE) == 0;
}

/* One more storage received on l's end; lets go of idle pins now and then. */
void mp__pins_tick(local *l)
{
    if (++l->clock % SWEEP_EVERY)
        return;
    for (unsigned i = 0; i < MP__PIN_SLOTS; i++)
        if (l->seg[i] && (l->clock - l->used[i] > IDLE_RECEIVES || dead(l->seg[i])))
            (void)unpin(l, i, true);
}

bool mp__pins_seen_before(local *l, uint64_t dev, uint64_t ino)
{
    for (unsigned i = 0; i < MP__PINS_SEEN; i++)
        if (l->seen_ino[i] == ino && l->seen_dev[i] == dev && ino)
            return true;
    l->seen_dev[l->seen_next] = dev;
    l->seen_ino[l->seen_next] = ino;
    l->seen_next = (l->seen_next + 1) % MP__PINS_SEEN;
    return false;
}

/* Pins s in a free slot of the probe run from h, else in the least
 * recently named one no message in flight names. */
void mp__pins_pin(local *l, mp__segment *s, unsigned h)
{
    uint64_t dev = (uint64_t)s->dev, ino = (uint64_t)s->ino;
    unsigned best = MP__PIN_SLOTS;
    for (unsigned k = 0; k < MP__PINS_PROBE; k++) {
        unsigned i = (h + k) & (MP__PIN_SLOTS - 1);
        if (l->seg[i] && l->seg[i]->dev == s->dev && l->seg[i]->ino == s->ino) {
            /* pinned already: a sender raced the pin, or its count is
             * spent (2^31 sends), which a new generation renews */
            uint64_t st = atomic_load(&l->table->slot[i].state);
            if ((st & MP__PIN_SENT) < MP__PIN_SENT || !unpin(l, i, true))
                return;
            best = i;
            break;
        }
        if (!l->seg[i]) {
            best = i;
            break;
        }
        if (best == MP__PIN_SLOTS || l->used[i] < l->used[best])
            best = i;
    }
    if (best == MP__PIN_SLOTS || !unpin(l, best, true))
        return;
    mp__pin *p = &l->table->slot[best];
    uint32_t gen = gen_of(atomic_load(&p->state)) + 1;
    atomic_store(&p->dev, dev);
    atomic_store(&p->ino, ino);
    atomic_store(&p->fd, s->fd);
    atomic_store(&l->table->done[best], 0);
    l->seg[best] = mp__segment_retain(s);
    l->gen[best] = gen;
    l->used[best] = l->clock;
    held++;
    atomic_store(&p->state, ((uint64_t)gen << 32) | MP__PIN_LIVE);
}

/* MPROC_PINS=0 in a receiving process: it pins nothing, so every storage
 * comes to it with its fd (read at each arrival by fd, which costs far
 * more than a getenv). */
bool mp__pins_wanted(void)
{
    const char *v = getenv("MPROC_PINS");
    return !v || strcmp(v, "0") != 0;
}

void mp__pins_received(mp__pins *p, mp__segment *s)
{
    local *l;
    if (s->strategy != MP__STRATEGY_FD || atomic_load(&p->owner) == MP__PINS_OFF ||
        !mp__pins_wanted())
        return;
    mp__pins_lock();
    if ((l = mp__pins_find_own(p)) && mp__pins_own(p, true)) {
        mp__pins_tick(l);
        if (mp__pins_seen_before(l, (uint64_t)s->dev, (uint64_t)s->ino))
            mp__pins_pin(l, s, mp__pins_home((uint64_t)s->dev, (uint64_t)s->ino));
    }
    mp__pins_unlock();
}

/* ---- pin references ------------------------------------------------------------ */

bool mp__pins_ref_ok(const mp__pin_ref *ref)
{
    return ref->slot < MP__PIN_SLOTS;
}

/* l owns p's pin ref names, at ref's generation: the segment (or the
 * keepsake, reuse), and the message counted done. This process pinned it
 * and only it lets go: the pin is live, so the count is taken without
 * reading state (the senders' cache line). */
static int take_owned(local *l, mp__pins *p, const mp__pin_ref *ref, uint64_t size,
                      mp__segment **out, mp__pins_reuse *reuse)
{
    unsigned i = ref->slot;
    if (size > l->seg[i]->map_len)
        return mp__error(MP_EPROTO, "receiving a message: a pinned storage claims %llu bytes "
                         "of a %zu-byte segment", (unsigned long long)size, l->seg[i]->map_len);
    if (reuse && l->kept[i] && (reuse->got = reuse->take(l->kept[i], reuse->ctx)))
        bump(&l->reused);
    else
        *out = mp__segment_retain(l->seg[i]);
    l->used[i] = l->clock;
    atomic_fetch_add(&p->done[i], 1);
    bump(&l->received);
    return 0;
}

/* Whether l (this process's entry for p) holds the live pin ref names. */
static bool holds(const local *l, const mp__pin_ref *ref, bool carried)
{
    const mp__segment *seg = l->seg[ref->slot];
    return seg && l->gen[ref->slot] == ref->gen &&
           (!carried || ((uint64_t)seg->ino == ref->ino && (uint64_t)seg->dev == ref->dev));
}

/* take_owned without this file's lock, for a caller that holds the end's
 * reader lock (the ring's receive: mp__pins_open with reuse): everything
 * of the end's entry is changed only under that lock, but for an entry
 * freed (its last handle released: no receive can be running on it) or
 * disowned (a fork child: the entry's pid is its parent's). Not at a sweep
 * (every SWEEP_EVERY receives), which takes the lock. */
static bool take_hot(mp__pins *p, const mp__pin_ref *ref, uint64_t size, mp__segment **out,
                     mp__pins_reuse *reuse)
{
    local *l = hot.l;
    bool carried = ref->dev || ref->ino;
    if (hot.table != p || hot.epoch != atomic_load(&epoch) || l->pid != mp__pid() ||
        atomic_load(&p->owner) != l->pid || (l->clock + 1) % SWEEP_EVERY == 0 ||
        !holds(l, ref, carried) || size > l->seg[ref->slot]->map_len)
        return false;
    (void)take_owned(l, p, ref, size, out, reuse); /* cannot fail: size was checked */
    l->clock++; /* mp__pins_tick() without its sweep */
    return true;
}

static int resolve(mp__pins *p, const mp__pin_ref *given, uint64_t size, mp__segment **out,
                   bool *counted, mp__pins_reuse *reuse)
{
    const mp__pin_ref *ref = given;
    bool carried = given->dev || given->ino;
    local *l;
    int rc;
    *out = NULL;
    mp__pins_lock();
    if ((l = mp__pins_find_own(p)) && mp__pins_own(p, false) && holds(l, ref, carried)) {
        rc = take_owned(l, p, ref, size, out, reuse);
        if (rc == 0) {
            mp__pins_tick(l);
            *counted = true;
            hot.table = p, hot.l = l, hot.epoch = atomic_load(&epoch);
        }
        mp__pins_unlock();
        return rc;
    }
    mp__pins_unlock();
    return mp__pins_borrow(p, given, size, out);
}

int mp__pins_open(mp__pins *p, const mp__pin_ref *ref, uint64_t size, mp__segment **out,
                  mp__pins_reuse *reuse)
{
    int rc;
    *out = NULL;
    if (reuse)
        reuse->got = NULL;
    if (!mp__pins_ref_ok(ref))
        return mp__error(MP_EPROTO, "receiving a message: pin slot %u is out of range",
                         ref->slot);
    if (reuse && take_hot(p, ref, size, out, reuse))
        return 0;
    bool counted = false;
    rc = resolve(p, ref, size, out, &counted, reuse);
    if (!counted && !give_back(p, ref) && rc == 0) {
        mp__segment_release(*out);
        *out = NULL;
        rc = mp__error(MP_EPROTO, "receiving a message: it names pin %u of generation %u, "
                                  "which no message in flight names", ref->slot, ref->gen);
    }
    if (rc == 0 && !counted)
        atomic_fetch_add_explicit(&by_pin, 1, memory_order_relaxed);
    return rc;
}

void mp__pins_keep(mp__pins *p, const mp__pin_ref *ref, void *obj, void (*release)(void *))
{
    local *l;
    if (!obj)
        return;
    mp__pins_lock();
    if ((l = mp__pins_find_own(p)) && holds(l, ref, false) && mp__pins_own(p, false)) {
        doom(l->kept[ref->slot], l->kept_release[ref->slot]);
        l->kept[ref->slot] = obj;
        l->kept_release[ref->slot] = release;
        obj = NULL;
    }
    mp__pins_unlock();
    if (obj)
        release(obj);
}

void mp__pins_drop(mp__pins *p, const mp__pin_ref *ref)
{
    if (mp__pins_ref_ok(ref))
        (void)give_back(p, ref);
}
