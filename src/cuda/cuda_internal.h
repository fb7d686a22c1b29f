/* What other layers need of the CUDA layer, in every build (with or without
 * CUDA). mp__cuda_fork_check and mp__cuda_on_exit are registered with the os
 * layer (mp__fork_hazard_register, mp__child_exit_register) once CUDA is
 * initialised / has exit work, so the process layer runs them without
 * calling this layer by name: the CUDA runtime does not survive fork. */
#ifndef MPROC_CUDA_INTERNAL_H
#define MPROC_CUDA_INTERNAL_H

#include <stdbool.h>
#include <sys/types.h>

/* True once this process made a CUDA runtime call that initialised the
 * driver (or a test simulated it). Always false in builds without CUDA,
 * unless simulated. Thread-safe, async-signal-safe. */
bool mp__cuda_initialized(void);

/* 0 when forking is safe; otherwise MP_ESTATE with a sentence naming caller
 * and telling to use the spawn or forkserver start method. */
int mp__cuda_fork_check(const char *caller);

/* Called by the CUDA code right before its first successful runtime call. */
void mp__cuda_mark_initialized(void);

/* Runs the CUDA layer's exit work (the producer's warning about allocations
 * still shared, and marking its segment so consumers fail fast). It is an
 * atexit handler too; a process that leaves through _exit (an mproc child
 * after its entry returned) calls this first. No-op when CUDA was not used,
 * and when already run. */
void mp__cuda_on_exit(void);
/* Set by the CUDA code when it has exit work. */
void mp__cuda_set_exit_hook(void (*fn)(void));

/* The CUDA tensor's attachment descriptor: gpu_ipc.c's, or in a build
 * without CUDA cuda_stub.c's, which refuses such an attachment cleanly
 * (MP_ENOTSUP) instead of leaving it an unknown kind. */
struct mp__objkind;
extern const struct mp__objkind mp__cuda_tensor_kind;
/* Registers it with the wire layer (mp__objkind_register); idempotent.
 * src/ipc/kinds.c calls it before any message is decoded. */
int mp__cuda_kinds_register(void);

/* The CUDA driver's file of a process's interprocess events in /dev/shm
 * (cuda.shm.<uid>.<pid>.<n>; src/cuda/event_files.c): the pid that a file
 * name holds, or 0 when the name is not such a file. `mproc shm gc` removes
 * those of dead processes. */
pid_t mp__cuda_event_file_pid(const char *name);
/* Calls fn for each of this user's event files (mp__shm_each); stops when
 * fn returns non-zero. Returns the number visited or a negative mp_error. */
int mp__cuda_event_files_each(int (*fn)(const char *name, void *ctx), void *ctx);
/* Removes this process's event files at its exit; called when mproc makes an
 * interprocess event. Idempotent, thread-safe. */
void mp__cuda_event_files_remove_at_exit(void);

/* Test hook: pretend CUDA was (true) or was not (false) initialised in this
 * process. Clearing it does not undo a real initialisation. */
void mp__cuda_simulate_initialized(bool on);

#endif
