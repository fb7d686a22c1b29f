# ThreadSanitizer build of the pool's threaded parts: src/pool/*.c and the
# pool test compiled with -fsanitize=thread, linked over the ordinary static
# library (whose objects the instrumented pool ones replace). Registered as
# the CTest test pool_test_tsan, labelled noasan (TSan and ASan do not mix).
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
    file(GLOB pool_tsan_src ${PROJECT_SOURCE_DIR}/src/pool/*.c)
    add_executable(pool_test_tsan ${PROJECT_SOURCE_DIR}/tests/pool/pool_test.c ${pool_tsan_src})
    target_compile_options(pool_test_tsan PRIVATE -fsanitize=thread -g -O1)
    target_link_options(pool_test_tsan PRIVATE -fsanitize=thread)
    target_link_libraries(pool_test_tsan PRIVATE mproc_test_support mproc_internal
                          ${CMOCKA_LIB} m)
    add_test(NAME pool_test_tsan COMMAND pool_test_tsan)
    set_tests_properties(pool_test_tsan PROPERTIES TIMEOUT 240 LABELS "pool;noasan"
      ENVIRONMENT "TSAN_OPTIONS=halt_on_error=1:exitcode=66")
  else()
    message(STATUS "pool_test_tsan: the toolchain cannot build -fsanitize=thread; skipped")
  endif()
endif()
