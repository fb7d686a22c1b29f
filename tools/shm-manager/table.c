/* The segment table and the reclaiming rule.
 *
 * A tracked segment is unlinked when (1) no live client holds it (each
 * holder created or opened it and has not reported closing it; a client
 * whose connection hits EOF or whose pidfd fires holds nothing), and
 * (2) no message carrying its name is in flight: sends reported <= receives
 * reported. Reports of different clients reach us on different connections,
 * so a receive may be read before the matching send; a segment is therefore
 * unlinked only if it qualified at two checks separated by a full read of
 * every readable connection (two-phase: candidate, then reclaim). A sender
 * flushes its report before the name leaves, so that read sees it. The
 * candidate must also have waited SETTLE seconds: a process that releases
 * the last reference unlinks the name itself right after its "closed"
 * report, and should not race the daemon for it.
 *
 * When no client is left, the grace period runs, then everything tracked is
 * unlinked, in flight or not: no live process can receive it any more.
 *
 * Segments nobody reported (found in /dev/shm at start, or left by a client
 * killed before its report) are adopted and judged by the kernel only; see
 * reclaim_adopted. */
#include "daemon.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SETTLE 0.05
#define PEER_PATIENCE 5.0

static double quarantine = 2.0;
static char own_socket[108];

static dseg *segs;
static int nsegs, segs_cap;

/* Name -> position in segs: every report looks a name up, and a busy
 * client makes ~100k reports a second against thousands of live
 * segments. Open addressing with linear probing; a slot holds position+1
 * (0: empty); removal shifts the run back instead of leaving tombstones. */
static uint32_t *slots;
static uint32_t nslots; /* a power of two, > 2 * nsegs */

static uint32_t hash_name(const char *s)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    while (*s)
        h = (h ^ (unsigned char)*s++) * 16777619u;
    return h;
}

static uint32_t home(int i) { return segs[i].hash & (nslots - 1); }

/* The slot holding name, or the empty slot where it would go. */
static uint32_t slot_of(const char *name, uint32_t h)
{
    uint32_t k = h & (nslots - 1);
    while (slots[k] && (segs[slots[k] - 1].hash != h || strcmp(segs[slots[k] - 1].name, name)))
        k = (k + 1) & (nslots - 1);
    return k;
}

static bool index_grow(void)
{
    uint32_t n = nslots ? nslots * 2 : 256, *ns = calloc(n, sizeof *ns);
    if (!ns)
        return false;
    free(slots);
    slots = ns;
    nslots = n;
    for (int i = 0; i < nsegs; i++)
        slots[slot_of(segs[i].name, segs[i].hash)] = (uint32_t)i + 1;
    return true;
}

static void index_remove(uint32_t k)
{
    uint32_t i = k;
    slots[i] = 0;
    for (uint32_t j = (i + 1) & (nslots - 1); slots[j]; j = (j + 1) & (nslots - 1)) {
        uint32_t h = home((int)slots[j] - 1);
        /* j's entry may fill the hole at i unless its home lies in (i, j] */
        if (i <= j ? (i < h && h <= j) : (i < h || h <= j))
            continue;
        slots[i] = slots[j];
        slots[j] = 0;
        i = j;
    }
}

static dseg *find(const char *name)
{
    uint32_t k;
    if (!nslots)
        return NULL;
    k = slot_of(name, hash_name(name));
    return slots[k] ? &segs[slots[k] - 1] : NULL;
}

static dseg *find_or_add(const char *name)
{
    dseg *s = find(name);
    if (s)
        return s;
    if ((uint32_t)(nsegs + 1) * 2 > nslots && !index_grow()) {
        dlog("out of memory tracking %s", name);
        return NULL;
    }
    if (nsegs == segs_cap) {
        int cap = segs_cap ? segs_cap * 2 : 64;
        dseg *ns = realloc(segs, (size_t)cap * sizeof *ns);
        if (!ns) {
            dlog("out of memory tracking %s", name);
            return NULL;
        }
        segs = ns;
        segs_cap = cap;
    }
    s = &segs[nsegs];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->hash = hash_name(s->name);
    slots[slot_of(s->name, s->hash)] = (uint32_t)++nsegs;
    return s;
}

/* Drops s; the last entry moves into its place. */
static void forget(dseg *s)
{
    int i = (int)(s - segs), last = nsegs - 1;
    free(s->holders);
    index_remove(slot_of(s->name, s->hash));
    if (i != last) {
        uint32_t k = slot_of(segs[last].name, segs[last].hash);
        *s = segs[last];
        slots[k] = (uint32_t)i + 1;
    }
    nsegs--;
}

static void holder_add(dseg *s, uint64_t id)
{
    for (int i = 0; i < s->nholders; i++)
        if (s->holders[i] == id)
            return;
    if (s->nholders == s->holders_cap) {
        int cap = s->holders_cap ? s->holders_cap * 2 : 4;
        uint64_t *nh = realloc(s->holders, (size_t)cap * sizeof *nh);
        if (!nh) {
            dlog("out of memory tracking holders of %s", s->name);
            return;
        }
        s->holders = nh;
        s->holders_cap = cap;
    }
    s->holders[s->nholders++] = id;
}

static void holder_remove(dseg *s, uint64_t id)
{
    for (int i = 0; i < s->nholders; i++)
        if (s->holders[i] == id) {
            s->holders[i] = s->holders[--s->nholders];
            return;
        }
}

static bool name_exists(const char *name)
{
    char path[sizeof "/dev/shm" + MP__SHM_NAME_MAX];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

/* "<verb> <name>" or "<verb> <name> <size>" into its parts: false when the
 * line has another shape. By hand, not sscanf: a busy client writes a
 * million lines a second, and the daemon's CPU is taken from it. */
static bool parse_report(const char *line, char *verb, char name[MP__SHM_NAME_MAX + 1],
                         unsigned long long *size)
{
    const char *p = line + 2, *end;
    char *rest;
    size_t n;
    if (!line[0] || line[1] != ' ')
        return false;
    *verb = line[0];
    n = strcspn(p, " ");
    if (n == 0 || n > MP__SHM_NAME_MAX)
        return false;
    memcpy(name, p, n);
    name[n] = '\0';
    end = p + n;
    *size = 0;
    if (*end == '\0')
        return true;
    if (end[1] < '0' || end[1] > '9')
        return false;
    errno = 0;
    *size = strtoull(end + 1, &rest, 10);
    return *rest == '\0' && errno == 0;
}

int table_report(uint64_t id, pid_t pid, const char *line)
{
    char verb, name[MP__SHM_NAME_MAX + 1];
    unsigned long long size;
    dseg *s;

    if (!parse_report(line, &verb, name, &size) || !mp__shm_name_ok(name)) {
        dlog("client %d: malformed report \"%s\"", (int)pid, line);
        return -1;
    }
    if (verb == 'U' || verb == 'X') {
        if (!(s = find(name)))
            return 0;
        if (verb == 'U')
            forget(s); /* the library unlinked it: nothing left to reclaim */
        else
            holder_remove(s, id);
        return 0;
    }
    /* Each client's reports arrive in its order, but clients are read one
     * ring after another: the sender's "S" may be read after the receiver
     * has unlinked the segment ("U", which forgot it). A report that would
     * start tracking a name that no longer exists is such a late one. */
    if (!(s = find(name)) && !name_exists(name))
        return 0;
    if (!s && !(s = find_or_add(name)))
        return 0;
    s->adopted = false;
    s->candidate = false;
    switch (verb) {
    case 'C':
        s->size = size;
        s->creator = pid;
        holder_add(s, id);
        break;
    case 'O':
        holder_add(s, id);
        break;
    case 'S':
        s->sent++;
        break;
    case 'R':
        s->received++;
        break;
    default:
        dlog("client %d: unknown report \"%s\"", (int)pid, line);
        return -1;
    }
    return 0;
}

void table_client_gone(uint64_t id, pid_t pid)
{
    for (int i = 0; i < nsegs; i++)
        holder_remove(&segs[i], id);
    (void)pid;
}

static void reclaim(const char *name, const char *why)
{
    if (shm_unlink(name) == 0)
        dlog("reclaimed %s (%s)", name, why);
    else if (errno != ENOENT)
        dlog("shm_unlink(%s): %s", name, strerror(errno));
}

void table_init(double quarantine_s, const char *socket_path)
{
    quarantine = quarantine_s > SETTLE ? quarantine_s : SETTLE;
    snprintf(own_socket, sizeof own_socket, "%s", socket_path);
}

/* The two-phase rule: true when s qualified at the previous check, still
 * does and has for `wait` seconds; otherwise records whether it qualifies
 * now, for the next check. */
static bool qualified_long_enough(dseg *s, bool ok, double now, double wait)
{
    if (ok && s->candidate && now - s->since >= wait)
        return true;
    if (ok && !s->candidate)
        s->since = now;
    s->candidate = ok;
    return false;
}

int table_reclaim(double now)
{
    int candidates = 0;
    for (int i = 0; i < nsegs; i++) {
        dseg *s = &segs[i];
        bool ok = s->nholders == 0 && s->sent <= s->received;
        if (s->adopted)
            continue;
        if (qualified_long_enough(s, ok, now, SETTLE)) {
            reclaim(s->name, "no holder left, nothing in flight");
            forget(s);
            i--;
            continue;
        }
        candidates += ok;
    }
    return candidates;
}

/* Whether another daemon of this uid tracks s (then it is forgotten
 * here); *peers is fetched at the first call. -1: a peer did not answer,
 * keep s for now; after PEER_PATIENCE s of that, a hung peer no longer
 * stops us (nothing would ever reclaim s otherwise). */
static int peer_owned(dseg *s, double now, char **peers, bool *asked)
{
    if (!*asked) {
        *asked = true;
        *peers = peers_list(own_socket);
    }
    if (!*peers) {
        if (s->peer_wait == 0)
            s->peer_wait = now;
        if (now - s->peer_wait < PEER_PATIENCE)
            return -1;
        dlog("reclaiming %s although a peer daemon did not answer for %g s", s->name,
             PEER_PATIENCE);
        return 0;
    }
    s->peer_wait = 0;
    if (!peers_track(*peers, s->name))
        return 0;
    dlog("left %s to another shm manager of this uid, which tracks it", s->name);
    return 1;
}

/* Adopted segments: nobody reported them to us, so trust only the kernel
 * (creator dead, no live process maps or holds it), and only after that
 * stayed true for the quarantine (the grace period): a message carrying
 * the name may sit in a queue, and its receiver gets that long to open it.
 * One that another daemon tracks (see peers.c) is left to it.
 * With `final`, candidates whose quarantine has not run out are kept. */
static int reclaim_adopted(double now, bool final)
{
    mp__seg_users users;
    char *peers = NULL;
    bool asked = false, have_users = false;
    int pending = 0;
    for (int i = 0; i < nsegs; i++) {
        dseg *s = &segs[i];
        bool ok;
        if (!s->adopted)
            continue;
        ok = s->nholders == 0 && s->sent <= s->received && !mp__pid_alive(s->creator);
        /* Who maps or holds it takes a walk of all of /proc: only for a
         * segment that passed the cheap checks, once per round. */
        if (ok && !have_users) {
            if (mp__seg_users_collect(&users, mp__mgr_name_ok) != 0)
                break;
            have_users = true;
        }
        ok = ok && mp__seg_users_count(&users, s->name) == 0;
        if (qualified_long_enough(s, ok, now, quarantine)) {
            int owned = peer_owned(s, now, &peers, &asked);
            if (owned < 0) {
                pending += !final;
                continue;
            }
            if (owned == 0)
                reclaim(s->name, "adopted: creator dead, unused");
            forget(s);
            i--;
            continue;
        }
        pending += ok && !final;
    }
    if (have_users)
        mp__seg_users_free(&users);
    free(peers);
    return pending;
}

int table_reclaim_adopted(double now) { return reclaim_adopted(now, false); }

/* Untracked segments (a SIGKILL between shm_open and the report, or while
 * no daemon ran): adopted, so the quarantine rule above applies. */
typedef struct scan_ctx {
    const pid_t *only; /* only segments named after these pids; all when n == 0 */
    int n;
    mp__seg_users users;
    bool have_users;
} scan_ctx;

static int scan_one(const char *name, void *arg)
{
    scan_ctx *c = arg;
    mp__seg_info info;
    char full[MP__SHM_NAME_MAX + 1];
    dseg *s;

    snprintf(full, sizeof full, "/%s", name);
    if (find(full))
        return 0;
    if (c->n > 0) {
        pid_t creator = (pid_t)atoi(name + strlen(MP__SHM_PREFIX));
        int k = 0;
        while (k < c->n && c->only[k] != creator)
            k++;
        if (k == c->n)
            return 0;
    }
    if (!c->have_users) {
        if (mp__seg_users_collect(&c->users, mp__mgr_name_ok) != 0)
            return 1;
        c->have_users = true;
    }
    if (mp__seg_inspect(name, &c->users, &info) != 0 || !(s = find_or_add(full)))
        return 0;
    s->adopted = true;
    s->size = info.size;
    s->creator = info.creator;
    dlog("adopted %s (creator %d %s, %d users)", full, (int)info.creator,
         info.creator_alive ? "alive" : "dead", info.users);
    return 0;
}

void table_scan(const pid_t *only, int n)
{
    scan_ctx c = {.only = only, .n = n};
    mp__seg_each(scan_one, &c);
    if (c.have_users)
        mp__seg_users_free(&c.users);
}

void table_reclaim_all(double now)
{
    reclaim_adopted(now, true);
    while (nsegs > 0) {
        dseg *s = &segs[nsegs - 1];
        if (!s->adopted)
            reclaim(s->name, "grace period over, no client left");
        forget(s);
    }
}

int table_count(void) { return nsegs; }

bool table_has_adopted(void)
{
    for (int i = 0; i < nsegs; i++)
        if (segs[i].adopted)
            return true;
    return false;
}

void table_list(FILE *f)
{
    for (int i = 0; i < nsegs; i++) {
        dseg *s = &segs[i];
        fprintf(f, "SEG %s %" PRIu64 " %d %d %" PRId64 " %" PRId64 " %s\n", s->name, s->size,
                (int)s->creator, s->nholders, s->sent, s->received,
                s->adopted ? "adopted" : "tracked");
    }
}
