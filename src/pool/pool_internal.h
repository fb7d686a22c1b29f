/* The pool's insides: the task registry, the frames that carry chunks to
 * workers and results back, results/jobs, and the pool itself. */
#ifndef MPROC_POOL_INTERNAL_H
#define MPROC_POOL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "mproc/pool.h"
#include "mproc/process.h"
#include "mproc/queue.h"
#include "os/os.h"
#include "pool/remote.h"

#define MP__TASK_NAME_MAX MP_ENTRY_NAME_MAX

/* The registered task called name, or NULL; the same for array tasks. */
mp_task_fn mp__task_lookup(const char *name);
mp_array_task_fn mp__array_task_lookup(const char *name);

/* A task's call made through mp__catch_raise (ctx: an mp__task_call), by a
 * pool worker and by an MPI pool's rank: the error is cleared first, so that
 * a failing task's sentence is its own. */
typedef struct mp__task_call {
    mp_task_fn fn;
    const mp_msg *in;
    mp_msg *out;
} mp__task_call;
int mp__task_call_run(void *ctx);

/* The one item of a chunk of an array task: items [start, start + count)
 * of the two shared arrays attached after it (in, then out). */
typedef struct mp__vec_slice {
    uint64_t start, count, in_size, out_size;
} mp__vec_slice;

/* ---- frames ---------------------------------------------------------------
 * A pack is a message that holds k messages: its payload is a header, k
 * directory entries and the k payloads; its attachments are theirs, in
 * order. Chunks to workers, results back and starmap argument tuples are
 * all packs (with their own magic). Result entries carry a code and an
 * error sentence per item. */
enum { MP__PACK_TASK = 0x4b53544d, MP__PACK_RESULT = 0x5345524d, MP__PACK_STAR = 0x5241544d,
       MP__PACK_EXIT = 0x5449584d };

typedef struct mp__pack_entry {
    int32_t rc;         /* results: 0 or the item's error */
    uint32_t nattach;   /* attachments of this item */
    uint64_t len;       /* payload bytes */
    uint64_t err_len;   /* results: bytes of the error sentence after the payload */
} mp__pack_entry;

typedef struct mp__pack_hdr {
    uint32_t magic;
    uint32_t count;
    uint32_t name_len; /* task name after the entries (TASK) */
    uint32_t reserved;
} mp__pack_hdr;

/* A pack under construction, built in the buffer it is sent from. */
typedef struct mp__packer {
    mp_msg *msg;
    uint32_t magic;
    uint32_t count, cap; /* entries written; room for entries */
    uint32_t name_len;
    char *buf;           /* header, cap entries, the name's room, data */
    size_t len, data_cap; /* data bytes written; room for data */
    char name[MP__TASK_NAME_MAX + 1];
} mp__packer;

/* On failure p holds nothing (dropping it again is harmless). */
int mp__packer_init(mp__packer *p, uint32_t magic, const char *name, size_t count_hint);
/* Appends one item: payload bytes and the attachments of `attach` (may be
 * NULL), with a result code and error sentence (NULL for none). */
int mp__packer_add(mp__packer *p, const void *payload, size_t len, const mp_msg *attach,
                   int rc, const char *err);
/* Appends one item made of the k messages in (a nested pack: starmap). */
int mp__packer_add_star(mp__packer *p, const mp_msg *const *in, size_t k);
/* Writes the payload into p->msg and hands the message to *out. */
int mp__packer_finish(mp__packer *p, mp_msg **out);
void mp__packer_drop(mp__packer *p);

/* A received pack, validated: every entry, length and attachment count
 * checked against the payload and the message (MP_EPROTO otherwise). */
typedef struct mp__pack_view {
    const mp_msg *msg;
    uint32_t magic, count;
    const mp__pack_entry *entries; /* in the payload, or an aligned copy */
    mp__pack_entry *owned;         /* the tables' block when the view owns it */
    const char *name;   /* TASK: NUL-terminated copy */
    char name_buf[MP__TASK_NAME_MAX + 1];
    const char **payloads;
    size_t *first_attach;
} mp__pack_view;

int mp__pack_open(const mp_msg *m, mp__pack_view *v);
/* The same with the view's tables in *buf (cap bytes, grown as needed and
 * kept by the caller for the next frame): no allocation per frame once it
 * is large enough. The view owns nothing then (closing it is harmless). */
int mp__pack_open_into(const mp_msg *m, mp__pack_view *v, void **buf, size_t *cap);
void mp__pack_close(mp__pack_view *v);
/* Item i as a new message (payload copy + attachments retained). */
int mp__pack_item(const mp__pack_view *v, uint32_t i, mp_msg **out);
/* The same into m, emptied first (mp__msg_reset). */
int mp__pack_item_into(const mp__pack_view *v, uint32_t i, mp_msg *m);
/* Fills the empty message m: len bytes at payload, and attachments
 * [first_attach, first_attach + nattach) of src. */
int mp__pack_build_into(const mp_msg *src, const void *payload, size_t len,
                        size_t first_attach, size_t nattach, mp_msg *m);
/* Copies attachments [from, from + n) of src onto dst. */
int mp__msg_copy_attachments(const mp_msg *src, size_t from, size_t n, mp_msg *dst);

/* ---- the worker (child side) ---------------------------------------------- */

/* Serves chunks on sock until told to exit or the parent goes: the exit
 * status of the worker. */
int mp__pool_worker_main(mp_conn *conn);

/* ---- results ------------------------------------------------------------- */

/* MSG: a message per item; ARRAY: map_array of a per-item task; VEC:
 * map_array of an array task, over the shared copies vin and vout. */
enum { MP__JOB_MSG = 0, MP__JOB_ARRAY = 1, MP__JOB_VEC = 2 };

/* MSG: a chunk's answer, kept whole (validated by the handler). Items
 * taken in order are read with a cursor (next item, its payload offset and
 * first attachment); one taken out of order opens the view (open). */
typedef struct mp__result_frame {
    mp_msg *msg;
    uint32_t next;
    size_t off, att;
    bool open;
    mp__pack_view v;
} mp__result_frame;

struct mp_async_result {
    atomic_int refs;
    const mp__result_ops *ops; /* NULL: this struct is the result; else impl is */
    void *impl;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int kind;
    size_t n, ndone;
    mp_msg **outs;   /* MSG: items borrowed (built once, kept); NULL before the first */
    /* MSG: each chunk's answer as it came (frames[start / chunk]); an item
     * becomes its own message only when it is taken or borrowed, in the
     * caller's thread: the handler thread moves chunks, not items. */
    mp__result_frame **frames;
    size_t chunk, nframes;
    int *rcs;        /* per item */
    char **errs;     /* per failed item; NULL until the first failure */
    uint8_t *done;   /* per item */
    size_t *order;   /* completion order (imap_unordered only); else NULL */
    bool ready;
    size_t first_bad; /* index of the first failed item, n when none */
    void *out_array;  /* ARRAY, VEC */
    size_t out_size;
    struct mp_tensor *vin, *vout; /* VEC: the shared arrays (retained) */
    mp_pool_callbacks cb;
    bool has_cb;
    char task[MP__TASK_NAME_MAX + 1];
};

/* order: keep the completion order (imap_unordered). */
int mp__result_new(const char *call, int kind, size_t n, bool order, const char *task,
                   const mp_pool_callbacks *cb, mp_async_result **out);
/* Handler thread, with r->mu held: records item i's outcome (err copied;
 * a success's message stays in its chunk's answer, r->frames); true when
 * that made the result ready. A whole
 * chunk goes under one lock, so waiters wake once per chunk, not per item:
 * mp__result_publish wakes them and unlocks. */
bool mp__result_item_locked(mp_async_result *r, size_t i, int rc, const char *err);
void mp__result_publish(mp_async_result *r);
/* Items [start, start + count) all with one outcome (no messages). */
bool mp__result_range_locked(mp_async_result *r, size_t start, size_t count, int rc,
                             const char *err);
/* Item i's error sentence (its code's name when none was kept). */
const char *mp__result_err(const mp_async_result *r, size_t i);
/* With r->mu held: waits until pred(r, arg) or timeout (0 or MP_ETIMEDOUT,
 * no sentence). */
int mp__result_wait_locked(mp_async_result *r, bool (*pred)(mp_async_result *, void *),
                           void *arg, double timeout);
/* With r->mu held and r ready: 0, or the first failed item's code with the
 * sentence "call: [item i: ]its error" (the item number when r has several). */
int mp__result_first_error(const mp_async_result *r, const char *call);
/* MSG: sets the chunk size and the table of chunk answers (before the
 * handler can see r). */
int mp__result_set_chunks(mp_async_result *r, size_t chunk);
/* MSG, with r->mu held (or r private to the caller): item i's result as a
 * new message (the caller's), built from its chunk's answer, or the one a
 * borrow built before. The item must be done and successful. */
int mp__result_take(mp_async_result *r, size_t i, mp_msg **out);
/* MSG: frees chunk k's answer (every item of it taken; r private). */
void mp__result_drop_frame(mp_async_result *r, size_t k);
/* The same for item j of chunk k (no division: a map's builder walks them). */
int mp__result_take_at(mp_async_result *r, size_t k, uint32_t j, mp_msg **out);
/* The same, built into m (empty, the caller's: a map's builder takes its
 * messages in blocks, mp__msg_create_block) unless a borrow built the item
 * before: *out is then that message and m stays empty. On failure m may
 * hold part of the item: the caller destroys it. */
int mp__result_take_into(mp_async_result *r, size_t k, uint32_t j, mp_msg *m, mp_msg **out);
/* The same, but borrowed: built into outs[i] once, kept there. */
int mp__result_borrow(mp_async_result *r, size_t i, const mp_msg **out);
/* Handler thread: runs the callback of a ready result. */
void mp__result_callback(mp_async_result *r);

/* A lazy iterator: over a map_async result, or served by ops. */
struct mp_imap {
    mp_async_result *r;
    bool unordered;
    size_t pos; /* items handed out */
    const mp__imap_ops *ops;
    void *impl;
};

/* ---- the pool -------------------------------------------------------------- */

typedef struct mp__chunk {
    struct mp__chunk *next;
    mp_async_result *r; /* retained */
    size_t start, count;
    mp_msg *frame;      /* kept until answered: a dead worker's unread chunks go again */
    bool sent;          /* the frame is in the worker's socket */
    double t_sent;      /* mp__now() when sent */
} mp__chunk;

void mp__chunk_free(mp__chunk *c);

enum { MP__POOL_RUN = 0, MP__POOL_CLOSED = 1, MP__POOL_TERMINATED = 2 };
#define MP__WHY_MAX 2304 /* an mp_raise text and its context */
/* Consecutive deaths before ready after which a worker slot is given up. */
#define MP__POOL_START_TRIES 3
/* Pipelining: a worker holds up to MP__POOL_DEPTH_MAX chunks, as many as it
 * runs in MP__POOL_HIDE seconds (a generous round trip on a loaded host),
 * plus the one it runs. A new worker, and one whose chunks take longer than
 * that, holds one: long tasks balance across workers as without
 * pipelining (two apply_async calls run in parallel); trivial ones stop
 * paying one round trip each. */
#define MP__POOL_DEPTH_MAX 32
#define MP__POOL_HIDE 50e-6
/* A worker whose chunks run under MP__POOL_SHORT holds two at least, so it
 * never waits for the handler thread between two of them (on a busy host
 * that wait, not the chunk, was the cost of a default-chunksize map); the
 * most that can cost is one such chunk of imbalance at the end. */
#define MP__POOL_SHORT 2e-3

typedef struct mp_process mp_process;

typedef struct worker {
    mp_process *proc;  /* NULL: no process in this slot */
    mp_conn *conn;     /* the parent's end, owning sock */
    int sock;
    int pidfd;         /* proc's sentinel: readable once it has ended */
    /* Chunks in flight, oldest first: the worker reads the next only after
     * it has answered the one before, so cur is the one it runs and the
     * rest were never read (a dead worker's are queued again). */
    mp__chunk *cur, *last;
    unsigned inflight;
    unsigned depth;    /* chunks it may hold: enough to hide one round trip */
    double t_done;     /* mp__now() of its last answer */
    double svc;        /* smoothed seconds per chunk */
    bool blocked;      /* its socket was full: wait for POLLOUT */
    unsigned chunks;   /* completed, for maxtasksperchild */
    unsigned failures; /* consecutive deaths before ready */
    bool ready;        /* its initializer ran; it serves */
    bool exiting;      /* asked to exit (retired or closing) */
} worker;

struct mp_pool {
    const mp__pool_ops *ops; /* NULL: the local pool below; else impl serves it */
    void *impl;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int nprocs;
    unsigned maxtasks;
    char *start_method, *initializer; /* copies, or NULL */
    mp_msg *initargs;                 /* copy, or NULL */
    int state;       /* MP__POOL_* (under mu) */
    bool finished;   /* handler thread done (under mu) */
    bool joined;     /* pthread_join done (under mu) */
    int start_rc;    /* the first start's outcome (under mu) */
    bool started;
    mp__chunk *head, *tail; /* queued (under mu) */
    int wake_fd;
    pthread_t thread;
    worker *w;                /* handler thread only */
    /* map_array with an array task: the shared in and out arrays of the
     * last finished call, reused by the next one that fits (under mu), so
     * repeated calls do not pay for fresh pages each time. */
    mp_tensor *vcache[2];
    void *scratch;            /* handler thread: the tables of the answer it reads */
    size_t scratch_cap;
    mp_async_result **ready;  /* handler thread: results awaiting callbacks */
    size_t nready, ready_cap;
    char start_error[MP__WHY_MAX + 64]; /* handler thread: last start failure */
    pid_t owner;                        /* the creating process (exit.c) */
    mp__link live_link;                 /* in exit.c's list of running pools */
    bool exit_hold;                     /* exit.c is stopping it (under its lock) */
};

/* exit.c: a pool joins the list of pools that exit terminates (its owner set
 * to this process) once its handler thread runs, and leaves it when freed
 * (waiting, if the exit handler is stopping it, until that is done). */
void mp__pool_track(mp_pool *p);
void mp__pool_untrack(mp_pool *p);

/* workers.c: starts a worker process in slot (handler thread). */
int mp__worker_start(mp_pool *p, int slot);
/* Reaps slot's ended process and frees its ends; `how` gets how it ended,
 * e.g. "(pid 12) was killed by signal 9 (SIGKILL)". */
void mp__worker_reap(mp_pool *p, int slot, char *how, size_t cap);
/* Asks the worker to exit after its current chunk. */
int mp__worker_send_exit(worker *w);
/* Queues chunks (takes them) and wakes the handler; MP_ESTATE if closed. */
int mp__pool_submit(mp_pool *p, mp__chunk *head, mp__chunk *tail, const char *call);
/* inflight.c (handler thread): a result ready for its callback; a chunk
 * failed item by item with rc and why (then freed); w's chunks in flight,
 * oldest first (push appends, pop takes the one it runs); a worker's end,
 * its answer. */
void mp__pool_push_ready(mp_pool *p, mp_async_result *r);
void mp__chunk_fail(mp_pool *p, mp__chunk *c, int rc, const char *why);
void mp__cur_push(worker *w, mp__chunk *c);
mp__chunk *mp__cur_pop(worker *w);
void mp__worker_ended(mp_pool *p, int slot);
void mp__worker_answer(mp_pool *p, worker *w, mp_msg *m); /* takes m */
/* VEC: takes a cached shared array of at least bytes (NULL when none). */
mp_tensor *mp__pool_vec_take(mp_pool *p, int which, size_t bytes);
/* The chunk size a map of n items gets. */
/* The chunk size to use: chunksize, or for 0 Python's rule
 * ceil(n / (4 * nprocs)), capped for small items (item_bytes: their mean
 * payload, 0 when unknown or carrying attachments) so that a chunk travels
 * inline (docs/pool.md). */
size_t mp__pool_chunksize(const mp_pool *p, size_t n, size_t chunksize, size_t item_bytes);
/* A chunk's record stays under the wire's inline limit (60 KiB) with room
 * for the header and the task name; the cap applies only when it leaves at
 * least this many items per chunk. */
#define MP__POOL_INLINE_BUDGET (56u * 1024u)
#define MP__POOL_INLINE_MIN_ITEMS 256u

#endif
