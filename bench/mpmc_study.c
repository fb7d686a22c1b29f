/* mpmc_study: where 4x4 MPMC's time goes, by placement (not part of make
 * bench; docs/performance-log.md, "4x4 MPMC by placement").
 *
 * One Queue, 16-byte messages, 1 or 4 producer and consumer processes. Every
 * process is forked and waits at a gate before the clock starts, so process
 * start is not in the figures (bench_messaging's MPMC row includes it). Each
 * repetition runs every placement once, in turn:
 *
 *   1x1 two CPUs   the producer on one CPU, the consumer on the other
 *   1x1 one CPU    both on one CPU
 *   4x4 unpinned   the scheduler places the eight processes
 *   4x4 pairs      a producer and a consumer, twice, on each CPU
 *   4x4 one CPU    all eight on one CPU
 *
 * and prints, per placement, the median wall time per message, the CPU
 * time per message (all processes together) and the context switches per
 * 1000 messages.
 *
 * Then the ring's two sides under contention, each contender on its own CPU
 * and running the whole time, as on a machine with a CPU for every process
 * (docs/performance-log.md, "Small messages without the reader lock"): 1 and 2
 * consumers draining a full ring, 1 and 2 producers filling an empty one;
 * the median time per message over many rounds. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "mproc.h"

enum { MAX_SIDE = 4, MAX_REPS = 99 };

typedef struct placement {
    const char *name;
    int side;            /* producers, and consumers */
    int (*slot)(int i);  /* the CPU slot of process i (consumers first); -1: unpinned */
} placement;

static int unpinned(int i) { (void)i; return -1; }
static int split(int i) { return i == 0 ? 0 : 1; }
static int first(int i) { (void)i; return 0; }
static int alternate(int i) { return i % 2; }

static const placement places[] = {
    {"1x1 two CPUs", 1, split},      {"1x1 one CPU", 1, first},
    {"4x4 unpinned", MAX_SIDE, unpinned}, {"4x4 pairs", MAX_SIDE, alternate},
    {"4x4 one CPU", MAX_SIDE, first},
};
enum { NPLACES = sizeof places / sizeof places[0] };

typedef struct sample {
    double wall, cpu, csw; /* per message (ns, ns) and per 1000 messages */
} sample;

/* what failed, and why: mproc's sentence (an mproc call), errno's (a
 * system call) or none (why is NULL). */
static void die(const char *what, const char *why)
{
    fprintf(stderr, "mpmc_study: %s%s%s\n", what, why ? ": " : "", why ? why : "");
    exit(1);
}

/* A producer puts `puts` messages; a consumer (puts == 0) gets until the
 * 1-byte stop message. Both wait for a byte on gate first. */
static void child(mp_queue *q, int gate, size_t puts, int slot)
{
    mp_msg *m = NULL;
    char go;
    /* a study killed (a test's timeout) takes its helpers with it */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || (slot >= 0 && bench_pin_cpu(slot) != 0) ||
        read(gate, &go, 1) != 1)
        _exit(2);
    if (puts && (mp_msg_create(&m) || mp_msg_set_payload(m, "0123456789abcdef", 16)))
        _exit(1);
    for (size_t i = 0; i < puts; i++)
        if (mp_queue_put(q, m, -1))
            _exit(1);
    for (;;) {
        mp_msg *r = NULL;
        size_t len = 0;
        if (puts || mp_queue_get(q, &r, -1))
            _exit(puts ? 0 : 1);
        mp_msg_payload(r, &len);
        mp_msg_destroy(r);
        if (len == 1)
            _exit(0);
    }
}

static double children_cpu(long *csw)
{
    struct rusage ru;
    getrusage(RUSAGE_CHILDREN, &ru);
    *csw = ru.ru_nvcsw + ru.ru_nivcsw;
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static int reap(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static sample run(mp_queue *q, mp_msg *stop, const placement *p, size_t n)
{
    pid_t pid[2 * MAX_SIDE];
    int gate[2], procs = 2 * p->side, bad = 0;
    long csw0, csw1;
    double cpu0 = children_cpu(&csw0), t0;
    char go[2 * MAX_SIDE] = {0};
    if (pipe(gate) != 0)
        die("pipe", strerror(errno));
    for (int i = 0; i < procs; i++) {
        if ((pid[i] = fork()) < 0)
            die("fork", strerror(errno));
        if (pid[i] == 0)
            child(q, gate[0], i < p->side ? 0 : n / (size_t)p->side, p->slot(i));
    }
    usleep(20000); /* every child at the gate */
    t0 = (double)bench_now_ns();
    if (write(gate[1], go, (size_t)procs) != procs)
        die("write", strerror(errno));
    for (int i = p->side; i < procs; i++)
        bad |= reap(pid[i]);
    for (int i = 0; i < p->side; i++)
        if (mp_queue_put(q, stop, -1))
            die("put of a stop message", mp_last_error());
    for (int i = 0; i < p->side; i++)
        bad |= reap(pid[i]);
    double wall = ((double)bench_now_ns() - t0) / (double)n;
    close(gate[0]);
    close(gate[1]);
    if (bad)
        die("a producer or consumer exited with an error", NULL);
    double cpu = (children_cpu(&csw1) - cpu0) * 1e9 / (double)n;
    return (sample){wall, cpu, (double)(csw1 - csw0) * 1000.0 / (double)n};
}

static int by_wall(const void *a, const void *b)
{
    double x = ((const sample *)a)->wall, y = ((const sample *)b)->wall;
    return (x > y) - (x < y);
}

/* ---- contention: a full ring drained, an empty one filled ------------------- */

enum { ROUND = 510, ROUNDS = 200 }; /* a round fills the ring (512 slots) but 2 */

typedef struct rounds {
    _Atomic int round, done;
    _Atomic uint64_t start[2], end[2];
} rounds;

/* Contender `id` (on CPU slot id) puts its share of each round, or gets until a
 * 1-byte stop message, when the round counter says go. */
static void contender(mp_queue *q, rounds *rs, int id, int k, bool producer)
{
    mp_msg *m = NULL;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || bench_pin_cpu(id) != 0 ||
        mp_msg_create(&m) || mp_msg_set_payload(m, "0123456789abcdef", 16))
        _exit(2);
    for (int r = 1; r <= ROUNDS; r++) {
        while (atomic_load(&rs->round) < r)
            sched_yield();
        uint64_t t0 = bench_now_ns();
        for (int i = 0; producer && i < ROUND / k; i++)
            if (mp_queue_put(q, m, -1))
                _exit(1);
        for (size_t len = 0; !producer && len != 1;) {
            mp_msg *g = NULL;
            if (mp_queue_get(q, &g, -1))
                _exit(1);
            mp_msg_payload(g, &len);
            mp_msg_destroy(g);
        }
        atomic_store(&rs->start[id], t0);
        atomic_store(&rs->end[id], bench_now_ns());
        atomic_fetch_add(&rs->done, 1);
    }
    _exit(0);
}

/* The median ns per message of k contenders, from the first one's start
 * to the last one's end of each round. */
static double contend(mp_queue *q, mp_msg *stop, int k, bool producer)
{
    rounds *rs = mmap(NULL, sizeof *rs, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                      -1, 0);
    static double t[ROUNDS];
    pid_t pid[2];
    mp_msg *m = NULL;
    int bad = 0;
    if (rs == MAP_FAILED)
        die("mmap", strerror(errno));
    if (mp_msg_create(&m) || mp_msg_set_payload(m, "0123456789abcdef", 16))
        die("a message for a contention run", mp_last_error());
    for (int i = 0; i < k; i++)
        if ((pid[i] = fork()) == 0)
            contender(q, rs, i, k, producer);
        else if (pid[i] < 0)
            die("fork", strerror(errno));
    for (int r = 1; r <= ROUNDS; r++) {
        for (int i = 0; !producer && i < ROUND + k; i++)
            if (mp_queue_put(q, i < ROUND ? m : stop, -1))
                die("put", mp_last_error());
        atomic_store(&rs->done, 0);
        atomic_store(&rs->round, r);
        while (atomic_load(&rs->done) < k)
            usleep(50);
        uint64_t a = rs->start[0], b = rs->end[0];
        for (int i = 1; i < k; i++) {
            a = rs->start[i] < a ? rs->start[i] : a;
            b = rs->end[i] > b ? rs->end[i] : b;
        }
        t[r - 1] = (double)(b - a) / ROUND;
        for (int i = 0; producer && i < ROUND / k * k; i++) {
            mp_msg *g = NULL;
            if (mp_queue_get(q, &g, -1))
                die("get", mp_last_error());
            mp_msg_destroy(g);
        }
    }
    for (int i = 0; i < k; i++)
        bad |= reap(pid[i]);
    if (bad)
        die("a contender exited with an error", NULL);
    mp_msg_destroy(m);
    munmap(rs, sizeof *rs);
    return bench_median(t, ROUNDS);
}

int main(int argc, char **argv)
{
    size_t n = 400000;
    int reps = 7;
    static sample s[NPLACES][MAX_REPS];
    mp_queue *q;
    mp_msg *stop;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc)
            n = strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else {
            bool help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
            fprintf(help ? stdout : stderr,
                    "usage: %s [--n MESSAGES] [--reps 1-%d]\n"
                    "  One queue's 16-byte messages, 1x1 and 4x4, in five placements: wall\n"
                    "  and CPU time per message, context switches (docs/performance-log.md,\n"
                    "  \"4x4 MPMC by placement\"). Default: 400000 messages, 7 reps.\n",
                    argv[0], MAX_REPS);
            return help ? 0 : 2;
        }
    }
    if (reps < 1 || reps > MAX_REPS || n < MAX_SIDE)
        return fprintf(stderr, "mpmc_study: --reps 1-%d, --n at least %d\n", MAX_REPS,
                       MAX_SIDE), 2;
    if (bench_cpu_of_slot(1) < 0)
        return fprintf(stderr, "mpmc_study: needs two CPUs\n"), 77;
    if (mp_queue_create(0, &q) || mp_msg_create(&stop) || mp_msg_set_payload(stop, "e", 1))
        die("setup", mp_last_error());
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < NPLACES; k++)
            s[k][r] = run(q, stop, &places[k], n);
    printf("%zu 16-byte messages, median of %d (cpus %d and %d)\n", n, reps,
           bench_cpu_of_slot(0), bench_cpu_of_slot(1));
    printf("%-14s %12s %12s %14s\n", "placement", "wall ns/msg", "cpu ns/msg", "switches/1000");
    for (int k = 0; k < NPLACES; k++) {
        qsort(s[k], (size_t)reps, sizeof s[k][0], by_wall);
        sample m = s[k][reps / 2];
        printf("%-14s %12.1f %12.1f %14.2f\n", places[k].name, m.wall, m.cpu, m.csw);
    }
    printf("\ncontention, each process on its own CPU, median of %d rounds of %d messages\n",
           ROUNDS, ROUND);
    for (int producer = 0; producer < 2; producer++) {
        double one = contend(q, stop, 1, producer), two = contend(q, stop, 2, producer);
        printf("%-8s 1: %6.1f ns/msg   2: %6.1f ns/msg   (%.2fx)\n",
               producer ? "fill" : "drain", one, two, two / one);
    }
    mp_msg_destroy(stop);
    mp_queue_release(q);
    return 0;
}
