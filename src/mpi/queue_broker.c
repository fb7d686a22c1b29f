/* The broker of a queue shared by every rank (queue.c): on the home rank,
 * the work that serves ranks of other hosts (protocol in queue.c's header
 * comment). One round of it takes the queue's broker lock, so whoever runs
 * it runs it alone; three kinds of thread do:
 *
 *  - the broker thread, which loops while nobody else does (yields, then
 *    naps while there is nothing to do);
 *  - a thread of the home rank waiting in mp_queue_get on any queue homed
 *    here (queue.c's home_get): for a while it runs every homed queue's
 *    round between its looks at its own queue, so a put from another host
 *    goes in (or straight to it), and a get from there is answered, while
 *    it spins, with no broker nap in between (a rank in a ping-pong is
 *    always waiting in some get);
 *  - a thread of the home rank that puts: its message goes straight to a
 *    get parked by a remote rank when the queue is empty
 *    (mp__mpi_qbroker_hand_over); once in the queue, the oldest messages
 *    go to parked gets at once (mp__mpi_qbroker_push), or, when the lock
 *    is busy, its holder is kicked into another round.
 *
 * Puts are received and put into the queue under the lock, so each
 * producer's order holds whoever receives them; answers to a rank are sent
 * under it too, so an answer and its message never interleave with another
 * answer on the rank's stream. */
#include "ipc/ipc.h"
#include "mpi/queue_mpi.h"
#include "os/os.h"
#include "wire/wire.h"

#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Homed queues with a broker: what a waiting home thread serves. */
static pthread_rwlock_t homed_lock = PTHREAD_RWLOCK_INITIALIZER;
static mp_mpi_queue *homed;
/* Home threads serving every homed queue now, and when the last one
 * stopped (mp__now, in microseconds): broker threads stand back while one
 * serves, and nap instead of yielding for STAND_BACK_US after, when the
 * next is likely to come. */
static atomic_int spinners;
static atomic_llong spun_until_us;
#define STAND_BACK_US 20000
/* Rung by a home thread that stops serving the rounds to block: wakes
 * the broker threads from their naps. */
static _Atomic uint32_t broker_bell;
/* The broker thread's naps: from 20 us, doubling while it stands back. */
#define NAP_MIN_US 20
#define NAP_MAX_US 200
#define SPIN_NAP_US 1000
/* How long a home put waits for a remote get that is likely on its way. */
#define HAND_WAIT_S 5e-6

int mp__mpi_qpush(plist *l, parked p)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        parked *v = realloc(l->v, (size_t)cap * sizeof *v);
        if (!v)
            return MP_ENOMEM;
        l->v = v, l->cap = cap;
    }
    l->v[l->n++] = p;
    return 0;
}

/* Removes entry i, keeping the order. */
parked mp__mpi_qtake(plist *l, int i)
{
    parked p = l->v[i];
    memmove(l->v + i, l->v + i + 1, (size_t)(--l->n - i) * sizeof *l->v);
    return p;
}

int mp__mpi_qfind(const plist *l, int src, uint64_t req)
{
    for (int i = 0; i < l->n; i++)
        if (l->v[i].src == src && l->v[i].req == req)
            return i;
    return -1;
}

/* ---- one round ---------------------------------------------------------------- */

int mp__mpi_qframe_msg(const qframe *f, int count, int src, int tag, mp_msg **out)
{
    int rc = mp__mpi_xfer_parse(f->msg, count - (int)sizeof f->h, src, tag, out);
    if (rc > 0)
        rc = mp__error(MP_EPROTO, "mp_mpi_queue: rank %d sent a marker on a queue's tag", src);
    return rc;
}

void mp__mpi_qanswer(mp_mpi_queue *b, int dest, uint64_t req, int rc, int64_t val,
                     const mp_msg *m)
{
    qframe a;
    size_t len = 0;
    int xrc;
    if (m && (xrc = mp__mpi_xfer_check(m)) != 0)
        rc = xrc, m = NULL; /* a host-local attachment: the getter gets the error */
    a.h = (qreq){req, rc, 0, val};
    if (m && mp__mpi_xfer_pack(m, a.msg, sizeof a.msg, &len) == 0)
        m = NULL; /* bytes alone: inside the answer */
    MPI_Send(&a, (int)(sizeof a.h + len), MPI_BYTE, dest, b->tag + 2, mp__mpi.comm);
    if (!m)
        return;
    for (int i = 0; i < 64; i++) {
        if (b->sends[i] && mp__mpi_inflight_test(b->sends[i])) {
            mp__mpi_inflight_free(b->sends[i]);
            b->sends[i] = NULL;
        }
        if (!b->sends[i]) {
            if (mp__mpi_xfer_send(m, dest, b->tag + 2, &b->sends[i]) != 0 && b->sends[i]) {
                mp__mpi_inflight_free(b->sends[i]);
                b->sends[i] = NULL;
            }
            return;
        }
    }
    /* All 64 slots busy: finish this one before going on. */
    mp__mpi_inflight *f = NULL;
    mp__mpi_xfer_send(m, dest, b->tag + 2, &f);
    while (f && !mp__mpi_inflight_test(f) && !atomic_load(&b->stop) && !mp__mpi.failed) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    if (f && !mp__mpi_inflight_busy(f))
        mp__mpi_inflight_free(f);
}

/* The answer to a put from src that the queue took (rc 0: queued or
 * handed to a get) or refused: a put that ran ahead is counted instead,
 * and confirmed in a batch (queue_ahead.c). */
static void put_answer(mp_mpi_queue *b, int src, uint64_t req, int window, int rc)
{
    if (window > 0)
        mp__mpi_qahead_taken(b, src, window, rc);
    else
        mp__mpi_qanswer(b, src, req, rc, 0, NULL);
}

/* The message a put's header announced: sent right after it, so it is
 * there or on its way; only a failed job (its sender died) ends the wait. */
static bool put_body(mp_mpi_queue *b, int src, MPI_Message *msg, MPI_Status *st)
{
    int found = 0;
    unsigned spins = 0;
    for (;;) {
        MPI_Improbe(src, b->tag, mp__mpi.comm, &found, msg, st);
        if (found)
            return true;
        if (++spins % 64 == 0 && (mp__mpi_check("mp_queue_get") != 0 || atomic_load(&b->stop)))
            return false;
    }
}

/* Whether a message may skip the home's queue, from a producer straight to
 * a waiting consumer: only when it would be the next one out of it (the
 * queue is empty and open) and no count must see it (JoinableQueue). */
static bool may_hand_over(mp_mpi_queue *b)
{
    const mp__queue *q = (const mp__queue *)b->q;
    return !b->joinable && mp__queue_size(q) == 0 && !atomic_load(&q->ctl->closed);
}

bool mp__mpi_qready(const mp_queue *lq)
{
    const mp__queue *q = (const mp__queue *)lq;
    return mp__queue_size(q) > 0 || atomic_load(&q->ctl->closed);
}

/* A put's header, and its message: inside it, or right behind it. */
static int put_recv(mp_mpi_queue *b, MPI_Message *msg, MPI_Status *st, qreq *h, mp_msg **m)
{
    qframe f;
    int count = 0, src = st->MPI_SOURCE;
    MPI_Get_count(st, MPI_BYTE, &count);
    if (MPI_Mrecv(&f, sizeof f, MPI_BYTE, msg, st) != MPI_SUCCESS || count < (int)sizeof f.h)
        return MP_EPROTO; /* not from a put: dropped (no rank sends such) */
    *h = f.h;
    if (count > (int)sizeof f.h)
        return mp__mpi_qframe_msg(&f, count, src, b->tag, m);
    if (!put_body(b, src, msg, st))
        return MP_ECHILD; /* the job failed: every call errs out from now on */
    return mp__mpi_xfer_recv_msg(msg, st, b->tag, m);
}

static bool broker_puts(mp_mpi_queue *b)
{
    MPI_Message msg;
    MPI_Status st;
    int found = 0;
    qreq h = {0, 0, 0, 0};
    mp_msg *m = NULL;
    MPI_Improbe(MPI_ANY_SOURCE, b->tag, mp__mpi.comm, &found, &msg, &st);
    if (!found)
        return false;
    int src = st.MPI_SOURCE, rc = put_recv(b, &msg, &st, &h, &m), i;
    if (h.req == 0 || rc == MP_ECHILD)
        return true; /* no put's header (requests count from 1), or a failed job */
    b->last_put[src] = h.req;
    if ((i = mp__mpi_qfind(&b->dropped, src, h.req)) >= 0) {
        mp__mpi_qtake(&b->dropped, i); /* cancelled before it came: answered then */
        mp_msg_destroy(m);
        return true;
    }
    /* A home thread waits in a get on this queue, running this round, and
     * nothing is ahead of the message: it is that get's, as if put and
     * taken at once. */
    int window = h.op == OP_POSTED ? (h.pad > 0 ? h.pad : 1) : 0;
    if (rc == 0 && b->taker && !*b->taker && b->puts.n == 0 && b->gets.n == 0 &&
        may_hand_over(b)) {
        *b->taker = m;
        put_answer(b, src, h.req, window, 0);
        return true;
    }
    /* Behind parked puts it waits its turn: order per producer. */
    if (rc == 0)
        rc = b->puts.n ? MP_ETIMEDOUT : mp_queue_put(b->q, m, 0);
    if (rc == MP_ETIMEDOUT &&
        (rc = mp__mpi_qpush(&b->puts, (parked){src, h.req, m, window})) == 0)
        return true;
    mp_msg_destroy(m);
    put_answer(b, src, h.req, window, rc);
    return true;
}

/* Parked puts, oldest first, go in while the queue has room. */
static bool broker_retry_puts(mp_mpi_queue *b)
{
    bool moved = false;
    while (b->puts.n > 0) {
        int rc = mp_queue_put(b->q, b->puts.v[0].m, 0);
        if (rc == MP_ETIMEDOUT)
            break;
        parked p = mp__mpi_qtake(&b->puts, 0);
        mp_msg_destroy(p.m);
        put_answer(b, p.src, p.req, p.window, rc);
        moved = true;
    }
    return moved;
}

static void cancel_put(mp_mpi_queue *b, int src, uint64_t req)
{
    int i = mp__mpi_qfind(&b->puts, src, req);
    if (i >= 0) {
        mp_msg_destroy(mp__mpi_qtake(&b->puts, i).m);
    } else if (req > b->last_put[src]) {
        if (mp__mpi_qpush(&b->dropped, (parked){src, req, NULL, 0}) != 0) {
            mp__mpi_qanswer(b, src, req, MP_ENOMEM, 0, NULL);
            return;
        }
    } else {
        return; /* queued already: its answer (0) is on its way */
    }
    mp__mpi_qanswer(b, src, req, MP_ETIMEDOUT, 0, NULL);
}

static bool broker_requests(mp_mpi_queue *b)
{
    MPI_Status st;
    int found = 0;
    qreq r;
    MPI_Iprobe(MPI_ANY_SOURCE, b->tag + 1, mp__mpi.comm, &found, &st);
    if (!found)
        return false;
    MPI_Recv(&r, sizeof r, MPI_BYTE, st.MPI_SOURCE, b->tag + 1, mp__mpi.comm, &st);
    int i;
    if (r.op == OP_GET) {
        if (mp__mpi_qpush(&b->gets, (parked){st.MPI_SOURCE, r.req, NULL, 0}) != 0)
            mp__mpi_qanswer(b, st.MPI_SOURCE, r.req, MP_ENOMEM, 0, NULL);
        /* Right behind a home put that went into the queue: the next such
         * put waits a moment for it (mp__mpi_qbroker_hand_over). */
        if (mp__now() - b->missed_at < HAND_WAIT_S)
            b->hand_wait = true;
    } else if (r.op == OP_CANCEL) { /* a get or a join that timed out */
        plist *l = mp__mpi_qfind(&b->gets, st.MPI_SOURCE, r.req) >= 0 ? &b->gets : &b->joins;
        if ((i = mp__mpi_qfind(l, st.MPI_SOURCE, r.req)) >= 0) {
            mp__mpi_qtake(l, i);
            mp__mpi_qanswer(b, st.MPI_SOURCE, r.req, MP_ETIMEDOUT, 0, NULL);
        }
    } else if (mp__mpi_qbroker_join_op(b, st.MPI_SOURCE, &r)) {
        /* task_done, join, qsize: queue_join.c */
    } else if (r.op == OP_CANCEL_PUT) {
        cancel_put(b, st.MPI_SOURCE, r.req);
    } else if (r.op == OP_FLUSH) {
        mp__mpi_qahead_flush_request(b, st.MPI_SOURCE, &r);
    } else {
        mp__mpi_qanswer(b, st.MPI_SOURCE, r.req, mp_queue_close(b->q), 0, NULL);
    }
    return true;
}

/* Parked gets, oldest first, take what the queue has. */
static bool broker_serve(mp_mpi_queue *b)
{
    bool moved = false;
    /* Looked at first: a get that finds nothing costs a system call. */
    while (b->gets.n > 0 && mp__mpi_qready(b->q)) {
        mp_msg *m = NULL;
        int rc = mp_queue_get(b->q, &m, 0);
        if (rc == MP_ETIMEDOUT)
            break;
        parked p = mp__mpi_qtake(&b->gets, 0);
        mp__mpi_qanswer(b, p.src, p.req, rc, 0, m);
        mp_msg_destroy(m);
        moved = true;
    }
    return moved;
}

/* One round, the caller holding the lock. Each step runs every round,
 * whatever the others found; the two that look for MPI messages only for
 * the tag of one that came (MPI_ANY_TAG: both; -1: none came). */
static bool round_locked(mp_mpi_queue *b, int tag)
{
    bool busy = (tag == MPI_ANY_TAG || tag == b->tag) && broker_puts(b);
    busy = ((tag == MPI_ANY_TAG || tag == b->tag + 1) && broker_requests(b)) || busy;
    busy = broker_serve(b) || busy;
    busy = broker_retry_puts(b) || busy;
    busy = mp__mpi_qbroker_joins(b) || busy;
    return busy;
}

/* A round, unless another thread runs one (then 0). Whether it did work.
 * taker: where a put may go straight to the caller's get (NULL: nowhere). */
static bool round_try(mp_mpi_queue *b, mp_msg **taker, int tag)
{
    if (pthread_mutex_trylock(&b->lock) != 0)
        return false;
    b->taker = taker;
    bool busy = round_locked(b, tag);
    b->taker = NULL;
    pthread_mutex_unlock(&b->lock);
    return busy;
}

/* ---- who runs it ------------------------------------------------------------------ */

bool mp__mpi_qbroker_hand_over(mp_mpi_queue *b, const mp_msg *m)
{
    bool done = false;
    if (pthread_mutex_trylock(&b->lock) != 0)
        return false;
    if (!may_hand_over(b) || mp__mpi_xfer_check(m) != 0)
        goto out_unlock;
    /* A get asked just now, or (a remote consumer in a tight loop asked
     * right after the last put last time) about to ask: take it in. A
     * message that goes into the queue costs its producer and its
     * consumer a system call each (the queue's doorbell). */
    double until = b->hand_wait ? mp__now() + HAND_WAIT_S : 0;
    while (broker_requests(b) || (b->gets.n == 0 && until > 0 && mp__now() < until))
        ;
    if (b->gets.n > 0 && may_hand_over(b)) { /* still: a request may have closed it */
        parked p = mp__mpi_qtake(&b->gets, 0);
        mp__mpi_qanswer(b, p.src, p.req, 0, 0, m);
        done = true;
    } else {
        b->hand_wait = false;
        b->missed_at = mp__now();
    }
out_unlock:
    pthread_mutex_unlock(&b->lock);
    return done;
}

void mp__mpi_qbroker_push(mp_mpi_queue *b)
{
    if (pthread_mutex_trylock(&b->lock) != 0) {
        /* Its holder may be past its serve step: one more round. */
        atomic_store(&b->kick, true);
        return;
    }
    if (b->gets.n > 0)
        broker_serve(b);
    pthread_mutex_unlock(&b->lock);
}

bool mp__mpi_qbroker_all(mp_mpi_queue *mine, mp_msg **got)
{
    bool busy = false;
    /* A look for an MPI message that finds none is a turn of MPI's
     * progress (over TCP, a system call): one look at every tag first,
     * then only the look for what it found. A message of another tag than
     * the homed queues' (a conn's, say, not received yet) may hide theirs
     * behind it: then every queue looks for its own. */
    int arrived = 0, tag = -1;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, mp__mpi.comm, &arrived, &st);
    pthread_rwlock_rdlock(&homed_lock);
    if (arrived) {
        tag = MPI_ANY_TAG;
        for (mp_mpi_queue *b = homed; b; b = b->next_homed)
            if (st.MPI_TAG == b->tag || st.MPI_TAG == b->tag + 1)
                tag = st.MPI_TAG;
    }
    for (mp_mpi_queue *b = homed; b; b = b->next_homed)
        busy = round_try(b, b == mine ? got : NULL, tag) || busy;
    pthread_rwlock_unlock(&homed_lock);
    return busy;
}

int mp__mpi_qbroker_wait(MPI_Request *req, double deadline, MPI_Status *st, const char *fn)
{
    bool any, answered = false;
    int rc = 0;
    pthread_rwlock_rdlock(&homed_lock);
    any = homed != NULL;
    pthread_rwlock_unlock(&homed_lock);
    if (!any)
        return mp__mpi_wait(req, deadline, st, fn);
    mp__mpi_qbroker_spinning(1);
    for (unsigned spins = 0; spins < 2 * MP__MPI_SPINS && !answered && rc == 0; spins++) {
        int got = 0, mrc = MPI_Test(req, &got, st ? st : MPI_STATUS_IGNORE);
        answered = got != 0;
        if (mrc != MPI_SUCCESS)
            rc = mp__mpi_error(mrc, fn, "MPI_Test");
        else if (!answered)
            mp__mpi_qbroker_all(NULL, NULL);
        if (rc == 0 && !answered && spins % 16 == 0 && (rc = mp__mpi_check(fn)) == 0)
            rc = mp__mpi_expired(deadline, fn, "would block");
        if (rc == 0 && !answered && spins >= MP__MPI_SPINS)
            sched_yield();
    }
    mp__mpi_qbroker_spinning(-1);
    if (rc != 0 || answered)
        return rc;
    /* Not answered after the spins: the broker thread serves from now. */
    mp__mpi_qbroker_hand_back();
    return mp__mpi_wait(req, deadline, st, fn);
}

void mp__mpi_qbroker_hand_back(void)
{
    atomic_store(&spun_until_us, 0);
    atomic_fetch_add(&broker_bell, 1);
    mp__futex_wake((uint32_t *)&broker_bell, INT_MAX, false);
}

void mp__mpi_qbroker_spinning(int delta)
{
    if (delta < 0)
        atomic_store(&spun_until_us, (long long)(mp__now() * 1e6));
    atomic_fetch_add(&spinners, delta);
}

/* Whether a home thread serves the rounds now or did a moment ago. */
static bool standing_back(void)
{
    return atomic_load(&spinners) > 0 ||
           (long long)(mp__now() * 1e6) - atomic_load(&spun_until_us) < STAND_BACK_US;
}

/* A nap of the broker thread, cut short when a home thread that served
 * the rounds goes on to block (mp__mpi_qbroker_hand_back). */
static void broker_nap(uint32_t bell, long us)
{
    mp__futex_wait((uint32_t *)&broker_bell, bell, mp__now() + (double)us * 1e-6, false);
}

static void *broker(void *arg)
{
    mp_mpi_queue *b = arg;
    unsigned idle = 0;
    long nap_us = NAP_MIN_US;
    while (!atomic_load(&b->stop)) {
        uint32_t bell = atomic_load(&broker_bell);
        /* A home thread waiting in a get runs the rounds: stay out of its
         * way, napping longer while it does (each wake-up takes a core
         * from it on a busy host); it rings when it stops. A broker that
         * is preempted holding the lock would stall it. */
        if (atomic_load(&spinners) > 0) {
            broker_nap(bell, SPIN_NAP_US);
            continue;
        }
        bool busy = round_try(b, NULL, MPI_ANY_TAG);
        busy = atomic_exchange(&b->kick, false) || busy;
        if (busy) {
            idle = 0, nap_us = NAP_MIN_US;
            continue;
        }
        /* One was waiting a moment ago and likely comes back: nap rather
         * than yield, which would take its core. */
        if (standing_back()) {
            broker_nap(bell, nap_us);
            nap_us = nap_us * 2 > NAP_MAX_US ? NAP_MAX_US : nap_us * 2;
            idle = 0;
            continue;
        }
        /* Nothing to do: yield a while (a request right behind the last
         * one is answered at once), then nap, longer the longer it stays
         * quiet (20 us naps for the first ~40 ms, then 200 us). */
        nap_us = NAP_MIN_US;
        if (++idle < 200) {
            sched_yield();
            continue;
        }
        broker_nap(bell, idle < 2200 ? NAP_MIN_US : NAP_MAX_US);
    }
    return NULL;
}

int mp__mpi_qbroker_start(mp_mpi_queue *b, const char *fn)
{
    if (pthread_create(&b->thread, NULL, broker, b) != 0)
        return mp__error(MP_ESYS, "%s: could not start the broker thread", fn);
    b->running = true;
    pthread_rwlock_wrlock(&homed_lock);
    b->next_homed = homed;
    homed = b;
    pthread_rwlock_unlock(&homed_lock);
    return 0;
}

void mp__mpi_qbroker_stop(mp_mpi_queue *b)
{
    if (!b->running)
        return;
    pthread_rwlock_wrlock(&homed_lock);
    for (mp_mpi_queue **p = &homed; *p; p = &(*p)->next_homed)
        if (*p == b) {
            *p = b->next_homed;
            break;
        }
    pthread_rwlock_unlock(&homed_lock);
    atomic_store(&b->stop, true);
    pthread_join(b->thread, NULL);
    b->running = false;
}
