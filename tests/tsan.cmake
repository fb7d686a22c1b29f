# ThreadSanitizer builds of the threaded parts: a layer's sources and its
# threaded tests compiled with -fsanitize=thread, linked over the ordinary
# static library (whose objects of that layer the instrumented ones replace).
# Registered as the CTest tests <test>_tsan, labelled noasan (TSan and ASan do
# not mix). Skipped, with a message, when the toolchain cannot build TSan
# programs or when the whole build already runs under a sanitizer.
include(CheckCSourceCompiles)

# mproc_tsan_tests(folder SOURCES src... TESTS name...): tests/<folder>/<name>.c
# each built with the instrumented sources, labelled <folder>.
function(mproc_tsan_tests folder)
  cmake_parse_arguments(arg "" "" "SOURCES;TESTS" ${ARGN})
  if(MPROC_SANITIZE OR NOT TARGET mproc_test_support)
    return()
  endif()
  if(NOT DEFINED MPROC_HAVE_TSAN)
    set(CMAKE_REQUIRED_FLAGS -fsanitize=thread)
    set(CMAKE_REQUIRED_LINK_OPTIONS -fsanitize=thread)
    check_c_source_compiles("int main(void) { return 0; }" MPROC_HAVE_TSAN)
  endif()
  if(NOT MPROC_HAVE_TSAN)
    message(STATUS "${folder} tests under TSan: the toolchain cannot build "
                   "-fsanitize=thread; skipped")
    return()
  endif()
  foreach(t ${arg_TESTS})
    add_executable(${t}_tsan ${PROJECT_SOURCE_DIR}/tests/${folder}/${t}.c ${arg_SOURCES})
    mproc_use_flags(${t}_tsan)
    target_compile_options(${t}_tsan PRIVATE -fsanitize=thread -g -O1)
    target_link_options(${t}_tsan PRIVATE -fsanitize=thread)
    target_link_libraries(${t}_tsan PRIVATE mproc_test_support mproc_internal ${CMOCKA_LIB} m)
    add_test(NAME ${t}_tsan COMMAND ${t}_tsan)
    set_tests_properties(${t}_tsan PROPERTIES TIMEOUT 240 LABELS "${folder};noasan"
      ENVIRONMENT "TSAN_OPTIONS=halt_on_error=1:exitcode=66")
  endforeach()
endfunction()

# src/sources.cmake's lists
mproc_tsan_tests(pool SOURCES ${MPROC_POOL_SOURCES} ${MPROC_WIRE_SOURCES}
                 TESTS pool_test workers_test array_task_test pool_exit_test)
mproc_tsan_tests(ipc SOURCES ${MPROC_IPC_SOURCES} ${MPROC_WIRE_SOURCES} ${MPROC_SHM_SOURCES}
                 TESTS ring_threads_test)
