/* The daemon's event loop: one poll over the listening socket, a signalfd,
 * each connection and each client's pidfd. Single-threaded. */
#include "loop.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "os/os.h"

/* A library client: a process that sent reports, alive until its pidfd
 * is readable. Its id names it in the table's holder lists (a pid can be
 * reused; an id is not). */
typedef struct client {
    pid_t pid;
    int pidfd;          /* -1: pidfd_open unsupported; checked each round */
    uint64_t id;
    bool gone;
    mp__mgr_ring *ring; /* its report ring, NULL when it sends datagrams */
} client;

/* A control connection (the CLI): one command, one answer. */
typedef struct conn {
    int fd;
    bool gone;
    size_t in_len;
    char in[MP__MGR_LINE_MAX];
} conn;

static client *clients;
static int nclients, clients_cap;
static conn **conns;
static int nconns;
static uint64_t next_id = 1;
static double started;
static const loop_config *config;
static bool stop_requested;

static int bind_at(const char *path, int type)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int one = 1, fd = socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (fd < 0)
        return mp__errno_error(errno, "socket for %s", path);
    if (type == SOCK_DGRAM) {
        int rcv = 4 << 20;
        setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof one);
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
    }
    unlink(path); /* a stale socket of a killed daemon; we hold the lock */
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        (type == SOCK_STREAM && listen(fd, 128) != 0)) {
        int rc = mp__errno_error(errno, "bind %s", path);
        close(fd);
        return rc;
    }
    if (type == SOCK_DGRAM) {
        /* Clients re-register when the socket is another daemon's. tmpfs
         * recycles inode numbers, so stamp the file with our pid too. */
        static long seq;
        struct timespec ts[2];
        clock_gettime(CLOCK_REALTIME, &ts[0]);
        ts[0].tv_nsec = ((long)getpid() * 1000 + seq++ % 1000) % 1000000000L;
        ts[1] = ts[0];
        if (utimensat(AT_FDCWD, path, ts, 0) != 0)
            dlog("utimensat(%s): %s", path, strerror(errno));
    }
    return fd;
}

static int clients_alive(void)
{
    int n = 0;
    for (int i = 0; i < nclients; i++)
        n += !clients[i].gone;
    return n;
}

static client *client_of(pid_t pid)
{
    for (int i = 0; i < nclients; i++)
        if (clients[i].pid == pid && !clients[i].gone)
            return &clients[i];
    if (nclients == clients_cap) {
        int cap = clients_cap ? clients_cap * 2 : 16;
        client *nc = realloc(clients, (size_t)cap * sizeof *nc);
        if (!nc)
            return NULL;
        clients = nc;
        clients_cap = cap;
    }
    client *c = &clients[nclients++];
    c->pid = pid;
    c->id = next_id++;
    c->gone = false;
    c->ring = NULL;
    c->pidfd = mp__pidfd_open(pid);
    if (c->pidfd < 0 && errno == ESRCH)
        c->gone = true; /* already dead: apply its last reports, then forget it */
    return c;
}

static void report_lines(void *ctx, char *buf)
{
    client *c = ctx;
    for (char *line = buf, *nl; *line; line = nl + 1) {
        if (!(nl = strchr(line, '\n')))
            break;
        *nl = 0;
        if (strncmp(line, "HELLO ", 6) == 0) {
            int proto = atoi(line + 6);
            if (proto != MP__MGR_PROTOCOL)
                dlog("pid %d speaks protocol %d, we speak %d", (int)c->pid, proto,
                     MP__MGR_PROTOCOL);
            continue;
        }
        /* WAKE (its ring is full) and PING only had to wake us. */
        if (strcmp(line, "WAKE") == 0 || strcmp(line, "PING") == 0)
            continue;
        table_report(c->id, c->pid, line);
    }
}

/* Reads what c wrote into its ring since the last round. */
static void read_ring(client *c)
{
    if (c->ring && !ring_read(c->ring, c->pid, report_lines, c)) {
        ring_detach(c->ring);
        c->ring = NULL;
    }
}

/* c is done with its ring (gone, or it sent a new one): its last lines,
 * then the receives it left pending, count. */
static void read_ring_last(client *c)
{
    read_ring(c);
    if (c->ring)
        ring_read_pending(c->ring, report_lines, c);
    ring_detach(c->ring);
    c->ring = NULL;
}

/* Nobody wakes us for what is written into a ring: while clients have
 * rings we look every RING_MIN_MS, backing off to RING_MAX_MS while they
 * write nothing. (A full ring sends WAKE; an active client PINGs.) */
#define RING_MIN_MS 10
#define RING_MAX_MS 250
static int ring_ms = RING_MIN_MS;

static void read_rings(void)
{
    bool any = false, read = false;
    for (int i = 0; i < nclients; i++) {
        client *c = &clients[i];
        uint64_t before = c->ring ? atomic_load(&c->ring->tail) : 0;
        read_ring(c);
        any = any || c->ring;
        read = read || (c->ring && atomic_load(&c->ring->tail) != before);
    }
    if (!any)
        ring_ms = -1;
    else if (read || ring_ms < 0)
        ring_ms = RING_MIN_MS;
    else if (ring_ms < RING_MAX_MS)
        ring_ms = ring_ms * 2 < RING_MAX_MS ? ring_ms * 2 : RING_MAX_MS;
}

/* A HELLO brought the client's (new) ring: what it left in the old one is
 * read first, the new one replaces it. */
static void take_ring(client *c, int fd)
{
    read_ring_last(c);
    c->ring = ring_attach(fd, c->pid);
}

#define MAX_DGRAM_FDS 4

/* The fds that came with a datagram, -1 padded. */
static int dgram_fds(struct msghdr *mh, int *fds)
{
    int n = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + i * sizeof fd, sizeof fd);
            if (n < MAX_DGRAM_FDS)
                fds[n++] = fd;
            else
                close(fd);
        }
    }
    return n;
}

/* Reads every queued datagram, each stamped by the kernel with its sender.
 * A HELLO may carry the client's report ring. */
static void drain_reports(int dfd)
{
    static char buf[65536 + 1];
    for (;;) {
        char ctl[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int) * MAX_DGRAM_FDS)];
        struct iovec iov = {buf, sizeof buf - 1};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl,
                            .msg_controllen = sizeof ctl};
        struct ucred *cred = NULL;
        int fds[MAX_DGRAM_FDS], nfds;
        ssize_t r = recvmsg(dfd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return;
        buf[r] = 0;
        nfds = dgram_fds(&mh, fds);
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_CREDENTIALS)
                cred = (struct ucred *)CMSG_DATA(cm);
        client *c = NULL;
        if (!cred || cred->uid != geteuid())
            dlog("ignored reports from pid %d uid %d: this shm manager serves uid %u only",
                 cred ? (int)cred->pid : -1, cred ? (int)cred->uid : -1,
                 (unsigned)geteuid());
        else if (!(c = client_of(cred->pid)))
            dlog("out of memory: reports of pid %d lost", (int)cred->pid);
        if (c && nfds == 1 && strncmp(buf, "HELLO ", 6) == 0) {
            take_ring(c, fds[0]);
            nfds = 0;
        }
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        if (c)
            report_lines(c, buf);
    }
}

static void accept_all(int lfd)
{
    for (;;) {
        struct ucred cred;
        socklen_t len = sizeof cred;
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        conn *c;
        if (fd < 0)
            return;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
            cred.uid != geteuid()) {
            char msg[160];
            int n = snprintf(msg, sizeof msg,
                             "ERR uid %u refused: this shm manager serves uid %u only\n",
                             (unsigned)cred.uid, (unsigned)geteuid());
            (void)!send(fd, msg, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
            dlog("refused a connection from pid %d uid %u", (int)cred.pid, (unsigned)cred.uid);
            close(fd);
            continue;
        }
        conn **nc = realloc(conns, (size_t)(nconns + 1) * sizeof *nc);
        if (!nc || !(c = calloc(1, sizeof *c))) {
            if (nc)
                conns = nc;
            dlog("out of memory: dropping a connection");
            close(fd);
            continue;
        }
        conns = nc;
        c->fd = fd;
        conns[nconns++] = c;
    }
}

static void reply(conn *c, const char *cmd)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    char dir[256] = "";
    c->gone = true;
    if (!f)
        return;
    mp__mgr_runtime_dir(dir, sizeof dir, false);
    if (strcmp(cmd, "STATUS") == 0) {
        fprintf(f, "pid %d\nprotocol %d\nclients %d\nsegments %d\ngrace %g\nuptime %.1f\n"
                   "runtime_dir %s\n",
                (int)getpid(), MP__MGR_PROTOCOL, clients_alive(), table_count(), config->grace,
                mp__now() - started, dir);
    } else if (strcmp(cmd, "LIST") == 0) {
        table_list(f);
    } else if (strcmp(cmd, "STOP") == 0) {
        fprintf(f, "OK stopping\n");
        stop_requested = true;
    } else {
        fprintf(f, "ERR unknown command \"%.32s\"\n", cmd);
    }
    fprintf(f, "END\n");
    fclose(f);
    /* Replies are small and the reader waits for them: block a little. */
    for (size_t off = 0; off < len;) {
        ssize_t w = send(c->fd, buf + off, len - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EAGAIN) {
            struct pollfd p = {.fd = c->fd, .events = POLLOUT};
            if (poll(&p, 1, 1000) > 0)
                continue;
        }
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    free(buf);
}

static void drain_control(conn *c)
{
    while (!c->gone) {
        ssize_t r = recv(c->fd, c->in + c->in_len, sizeof c->in - c->in_len - 1, MSG_DONTWAIT);
        char *nl;
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return;
        if (r <= 0) {
            c->gone = true;
            return;
        }
        c->in_len += (size_t)r;
        c->in[c->in_len] = 0;
        if ((nl = strchr(c->in, '\n'))) {
            *nl = 0;
            reply(c, c->in);
        } else if (c->in_len == sizeof c->in - 1) {
            c->gone = true;
        }
    }
}

static void close_gone(void)
{
    for (int i = 0; i < nconns; i++) {
        if (!conns[i]->gone)
            continue;
        close(conns[i]->fd);
        free(conns[i]);
        conns[i--] = conns[--nconns];
    }
    static pid_t *gone;
    static int gone_cap;
    int ngone = 0;
    for (int i = 0; i < nclients; i++) {
        client *c = &clients[i];
        if (!c->gone && c->pidfd < 0 && !mp__pid_alive(c->pid))
            c->gone = true;
        if (!c->gone)
            continue;
        /* What it wrote before it died counts: the name it sent may be
         * in a queue, and its closes end its holds. */
        read_ring_last(c);
        table_client_gone(c->id, c->pid);
        if (ngone == gone_cap) {
            int cap = gone_cap ? gone_cap * 2 : 16;
            pid_t *g = realloc(gone, (size_t)cap * sizeof *g);
            if (g) {
                gone = g;
                gone_cap = cap;
            }
        }
        if (ngone < gone_cap)
            gone[ngone++] = c->pid;
        else
            table_scan(&c->pid, 1); /* out of memory: this one alone */
        if (c->pidfd >= 0)
            close(c->pidfd);
        clients[i--] = clients[--nclients];
    }
    /* What they created but could not report: one pass for all of them. */
    if (ngone)
        table_scan(gone, ngone);
}

/* One poll round. Returns the number of reclaim candidates. */
static int serve(int lfd, int dfd, int sfd, int timeout_ms)
{
    int nc = nconns, ncl = nclients, np = 0;
    struct pollfd *p = calloc((size_t)(3 + nc + ncl), sizeof *p);
    if (!p) {
        usleep(10000);
        return 1;
    }
    p[np++] = (struct pollfd){.fd = lfd, .events = POLLIN};
    p[np++] = (struct pollfd){.fd = dfd, .events = POLLIN};
    p[np++] = (struct pollfd){.fd = sfd, .events = POLLIN};
    for (int i = 0; i < nc; i++)
        p[np++] = (struct pollfd){.fd = conns[i]->fd, .events = POLLIN};
    for (int i = 0; i < ncl; i++)
        p[np++] = (struct pollfd){.fd = clients[i].pidfd, .events = POLLIN};
    if (poll(p, (nfds_t)np, timeout_ms) > 0) {
        if (p[2].revents) {
            struct signalfd_siginfo si;
            if (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                dlog("signal %u: stopping", si.ssi_signo);
                stop_requested = true;
            }
        }
        /* Always read the whole queue: a candidate marked at the previous
         * round must see every report written before now, and a client
         * seen dead below has all its reports in the queue already. */
        drain_reports(dfd);
        read_rings();
        for (int i = 0; i < nc; i++)
            drain_control(conns[i]);
        for (int i = 0; i < ncl; i++)
            if (p[3 + nc + i].revents)
                clients[i].gone = true;
        if (p[0].revents)
            accept_all(lfd);
    } else {
        drain_reports(dfd);
        read_rings();
    }
    free(p);
    close_gone();
    return table_reclaim(mp__now());
}

/* Binds both sockets at their paths (replacing stale ones). */
static int bind_both(const char *spath, const char *dpath, int *lfd, int *dfd)
{
    if ((*lfd = bind_at(spath, SOCK_STREAM)) < 0)
        return -1;
    if ((*dfd = bind_at(dpath, SOCK_DGRAM)) < 0) {
        close(*lfd);
        return -1;
    }
    return 0;
}

static void close_both(const char *spath, const char *dpath, int lfd, int dfd)
{
    unlink(dpath);
    unlink(spath);
    close(lfd);
    close(dfd);
}

/* What the loop keeps between rounds. */
typedef struct loop_state {
    char spath[sizeof(((struct sockaddr_un *)0)->sun_path)];
    char dpath[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int lfd, dfd, sfd, candidates;
    double grace_end;     /* when the grace period with no client ends; 0: not running */
    bool idle_reclaimed;  /* reclaimed with no client (persistent), until a client comes */
    double adopted_check; /* when the adopted candidates were last looked at */
    int adopted_pending;  /* adopted candidates still in quarantine */
    bool rescanned;       /* /dev/shm scanned again since the last client left */
} loop_state;

/* Signals through a signalfd, then both sockets. Tells the starter 'R' or
 * 'F' on ready_fd. */
static int loop_listen(loop_state *st, int ready_fd)
{
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    sigprocmask(SIG_BLOCK, &sigs, NULL);
    if ((st->sfd = signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK)) < 0)
        mp__errno_error(errno, "signalfd");
    if (mp__mgr_path(st->spath, sizeof st->spath, MP__MGR_SOCKET, true) < 0 ||
        mp__mgr_path(st->dpath, sizeof st->dpath, MP__MGR_DGRAM, true) < 0 || st->sfd < 0 ||
        bind_both(st->spath, st->dpath, &st->lfd, &st->dfd) < 0) {
        dlog("cannot listen: %s", mp_last_error());
        starter_tell(ready_fd, 'F');
        if (st->sfd >= 0)
            close(st->sfd);
        return -1;
    }
    return 0;
}

/* How long this round's poll may sleep (ms, -1: until something happens). */
static int round_timeout(const loop_state *st)
{
    int timeout = -1;
    if (st->candidates > 0)
        timeout = 20;
    else if (st->grace_end > 0)
        timeout = mp__poll_ms(st->grace_end);
    else if (table_has_adopted() || (nclients > 0 && clients[0].pidfd < 0))
        timeout = 250;
    if (timeout < 0 || timeout > 250) /* the adopted ones' clock */
        timeout = table_has_adopted() ? 250 : timeout;
    if (ring_ms > 0 && (timeout < 0 || timeout > ring_ms))
        timeout = ring_ms;
    return timeout;
}

/* The grace period with no client is over: 0 to go on, 1 to exit (0),
 * -1 to exit (1). */
static int grace_over(loop_state *st, const loop_config *cfg)
{
    /* A process killed between shm_open and its first report never
     * became our client, so no pidfd told us to look for its segments:
     * one last scan adopts them (their quarantine delays the exit). */
    if (!st->rescanned) {
        st->rescanned = true;
        table_scan(NULL, 0);
        st->adopted_check = mp__now();
        if ((st->adopted_pending = table_reclaim_adopted(st->adopted_check)) > 0)
            return 0;
    }
    /* New clients now find no socket and start another daemon (it waits
     * for our lock); whoever slipped in before the unlink is served, and
     * we stay. */
    unlink(st->dpath);
    unlink(st->spath);
    drain_reports(st->dfd);
    close_both(st->spath, st->dpath, st->lfd, st->dfd);
    close_gone();
    if (clients_alive() == 0) {
        table_reclaim_all(mp__now());
        if (!cfg->persistent) {
            dlog("no client for %g s: exiting", cfg->grace);
            return 1;
        }
        st->idle_reclaimed = true; /* until a client comes */
    }
    if (bind_both(st->spath, st->dpath, &st->lfd, &st->dfd) < 0) {
        dlog("cannot listen again: %s", mp_last_error());
        return -1;
    }
    st->grace_end = 0;
    return 0;
}

int loop_run(const loop_config *cfg, int ready_fd)
{
    loop_state st = {.lfd = -1, .dfd = -1};
    int over = 0;

    config = cfg;
    started = mp__now();
    if (loop_listen(&st, ready_fd) < 0)
        return 1;
    table_init(cfg->grace, st.spath);
    table_scan(NULL, 0);
    dlog("listening on %s (grace %g s%s)", st.spath, cfg->grace,
         cfg->persistent ? ", persistent" : "");
    starter_tell(ready_fd, 'R');
    while (!stop_requested && over == 0) {
        if (clients_alive() == 0 && !st.idle_reclaimed && st.grace_end == 0)
            st.grace_end = mp__now() + cfg->grace;
        st.candidates = serve(st.lfd, st.dfd, st.sfd, round_timeout(&st));
        if (mp__now() - st.adopted_check >= 0.25) {
            st.adopted_check = mp__now();
            st.adopted_pending = table_reclaim_adopted(st.adopted_check);
        }
        if (clients_alive() > 0) {
            st.grace_end = 0;
            st.idle_reclaimed = false;
            st.rescanned = false;
        } else if (st.grace_end > 0 && mp__now() >= st.grace_end && st.adopted_pending == 0)
            over = grace_over(&st, cfg);
    }
    if (over != 0) {
        close(st.sfd);
        return over > 0 ? 0 : 1;
    }
    /* STOP or a signal: live clients keep their segments (they start a new
     * daemon at their next report, which adopts them); with none, reclaim. */
    drain_reports(st.dfd);
    close_both(st.spath, st.dpath, st.lfd, st.dfd);
    for (int i = 0; i < nconns; i++)
        conns[i]->gone = true;
    close_gone();
    if (clients_alive() == 0)
        table_reclaim_all(mp__now());
    dlog("stopped");
    close(st.sfd);
    return 0;
}
