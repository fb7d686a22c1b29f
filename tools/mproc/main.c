/* mproc: inspect and clean shared memory, check the system, control the
 * shm manager daemon. Usage and exit codes: `mproc help`, docs/cli.md. */
#include <stdarg.h>
#include <string.h>

#include "cli.h"
#include "mproc.h"
#include "os/os.h"

static const struct {
    const char *topic, *text;
} topics[] = {
    {"",
     "usage: mproc <command> [options]\n"
     "       mproc --help | --version\n"
     "\n"
     "commands:\n"
     "  shm ls [--json]              list this user's mproc shared-memory segments\n"
     "  shm gc [--dry-run]           remove segments whose owners are all dead\n"
     "  doctor [--json]              check the system limits mproc depends on\n"
     "  shm-manager start|stop|status  control the leak-reclaiming daemon\n"
     "  version                      print the version\n"
     "  help [command]               this text, or a command's\n"
     "\n"
     "Every command accepts -h/--help and -V/--version; options take their value\n"
     "as --opt VALUE or --opt=VALUE.\n"
     "exit codes: 0 success; 1 failure (doctor: a check did not pass);\n"
     "            2 bad arguments; 3 shm-manager status: not running\n"},
    {"shm",
     "usage: mproc shm ls [--json] [--prefix NAME]\n"
     "       mproc shm gc [--dry-run] [--prefix NAME]\n"
     "  Segments are this user's /dev/shm/mproc-* files (file_system strategy) and\n"
     "  the memfds of its live processes (file_descriptor strategy).\n"},
    {"shm ls",
     "usage: mproc shm ls [--json] [--prefix NAME]\n"
     "  Lists this user's mproc segments: name (/mproc-... for file_system,\n"
     "  memfd:... for file_descriptor), size in bytes, creator pid, whether the\n"
     "  creator is alive, the header refcount, how many live processes map it\n"
     "  or hold an fd, and whether it is leaked (its creator is dead, nobody\n"
     "  uses it, and the shm manager does not know a message carrying it to be\n"
     "  in flight).\n"
     "  --json         one JSON object: {\"segments\": [...]}\n"
     "  --prefix NAME  only names starting with NAME (e.g. /mproc-1234-)\n"},
    {"shm gc",
     "usage: mproc shm gc [--dry-run] [--prefix NAME]\n"
     "  Removes the leaked file_system segments (see `mproc help shm ls`) and\n"
     "  prints each one freed, then a total. Memory is returned once the last\n"
     "  mapping goes; nobody maps a leaked segment.\n"
     "  --dry-run      print what would be freed, remove nothing\n"
     "  --prefix NAME  only names starting with NAME\n"},
    {"doctor",
     "usage: mproc doctor [--json] [--tensors N]\n"
     "  Checks, and explains with the fix: the open-files limit against what N\n"
     "  shared tensors need under file_descriptor (N from 0 to 1000000000,\n"
     "  default 1000), /dev/shm size and free space (and the 64 MiB container\n"
     "  default), memfd and sealing, SCM_RIGHTS limits, the runtime directory,\n"
     "  whether the shm manager runs, and the ptrace scope.\n"
     "  Exit status 1 when a check warns or fails.\n"},
    {"shm-manager",
     "usage: mproc shm-manager start|stop|status [--json]\n"
     "  start   start the daemon now (it stays until stopped, reclaiming what\n"
     "          clients leave after each grace period); 0 if already running\n"
     "  stop    ask it to exit (live clients keep their segments and start a new\n"
     "          daemon when they next need one); 0 if none runs\n"
     "  status  print its pid, clients, tracked segments; exit 3 if none runs\n"
     "  The library starts the daemon by itself; these are for operators.\n"},
    {"version", "usage: mproc version  (or mproc -V, mproc --version)\n"
                "  Prints the version of the tool and of libmproc.\n"},
    {"help", "usage: mproc help [command]\n"},
};

bool cli_usage(FILE *f, const char *topic)
{
    for (size_t i = 0; i < sizeof topics / sizeof topics[0]; i++)
        if (strcmp(topics[i].topic, topic) == 0) {
            fputs(topics[i].text, f);
            return true;
        }
    return false;
}

int cli_bad_usage(const char *topic, const char *fmt, ...)
{
    va_list ap;
    fputs("mproc: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    cli_usage(stderr, topic);
    return EXIT_USAGE;
}

bool cli_wants_help(int argc, char **argv)
{
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return true;
    return false;
}

void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

int cli_getopt(int argc, char **argv, const char *shortopts, const struct option *longopts,
               const char *topic, int *status)
{
    int c;
    opterr = 0; /* our own messages, each followed by the usage */
    c = getopt_long(argc, argv, shortopts, longopts, NULL);
    if (c == 'h') {
        cli_usage(stdout, topic);
        *status = EXIT_OK;
        return CLI_DONE;
    }
    if (c == 'V') {
        cli_version();
        *status = EXIT_OK;
        return CLI_DONE;
    }
    if (c == '?' || c == ':') {
        /* optopt: the short option at fault; for a long one, argv names it. */
        const char *what = c == ':' ? "a value is missing after" : "unknown option";
        const char *arg = argv[optind - 1];
        int len = (int)strcspn(arg, "=");
        for (const struct option *o = longopts; c == '?' && arg[len] && o->name; o++)
            if (strncmp(arg, "--", 2) == 0 && (int)strlen(o->name) == len - 2 &&
                strncmp(o->name, arg + 2, (size_t)len - 2) == 0)
                what = "no value goes with";
        if (optopt && strncmp(arg, "--", 2) != 0)
            *status = cli_bad_usage(topic, "%s -%c", what, optopt);
        else
            *status = cli_bad_usage(topic, "%s %.*s", what, len, arg);
        return CLI_DONE;
    }
    return c;
}

bool cli_number(const char *topic, const char *opt, const char *text, long long min,
                long long max, long long *out, int *status)
{
    if (mp__parse_ll(opt, text, min, max, out) == 0)
        return true;
    *status = cli_bad_usage(topic, "%s", mp_last_error());
    return false;
}

void cli_version(void)
{
    printf("mproc %s (libmproc %s)\n", MP_VERSION_STRING, mp_version());
}

static int cmd_help(int argc, char **argv)
{
    char topic[64] = "";
    if (argc > 3)
        return cli_bad_usage("help", "help takes at most one command");
    if (argc >= 2)
        snprintf(topic, sizeof topic, "%s%s%s", argv[1], argc == 3 ? " " : "",
                 argc == 3 ? argv[2] : "");
    if (!cli_usage(stdout, topic))
        return cli_bad_usage("", "no help for \"%s\"", topic);
    return EXIT_OK;
}

static int cmd_version(int argc, char **argv)
{
    static const struct option opts[] = {CLI_COMMON_OPTIONS};
    int c, status = EXIT_OK;
    optind = 0;
    if ((c = cli_getopt(argc, argv, "+:hV", opts, "version", &status)) != -1)
        return c == CLI_DONE ? status : cli_bad_usage("version", "version takes no options");
    if (optind < argc)
        return cli_bad_usage("version", "version takes no arguments");
    cli_version();
    return EXIT_OK;
}

/* Options before the command: only --help and --version; "+" stops at the
 * command so its own options are left to it. */
int main(int argc, char **argv)
{
    static const struct option opts[] = {CLI_COMMON_OPTIONS};
    int c, status = EXIT_OK;
    const char *cmd;
    optind = 0;
    if ((c = cli_getopt(argc, argv, "+:hV", opts, "", &status)) != -1)
        return c == CLI_DONE ? status : cli_bad_usage("", "unexpected option");
    if (optind >= argc)
        return cli_bad_usage("", "no command given");
    argc -= optind;
    argv += optind;
    cmd = argv[0];
    if (strcmp(cmd, "help") == 0)
        return cli_wants_help(argc, argv) ? (cli_usage(stdout, "help"), EXIT_OK)
                                          : cmd_help(argc, argv);
    if (strcmp(cmd, "version") == 0)
        return cmd_version(argc, argv);
    if (strcmp(cmd, "shm") == 0)
        return cmd_shm(argc, argv);
    if (strcmp(cmd, "doctor") == 0)
        return cmd_doctor(argc, argv);
    if (strcmp(cmd, "shm-manager") == 0)
        return cmd_shm_manager(argc, argv);
    return cli_bad_usage("", "unknown command \"%s\"", cmd);
}
