/* The mproc command-line tool: shared declarations (see docs/cli.md). */
#ifndef MPROC_CLI_H
#define MPROC_CLI_H

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>

/* Exit codes (documented in docs/cli.md and `mproc help`). */
enum {
    EXIT_OK = 0,
    EXIT_FAIL = 1,        /* the command failed, or doctor found a problem */
    EXIT_USAGE = 2,       /* bad arguments */
    EXIT_NOT_RUNNING = 3  /* shm-manager status: no daemon */
};

/* Each subcommand gets argv from its own name on. */
int cmd_shm(int argc, char **argv);
int cmd_doctor(int argc, char **argv);
int cmd_shm_manager(int argc, char **argv);

/* Prints the usage of a topic ("", "shm", "shm ls", "doctor", ...) to f;
 * false for an unknown topic. */
bool cli_usage(FILE *f, const char *topic);
/* Usage of topic on stderr after "mproc: <msg>"; returns EXIT_USAGE. */
int cli_bad_usage(const char *topic, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Whether argv holds -h / --help. */
bool cli_wants_help(int argc, char **argv);

/* Every subcommand's long options end with these (and its short options
 * string holds "hV"). */
#define CLI_COMMON_OPTIONS                                                                  \
    {"help", no_argument, 0, 'h'}, {"version", no_argument, 0, 'V'}, { 0, 0, 0, 0 }
#define CLI_DONE (-2)
/* getopt_long for a subcommand whose argv[0] is its own name; set optind = 0
 * before the first call. Returns the next option character, -1 after the
 * last option, or CLI_DONE with *status set: -h/--help or -V/--version
 * answered (EXIT_OK), or an unknown option or a missing value reported with
 * the topic's usage (EXIT_USAGE). */
int cli_getopt(int argc, char **argv, const char *shortopts, const struct option *longopts,
               const char *topic, int *status);
/* Strict whole number for option opt (e.g. "--tensors") in [min, max];
 * false with *status = EXIT_USAGE after saying what is wrong (empty, junk,
 * negative, overflow) and the topic's usage. */
bool cli_number(const char *topic, const char *opt, const char *text, long long min,
                long long max, long long *out, int *status);
/* Prints the version line on stdout. */
void cli_version(void);

/* Writes s as a JSON string (with quotes). */
void json_string(FILE *f, const char *s);

#endif
