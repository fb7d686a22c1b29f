/* Strict parsing of the numbers people type (options, environment
 * variables): strtoll/strtod alone accept "", "12abc", " 7", "nan", "inf"
 * and wrap or saturate silently, which turned typos into 0 or into absurd
 * values. Everything here either yields a number inside the caller's range
 * or an MP_EINVAL sentence saying which setting, what text and why. */
#include "os/os.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Only [+-]digits[.digits][e[+-]digits]: refuses hex, nan, inf and spaces
 * before strtod gets a chance to accept them. */
static bool plain_decimal(const char *s, bool allow_fraction)
{
    bool digits = false;
    if (*s == '+' || *s == '-')
        s++;
    for (; isdigit((unsigned char)*s); s++)
        digits = true;
    if (allow_fraction && *s == '.')
        for (s++; isdigit((unsigned char)*s); s++)
            digits = true;
    if (allow_fraction && digits && (*s == 'e' || *s == 'E')) {
        s++;
        if (*s == '+' || *s == '-')
            s++;
        if (!isdigit((unsigned char)*s))
            return false;
        while (isdigit((unsigned char)*s))
            s++;
    }
    return digits && *s == '\0';
}

static const char *why_not(const char *text, bool allow_fraction)
{
    if (!text || !*text)
        return "it is empty";
    if (!plain_decimal(text, allow_fraction))
        return allow_fraction ? "it is not a decimal number" : "it is not a whole decimal number";
    return NULL;
}

int mp__parse_ll(const char *what, const char *text, long long min, long long max,
                 long long *out)
{
    const char *why = why_not(text, false);
    long long v;
    char *end;
    if (!why) {
        errno = 0;
        v = strtoll(text, &end, 10);
        if (errno == ERANGE || v < min || v > max)
            why = v < 0 && min >= 0 && errno != ERANGE ? "it is negative" : "it is out of range";
    }
    if (why)
        return mp__error(MP_EINVAL, "%s \"%s\": %s; give a whole number from %lld to %lld", what,
                         text ? text : "", why, min, max);
    *out = v;
    return 0;
}

int mp__parse_double(const char *what, const char *text, double min, double max, double *out)
{
    const char *why = why_not(text, true);
    double v = 0;
    if (!why) {
        errno = 0;
        v = strtod(text, NULL);
        if (errno == ERANGE && fabs(v) > 1.0)
            why = "it is out of range";
        else if (!isfinite(v))
            why = "it is not finite";
        else if (v < min && min >= 0 && v < 0)
            why = "it is negative";
        else if (v < min || v > max)
            why = "it is out of range";
    }
    if (why)
        return mp__error(MP_EINVAL, "%s \"%s\": %s; give a number from %.15g to %.15g", what,
                         text ? text : "", why, min, max);
    *out = v == 0 ? 0 : v; /* no -0 */
    return 0;
}

/* "environment variable NAME "text": why; range (unset it ...)". */
static int env_fail(int rc)
{
    char detail[512];
    snprintf(detail, sizeof detail, "%s", mp_last_error());
    return mp__error(rc, "environment variable %s (unset it to get the default)", detail);
}

int mp__env_ll(const char *name, long long min, long long max, long long *out)
{
    const char *v = getenv(name);
    int rc;
    if (!v || !*v)
        return 0;
    rc = mp__parse_ll(name, v, min, max, out);
    return rc < 0 ? env_fail(rc) : 1;
}

int mp__env_double(const char *name, double min, double max, double *out)
{
    const char *v = getenv(name);
    int rc;
    if (!v || !*v)
        return 0;
    rc = mp__parse_double(name, v, min, max, out);
    return rc < 0 ? env_fail(rc) : 1;
}
