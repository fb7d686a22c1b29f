/* The mproc command-line tool: shared declarations (see docs/cli.md). */
#ifndef MPROC_CLI_H
#define MPROC_CLI_H

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

/* Writes s as a JSON string (with quotes). */
void json_string(FILE *f, const char *s);

#endif
