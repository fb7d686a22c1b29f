# ThreadSanitizer build of the ring under threads: src/ipc/*.c and the
# threaded ring test compiled with -fsanitize=thread, linked over the ordinary
# static library (whose ipc objects the instrumented ones replace). Registered as
# the CTest tests <test>_tsan, labelled noasan (TSan and ASan do not mix).
# Skipped, with a message, when the toolchain cannot build TSan programs or
# when the whole build already runs under a sanitizer.
include(CheckCSourceCompiles)
if(NOT MPROC_SANITIZE AND TARGET mproc_test_support)
  set(CMAKE_REQUIRED_FLAGS -fsanitize=thread)
  set(CMAKE_REQUIRED_LINK_OPTIONS -fsanitize=thread)
  check_c_source_compiles("int main(void) { return 0; }" MPROC_HAVE_TSAN)
  unset(CMAKE_REQUIRED_FLAGS)
  unset(CMAKE_REQUIRED_LINK_OPTIONS)
  if(MPROC_HAVE_TSAN)
    set(ipc_tsan_src ${MPROC_IPC_SOURCES})   # src/sources.cmake
    foreach(t ring_threads_test)
      add_executable(${t}_tsan ${PROJECT_SOURCE_DIR}/tests/ipc/${t}.c ${ipc_tsan_src})
      mproc_use_flags(${t}_tsan)
      target_compile_options(${t}_tsan PRIVATE -fsanitize=thread -g -O1)
      target_link_options(${t}_tsan PRIVATE -fsanitize=thread)
      target_link_libraries(${t}_tsan PRIVATE mproc_test_support mproc_internal
                            ${CMOCKA_LIB} m)
      add_test(NAME ${t}_tsan COMMAND ${t}_tsan)
      set_tests_properties(${t}_tsan PROPERTIES TIMEOUT 240 LABELS "ipc;noasan"
        ENVIRONMENT "TSAN_OPTIONS=halt_on_error=1:exitcode=66")
    endforeach()
  else()
    message(STATUS "ipc tests under TSan: the toolchain cannot build -fsanitize=thread; "
                   "skipped")
  endif()
endif()
