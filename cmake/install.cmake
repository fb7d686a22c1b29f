# Installs the CMake package (mprocConfig.cmake, mprocConfigVersion.cmake,
# mprocTargets*.cmake) and a pkg-config file, and tells the library where the
# shm-manager daemon lives. Included at the end of the top CMakeLists.txt, after
# install(TARGETS mproc mproc_static EXPORT mprocTargets ...).
#
#   find_package(mproc 0.1 REQUIRED)
#   target_link_libraries(app PRIVATE mproc::mproc)          # shared
#   target_link_libraries(app PRIVATE mproc::mproc_static)   # static
#
#   cc app.c $(pkg-config --cflags --libs mproc)
#   cc -static-libgcc app.c $(pkg-config --static --cflags --libs mproc)
include(CMakePackageConfigHelpers)

set(MPROC_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/mproc)

install(EXPORT mprocTargets NAMESPACE mproc:: DESTINATION ${MPROC_CMAKE_DIR})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/mprocConfig.cmake.in
  ${PROJECT_BINARY_DIR}/mprocConfig.cmake
  INSTALL_DESTINATION ${MPROC_CMAKE_DIR})
# 0.x: a minor bump may break the API, so only the same minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/mprocConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/mprocConfig.cmake
              ${PROJECT_BINARY_DIR}/mprocConfigVersion.cmake
  DESTINATION ${MPROC_CMAKE_DIR})

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
install(FILES ${PROJECT_BINARY_DIR}/mproc.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)

# Where the library looks for mproc-shm-manager when it has to start it
# (after $MPROC_SHM_MANAGER): the build tree first, so tests and examples run
# without installing, then the install bindir. See src/shm/manager_client.c.
target_compile_definitions(mproc_objects PRIVATE
  MPROC_BUILD_BINDIR="${PROJECT_BINARY_DIR}"
  MPROC_INSTALL_BINDIR="${CMAKE_INSTALL_FULL_BINDIR}")

# src/shm/manager_client.c installs the shm-manager hooks from a constructor;
# a static link keeps that object only if something references it.
target_link_options(mproc_static INTERFACE "LINKER:--undefined=mp__mgr_client_anchor")
