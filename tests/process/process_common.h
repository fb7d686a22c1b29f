/* What tests/process's process_test and process_start_test share: the
 * entries their children run (registered in both programs, so a spawned
 * child finds them) and the helpers that start them. */
#ifndef MPROC_TESTS_PROCESS_COMMON_H
#define MPROC_TESTS_PROCESS_COMMON_H

#include "mp_test.h"

#include <stdbool.h>
#include <sys/types.h>

typedef struct targ {
    int op; /* what the child does */
    int value;
    int rank_to_fail;
    int stubborn; /* the ranks that hang ignore SIGTERM */
} targ;

enum { OP_RETURN, OP_SIGNAL, OP_HANG, OP_RAISE, OP_SEGV, OP_FD_CLOSED, OP_SLEEP_MS };

void sleep_ms(int ms);
/* A message whose payload is a. */
mp_msg *make_args(targ a);
/* Runs the entry t_op with a under method to the end; returns the process. */
mp_process *run_op(const char *method, targ a);
int exitcode_of(mp_process *p);
/* Whether pid has exited (gone, or a zombie waiting to be reaped). */
bool pid_gone(pid_t pid);
/* Starts every kind of child once under each method, before the tests. */
void warm_up(void);

#endif
