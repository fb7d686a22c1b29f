#include "record.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *skip_ws(const char *p)
{
    while (isspace((unsigned char)*p))
        p++;
    return p;
}

/* Parses a JSON string at p (at the opening quote) into out; returns the
 * position after it, or NULL. \uXXXX beyond ASCII becomes '?'. */
static const char *parse_string(const char *p, char *out, size_t cap)
{
    size_t n = 0;
    if (*p++ != '"')
        return NULL;
    while (*p && *p != '"') {
        char c = *p++;
        if (c == '\\') {
            char e = *p++;
            switch (e) {
            case '"': case '\\': case '/': c = e; break;
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': {
                char hex[5] = {0};
                for (int i = 0; i < 4; i++) {
                    if (!isxdigit((unsigned char)p[i]))
                        return NULL;
                    hex[i] = p[i];
                }
                long v = strtol(hex, NULL, 16);
                c = v < 0x80 ? (char)v : '?';
                p += 4;
                break;
            }
            default:
                return NULL;
            }
        } else if ((unsigned char)c < 0x20) {
            return NULL;
        }
        if (n + 1 < cap)
            out[n++] = c;
    }
    if (*p != '"')
        return NULL;
    if (cap)
        out[n] = '\0';
    return p + 1;
}

/* Copies src into dst (cap bytes), cutting it short if needed. */
static void copy_str(char *dst, size_t cap, const char *src)
{
    size_t n = strlen(src);
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static int failf(char *err, size_t cap, const char *what)
{
    snprintf(err, cap, "%s", what);
    return -1;
}

/* The optional fields: 0 (taken or not one of them) or -1 (mistyped). */
static int take_optional(bench_record *r, const char *key, bool is_str, const char *sval,
                         double num, char *err, size_t cap)
{
    static const char *const strs[] = {"kind", "placement"};
    static const char *const nums[] = {"mproc_p99", "primitive_p99", "samples"};
    for (int i = 0; i < 2; i++)
        if (!strcmp(key, strs[i])) {
            if (!is_str)
                goto mistyped;
            if (i == 0)
                copy_str(r->kind, sizeof r->kind, sval);
            else
                copy_str(r->placement, sizeof r->placement, sval);
        }
    for (int i = 0; i < 3; i++)
        if (!strcmp(key, nums[i])) {
            if (is_str)
                goto mistyped;
            if (i == 0)
                r->mproc_p99 = num;
            else if (i == 1)
                r->primitive_p99 = num;
            else
                r->samples = (int)num;
        }
    return 0;
mistyped:
    snprintf(err, cap, "field \"%s\" has the wrong type", key);
    return -1;
}

int bench_record_parse(const char *line, bench_record *r, char *err, size_t cap)
{
    static const char *const names[] = {"op", "unit", "mproc", "primitive_name", "primitive",
                                        "ratio"};
    unsigned seen = 0;
    const char *p = skip_ws(line);
    memset(r, 0, sizeof *r);
    if (*p++ != '{')
        return failf(err, cap, "not a JSON object");
    p = skip_ws(p);
    while (*p != '}') {
        char key[64], sval[256];
        double num = 0;
        bool is_str;
        if (!(p = parse_string(p, key, sizeof key)))
            return failf(err, cap, "bad key string");
        p = skip_ws(p);
        if (*p++ != ':')
            return failf(err, cap, "missing ':' after a key");
        p = skip_ws(p);
        is_str = *p == '"';
        if (is_str) {
            if (!(p = parse_string(p, sval, sizeof sval)))
                return failf(err, cap, "bad string value");
        } else {
            char *end;
            num = strtod(p, &end);
            if (end == p)
                return failf(err, cap, "a value is neither a string nor a number");
            p = end;
        }
        if (take_optional(r, key, is_str, sval, num, err, cap) < 0)
            return -1;
        for (int i = 0; i < 6; i++) {
            if (strcmp(key, names[i]) != 0)
                continue;
            bool want_str = i == 0 || i == 1 || i == 3;
            if (want_str != is_str) {
                snprintf(err, cap, "field \"%s\" should be a %s", key,
                         want_str ? "string" : "number");
                return -1;
            }
            seen |= 1u << i;
            if (i == 0) copy_str(r->op, sizeof r->op, sval);
            if (i == 1) copy_str(r->unit, sizeof r->unit, sval);
            if (i == 2) r->mproc = num;
            if (i == 3) copy_str(r->primitive_name, sizeof r->primitive_name, sval);
            if (i == 4) r->primitive = num;
            if (i == 5) r->ratio = num;
        }
        p = skip_ws(p);
        if (*p == ',')
            p = skip_ws(p + 1);
        else if (*p != '}')
            return failf(err, cap, "missing ',' or '}'");
    }
    if (*skip_ws(p + 1) != '\0')
        return failf(err, cap, "text after the object");
    for (int i = 0; i < 6; i++) {
        if (!(seen & (1u << i))) {
            snprintf(err, cap, "missing field \"%s\"", names[i]);
            return -1;
        }
    }
    return 0;
}
