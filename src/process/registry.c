/* Entry registry, start methods, contexts and the fork-with-threads guard. */
#include "process/process_internal.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the registry of entries and tasks -----------------------------------
 * One table for MP_ENTRY, MP_TASK and MP_ARRAY_TASK functions, with one
 * capacity (MP_REGISTRY_MAX, all kinds together) and one name limit. Readers take
 * no lock, so a child forked while another thread registers can still look
 * its entry up: a slot is complete before the count that publishes it is
 * stored (release/acquire). Writers serialize on a mutex. */

typedef struct reg_slot {
    mp__reg_kind kind;
    char name[MP_ENTRY_NAME_MAX + 1];
    void (*fn)(void);
} reg_slot;

static reg_slot slots[MP_REGISTRY_MAX];
static atomic_int n_slots;
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

/* The first failure of a registration made at load time, which has nobody
 * to return it to: mp_setup and every start report it. */
static atomic_int load_failure;
static char load_sentence[320];

static const char *const kind_macro[] = {"MP_ENTRY", "MP_TASK", "MP_ARRAY_TASK"};
static const char *const kind_word[] = {"entry", "task", "array task"};

/* Tasks and array tasks share one name space (the pool looks a chunk's task
 * name up as either); entries have their own. */
static bool same_space(mp__reg_kind a, mp__reg_kind b)
{
    return a == b || (a != MP__REG_ENTRY && b != MP__REG_ENTRY);
}

/* The slot called name: of exactly kind, or with any_of_space of any kind
 * in kind's name space. */
static reg_slot *find(mp__reg_kind kind, const char *name, bool any_of_space)
{
    int n = atomic_load_explicit(&n_slots, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if ((slots[i].kind == kind || (any_of_space && same_space(slots[i].kind, kind))) &&
            strcmp(slots[i].name, name) == 0)
            return &slots[i];
    return NULL;
}

int mp__registry_name_check(const char *name, const char *what, const char *call)
{
    size_t len = name ? strlen(name) : 0;
    if (!name)
        return mp__error(MP_EINVAL, "%s: the %s name is NULL", call, what);
    if (len == 0 || len > MP_ENTRY_NAME_MAX)
        return mp__error(MP_EINVAL, "%s: the %s name '%.32s%s' is %zu bytes; names are 1..%d "
                         "bytes (MP_ENTRY_NAME_MAX)", call, what, name, len > 32 ? "..." : "",
                         len, MP_ENTRY_NAME_MAX);
    return 0;
}

int mp__entry_check(const char *entry, const char *what, const char *call)
{
    int rc = mp__registry_name_check(entry, what, call);
    if (rc)
        return rc;
    if (mp__entry_lookup(entry))
        return 0;
    if (strcmp(what, "entry") != 0) /* an entry in another role: "for the initializer" */
        return mp__error(MP_ENOENT, "%s: no entry called '%s' for the %s (define it with "
                         "MP_ENTRY(%s))", call, entry, what, entry);
    return mp__error(MP_ENOENT, "%s: no entry called '%s' is registered (define it with "
                     "MP_ENTRY(%s))", call, entry, entry);
}

int mp__registry_add(mp__reg_kind kind, const char *name, void (*fn)(void), const char *call)
{
    size_t len = name ? strlen(name) : 0;
    int rc = mp__registry_name_check(name, kind_word[kind], call);
    if (rc)
        return rc;
    if (!fn)
        return mp__error(MP_EINVAL, "%s: the function to register as '%s' is NULL", call, name);
    pthread_mutex_lock(&registry_lock);
    int n = atomic_load_explicit(&n_slots, memory_order_relaxed);
    reg_slot *dup = find(kind, name, true);
    if (dup)
        rc = mp__error(MP_EINVAL, "%s: %s '%s' is registered already; %s names must be unique",
                       call, kind_word[dup->kind], name,
                       kind == MP__REG_ENTRY ? "entry" : "task and array task");
    else if (n == MP_REGISTRY_MAX)
        rc = mp__error(MP_EOVERFLOW, "%s: cannot register %s '%s': the registry is full "
                       "(MP_REGISTRY_MAX = %d entries and tasks)", call, kind_word[kind], name,
                       MP_REGISTRY_MAX);
    if (!rc) {
        slots[n].kind = kind;
        memcpy(slots[n].name, name, len + 1);
        slots[n].fn = fn;
        atomic_store_explicit(&n_slots, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&registry_lock);
    return rc;
}

void (*mp__registry_find(mp__reg_kind kind, const char *name))(void)
{
    reg_slot *s = name ? find(kind, name, false) : NULL;
    return s ? s->fn : NULL;
}

void mp__registry_add_at_load(mp__reg_kind kind, const char *name, void (*fn)(void))
{
    mp__error_saved saved;
    mp__error_save(&saved); /* a constructor must not leave a sentence behind */
    int rc = mp__registry_add(kind, name, fn, kind_macro[kind]);
    if (rc) {
        pthread_mutex_lock(&registry_lock);
        if (!atomic_load(&load_failure)) {
            snprintf(load_sentence, sizeof load_sentence, "%s", mp_last_error());
            atomic_store(&load_failure, rc);
        }
        pthread_mutex_unlock(&registry_lock);
    }
    mp__error_restore(&saved);
}

int mp__registry_check(const char *call)
{
    int rc = atomic_load(&load_failure);
    if (!rc)
        return 0;
    return mp__error(rc, "%s: a function registered at load time was refused: %s", call,
                     load_sentence);
}

int mp_register_entry(const char *name, mp_entry_fn fn)
{
    return mp__registry_add(MP__REG_ENTRY, name, (void (*)(void))fn, "mp_register_entry");
}

void mp_register_entry_at_load(const char *name, mp_entry_fn fn)
{
    mp__registry_add_at_load(MP__REG_ENTRY, name, (void (*)(void))fn);
}

mp_entry_fn mp__entry_lookup(const char *name)
{
    return (mp_entry_fn)mp__registry_find(MP__REG_ENTRY, name);
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

int mp__method_parse(const char *name, mp__method *out, const char *fn)
{
    for (int i = 0; i < MP__METHOD_COUNT; i++)
        if (name && strcmp(name, contexts[i].name) == 0) {
            *out = (mp__method)i;
            return 0;
        }
    return mp__error(MP_EINVAL, "%s: unknown start method '%s': use \"fork\", \"spawn\" or "
                                "\"forkserver\"", fn, name ? name : "(null)");
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
    mp__method m = MP__FORK; /* set by mp__method_parse or the default */
    int expected = -1;
    if (!method) {
        if (!force)
            return mp__error(MP_EINVAL, "mp_set_start_method: NULL method (pass force = "
                                        "true to unset it)");
        atomic_store(&current_method, -1);
        return 0;
    }
    if (mp__method_parse(method, &m, "mp_set_start_method") < 0)
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
    mp__method m = MP__FORK; /* set by mp__method_parse or the default */
    if (!out)
        return mp__error(MP_EINVAL, "mp_get_context: out is NULL");
    *out = NULL;
    if (!method)
        m = mp__method_default();
    else if (mp__method_parse(method, &m, "mp_get_context") < 0)
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
    int rc = mp__fork_hazards_check(call); /* e.g. CUDA: its runtime does not survive fork */
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
