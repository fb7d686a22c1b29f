/* A user program built against an installed mproc (tests/build/install_test.sh). */
#include <mproc.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    if (strcmp(mp_version(), MP_VERSION_STRING) != 0) {
        fprintf(stderr, "header %s, library %s\n", MP_VERSION_STRING, mp_version());
        return 1;
    }
    if (strcmp(mp_err_name(MP_EINVAL), "MP_EINVAL") != 0)
        return 1;
    printf("mproc %s\n", mp_version());
    return 0;
}
