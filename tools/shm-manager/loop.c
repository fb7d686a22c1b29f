/* The daemon's event loop: one poll over the listening socket, a signalfd,
 * each connection and each client's pidfd. Single-threaded. */
#include "loop.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"

enum { KIND_NEW, KIND_CLIENT, KIND_CONTROL };

typedef struct conn {
    int fd, pidfd;
    int kind;
    uint64_t id;
    pid_t pid;
    bool gone;
    size_t in_len;
    char in[MP__MGR_LINE_MAX * 4];
} conn;

static conn **conns;
static int nconns;
static uint64_t next_id = 1;
static double started;
static const loop_config *config;
static bool stop_requested;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int listen_on(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (fd < 0)
        return -1;
    unlink(path); /* a stale socket of a killed daemon; we hold the lock */
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 128) != 0) {
        dlog("bind/listen %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static int clients_alive(void)
{
    int n = 0;
    for (int i = 0; i < nconns; i++)
        n += conns[i]->kind == KIND_CLIENT && !conns[i]->gone;
    return n;
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
        c->pidfd = -1;
        c->pid = cred.pid;
        c->id = next_id++;
        conns[nconns++] = c;
    }
}

static void reply(conn *c, const char *cmd)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    char dir[256] = "";
    if (!f)
        return;
    mp__mgr_runtime_dir(dir, sizeof dir, false);
    if (strcmp(cmd, "STATUS") == 0) {
        fprintf(f, "pid %d\nprotocol %d\nclients %d\nsegments %d\ngrace %g\nuptime %.1f\n"
                   "runtime_dir %s\n",
                (int)getpid(), MP__MGR_PROTOCOL, clients_alive(), table_count(), config->grace,
                now() - started, dir);
    } else if (strcmp(cmd, "LIST") == 0) {
        table_list(f);
    } else if (strcmp(cmd, "STOP") == 0) {
        fprintf(f, "OK stopping\n");
        stop_requested = true;
    } else {
        fprintf(f, "ERR unknown command %s\n", cmd);
    }
    fprintf(f, "END\n");
    fclose(f);
    /* Replies are small and the reader waits for them: block a little. */
    struct timeval tv = {1, 0};
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
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
    c->gone = true;
}

static void handle_line(conn *c, char *line)
{
    if (c->kind == KIND_NEW) {
        int proto = 0, pid = 0;
        if (sscanf(line, "HELLO %d %d", &proto, &pid) == 2) {
            if (proto != MP__MGR_PROTOCOL) {
                dlog("pid %d speaks protocol %d, we speak %d: dropped", (int)c->pid, proto,
                     MP__MGR_PROTOCOL);
                c->gone = true;
                return;
            }
            c->kind = KIND_CLIENT;
            c->pidfd = (int)syscall(SYS_pidfd_open, c->pid, 0);
            return;
        }
        c->kind = KIND_CONTROL;
        reply(c, line);
        return;
    }
    if (c->kind == KIND_CLIENT)
        table_report(c->id, c->pid, line);
}

/* Reads everything the peer wrote. At EOF (or on error) marks it gone. */
static void drain(conn *c)
{
    while (!c->gone) {
        ssize_t r = recv(c->fd, c->in + c->in_len, sizeof c->in - c->in_len, MSG_DONTWAIT);
        char *nl, *start = c->in;
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return;
        if (r <= 0) {
            c->gone = true;
            return;
        }
        c->in_len += (size_t)r;
        while (!c->gone && (nl = memchr(start, '\n', c->in_len - (size_t)(start - c->in)))) {
            *nl = 0;
            handle_line(c, start);
            start = nl + 1;
        }
        c->in_len -= (size_t)(start - c->in);
        memmove(c->in, start, c->in_len);
        if (c->in_len == sizeof c->in) {
            dlog("pid %d: line too long, dropped", (int)c->pid);
            c->gone = true;
        }
    }
}

static void close_gone(void)
{
    for (int i = 0; i < nconns; i++) {
        conn *c = conns[i];
        if (!c->gone)
            continue;
        if (c->kind == KIND_CLIENT) {
            table_client_gone(c->id, c->pid);
            if (!mp__pid_alive(c->pid))
                table_scan(c->pid); /* what it created but could not report */
        }
        close(c->fd);
        if (c->pidfd >= 0)
            close(c->pidfd);
        free(c);
        conns[i--] = conns[--nconns];
    }
}

/* One poll round. Returns the number of reclaim candidates. */
static int serve(int lfd, int sfd, int timeout_ms)
{
    int n = nconns, np = 0;
    struct pollfd *p = calloc((size_t)(2 + 2 * n), sizeof *p);
    if (!p) {
        usleep(10000);
        return 1;
    }
    p[np++] = (struct pollfd){.fd = lfd, .events = POLLIN};
    p[np++] = (struct pollfd){.fd = sfd, .events = POLLIN};
    for (int i = 0; i < n; i++) {
        p[np++] = (struct pollfd){.fd = conns[i]->fd, .events = POLLIN};
        p[np++] = (struct pollfd){.fd = conns[i]->pidfd, .events = POLLIN};
    }
    if (poll(p, (nfds_t)np, timeout_ms) > 0) {
        if (p[1].revents) {
            struct signalfd_siginfo si;
            if (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                dlog("signal %u: stopping", si.ssi_signo);
                stop_requested = true;
            }
        }
        /* Read every connection, readable or not: a candidate decided at the
         * previous round must see all reports written before now. */
        for (int i = 0; i < n; i++) {
            drain(conns[i]);
            if (p[3 + 2 * i].revents && conns[i]->kind == KIND_CLIENT) {
                drain(conns[i]); /* its last words, then it is gone */
                conns[i]->gone = true;
            }
        }
        if (p[0].revents)
            accept_all(lfd);
    }
    free(p);
    close_gone();
    return table_reclaim(clients_alive() > 0);
}

int loop_run(const loop_config *cfg, int ready_fd)
{
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    sigset_t sigs;
    int lfd, sfd, candidates = 0;
    double grace_end = 0;
    bool idle_reclaimed = false;

    config = cfg;
    started = now();
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    sigprocmask(SIG_BLOCK, &sigs, NULL);
    sfd = signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK);
    if (mp__mgr_path(path, sizeof path, MP__MGR_SOCKET, true) < 0 || sfd < 0 ||
        (lfd = listen_on(path)) < 0) {
        dlog("cannot listen: %s", mp_last_error());
        if (ready_fd >= 0)
            close(ready_fd);
        return 1;
    }
    table_scan(0);
    dlog("listening on %s (grace %g s%s)", path, cfg->grace,
         cfg->persistent ? ", persistent" : "");
    if (ready_fd >= 0) {
        (void)!write(ready_fd, "R", 1);
        close(ready_fd);
    }
    while (!stop_requested) {
        int timeout = -1;
        if (clients_alive() == 0 && !idle_reclaimed && grace_end == 0)
            grace_end = now() + cfg->grace;
        if (candidates > 0)
            timeout = 20;
        else if (grace_end > 0)
            timeout = grace_end > now() ? (int)((grace_end - now()) * 1000) + 1 : 0;
        else if (table_has_adopted())
            timeout = 1000;
        candidates = serve(lfd, sfd, timeout);
        if (clients_alive() > 0) {
            grace_end = 0;
            idle_reclaimed = false;
            continue;
        }
        if (grace_end == 0 || now() < grace_end)
            continue;
        /* Grace over. Stop taking connections, then serve whoever slipped in. */
        unlink(path);
        accept_all(lfd);
        if (nconns > 0) {
            close(lfd);
            if ((lfd = listen_on(path)) < 0)
                return 1;
            grace_end = 0;
            continue;
        }
        table_reclaim_all();
        if (!cfg->persistent) {
            dlog("no client for %g s: exiting", cfg->grace);
            close(lfd);
            close(sfd);
            return 0;
        }
        close(lfd);
        if ((lfd = listen_on(path)) < 0)
            return 1;
        grace_end = 0;
        idle_reclaimed = true; /* until a client comes */
    }
    /* STOP or a signal: live clients keep their segments (they restart a
     * daemon at their next report); with none left, reclaim now. */
    unlink(path);
    close(lfd);
    for (int i = 0; i < nconns; i++)
        drain(conns[i]);
    close_gone();
    if (clients_alive() == 0)
        table_reclaim_all();
    dlog("stopped");
    close(sfd);
    return 0;
}
