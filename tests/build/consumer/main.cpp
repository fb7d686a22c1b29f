// A C++ user program built with find_package(mproc) (tests/build/install_test.sh).
#include <mproc.h>

#include <cstring>
#include <iostream>

int main()
{
    if (std::strcmp(mp_version(), MP_VERSION_STRING) != 0)
        return 1;
    if (std::strcmp(mp_strerror(MP_ENOSPC), "no space left in shared memory") != 0)
        return 1;
    std::cout << "mproc " << mp_version() << " (C++)\n";
    return 0;
}
