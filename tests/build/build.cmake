# Build-level tests (shell scripts, see each file's header), label "build":
#   build_header       include/mproc.h compiles alone as strict C11 and as C++17
#   build_install      an installed copy works through pkg-config and find_package;
#                      SONAME, mp_version() and the package version agree
#   build_static_link  the static link line of docs/build.md, exactly; a program
#                      so linked decodes every object kind it receives
#   build_relocate     install (DESTDIR), delete the build tree, move the prefix:
#                      the installed daemon reclaims a killed producer's segments
#   build_subproject   add_subdirectory(mproc) from another project
#   build_apidoc       the Doxygen reference builds; no public function undocumented
#   build_apidoc_check the doc check itself fails on an undocumented function
#   build_man          the man pages render without warnings and name every command
#   build_layers       a layer calls only layers below it (docs/architecture.md)
#   build_doc_decls    the function declarations shown in the docs are the headers'
#                      (and its --selftest: the check fails on a wrong one)
# Those that link fresh programs against an installed or separately built
# library cannot run in the ASan build (no sanitizer runtime there): noasan.
find_program(MPROC_SH sh REQUIRED)
set(mproc_build_dir ${CMAKE_CURRENT_LIST_DIR})
add_test(NAME build_header
  COMMAND ${MPROC_SH} ${mproc_build_dir}/header_test.sh
          ${PROJECT_SOURCE_DIR} ${CMAKE_C_COMPILER} ${CMAKE_CXX_COMPILER})
set_tests_properties(build_header PROPERTIES TIMEOUT 60 LABELS build)

add_test(NAME build_doc_decls
  COMMAND ${MPROC_SH} ${mproc_build_dir}/doc_decls_test.sh ${PROJECT_SOURCE_DIR} ${CMAKE_C_COMPILER})
add_test(NAME build_doc_decls_check
  COMMAND ${MPROC_SH} ${mproc_build_dir}/doc_decls_test.sh --selftest ${PROJECT_SOURCE_DIR}
          ${CMAKE_C_COMPILER})
set_tests_properties(build_doc_decls build_doc_decls_check PROPERTIES TIMEOUT 60 LABELS build)

add_test(NAME build_install
  COMMAND ${MPROC_SH} ${mproc_build_dir}/install_test.sh
          ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR} ${CMAKE_C_COMPILER}
          ${CMAKE_CXX_COMPILER} ${CMAKE_COMMAND} ${MPROC_SOVERSION})
set_tests_properties(build_install PROPERTIES TIMEOUT 180 LABELS "build;noasan")

# kinds_sender: sends every object kind to the statically linked
# kinds_receiver that build_static_link builds (MPROC_KINDS_SENDER).
add_executable(kinds_sender ${mproc_build_dir}/kinds_sender.c)
target_link_libraries(kinds_sender PRIVATE mproc_internal)
mproc_use_flags(kinds_sender)
add_test(NAME build_static_link
  COMMAND ${MPROC_SH} ${mproc_build_dir}/static_link_test.sh ${PROJECT_SOURCE_DIR}
          ${CMAKE_C_COMPILER} --build ${PROJECT_BINARY_DIR} ${CMAKE_COMMAND})
set_tests_properties(build_static_link PROPERTIES TIMEOUT 180 LABELS "build;noasan"
                     RESOURCE_LOCK mproc_dev_shm
                     ENVIRONMENT MPROC_KINDS_SENDER=$<TARGET_FILE:kinds_sender>)

foreach(t relocate subproject)
  add_test(NAME build_${t}
    COMMAND ${MPROC_SH} ${mproc_build_dir}/private_shm.sh ${MPROC_SH}
            ${mproc_build_dir}/${t}_test.sh ${PROJECT_SOURCE_DIR} ${CMAKE_C_COMPILER}
            ${CMAKE_COMMAND})
  set_tests_properties(build_${t} PROPERTIES TIMEOUT 400 LABELS "build;noasan"
                       RESOURCE_LOCK mproc_dev_shm)
endforeach()

if(DOXYGEN_EXECUTABLE)
  add_test(NAME build_apidoc
    COMMAND ${MPROC_SH} ${mproc_build_dir}/apidoc_test.sh ${DOXYGEN_EXECUTABLE}
            ${PROJECT_BINARY_DIR}/Doxyfile ${PROJECT_BINARY_DIR}/apidoc_test)
  add_test(NAME build_apidoc_check
    COMMAND ${MPROC_SH} ${mproc_build_dir}/apidoc_test.sh --selftest ${DOXYGEN_EXECUTABLE}
            ${PROJECT_BINARY_DIR}/Doxyfile ${PROJECT_SOURCE_DIR})
else()
  foreach(t build_apidoc build_apidoc_check)
    add_test(NAME ${t} COMMAND ${MPROC_SH} -c "echo 'skipped: doxygen not installed'; exit 77")
  endforeach()
endif()
set_tests_properties(build_apidoc build_apidoc_check PROPERTIES TIMEOUT 120 LABELS build
                     SKIP_RETURN_CODE 77)

add_test(NAME build_man
  COMMAND ${MPROC_SH} ${mproc_build_dir}/man_test.sh ${PROJECT_SOURCE_DIR})
set_tests_properties(build_man PROPERTIES TIMEOUT 60 LABELS build SKIP_RETURN_CODE 77)

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

# build_layers: every call between src/ folders goes down the layer table of
#   docs/architecture.md (nm over the library's object files).
add_test(NAME build_layers
  COMMAND ${MPROC_PYTHON3} ${CMAKE_CURRENT_LIST_DIR}/layers_test.py
          ${PROJECT_SOURCE_DIR}/docs/architecture.md ${CMAKE_NM}
          "$<TARGET_OBJECTS:mproc_objects>" "$<TARGET_OBJECTS:mproc_mpi>")
set_tests_properties(build_layers PROPERTIES TIMEOUT 120 LABELS build)
