/* mproc — processes, start methods, contexts and mp_spawn.
 *
 * Entry functions are registered by name at load time with MP_ENTRY, so a
 * child started by exec (spawn) or by the forkserver finds them. Call
 * mp_init(&argc, &argv) at the top of main: in a child started by exec it
 * runs the entry and exits, never returning; in the parent it returns 0 at
 * once. Code above mp_init runs in every spawned child too (as Python code
 * above `if __name__ == '__main__':` does).
 */
#ifndef MPROC_PROCESS_H
#define MPROC_PROCESS_H

#include <stdbool.h>
#include <sys/types.h>

#include "mproc/error.h"
#include "mproc/msg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An entry: rank is the child's index under mp_spawn and 0 for a plain
 * mp_process. args is the argument message (owned by the runtime; retain
 * what you keep). Returning non-zero fails the child with that exit code. */
typedef int (*mp_entry_fn)(int rank, mp_msg *args);

/* Registers fn under name; MP_EINVAL on a duplicate or bad name. Normally
 * called through MP_ENTRY from a constructor, before main. */
int mp_register_entry(const char *name, mp_entry_fn fn);

/* Defines and registers an entry called NAME:
 *   MP_ENTRY(worker) { ... use rank, args ...; return 0; } */
#define MP_ENTRY(NAME)                                                          \
    static int NAME(int rank, mp_msg *args);                                    \
    __attribute__((constructor)) static void mp__register_entry_##NAME(void)    \
    {                                                                           \
        mp_register_entry(#NAME, NAME);                                         \
    }                                                                           \
    static int NAME(int rank, mp_msg *args)

/* See the file comment. Returns 0 in the parent; never returns in a child
 * started by exec. */
int mp_init(int *argc, char ***argv);

/* Fails the calling child with a message that reaches the parent's error
 * record, then exits with status 1. In a process that is not an mproc child
 * it records the message and exits 1. Never returns. */
__attribute__((noreturn, format(printf, 1, 2))) void mp_raise(const char *fmt, ...);

#ifdef __cplusplus
}
#endif
#endif
