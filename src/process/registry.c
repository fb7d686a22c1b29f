/* Entry registry, start methods, contexts and the fork-with-threads guard. */
#include "cuda/cuda_internal.h"
#include "process/process_internal.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- entries ------------------------------------------------------------- */

typedef struct entry {
    char name[MP_ENTRY_NAME_MAX + 1];
    mp_entry_fn fn;
} entry;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static entry *entries;
static size_t n_entries, cap_entries;

static bool name_ok(const char *name)
{
    size_t n;
    if (!name)
        return false;
    n = strlen(name);
    return n > 0 && n <= MP_ENTRY_NAME_MAX;
}

static entry *find_locked(const char *name)
{
    for (size_t i = 0; i < n_entries; i++)
        if (strcmp(entries[i].name, name) == 0)
            return &entries[i];
    return NULL;
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void atfork_prepare(void)
{
    pthread_mutex_lock(&registry_lock);
}
static void atfork_release(void)
{
    pthread_mutex_unlock(&registry_lock);
}
/* A fork child looks its entry up: the lock must not be held by a thread
 * that fork left behind. */
static void register_atfork(void)
{
    pthread_atfork(atfork_prepare, atfork_release, atfork_release);
}

int mp_register_entry(const char *name, mp_entry_fn fn)
{
    int rc = 0;
    if (!name_ok(name) || !fn)
        return mp__error(MP_EINVAL,
                         "mp_register_entry: need a name of 1..%d bytes and a "
                         "function",
                         MP_ENTRY_NAME_MAX);
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&registry_lock);
    if (find_locked(name)) {
        rc = mp__error(MP_EINVAL,
                       "mp_register_entry: an entry called '%s' is already "
                       "registered; entry names must be unique",
                       name);
        goto out_unlock;
    }
    if (n_entries == cap_entries) {
        size_t cap = cap_entries ? cap_entries * 2 : 16;
        entry *e = realloc(entries, cap * sizeof *e);
        if (!e) {
            rc = mp__error(MP_ENOMEM, "mp_register_entry: out of memory");
            goto out_unlock;
        }
        entries = e;
        cap_entries = cap;
    }
    strcpy(entries[n_entries].name, name);
    entries[n_entries].fn = fn;
    n_entries++;
out_unlock:
    pthread_mutex_unlock(&registry_lock);
    return rc;
}

mp_entry_fn mp__entry_lookup(const char *name)
{
    entry *e;
    mp_entry_fn fn = NULL;
    if (!name_ok(name))
        return NULL;
    pthread_mutex_lock(&registry_lock);
    e = find_locked(name);
    if (e)
        fn = e->fn;
    pthread_mutex_unlock(&registry_lock);
    return fn;
}

/* ---- start methods ------------------------------------------------------- */

static mp_context contexts[MP__METHOD_COUNT] = {
    {MP__FORK, "fork"},
    {MP__SPAWN, "spawn"},
    {MP__FORKSERVER, "forkserver"},
};
/* Default first, as Python lists them. */
static const char *const all_methods[] = {"fork", "spawn", "forkserver", NULL};

/* -1: not fixed yet; else the mp__method. */
static atomic_int current_method = -1;

const char *mp__method_name(mp__method m)
{
    return contexts[m].name;
}

int mp__method_parse(const char *name, mp__method *out)
{
    for (int i = 0; i < MP__METHOD_COUNT; i++)
        if (name && strcmp(name, contexts[i].name) == 0) {
            *out = (mp__method)i;
            return 0;
        }
    return mp__error(MP_EINVAL,
                     "unknown start method '%s': use \"fork\", \"spawn\" or "
                     "\"forkserver\"",
                     name ? name : "(null)");
}

void mp__method_inherit(mp__method m)
{
    if (m >= 0 && m < MP__METHOD_COUNT)
        atomic_store(&current_method, (int)m);
}

mp__method mp__method_default(void)
{
    int expected = -1;
    /* The first reader fixes the default, as Python's get_start_method(). */
    atomic_compare_exchange_strong(&current_method, &expected, (int)MP__FORK);
    return (mp__method)atomic_load(&current_method);
}

int mp_set_start_method(const char *method, bool force)
{
    mp__method m;
    int expected = -1;
    if (!method) {
        if (!force)
            return mp__error(MP_EINVAL, "mp_set_start_method: NULL method (pass force = "
                                        "true to unset it)");
        atomic_store(&current_method, -1);
        return 0;
    }
    if (mp__method_parse(method, &m) < 0)
        return MP_EINVAL;
    if (force) {
        atomic_store(&current_method, (int)m);
        return 0;
    }
    if (!atomic_compare_exchange_strong(&current_method, &expected, (int)m))
        return mp__error(MP_ESTATE,
                         "mp_set_start_method: the start method is already "
                         "fixed ('%s'); call it once, early, or pass force = "
                         "true",
                         contexts[expected].name);
    return 0;
}

const char *mp_get_start_method(void)
{
    return contexts[mp__method_default()].name;
}

const char *const *mp_get_all_start_methods(void)
{
    return all_methods;
}

int mp_get_context(const char *method, mp_context **out)
{
    mp__method m;
    if (!out)
        return mp__error(MP_EINVAL, "mp_get_context: out is NULL");
    if (!method)
        m = mp__method_default();
    else if (mp__method_parse(method, &m) < 0)
        return MP_EINVAL;
    *out = &contexts[m];
    return 0;
}

const char *mp_context_start_method(const mp_context *ctx)
{
    return ctx ? ctx->name : "";
}

/* ---- fork hazard --------------------------------------------------------- */

static atomic_bool refuse_threads;

void mp_set_fork_refuse_threads(bool refuse)
{
    atomic_store(&refuse_threads, refuse);
}

static int count_threads(int *n)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int count = 0;
    if (!d)
        return mp__errno_error(errno, "mp_fork_hazard: opendir(/proc/self/task)");
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            count++;
    closedir(d);
    *n = count;
    return 0;
}

int mp_fork_hazard(bool *hazard, int *nthreads)
{
    int n = 0, rc;
    if (!hazard)
        return mp__error(MP_EINVAL, "mp_fork_hazard: hazard is NULL");
    rc = count_threads(&n);
    if (rc < 0)
        return rc;
    *hazard = n > 1;
    if (nthreads)
        *nthreads = n;
    return 0;
}

int mp__fork_check(const char *call)
{
    bool hazard;
    int n;
    int rc = mp__cuda_fork_check(call); /* the CUDA runtime does not survive fork */
    if (rc < 0)
        return rc;
    if (!atomic_load(&refuse_threads))
        return 0;
    if (mp_fork_hazard(&hazard, &n) < 0 || !hazard)
        return 0;
    return mp__error(MP_ESTATE,
                     "%s: refusing to fork a process with %d threads (a lock "
                     "held by another thread would stay locked in the child); "
                     "use the \"spawn\" or \"forkserver\" start method",
                     call, n);
}
