/* mproc shm ls / gc: this user's segments, seen from outside. */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "cuda/cuda_internal.h"
#include "shm/manager.h"

typedef struct seg {
    mp__seg_info info;
    bool fd_strategy;      /* a memfd seen in live processes */
    bool cuda_event;       /* the CUDA driver's event file, not an mproc segment */
    long long in_flight;   /* sent - received per the daemon; 0 if unknown */
    int daemon_holders;    /* -1 when the daemon does not track it */
    bool leaked;
} seg;

typedef struct seglist {
    seg *v;
    int n, cap;
    const char *prefix;
    const mp__seg_users *users;
} seglist;

static seg *push(seglist *l)
{
    if (l->n == l->cap) {
        int cap = l->cap ? l->cap * 2 : 32;
        seg *nv = realloc(l->v, (size_t)cap * sizeof *nv);
        if (!nv)
            return NULL;
        l->v = nv;
        l->cap = cap;
    }
    memset(&l->v[l->n], 0, sizeof l->v[0]);
    l->v[l->n].daemon_holders = -1;
    return &l->v[l->n++];
}

static int add_mproc_segment(const char *name, void *ctx)
{
    seglist *l = ctx;
    char full[MP__SHM_NAME_MAX + 1];
    seg *s;
    snprintf(full, sizeof full, "/%s", name);
    if (l->prefix && strncmp(full, l->prefix, strlen(l->prefix)) != 0)
        return 0;
    if (!(s = push(l)))
        return 1;
    if (mp__seg_inspect(name, l->users, &s->info) != 0)
        l->n--; /* vanished meanwhile */
    return 0;
}

/* The CUDA driver's event files (cuda.shm.<uid>.<pid>.<n>): the driver never
 * removes them, mproc does at a normal exit, so a killed process leaves its
 * own (src/cuda/event_files.c). No header: the name gives the pid. */
static int add_cuda_event_file(const char *name, void *ctx)
{
    seglist *l = ctx;
    char path[sizeof "/dev/shm" + sizeof l->v->info.name];
    const char *shm_name = path + strlen("/dev/shm"); /* "/cuda.shm..." */
    struct stat st;
    seg *s;
    /* a longer name is not the driver's (and gc must unlink it whole) */
    if (strlen(name) + 1 >= sizeof l->v->info.name)
        return 0;
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    if ((l->prefix && strncmp(shm_name, l->prefix, strlen(l->prefix)) != 0) ||
        stat(path, &st) != 0)
        return 0;
    if (!(s = push(l)))
        return 1;
    s->cuda_event = true;
    memcpy(s->info.name, shm_name, strlen(shm_name) + 1);
    s->info.size = s->info.file_size = (uint64_t)st.st_size;
    s->info.creator = mp__cuda_event_file_pid(name);
    s->info.creator_alive = mp__pid_alive(s->info.creator);
    s->info.users = mp__seg_users_count(l->users, s->info.name);
    return 0;
}

/* What `shm ls` shows of /dev/shm: mproc's segments and the driver's files. */
static bool listed(const char *name)
{
    return mp__mgr_name_ok(name) || mp__cuda_event_file_pid(name) > 0;
}

static int add_listed(const char *name, void *ctx)
{
    return mp__mgr_name_ok(name) ? add_mproc_segment(name, ctx)
                                 : add_cuda_event_file(name, ctx);
}

/* file_descriptor segments: memfds named "mproc" held by live processes. */
static void add_memfds(seglist *l)
{
    DIR *proc = opendir("/proc");
    struct dirent *p;
    if (!proc)
        return;
    while ((p = readdir(proc))) {
        char dir[300], link[600], target[256];
        DIR *fds;
        struct dirent *f;
        if (p->d_name[0] < '1' || p->d_name[0] > '9')
            continue;
        snprintf(dir, sizeof dir, "/proc/%s/fd", p->d_name);
        if (!(fds = opendir(dir)))
            continue;
        while ((f = readdir(fds))) {
            struct stat st;
            ssize_t n;
            seg *s = NULL;
            snprintf(link, sizeof link, "%s/%s", dir, f->d_name);
            n = readlink(link, target, sizeof target - 1);
            if (n <= 0)
                continue;
            target[n] = 0;
            if (strncmp(target, "/memfd:mproc", 12) != 0 || stat(link, &st) != 0 ||
                st.st_uid != geteuid())
                continue;
            for (int i = 0; i < l->n && !s; i++)
                if (l->v[i].fd_strategy && l->v[i].info.file_size == (uint64_t)st.st_ino)
                    s = &l->v[i];
            if (s) {
                s->info.users++;
                continue;
            }
            if (!(s = push(l)))
                break;
            s->fd_strategy = true;
            snprintf(s->info.name, sizeof s->info.name, "memfd:mproc@%lu",
                     (unsigned long)st.st_ino);
            s->info.file_size = (uint64_t)st.st_ino; /* key while scanning */
            s->info.size = (uint64_t)st.st_size;
            s->info.creator = (pid_t)atoi(p->d_name);
            s->info.creator_alive = true;
            s->info.users = 1;
        }
        closedir(fds);
    }
    closedir(proc);
}

/* What the daemon knows: holders and messages in flight. */
static void merge_daemon(seglist *l)
{
    char *reply = NULL, *line, *save = NULL;
    if (mp__mgr_control("LIST", &reply, 2.0) != 0)
        return;
    for (line = strtok_r(reply, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[MP__SHM_NAME_MAX + 1];
        unsigned long long size;
        int creator, holders;
        long long sent, received;
        if (sscanf(line, "SEG %64s %llu %d %d %lld %lld", name, &size, &creator, &holders,
                   &sent, &received) != 6)
            continue;
        for (int i = 0; i < l->n; i++)
            if (!l->v[i].fd_strategy && strcmp(l->v[i].info.name, name) == 0) {
                l->v[i].daemon_holders = holders;
                l->v[i].in_flight = sent > received ? sent - received : 0;
            }
    }
    free(reply);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const seg *)a)->info.name, ((const seg *)b)->info.name);
}

static int collect(seglist *l, mp__seg_users *users)
{
    int rc = mp__seg_users_collect(users, listed);
    if (rc < 0)
        return rc;
    l->users = users;
    if ((rc = mp__shm_each(listed, add_listed, l)) < 0)
        return rc;
    if (!l->prefix)
        add_memfds(l);
    merge_daemon(l);
    for (int i = 0; i < l->n; i++) {
        seg *s = &l->v[i];
        if (!s->fd_strategy && s->info.users <= 0 && !s->info.creator_alive &&
            s->in_flight == 0 && s->daemon_holders <= 0)
            s->leaked = true;
        /* A peer that opened the dead process's events maps its file for
         * life, but never opens it again: the name can go. */
        if (s->cuda_event && !s->info.creator_alive)
            s->leaked = true;
    }
    if (l->n > 1)
        qsort(l->v, (size_t)l->n, sizeof *l->v, by_name);
    return 0;
}

static uint64_t seg_size(const seg *s)
{
    return s->info.has_header || s->fd_strategy ? s->info.size : s->info.file_size;
}

/* The text of one row's numbers, and of its refcount ("-" for a memfd). */
typedef struct row {
    char size[24], creator[16], refs[16], users[16];
} row;

static void row_of(const seg *s, row *r)
{
    snprintf(r->size, sizeof r->size, "%llu", (unsigned long long)seg_size(s));
    snprintf(r->creator, sizeof r->creator, "%d", (int)s->info.creator);
    snprintf(r->refs, sizeof r->refs, "-");
    if (!s->fd_strategy && s->info.has_header)
        snprintf(r->refs, sizeof r->refs, "%u", s->info.refcount);
    snprintf(r->users, sizeof r->users, "%d", s->info.users);
}

static int widest(int w, const char *text)
{
    int n = (int)strlen(text);
    return n > w ? n : w;
}

/* Columns as wide as their widest cell, so a list fits an 80-column
 * terminal (74 columns with 7-digit pids and 10-digit sizes). No STRATEGY
 * column: the name says it ("/mproc-..." is a file_system segment,
 * "memfd:..." a file_descriptor one); --json has it. */
static void print_text(const seglist *l)
{
    int wn = 4, ws = 4, wc = 7, wr = 4, wu = 5;
    row r;
    for (int i = 0; i < l->n; i++) {
        row_of(&l->v[i], &r);
        wn = widest(wn, l->v[i].info.name);
        ws = widest(ws, r.size);
        wc = widest(wc, r.creator);
        wr = widest(wr, r.refs);
        wu = widest(wu, r.users);
    }
    printf("%-*s %*s %*s %-5s %*s %*s %s\n", wn, "NAME", ws, "SIZE", wc, "CREATOR", "ALIVE", wr,
           "REFS", wu, "USERS", "LEAKED");
    for (int i = 0; i < l->n; i++) {
        const seg *s = &l->v[i];
        row_of(s, &r);
        printf("%-*s %*s %*s %-5s %*s %*s %s\n", wn, s->info.name, ws, r.size, wc, r.creator,
               s->info.creator_alive ? "yes" : "no", wr, r.refs, wu, r.users,
               s->leaked ? "yes" : "no");
    }
}

static const char *strategy_of(const seg *s)
{
    return s->cuda_event ? "cuda_event" : s->fd_strategy ? "file_descriptor" : "file_system";
}

static void print_json(const seglist *l)
{
    printf("{\"segments\":[");
    for (int i = 0; i < l->n; i++) {
        const seg *s = &l->v[i];
        printf("%s\n{\"name\":", i ? "," : "");
        json_string(stdout, s->info.name);
        printf(",\"size\":%llu,\"strategy\":\"%s\",\"creator\":%d,\"creator_alive\":%s,",
               (unsigned long long)seg_size(s),
               strategy_of(s), (int)s->info.creator,
               s->info.creator_alive ? "true" : "false");
        if (!s->fd_strategy && s->info.has_header)
            printf("\"refcount\":%u,", s->info.refcount);
        else
            printf("\"refcount\":null,");
        printf("\"users\":%d,\"in_flight\":%lld,\"leaked\":%s}", s->info.users, s->in_flight,
               s->leaked ? "true" : "false");
    }
    printf("%s]}\n", l->n ? "\n" : "");
}

/* argv[0] is "ls" or "gc"; flag is that command's one switch. */
static int parse(int argc, char **argv, const char *topic, const char *flag, bool *flag_on,
                 const char **prefix)
{
    const struct option opts[] = {{flag + 2, no_argument, 0, 'f'},
                                  {"prefix", required_argument, 0, 'p'},
                                  CLI_COMMON_OPTIONS};
    int c, status = EXIT_OK;
    optind = 0;
    while ((c = cli_getopt(argc, argv, ":hV", opts, topic, &status)) != -1) {
        if (c == CLI_DONE)
            return status == EXIT_OK ? CLI_DONE : status;
        if (c == 'f')
            *flag_on = true;
        else if (c == 'p')
            *prefix = optarg;
    }
    if (optind < argc)
        return cli_bad_usage(topic, "unexpected argument \"%s\"", argv[optind]);
    return EXIT_OK;
}

static int shm_ls(int argc, char **argv)
{
    bool json = false;
    seglist l = {0};
    mp__seg_users users = {0};
    int rc = parse(argc, argv, "shm ls", "--json", &json, &l.prefix);
    if (rc != EXIT_OK)
        return rc == CLI_DONE ? EXIT_OK : rc;
    if (collect(&l, &users) < 0) {
        fprintf(stderr, "mproc shm ls: %s\n", mp_last_error());
        rc = EXIT_FAIL;
    } else if (json) {
        print_json(&l);
    } else {
        print_text(&l);
    }
    mp__seg_users_free(&users);
    free(l.v);
    return rc;
}

static int shm_gc(int argc, char **argv)
{
    bool dry = false;
    seglist l = {0};
    mp__seg_users users = {0};
    unsigned long long bytes = 0;
    int freed = 0, rc = parse(argc, argv, "shm gc", "--dry-run", &dry, &l.prefix);
    if (rc != EXIT_OK)
        return rc == CLI_DONE ? EXIT_OK : rc;
    if (collect(&l, &users) < 0) {
        fprintf(stderr, "mproc shm gc: %s\n", mp_last_error());
        rc = EXIT_FAIL;
        goto out;
    }
    for (int i = 0; i < l.n; i++) {
        const seg *s = &l.v[i];
        if (!s->leaked)
            continue;
        if (!dry && shm_unlink(s->info.name) != 0 && errno != ENOENT) {
            fprintf(stderr, "mproc shm gc: shm_unlink(%s): %s\n", s->info.name,
                    strerror(errno));
            rc = EXIT_FAIL;
            continue;
        }
        /* The name holds the dead creator's pid; the line fits 80 columns. */
        printf("%s %s (%llu bytes)\n", dry ? "would free" : "freed", s->info.name,
               (unsigned long long)s->info.file_size);
        freed++;
        bytes += s->info.file_size;
    }
    printf("%s %d segment%s, %llu bytes\n", dry ? "would free" : "freed", freed,
           freed == 1 ? "" : "s", bytes);
out:
    mp__seg_users_free(&users);
    free(l.v);
    return rc;
}

int cmd_shm(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "ls") == 0)
        return shm_ls(argc - 1, argv + 1);
    if (argc >= 2 && strcmp(argv[1], "gc") == 0)
        return shm_gc(argc - 1, argv + 1);
    if (argc >= 2 && argv[1][0] == '-') {
        static const struct option opts[] = {CLI_COMMON_OPTIONS};
        int status = EXIT_OK;
        optind = 0;
        if (cli_getopt(argc, argv, "+:hV", opts, "shm", &status) == CLI_DONE)
            return status;
    }
    if (argc < 2)
        return cli_bad_usage("shm", "shm needs a subcommand: ls or gc");
    return cli_bad_usage("shm", "unknown shm subcommand \"%s\"", argv[1]);
}
