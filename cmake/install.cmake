# Installs the headers, both libraries, the CMake package (mprocConfig.cmake,
# mprocConfigVersion.cmake, mprocTargets*.cmake) and mproc.pc. Components
# (for the .deb files, cmake/package.cmake): lib (the shared library and the
# daemon, which the library starts), dev (headers, libmproc.a, the .so link,
# pkg-config, CMake package), tools (the CLI and the man pages).
#
#   find_package(mproc 0.1 REQUIRED)
#   target_link_libraries(app PRIVATE mproc::mproc)          # shared
#   target_link_libraries(app PRIVATE mproc::mproc_static)   # static
#
#   cc app.c $(pkg-config --cflags --libs mproc)
#   cc app.c $(pkg-config --cflags mproc) .../libmproc.a -pthread -lrt -ldl -lm -ldw
#
# Nothing here depends on CUDA: the package needs Threads only.
include(CMakePackageConfigHelpers)

set(MPROC_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/mproc)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT dev)
install(TARGETS mproc EXPORT mprocTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT lib NAMELINK_COMPONENT dev)
install(TARGETS mproc_static EXPORT mprocTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(EXPORT mprocTargets NAMESPACE mproc:: DESTINATION ${MPROC_CMAKE_DIR} COMPONENT dev)

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/mprocConfig.cmake.in
  ${PROJECT_BINARY_DIR}/mprocConfig.cmake
  INSTALL_DESTINATION ${MPROC_CMAKE_DIR})
# 0.x: a minor bump may break the API, so only the same minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/mprocConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/mprocConfig.cmake
              ${PROJECT_BINARY_DIR}/mprocConfigVersion.cmake
  DESTINATION ${MPROC_CMAKE_DIR} COMPONENT dev)

# pkg-config: prefix is computed from the .pc file's own place (${pcfiledir}),
# so `cmake --install build --prefix /anywhere` and DESTDIR copies stay valid.
file(RELATIVE_PATH MPROC_PC_TO_PREFIX
  ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" MPROC_PC_TO_PREFIX "${MPROC_PC_TO_PREFIX}")
file(RELATIVE_PATH MPROC_PC_LIBDIR ${CMAKE_INSTALL_PREFIX} ${CMAKE_INSTALL_FULL_LIBDIR})
file(RELATIVE_PATH MPROC_PC_INCLUDEDIR ${CMAKE_INSTALL_PREFIX} ${CMAKE_INSTALL_FULL_INCLUDEDIR})
set(MPROC_PC_EXTRA_CFLAGS "")
if(NOT DLPACK_INCLUDE_DIR STREQUAL "/usr/include")   # mproc/tensor.h includes dlpack.h
  set(MPROC_PC_EXTRA_CFLAGS " -I${DLPACK_INCLUDE_DIR}")
endif()
configure_file(${CMAKE_CURRENT_LIST_DIR}/mproc.pc.in ${PROJECT_BINARY_DIR}/mproc.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/mproc.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT dev)
