# Debian packages through CPack (`make deb`, then `cpack -G DEB` in the build):
#   libmproc0     the shared library and the daemon it starts
#                 (libexec/mproc/mproc-shm-manager, found relative to the
#                 library, so leak protection works right after apt install)
#   libmproc-dev  headers, libmproc.a, the libmproc.so link, mproc.pc, the CMake package
#   mproc-tools   the mproc CLI and the man pages
# Run-time dependencies come from dpkg-shlibdeps (package dpkg-dev).
set(CPACK_PACKAGE_NAME mproc)
set(CPACK_PACKAGE_VENDOR "mproc")
set(CPACK_PACKAGE_CONTACT "mproc maintainers <mproc@users.noreply.github.com>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "torch.multiprocessing for C: processes, queues and zero-copy shared tensors")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR DEB)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL lib dev tools)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)

set(CPACK_DEBIAN_LIB_PACKAGE_NAME libmproc0)
set(CPACK_DEBIAN_LIB_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)           # shlibs + ldconfig trigger
set(CPACK_COMPONENT_LIB_DESCRIPTION
    "mproc shared library and its shm-manager daemon\n"
    "Processes, queues and pipes that carry tensors through shared memory, with a\n"
    "daemon that reclaims the segments of processes killed at any moment.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libmproc-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
# mproc/tensor.h includes dlpack/dlpack.h.
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "libmproc0 (= ${PROJECT_VERSION}), libdlpack-dev")
set(CPACK_COMPONENT_DEV_DESCRIPTION
    "mproc development files\n"
    "Headers, the static library, pkg-config file (mproc.pc) and CMake package\n"
    "(find_package(mproc)).")

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME mproc-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION utils)
# The CLI starts and inspects the daemon that libmproc0 ships.
set(CPACK_DEBIAN_TOOLS_PACKAGE_DEPENDS "libmproc0 (= ${PROJECT_VERSION})")
set(CPACK_COMPONENT_TOOLS_DESCRIPTION
    "mproc command-line tool\n"
    "mproc doctor, mproc shm ls/gc and mproc shm-manager start/stop/status.")
include(CPack)
