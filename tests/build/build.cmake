# Build-level tests (shell scripts, see each file's header):
#   build_header: include/mproc.h compiles alone as strict C11 and as C++17.
#   build_install: an installed copy works through pkg-config and find_package.
# build_install links a fresh program against the installed library, which an
# ASan build cannot do without the sanitizer runtime, so it is labelled noasan.
find_program(MPROC_SH sh REQUIRED)
add_test(NAME build_header
  COMMAND ${MPROC_SH} ${CMAKE_CURRENT_LIST_DIR}/header_test.sh
          ${PROJECT_SOURCE_DIR} ${CMAKE_C_COMPILER} ${CMAKE_CXX_COMPILER})
set_tests_properties(build_header PROPERTIES TIMEOUT 60 LABELS build)

add_test(NAME build_install
  COMMAND ${MPROC_SH} ${CMAKE_CURRENT_LIST_DIR}/install_test.sh
          ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR} ${CMAKE_C_COMPILER}
          ${CMAKE_CXX_COMPILER} ${CMAKE_COMMAND})
set_tests_properties(build_install PROPERTIES TIMEOUT 180 LABELS "build;noasan")

# build_names: no exported symbol or public name of mproc is also one of
#   libtommath's or GMP's (both often linked beside mproc).
# build_exports: libmproc.so exports exactly the functions include/ declares.
find_program(MPROC_PYTHON3 python3 REQUIRED)
foreach(mode names exports)
  set(arg ${mode})
  if(mode STREQUAL "names")
    set(arg clash)
  endif()
  add_test(NAME build_${mode}
    COMMAND ${MPROC_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/names_test.py ${arg}
            ${PROJECT_SOURCE_DIR} ${CMAKE_C_COMPILER} $<TARGET_FILE:mproc>)
  set_tests_properties(build_${mode} PROPERTIES TIMEOUT 120 LABELS build)
endforeach()
