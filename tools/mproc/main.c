/* mproc: inspect and clean shared memory, check the system, control the
 * shm manager daemon. Usage and exit codes: `mproc help`, docs/cli.md. */
#include <stdarg.h>
#include <string.h>

#include "cli.h"
#include "mproc.h"

static const struct {
    const char *topic, *text;
} topics[] = {
    {"",
     "usage: mproc <command> [options]\n"
     "\n"
     "commands:\n"
     "  shm ls [--json]              list this user's mproc shared-memory segments\n"
     "  shm gc [--dry-run]           remove segments whose owners are all dead\n"
     "  doctor [--json]              check the system limits mproc depends on\n"
     "  shm-manager start|stop|status  control the leak-reclaiming daemon\n"
     "  version                      print the version\n"
     "  help [command]               this text, or a command's\n"
     "\n"
     "Every command accepts --help.\n"
     "exit codes: 0 success; 1 failure (doctor: a check did not pass);\n"
     "            2 bad arguments; 3 shm-manager status: not running\n"},
    {"shm",
     "usage: mproc shm ls [--json] [--prefix NAME]\n"
     "       mproc shm gc [--dry-run] [--prefix NAME]\n"
     "  Segments are this user's /dev/shm/mproc-* files (file_system strategy) and\n"
     "  the memfds of its live processes (file_descriptor strategy).\n"},
    {"shm ls",
     "usage: mproc shm ls [--json] [--prefix NAME]\n"
     "  Lists this user's mproc segments: name, size in bytes, strategy, creator\n"
     "  pid, whether the creator is alive, the header refcount, how many live\n"
     "  processes map it or hold an fd, and whether it is leaked (its creator is\n"
     "  dead, nobody uses it, and the shm manager does not know a message\n"
     "  carrying it to be in flight).\n"
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
     "  shared tensors need under file_descriptor (default N = 1000), /dev/shm size\n"
     "  and free space (and the 64 MiB container default), memfd and sealing,\n"
     "  SCM_RIGHTS limits, whether the shm manager runs, and the ptrace scope.\n"
     "  Exit status 1 when a check warns or fails.\n"},
    {"shm-manager",
     "usage: mproc shm-manager start|stop|status [--json]\n"
     "  start   start the daemon now (it stays until stopped, reclaiming what\n"
     "          clients leave after each grace period); 0 if already running\n"
     "  stop    ask it to exit (live clients keep their segments and start a new\n"
     "          daemon when they next need one); 0 if none runs\n"
     "  status  print its pid, clients, tracked segments; exit 3 if none runs\n"
     "  The library starts the daemon by itself; these are for operators.\n"},
    {"version", "usage: mproc version\n  Prints the version of the tool and of libmproc.\n"},
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

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : NULL;
    if (!cmd)
        return cli_bad_usage("", "no command given");
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0)
        return cli_usage(stdout, ""), EXIT_OK;
    if (strcmp(cmd, "help") == 0)
        return cli_wants_help(argc - 1, argv + 1) ? (cli_usage(stdout, "help"), EXIT_OK)
                                                  : cmd_help(argc - 1, argv + 1);
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        if (cli_wants_help(argc - 1, argv + 1))
            return cli_usage(stdout, "version"), EXIT_OK;
        if (argc > 2)
            return cli_bad_usage("version", "version takes no arguments");
        printf("mproc %s (libmproc %s)\n", MP_VERSION_STRING, mp_version());
        return EXIT_OK;
    }
    if (strcmp(cmd, "shm") == 0)
        return cmd_shm(argc - 1, argv + 1);
    if (strcmp(cmd, "doctor") == 0)
        return cmd_doctor(argc - 1, argv + 1);
    if (strcmp(cmd, "shm-manager") == 0)
        return cmd_shm_manager(argc - 1, argv + 1);
    return cli_bad_usage("", "unknown command \"%s\"", cmd);
}
