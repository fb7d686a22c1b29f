/* Backtraces of a child killed by a fatal signal, in two halves.
 *
 * Child (inside the signal handler, so only async-signal-safe calls): the
 * return addresses from backtrace() (primed before, so it does not load
 * libgcc_s here), and for each the file it falls in and that file's load
 * address, read from /proc/self/maps with open/read. One record per frame.
 *
 * Parent (when the records arrive, an ordinary context): libdw opens the
 * same files offline and turns each address into function, file and line
 * from the symbol table and DWARF, so no -rdynamic is needed; a frame libdw
 * cannot resolve keeps its module+offset. Running libdw in the dying child
 * instead would malloc and take locks inside a signal handler. */
#include "process/process_internal.h"

#include <dwarf.h>
#include <elfutils/libdwfl.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- child side: async-signal-safe ------------------------------------- */

typedef struct frame_loc {
    uintptr_t pc, base;
    char path[MP__FRAME_PATH_MAX];
} frame_loc;

static frame_loc locs[MP__FRAMES_MAX];
static char maps_buf[4096];

static const char *parse_hex(const char *s, uintptr_t *out)
{
    uintptr_t v = 0;
    for (;; s++) {
        int d = *s >= '0' && *s <= '9' ? *s - '0'
              : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10 : -1;
        if (d < 0)
            break;
        v = v * 16 + (uintptr_t)d;
    }
    *out = v;
    return s;
}

/* "start-end perms offset dev inode   path": the path of a file mapping,
 * start and offset; false for anonymous and special ([vdso]) mappings. */
static bool parse_maps_line(const char *l, uintptr_t *start, uintptr_t *end, uintptr_t *off,
                            const char **path)
{
    int field = 0;
    l = parse_hex(l, start);
    if (*l++ != '-')
        return false;
    l = parse_hex(l, end);
    for (; *l && field < 5; field++) { /* perms offset dev inode, then the path */
        while (*l == ' ')
            l++;
        if (field == 1)
            parse_hex(l, off);
        if (field < 4)
            while (*l && *l != ' ')
                l++;
    }
    *path = l;
    return *l == '/';
}

/* One /proc/self/maps line: every frame inside it gets its file and the
 * address where the file's first mapping starts (prev tracks that first
 * mapping, since a file's mappings are listed together in order). */
static void match_line(const char *line, int n, uintptr_t *file_base, char *prev, size_t cap)
{
    uintptr_t start, end, off = 0;
    const char *path;
    size_t len;
    if (!parse_maps_line(line, &start, &end, &off, &path))
        return;
    len = strlen(path);
    if (len >= cap)
        return;
    if (off == 0 || memcmp(prev, path, len + 1) != 0) {
        *file_base = start - off;
        memcpy(prev, path, len + 1);
    }
    for (int i = 0; i < n; i++)
        if (locs[i].pc >= start && locs[i].pc < end) {
            locs[i].base = *file_base;
            memcpy(locs[i].path, path, len + 1);
        }
}

static void locate_frames(int n)
{
    static char prev[MP__FRAME_PATH_MAX];
    uintptr_t file_base = 0;
    size_t have = 0;
    ssize_t r;
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    prev[0] = '\0';
    while ((r = read(fd, maps_buf + have, sizeof maps_buf - 1 - have)) > 0 ||
           (r < 0 && errno == EINTR)) {
        char *line = maps_buf, *nl;
        if (r < 0)
            continue;
        have += (size_t)r;
        maps_buf[have] = '\0';
        while ((nl = memchr(line, '\n', have - (size_t)(line - maps_buf)))) {
            *nl = '\0';
            match_line(line, n, &file_base, prev, sizeof prev);
            line = nl + 1;
        }
        have -= (size_t)(line - maps_buf);
        memmove(maps_buf, line, have);
        if (have == sizeof maps_buf - 1) /* a line longer than the buffer */
            have = 0;
    }
    close(fd);
}

static void put_hex(char **p, uintptr_t v)
{
    char tmp[2 * sizeof v];
    int n = 0;
    do
        tmp[n++] = "0123456789abcdef"[v & 15];
    while ((v >>= 4) != 0);
    while (n > 0)
        *(*p)++ = tmp[--n];
}

void mp__backtrace_send(int chan, uintptr_t fault_pc)
{
    void *frames[MP__FRAMES_MAX + 8];
    int n = backtrace(frames, MP__FRAMES_MAX + 8), first = 0;
    char rec[MP__FRAME_PATH_MAX + 64];
    /* Drop the handler's own frames (this function, the handler, the
     * kernel's signal trampoline): start at the faulting instruction. */
    for (int i = 0; i < n && i < 8; i++)
        if ((uintptr_t)frames[i] == fault_pc)
            first = i;
    if (first == 0 && n > 3)
        first = 3;
    n -= first;
    if (n > MP__FRAMES_MAX)
        n = MP__FRAMES_MAX;
    for (int i = 0; i < n; i++) {
        locs[i].pc = (uintptr_t)frames[first + i];
        locs[i].base = 0;
        locs[i].path[0] = '\0';
    }
    locate_frames(n);
    for (int i = 0; i < n; i++) {
        char *p = rec;
        size_t len = strlen(locs[i].path);
        *p++ = MP__REC_MARK;
        *p++ = MP__REC_FRAME;
        put_hex(&p, locs[i].pc);
        *p++ = ' ';
        put_hex(&p, locs[i].base);
        *p++ = ' ';
        memcpy(p, locs[i].path, len);
        send(chan, rec, (size_t)(p - rec) + len, MSG_NOSIGNAL);
    }
}

/* ---- parent side ---------------------------------------------------------- */

void mp__backtrace_add_frame(mp__status *st, const char *rec, size_t len)
{
    char text[MP__FRAME_PATH_MAX + 64], *end;
    mp__frame *f;
    if (st->nframes >= MP__FRAMES_MAX || len >= sizeof text)
        return;
    if (!st->frames && !(st->frames = calloc(MP__FRAMES_MAX, sizeof *st->frames)))
        return;
    memcpy(text, rec, len);
    text[len] = '\0';
    f = &st->frames[st->nframes];
    f->pc = (uintptr_t)strtoull(text, &end, 16);
    if (*end != ' ')
        return;
    f->base = (uintptr_t)strtoull(end + 1, &end, 16);
    if (*end != ' ')
        return;
    f->path = end[1] == '/' ? strdup(end + 1) : NULL;
    st->nframes++;
}

static const Dwfl_Callbacks offline_callbacks = {
    .find_debuginfo = dwfl_standard_find_debuginfo, /* .gnu_debuglink, build-id */
    .section_address = dwfl_offline_section_address,
};

/* Each distinct file once, at its base (add_p_vaddr false: base is where
 * its first PT_LOAD starts, which is what the child read from its maps). */
static Dwfl *report_modules(const mp__status *st)
{
    Dwfl *dwfl = dwfl_begin(&offline_callbacks);
    if (!dwfl)
        return NULL;
    dwfl_report_begin(dwfl);
    for (int i = 0; i < st->nframes; i++) {
        const mp__frame *f = &st->frames[i];
        bool seen = false;
        if (!f->path)
            continue;
        for (int j = 0; j < i && !seen; j++)
            seen = st->frames[j].path && st->frames[j].base == f->base &&
                   strcmp(st->frames[j].path, f->path) == 0;
        if (!seen) {
            const char *name = strrchr(f->path, '/');
            dwfl_report_elf(dwfl, name ? name + 1 : f->path, f->path, -1, f->base, false);
        }
    }
    dwfl_report_end(dwfl, NULL, NULL);
    return dwfl;
}

/* The innermost inlined function at a (DWARF scopes), into buf; false when
 * a is not inside an inlined call (or there is no DWARF). */
static bool inlined_name(Dwfl_Module *m, Dwarf_Addr a, char *buf, size_t cap)
{
    Dwarf_Addr bias = 0;
    Dwarf_Die *cu = dwfl_module_addrdie(m, a, &bias), *scopes = NULL;
    int n = cu ? dwarf_getscopes(cu, a - bias, &scopes) : 0;
    bool found = false;
    for (int i = 0; i < n && !found; i++) {
        int tag = dwarf_tag(&scopes[i]);
        const char *name = dwarf_diename(&scopes[i]); /* follows abstract_origin */
        if (tag == DW_TAG_subprogram)
            break;
        if (tag == DW_TAG_inlined_subroutine && name) {
            snprintf(buf, cap, "%s", name);
            found = true;
        }
    }
    free(scopes);
    return found;
}

/* "#3  fn at /src/file.c:42 (module+0x1a2b)", fewer parts when unknown;
 * "#0  inner (inlined into fn) at ..." when the line is in inlined code. */
static void format_frame(Dwfl *dwfl, int i, const mp__frame *f, char *buf, size_t cap)
{
    /* Frame 0 is the faulting instruction; the others are return addresses,
     * whose call is the instruction before. */
    Dwarf_Addr a = f->pc - (i > 0 ? 1 : 0);
    Dwfl_Module *m = dwfl && f->path ? dwfl_addrmodule(dwfl, a) : NULL;
    const char *fn = m ? dwfl_module_addrname(m, a) : NULL;
    Dwfl_Line *line = m ? dwfl_module_getsrc(m, a) : NULL;
    const char *file = NULL, *mod = f->path ? strrchr(f->path, '/') : NULL;
    int lineno = 0, n;
    mod = mod ? mod + 1 : f->path; /* a path without '/' is its own name */
    if (line)
        file = dwfl_lineinfo(line, NULL, &lineno, NULL, NULL, NULL);
    char inl[256];
    /* "__libc_start_main@@GLIBC_2.34": the version says nothing here. */
    if (fn && inlined_name(m, a, inl, sizeof inl))
        n = snprintf(buf, cap, "#%-2d %s (inlined into %.*s)", i, inl, (int)strcspn(fn, "@"),
                     fn);
    else
        n = snprintf(buf, cap, "#%-2d %.*s", i, fn ? (int)strcspn(fn, "@") : 2,
                     fn ? fn : "??");
    if (file && n >= 0 && (size_t)n < cap)
        n += snprintf(buf + n, cap - (size_t)n, " at %s:%d", file, lineno);
    if (n >= 0 && (size_t)n < cap) {
        if (mod)
            snprintf(buf + n, cap - (size_t)n, " (%s+0x%lx)", mod,
                     (unsigned long)(f->pc - f->base));
        else
            snprintf(buf + n, cap - (size_t)n, " (0x%lx)", (unsigned long)f->pc);
    }
}

void mp__backtrace_finish(mp__status *st)
{
    Dwfl *dwfl;
    char line[MP__FRAME_PATH_MAX + 256];
    if (st->nframes == 0)
        return;
    dwfl = report_modules(st);
    for (int i = 0; i < st->nframes; i++) {
        format_frame(dwfl, i, &st->frames[i], line, sizeof line);
        mp__status_append(st, line, strlen(line));
        free(st->frames[i].path);
    }
    if (dwfl)
        dwfl_end(dwfl);
    free(st->frames);
    st->frames = NULL;
    st->nframes = 0;
}

void mp__backtrace_free(mp__status *st)
{
    for (int i = 0; i < st->nframes; i++)
        free(st->frames[i].path);
    free(st->frames);
    st->frames = NULL;
    st->nframes = 0;
}
