/* The job: mp_mpi_init/finalize, who is who, and the waits every blocking
 * call of the layer goes through (they watch for failed ranks). */
#include "mpi/mpi_internal.h"
#include "shm/recycle.h"

#include <errno.h>
#include <stddef.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

mp__mpi_job mp__mpi = {.comm = MPI_COMM_NULL, .node = MPI_COMM_NULL};

int mp__mpi_need(const char *fn)
{
    if (!mp__mpi.up)
        return mp__error(MP_ESTATE, "%s: the MPI layer is not initialized; call mp_mpi_init "
                                    "after mp_setup, in every rank", fn);
    return 0;
}

bool mp__mpi_forked(void)
{
    return mp__mpi.up && mp__pid() != mp__mpi.pid;
}

int mp__mpi_own(const char *fn)
{
    if (!mp__mpi_forked())
        return 0;
    return mp__error(MP_ESTATE, "%s: this object is shared by MPI ranks and belongs to the "
                                "rank's process (pid %d); this process (pid %d) was forked "
                                "from it, and MPI cannot be used in a forked process: give "
                                "the child a local mp_queue or mp_pipe and let the rank "
                                "forward", fn, (int)mp__mpi.pid, (int)mp__pid());
}

int mp__mpi_error(int mpirc, const char *fn, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(mpirc, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", mpirc);
    return mp__error(MP_ESYS, "%s: %s failed: %s", fn, what, text);
}

int mp__mpi_fail_error(const char *fn)
{
    const mp__mpi_fail *f = &mp__mpi.failure;
    return mp__error(MP_ECHILD, "%s: rank %d (pid %d on %s) failed: %s", fn, f->rank, f->pid,
                     f->host, f->message);
}

static void fail_note(const mp__mpi_fail *f)
{
    if (!mp__mpi.failed) {
        mp__mpi.failure = *f;
        mp__mpi.failure.host[MP__MPI_HOST_MAX - 1] = 0;
        mp__mpi.failure.message[MP__MPI_TEXT_MAX - 1] = 0;
        mp__mpi.failed = true;
    }
}

void mp__mpi_fail_report(const mp__mpi_fail *f)
{
    bool first = !mp__mpi.failed;
    fail_note(f);
    if (!first)
        return; /* a consequence of a failure everyone already knows */
    /* Small fixed-size records go eagerly: the sends complete at once, so a
     * rank that exits right after still delivers its record. */
    for (int r = 0; r < mp__mpi.size; r++)
        if (r != mp__mpi.rank)
            MPI_Send(&mp__mpi.failure, sizeof(mp__mpi_fail), MPI_BYTE, r, MP__TAG_FAIL,
                     mp__mpi.comm);
}

/* A zombie's exit status from /proc/PID/stat (field 52), while mpirun has
 * not reaped it yet: -signal or the status, or INT32_MIN when unknown. */
static int zombie_status(pid_t pid, int *sig)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p)
        return INT32_MIN;
    int field = 2;
    char *save = NULL;
    for (char *tok = strtok_r(p + 1, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        if (++field == 52) {
            int st = atoi(tok);
            *sig = st & 0x7f;
            return *sig ? -*sig : (st >> 8) & 0xff;
        }
    }
    return INT32_MIN;
}

/* A rank of this host whose pidfd turned readable has exited. */
static void check_local_pids(void)
{
    for (int r = 0; r < mp__mpi.size && !mp__mpi.failed; r++) {
        mp__mpi_peer *p = &mp__mpi.peers[r];
        struct pollfd pfd = {.fd = p->pidfd, .events = POLLIN};
        if (p->pidfd < 0 || poll(&pfd, 1, 0) != 1)
            continue;
        mp__mpi_fail f = {.rank = r, .pid = p->pid};
        int sig = 0, st = zombie_status(p->pid, &sig);
        snprintf(f.host, sizeof f.host, "%s", p->host);
        f.exitcode = st == INT32_MIN ? -1 : st;
        f.signal = sig;
        if (sig)
            snprintf(f.message, sizeof f.message, "died of signal %d (%s) without a report", sig,
                     strsignal(sig));
        else
            snprintf(f.message, sizeof f.message, "exited%s without a report",
                     st == INT32_MIN ? "" : " while the job ran");
        mp__mpi_fail_report(&f);
    }
}

int mp__mpi_check(const char *fn)
{
    int done = 0;
    /* Other threads (the queue broker's, a user's) wait too; the watch's
     * request is the initializing thread's alone (an MPI request is tested
     * by one thread), what it found is everyone's. */
    if (!pthread_equal(pthread_self(), mp__mpi.main_thread))
        return mp__mpi.failed ? mp__mpi_fail_error(fn) : 0;
    if (!mp__mpi.failed && mp__mpi.fail_req != MPI_REQUEST_NULL) {
        MPI_Test(&mp__mpi.fail_req, &done, MPI_STATUS_IGNORE);
        if (done) {
            fail_note(&mp__mpi.fail_in);
            MPI_Irecv(&mp__mpi.fail_in, sizeof(mp__mpi_fail), MPI_BYTE, MPI_ANY_SOURCE,
                      MP__TAG_FAIL, mp__mpi.comm, &mp__mpi.fail_req);
        }
    }
    if (!mp__mpi.failed) {
        double now = mp__now();
        if (now >= mp__mpi.next_pid_check) {
            mp__mpi.next_pid_check = now + 0.005;
            check_local_pids();
        }
    }
    return mp__mpi.failed ? mp__mpi_fail_error(fn) : 0;
}

/* Spins on MPI first (latency), then yields, then naps: ranks may share
 * cores (oversubscribed runs, worker processes beside them) and a long
 * wait must not take a core from them. The spin lasts a few hundred
 * microseconds, as MPI's own blocking calls (which never stop spinning)
 * would: a rank that yields at once loses its core to any runnable
 * process on a loaded host, and its peer's next message waits for a
 * whole time slice. */
void mp__mpi_backoff(unsigned *spins)
{
    (*spins)++;
    if (*spins < MP__MPI_SPINS)
        return;
    if (*spins < 2 * MP__MPI_SPINS) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, *spins < 2 * MP__MPI_SPINS + 1000 ? 20000 : 200000};
    nanosleep(&ts, NULL);
}

double mp__mpi_slice(double deadline)
{
    const double slice = 0.05;
    if (deadline == 0)
        return 0;
    if (deadline < 0)
        return slice;
    double left = deadline - mp__now();
    return left < 0 ? 0 : left < slice ? left : slice;
}

int mp__mpi_expired(double deadline, const char *fn, const char *what)
{
    if (deadline == 0)
        return mp__error(MP_ETIMEDOUT, "%s: %s", fn, what);
    if (deadline > 0 && mp__now() >= deadline)
        return mp__error(MP_ETIMEDOUT, "%s: timed out", fn);
    return 0;
}

static int wait_req(MPI_Request *req, double deadline, MPI_Status *st, const char *fn,
                    bool data)
{
    unsigned spins = 0;
    for (;;) {
        int done = 0, rc = MPI_Test(req, &done, st ? st : MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return mp__mpi_error(rc, fn, "MPI_Test");
        if (done)
            return 0;
        /* The rest every 16 rounds while spinning (at once for a poll,
         * and once yielding or napping): a waiter that mostly tests
         * answers sooner. */
        if (spins % 16 == 0 || spins >= MP__MPI_SPINS || deadline == 0) {
            if ((rc = mp__mpi_check(fn)) != 0)
                return rc;
            if ((rc = mp__mpi_expired(deadline, fn, "would block")) != 0)
                return rc;
        }
        if (data && spins >= MP__MPI_SPINS)
            sched_yield(); /* bytes flow only while MPI is called: never nap */
        else
            mp__mpi_backoff(&spins);
    }
}

int mp__mpi_wait(MPI_Request *req, double deadline, MPI_Status *st, const char *fn)
{
    return wait_req(req, deadline, st, fn, false);
}

int mp__mpi_wait_data(MPI_Request *req, double deadline, MPI_Status *st, const char *fn)
{
    return wait_req(req, deadline, st, fn, true);
}

/* Rank 0 draws a random token that names this job's same-host sockets. */
static int job_token(char *tok, size_t cap)
{
    unsigned char raw[12] = {0};
    if (mp__mpi.rank == 0) {
        FILE *f = fopen("/dev/urandom", "re");
        if (!f || fread(raw, 1, sizeof raw, f) != sizeof raw) {
            if (f)
                fclose(f);
            return mp__errno_error(errno, "mp_mpi_init: reading /dev/urandom");
        }
        fclose(f);
    }
    MPI_Bcast(raw, sizeof raw, MPI_BYTE, 0, mp__mpi.comm);
    for (size_t i = 0; i < sizeof raw && 2 * i + 2 < cap; i++)
        snprintf(tok + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

/* Host names and pids of every rank, and which ranks share this host. */
static int gather_peers(void)
{
    mp__mpi_fail me = {.rank = mp__mpi.rank, .pid = (int32_t)getpid()};
    mp__mpi_fail *all = calloc((size_t)mp__mpi.size, sizeof *all);
    int *locals = calloc((size_t)mp__mpi.size, sizeof *locals);
    mp__mpi.peers = calloc((size_t)mp__mpi.size, sizeof *mp__mpi.peers);
    if (!all || !locals || !mp__mpi.peers) {
        free(all), free(locals);
        return mp__error(MP_ENOMEM, "mp_mpi_init: out of memory for %d ranks", mp__mpi.size);
    }
    gethostname(me.host, sizeof me.host - 1);
    /* Only the fixed head (no message) crosses: host and pid. */
    size_t head = offsetof(mp__mpi_fail, message);
    char *buf = malloc(head * (size_t)mp__mpi.size);
    if (!buf) {
        free(all), free(locals);
        return mp__error(MP_ENOMEM, "mp_mpi_init: out of memory for %d ranks", mp__mpi.size);
    }
    MPI_Allgather(&me, (int)head, MPI_BYTE, buf, (int)head, MPI_BYTE, mp__mpi.comm);
    int world = mp__mpi.rank;
    for (int r = 0; r < mp__mpi.size; r++) {
        memcpy(&all[r], buf + head * (size_t)r, head);
        mp__mpi_peer *p = &mp__mpi.peers[r];
        snprintf(p->host, sizeof p->host, "%s", all[r].host);
        p->pid = all[r].pid;
        p->local = -1, p->sock = -1, p->pidfd = -1;
    }
    /* The node communicator's ranks, in local order. */
    MPI_Allgather(&world, 1, MPI_INT, locals, 1, MPI_INT, mp__mpi.node);
    for (int l = 0; l < mp__mpi.local_size; l++)
        mp__mpi.peers[locals[l]].local = l;
    free(buf), free(all), free(locals);
    return 0;
}

static int init_mpi(int *argc, char ***argv)
{
    int inited = 0, provided = 0, rc;
    MPI_Initialized(&inited);
    if (!inited) {
        rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS)
            return mp__mpi_error(rc, "mp_mpi_init", "MPI_Init_thread");
        mp__mpi.owns_mpi = true;
    } else {
        MPI_Query_thread(&provided);
    }
    mp__mpi.thread_level = provided;
    mp__mpi.main_thread = pthread_self();
    MPI_Comm_dup(MPI_COMM_WORLD, &mp__mpi.comm);
    /* Errors come back as codes: a dead peer must not abort us silently. */
    MPI_Comm_set_errhandler(mp__mpi.comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mp__mpi.comm, &mp__mpi.rank);
    MPI_Comm_size(mp__mpi.comm, &mp__mpi.size);
    MPI_Comm_split_type(mp__mpi.comm, MPI_COMM_TYPE_SHARED, mp__mpi.rank, MPI_INFO_NULL,
                        &mp__mpi.node);
    MPI_Comm_rank(mp__mpi.node, &mp__mpi.local_rank);
    MPI_Comm_size(mp__mpi.node, &mp__mpi.local_size);
    return 0;
}

int mp_mpi_init(int *argc, char ***argv)
{
    char token[32] = "";
    const char *env = getenv("MPROC_MPI_LOCAL");
    int rc;
    if (mp__mpi.up)
        return mp__error(MP_ESTATE, "mp_mpi_init: called twice; once per process is enough");
    if ((rc = init_mpi(argc, argv)) != 0)
        return rc;
    mp__mpi.local_path = !(env && strcmp(env, "0") == 0);
    mp__mpi.failed = false;
    mp__mpi.fail_req = MPI_REQUEST_NULL;
    if ((rc = gather_peers()) != 0 || (rc = job_token(token, sizeof token)) != 0)
        goto fail;
    if ((rc = mp__mpi_local_connect(token)) != 0)
        goto fail;
    MPI_Irecv(&mp__mpi.fail_in, sizeof(mp__mpi_fail), MPI_BYTE, MPI_ANY_SOURCE, MP__TAG_FAIL,
              mp__mpi.comm, &mp__mpi.fail_req);
    mp__mpi.pid = mp__pid();
    mp__mpi.up = true;
    return 0;
fail:
    mp__mpi_local_close();
    free(mp__mpi.peers);
    mp__mpi.peers = NULL;
    return rc;
}

/* After a failure: rank 0 has the record to print; the others give it up
 * to 10 s to do so and end the job (its abort kills them). */
static void linger_for_rank0(void)
{
    struct timespec ts = {0, 10 * 1000 * 1000};
    for (int i = 0; i < 1000 && mp__mpi.rank != 0; i++)
        nanosleep(&ts, NULL);
}

int mp_mpi_finalize(void)
{
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = 0;
    if (!mp__mpi.up)
        return 0;
    if (!mp__mpi.failed) {
        /* Everyone arrives, or a failure shows up while waiting. */
        MPI_Ibarrier(mp__mpi.comm, &req);
        rc = mp__mpi_wait(&req, -1, NULL, "mp_mpi_finalize");
    }
    if (mp__mpi.failed || rc != 0) {
        /* A collective finalize would wait for the dead: MPI stays up and
         * the caller exits non-zero, which makes mpirun end the job. */
        linger_for_rank0();
        return mp__mpi.failed ? mp__mpi_fail_error("mp_mpi_finalize") : rc;
    }
    MPI_Cancel(&mp__mpi.fail_req);
    MPI_Wait(&mp__mpi.fail_req, MPI_STATUS_IGNORE);
    mp__mpi_local_close();
    free(mp__mpi.peers);
    mp__mpi.peers = NULL;
    /* Received tensors' memory kept for reuse goes back to the system. */
    mp__segment_recycle_drain();
    MPI_Comm_free(&mp__mpi.node);
    MPI_Comm_free(&mp__mpi.comm);
    mp__mpi.up = false;
    if (mp__mpi.owns_mpi)
        MPI_Finalize();
    mp__mpi.owns_mpi = false;
    return 0;
}

int mp_mpi_rank(void)
{
    int rc = mp__mpi_need("mp_mpi_rank");
    return rc ? rc : mp__mpi.rank;
}

int mp_mpi_size(void)
{
    int rc = mp__mpi_need("mp_mpi_size");
    return rc ? rc : mp__mpi.size;
}

int mp_mpi_local_rank(void)
{
    int rc = mp__mpi_need("mp_mpi_local_rank");
    return rc ? rc : mp__mpi.local_rank;
}

int mp_mpi_local_size(void)
{
    int rc = mp__mpi_need("mp_mpi_local_size");
    return rc ? rc : mp__mpi.local_size;
}

int mp__mpi_rank_check(int rank, const char *what, const char *fn)
{
    int rc = mp__mpi_need(fn);
    if (rc)
        return rc;
    if (rank < 0 || rank >= mp__mpi.size)
        return mp__error(MP_EINVAL, "%s: %s %d is not a rank of this job (0..%d)", fn, what,
                         rank, mp__mpi.size - 1);
    return 0;
}

int mp_mpi_rank_info(int rank, const char **host, pid_t *pid)
{
    int rc = mp__mpi_rank_check(rank, "rank", "mp_mpi_rank_info");
    if (rc)
        return rc;
    if (host)
        *host = mp__mpi.peers[rank].host;
    if (pid)
        *pid = mp__mpi.peers[rank].pid;
    return 0;
}

int mp_mpi_is_local(int rank)
{
    int rc = mp__mpi_rank_check(rank, "rank", "mp_mpi_is_local");
    if (rc)
        return rc;
    return mp__mpi.local_path && mp__mpi.peers[rank].local >= 0 ? 1 : 0;
}

int mp_mpi_barrier(void)
{
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = mp__mpi_need("mp_mpi_barrier");
    if (rc || (rc = mp__mpi_own("mp_mpi_barrier")) != 0)
        return rc;
    if (mp__mpi.failed)
        return mp__mpi_fail_error("mp_mpi_barrier");
    if ((rc = MPI_Ibarrier(mp__mpi.comm, &req)) != MPI_SUCCESS)
        return mp__mpi_error(rc, "mp_mpi_barrier", "MPI_Ibarrier");
    return mp__mpi_wait(&req, -1, NULL, "mp_mpi_barrier");
}
