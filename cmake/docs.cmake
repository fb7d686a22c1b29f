# The API reference and the man pages.
#
# `make docs` (target docs): Doxygen over include/ into <build>/docs/html,
# through cmake/doxygen-filter.awk (the headers' plain comments become doc
# comments), then the same check as the test build_apidoc: every public
# function has a doc comment. Doxygen is Debian's package doxygen.
find_program(DOXYGEN_EXECUTABLE doxygen)
configure_file(${CMAKE_CURRENT_LIST_DIR}/Doxyfile.in ${PROJECT_BINARY_DIR}/Doxyfile @ONLY)
if(DOXYGEN_EXECUTABLE)
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E make_directory ${PROJECT_BINARY_DIR}/docs
    COMMAND sh ${PROJECT_SOURCE_DIR}/tests/build/apidoc_test.sh ${DOXYGEN_EXECUTABLE}
            ${PROJECT_BINARY_DIR}/Doxyfile ${PROJECT_BINARY_DIR}/docs
    COMMENT "API reference: ${PROJECT_BINARY_DIR}/docs/html/index.html"
    VERBATIM)
else()
  add_custom_target(docs
    COMMAND ${CMAKE_COMMAND} -E echo "make docs needs doxygen (apt-get install doxygen)"
    COMMAND false
    VERBATIM)
endif()

# Man pages, written in roff (docs/man/): the CLI and the daemon.
if(MPROC_BUILD_TOOLS)
  install(FILES ${PROJECT_SOURCE_DIR}/docs/man/mproc.1
          DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT tools)
  install(FILES ${PROJECT_SOURCE_DIR}/docs/man/mproc-shm-manager.8
          DESTINATION ${CMAKE_INSTALL_MANDIR}/man8 COMPONENT tools)
endif()
