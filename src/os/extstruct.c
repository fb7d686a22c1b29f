/* Extensible structs, read and written the way Linux's copy_struct_from_user
 * does, so that options, callbacks and records can grow without breaking a
 * program compiled against an older (or newer) mproc.h. */
#include "os/os.h"

#include <string.h>

/* The size field as the caller set it, or a failure naming how to set it:
 * every options struct has an _init function; callbacks and records do not. */
static int user_size(const void *user, const char *call, const char *type, size_t *out)
{
    size_t n = 0, len = strlen(type);
    memcpy(&n, user, sizeof n);
    if (n >= sizeof(size_t) && n <= MP__STRUCT_SIZE_MAX) {
        *out = n;
        return 0;
    }
    if (len > 8 && strcmp(type + len - 8, "_options") == 0)
        return mp__error(MP_EINVAL, "%s: %s.size is %zu: set it to sizeof(%s) before the "
                                    "call (%s_init does)", call, type, n, type, type);
    return mp__error(MP_EINVAL, "%s: %s.size is %zu: set it to sizeof(%s) before the call "
                                "(%s s = {.size = sizeof s};)", call, type, n, type, type);
}

int mp__struct_in(void *dst, size_t dst_size, const void *src, const char *call,
                  const char *type)
{
    size_t n = 0;
    int rc = user_size(src, call, type, &n);
    if (rc)
        return rc;
    if (n > dst_size) {
        /* A newer caller: fine as long as it leaves every field we do not
         * know at zero, which by the growth rule means "the old behaviour". */
        const unsigned char *tail = (const unsigned char *)src + dst_size;
        for (size_t i = 0; i < n - dst_size; i++)
            if (tail[i])
                return mp__error(MP_ENOTSUP,
                                 "%s: %s sets a field at byte %zu that this library "
                                 "(mproc %s, %zu-byte %s) does not know: link the "
                                 "mproc the program was built against, or leave it zero",
                                 call, type, dst_size + i, MP_VERSION_STRING, dst_size, type);
        n = dst_size;
    }
    memcpy(dst, src, n);
    memset((unsigned char *)dst + n, 0, dst_size - n);
    memcpy(dst, &dst_size, sizeof dst_size);
    return 0;
}

int mp__struct_out(void *dst, const void *src, size_t src_size, const char *call,
                   const char *type)
{
    size_t n = 0;
    int rc = user_size(dst, call, type, &n);
    if (rc)
        return rc;
    /* An older caller gets the prefix it knows; a newer one gets ours and
     * zeros (the "not set" value of every field added later). */
    size_t common = n < src_size ? n : src_size;
    if (common > sizeof n)
        memcpy((unsigned char *)dst + sizeof n, (const unsigned char *)src + sizeof n,
               common - sizeof n);
    if (n > src_size)
        memset((unsigned char *)dst + src_size, 0, n - src_size);
    return 0;
}
