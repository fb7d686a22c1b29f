/* A function named so that another process running the same program finds
 * it: the loaded object that holds it (by name; "" for the main program)
 * and its offset in that object. Under fork the address itself would do,
 * but spawn and the forkserver exec the program again, and ASLR loads it
 * elsewhere. The first bytes of the function's code travel too, so that a
 * process running another build refuses the reference. */
#include "os/os.h"

#include <link.h>
#include <stdio.h>
#include <string.h>

typedef struct find_ctx {
    uintptr_t addr;
    mp__coderef *ref; /* make: filled; resolve: matched */
    uintptr_t base;
    bool found;
} find_ctx;

/* Whether addr lies in an executable PT_LOAD segment of the object. */
static bool in_text(const struct dl_phdr_info *info, uintptr_t addr)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && addr >= lo &&
            addr - lo < ph->p_memsz)
            return true;
    }
    return false;
}

static int find_owner(struct dl_phdr_info *info, size_t size, void *arg)
{
    find_ctx *c = arg;
    (void)size;
    if (!in_text(info, c->addr))
        return 0;
    snprintf(c->ref->module, sizeof c->ref->module, "%s",
             info->dlpi_name ? info->dlpi_name : "");
    c->base = info->dlpi_addr;
    c->found = true;
    return 1;
}

static int find_module(struct dl_phdr_info *info, size_t size, void *arg)
{
    find_ctx *c = arg;
    (void)size;
    if (strcmp(info->dlpi_name ? info->dlpi_name : "", c->ref->module) != 0)
        return 0;
    c->base = info->dlpi_addr;
    c->addr = info->dlpi_addr + (uintptr_t)c->ref->offset;
    c->found = in_text(info, c->addr);
    return 1;
}

int mp__coderef_make(void (*fn)(void), mp__coderef *ref, const char *call)
{
    find_ctx c = {.addr = (uintptr_t)fn, .ref = ref};
    memset(ref, 0, sizeof *ref);
    dl_iterate_phdr(find_owner, &c);
    if (!c.found || strlen(ref->module) >= sizeof ref->module - 1)
        return mp__error(MP_EINVAL, "%s: the function at %p is not in the code of a loaded "
                         "program or library", call, (void *)fn);
    ref->offset = (uint64_t)(c.addr - c.base);
    memcpy(ref->code, (const void *)c.addr, sizeof ref->code);
    ref->set = 1;
    return 0;
}

int mp__coderef_resolve(const mp__coderef *ref, void (**fn)(void), const char *call)
{
    mp__coderef copy = *ref;
    find_ctx c = {.ref = &copy};
    copy.module[sizeof copy.module - 1] = '\0';
    *fn = NULL;
    if (!ref->set)
        return 0;
    dl_iterate_phdr(find_module, &c);
    if (!c.found || memcmp((const void *)c.addr, ref->code, sizeof ref->code) != 0)
        return mp__error(MP_ENOENT, "%s: the function (offset %#llx in %s) is not loaded "
                         "in this process; it must be in the program or a library "
                         "that every process using the object loads",
                         call, (unsigned long long)ref->offset,
                         copy.module[0] ? copy.module : "the main program");
    *fn = (void (*)(void))c.addr;
    return 0;
}
