/* mproc doctor: the system limits mproc depends on, each with its fix. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/ioctl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "cli.h"
#include "shm/manager.h"

enum { OK, INFO, WARN, FAIL };
static const char *const status_name[] = {"ok", "info", "warn", "fail"};

typedef struct check {
    const char *name;
    int status;
    char detail[400];
    char fix[400];
} check;

static check checks[12];
static int nchecks;

static check *add(const char *name, int status, const char *fix, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static check *add(const char *name, int status, const char *fix, const char *fmt, ...)
{
    check *c = &checks[nchecks++];
    va_list ap;
    c->name = name;
    c->status = status;
    snprintf(c->fix, sizeof c->fix, "%s", fix ? fix : "");
    va_start(ap, fmt);
    vsnprintf(c->detail, sizeof c->detail, fmt, ap);
    va_end(ap);
    return c;
}

/* More than the kernel lets one process open (fs.nr_open is at most 2^30):
 * larger counts are typos, and fds = tensors + 64 stays far from overflow. */
#define TENSORS_MAX 1000000000LL

static long read_long(const char *path)
{
    FILE *f = fopen(path, "re");
    long v = -1;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

/* file_descriptor: each shared storage a process holds is one fd (plus the
 * ones in flight); 64 for everything else. */
static void check_nofile(long long tensors)
{
    struct rlimit rl;
    long long need = tensors + 64;
    char fix[400];
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        add("open_files", FAIL, NULL, "getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
        return;
    }
    snprintf(fix, sizeof fix,
             rl.rlim_max != RLIM_INFINITY && (long long)rl.rlim_max < need
                 ? "raise the hard limit (limits.conf nofile, systemd LimitNOFILE=, docker "
                   "--ulimit nofile=%lld), or mp_set_sharing_strategy(\"file_system\")"
                 : "run `ulimit -n %lld` (or setrlimit in main), or "
                   "mp_set_sharing_strategy(\"file_system\")",
             need);
    if (rl.rlim_cur != RLIM_INFINITY && (long long)rl.rlim_cur < need)
        add("open_files", WARN, fix,
            "open-files limit is %llu (soft) / %llu (hard): too low for %lld shared tensors "
            "under file_descriptor, which need about %lld fds",
            (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max, tensors, need);
    else
        add("open_files", OK, NULL,
            "open-files limit is %llu (soft) / %llu (hard): enough for %lld shared tensors "
            "(about %lld fds)",
            (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max, tensors, need);
}

static void check_dev_shm(void)
{
    struct statvfs v;
    unsigned long long total, avail;
    if (statvfs("/dev/shm", &v) != 0) {
        add("dev_shm", FAIL, "mount a tmpfs on /dev/shm (mount -t tmpfs -o size=1g tmpfs /dev/shm)",
            "/dev/shm: %s", strerror(errno));
        return;
    }
    total = (unsigned long long)v.f_blocks * v.f_frsize;
    avail = (unsigned long long)v.f_bavail * v.f_frsize;
    if (total <= 64ull << 20)
        add("dev_shm", WARN,
            "give the container more: docker run --shm-size=2g (or --ipc=host); Kubernetes: "
            "an emptyDir with medium: Memory mounted on /dev/shm",
            "/dev/shm is %llu MiB (%llu MiB free): this looks like a container's 64 MiB "
            "default, too small for real tensors",
            total >> 20, avail >> 20);
    else if (avail < total / 10)
        add("dev_shm", WARN, "free space: `mproc shm gc` removes leaked mproc segments",
            "/dev/shm is %llu MiB with only %llu MiB free", total >> 20, avail >> 20);
    else
        add("dev_shm", OK, NULL, "/dev/shm is %llu MiB, %llu MiB free", total >> 20,
            avail >> 20);
}

static void check_memfd(void)
{
    int fd = memfd_create("mproc-doctor", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        add("memfd", WARN,
            "use a kernel >= 3.17 without a seccomp filter on memfd_create; mproc falls back "
            "to unlinked POSIX segments, which cannot be sealed",
            "memfd_create: %s", strerror(errno));
        return;
    }
    if (ftruncate(fd, 4096) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        add("memfd", WARN, "receivers cannot be protected against a peer truncating a segment",
            "memfd sealing: %s", strerror(errno));
    else
        add("memfd", OK, NULL, "memfd_create and sealing (shrink, grow) work");
    close(fd);
}

static void check_scm_rights(void)
{
    long optmem = read_long("/proc/sys/net/core/optmem_max");
    /* SCM_MAX_FD is 253 per message; the control buffer also counts against
     * optmem_max (253 fds need a little over 1 KiB). */
    if (optmem >= 0 && optmem < 2048)
        add("scm_rights", WARN, "sysctl -w net.core.optmem_max=20480",
            "net.core.optmem_max is %ld bytes: messages with many tensors may fail", optmem);
    else
        add("scm_rights", OK, NULL,
            "up to 253 fds per message (SCM_MAX_FD); net.core.optmem_max %ld bytes", optmem);
}

/* The runtime directory holds the daemon's socket: each way it can be
 * unusable has its own fix (see mp__mgr_runtime_dir_diagnose). false when
 * it is unusable, so the daemon check does not blame the daemon. */
static bool check_runtime_dir(void)
{
    char dir[256], problem[512], fix[512];
    bool exists;
    if (mp__mgr_runtime_dir_diagnose(dir, sizeof dir, false, &exists, problem, sizeof problem,
                                     fix, sizeof fix) < 0) {
        add("runtime_dir", FAIL, fix, "%s: the shm manager cannot run there", problem);
        return false;
    }
    if (exists)
        add("runtime_dir", OK, NULL, "runtime directory %s is yours and private (0700)", dir);
    else
        add("runtime_dir", OK, NULL, "runtime directory %s does not exist yet; it is made "
            "(mode 0700) when first needed", dir);
    return true;
}

/* $MPROC_SHM_MANAGER_GRACE: a bad value stops the daemon from starting. */
static bool check_grace_env(void)
{
    double grace = MP__MGR_GRACE_DEFAULT;
    if (mp__mgr_grace_env(&grace) < 0) {
        add("grace_env", FAIL,
            "set MPROC_SHM_MANAGER_GRACE to a number of seconds (e.g. 2) or unset it",
            "%s: the shm manager refuses to start", mp_last_error());
        return false;
    }
    return true;
}

/* The terminal's width when stdout is one; 0 (no wrapping, one line per
 * check for scripts) otherwise. */
static int terminal_width(void)
{
    struct winsize ws;
    if (!isatty(STDOUT_FILENO) || ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) != 0 || ws.ws_col < 40)
        return 0;
    return ws.ws_col;
}

/* head, then text word-wrapped to width - 1 columns (so a line never wraps
 * on the terminal), continuation lines indented under the text's start. */
static void print_wrapped(const char *head, const char *text, int width)
{
    int indent = (int)strlen(head), room = width - 1 - indent;
    fputs(head, stdout);
    while (width > 0 && room >= 20 && (int)strlen(text) > room) {
        int cut = room;
        while (cut > 0 && text[cut] != ' ')
            cut--;
        if (cut == 0)
            cut = room; /* one word longer than the line: break it */
        printf("%.*s\n%*s", cut, text, indent, "");
        text += cut;
        while (*text == ' ')
            text++;
    }
    printf("%s\n", text);
}

static void check_manager(bool usable_dir)
{
    char *reply = NULL, dir[256] = "?", bin[4096];
    int rc;
    if (!usable_dir) {
        add("shm_manager", FAIL, "fix the runtime_dir check first",
            "mproc-shm-manager cannot run: its runtime directory is unusable");
        return;
    }
    rc = mp__mgr_control("STATUS", &reply, 2.0);
    mp__mgr_runtime_dir(dir, sizeof dir, false);
    if (rc == 0) {
        int pid = 0, clients = 0, segs = 0;
        char *p;
        if ((p = strstr(reply, "pid ")))
            pid = atoi(p + 4);
        if ((p = strstr(reply, "clients ")))
            clients = atoi(p + 8);
        if ((p = strstr(reply, "segments ")))
            segs = atoi(p + 9);
        add("shm_manager", OK, NULL,
            "mproc-shm-manager runs (pid %d, %d clients, %d segments) in %s", pid, clients,
            segs, dir);
    } else if (rc == MP_ENOENT && getenv("MPROC_SHM_MANAGER") &&
               strcmp(getenv("MPROC_SHM_MANAGER"), "none") == 0) {
        add("shm_manager", WARN, "unset MPROC_SHM_MANAGER to turn leak protection back on",
            "MPROC_SHM_MANAGER=none: the library starts no daemon, so file_system segments of "
            "killed processes are not reclaimed");
    } else if (rc == MP_ENOENT && mp__mgr_binary(bin, sizeof bin) < 0) {
        /* Then the library cannot start it either: leak protection is off. */
        add("shm_manager", FAIL,
            getenv("MPROC_SHM_MANAGER")
                ? "point MPROC_SHM_MANAGER at an executable mproc-shm-manager, or unset it"
                : "install mproc-shm-manager where the library looks for it (<prefix>/libexec/"
                  "mproc/ of libmproc's install prefix), or set "
                  "MPROC_SHM_MANAGER=/path/to/mproc-shm-manager",
            "mproc-shm-manager is not running and cannot be started: %s", mp_last_error());
    } else if (rc == MP_ENOENT) {
        add("shm_manager", INFO,
            "nothing to do: the library starts it when a process first uses file_system "
            "(or run `mproc shm-manager start`)",
            "mproc-shm-manager is not running (runtime directory %s); it starts on demand "
            "from %s", dir, bin);
    } else if (rc == MP_ETIMEDOUT || rc == MP_EAGAIN) {
        add("shm_manager", FAIL,
            "it is hung: `mproc shm-manager stop`, else kill the pid in its lock file; see "
            "its log in the runtime directory",
            "mproc-shm-manager does not answer: %s", mp_last_error());
    } else {
        add("shm_manager", FAIL, "see the daemon's log (" MP__MGR_LOG ") in the runtime "
            "directory, then `mproc shm-manager stop` and start it again",
            "mproc-shm-manager fails: %s", mp_last_error());
    }
    free(reply);
}

static void check_ptrace(void)
{
    long scope = read_long("/proc/sys/kernel/yama/ptrace_scope");
    if (scope < 0)
        add("ptrace_scope", OK, NULL, "no Yama ptrace restrictions");
    else if (scope >= 2)
        add("ptrace_scope", WARN, "sysctl -w kernel.yama.ptrace_scope=1",
            "kernel.yama.ptrace_scope is %ld: debuggers cannot attach to worker processes", scope);
    else
        add("ptrace_scope", OK, NULL, "kernel.yama.ptrace_scope is %ld", scope);
}

int cmd_doctor(int argc, char **argv)
{
    static const struct option opts[] = {{"json", no_argument, 0, 'j'},
                                         {"tensors", required_argument, 0, 't'},
                                         CLI_COMMON_OPTIONS};
    bool json = false;
    long long tensors = 1000;
    int c, worst = OK, status = EXIT_OK;
    optind = 0;
    while ((c = cli_getopt(argc, argv, ":hV", opts, "doctor", &status)) != -1) {
        if (c == CLI_DONE)
            return status;
        if (c == 'j')
            json = true;
        else if (c == 't' &&
                 !cli_number("doctor", "--tensors", optarg, 0, TENSORS_MAX, &tensors, &status))
            return status;
    }
    if (optind < argc)
        return cli_bad_usage("doctor", "unexpected argument \"%s\"", argv[optind]);
    nchecks = 0;
    check_nofile(tensors);
    check_dev_shm();
    check_memfd();
    check_scm_rights();
    check_grace_env();
    check_manager(check_runtime_dir());
    check_ptrace();
    for (int i = 0; i < nchecks; i++)
        worst = checks[i].status > worst ? checks[i].status : worst;
    if (json) {
        printf("{\"ok\":%s,\"checks\":[", worst >= WARN ? "false" : "true");
        for (int i = 0; i < nchecks; i++) {
            printf("%s\n{\"name\":\"%s\",\"status\":\"%s\",\"detail\":", i ? "," : "",
                   checks[i].name, status_name[checks[i].status]);
            json_string(stdout, checks[i].detail);
            printf(",\"fix\":");
            if (checks[i].fix[0])
                json_string(stdout, checks[i].fix);
            else
                printf("null");
            printf("}");
        }
        printf("\n]}\n");
    } else {
        int width = terminal_width();
        for (int i = 0; i < nchecks; i++) {
            char tag[8];
            snprintf(tag, sizeof tag, "[%s]", status_name[checks[i].status]);
            char head[32];
            snprintf(head, sizeof head, "%-6s %-12s ", tag, checks[i].name);
            print_wrapped(head, checks[i].detail, width);
            if (checks[i].status != OK && checks[i].fix[0])
                print_wrapped("                    fix: ", checks[i].fix, width);
        }
    }
    return worst >= WARN ? EXIT_FAIL : EXIT_OK;
}
