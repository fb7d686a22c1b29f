# libFuzzer target for the frame decoder (tests/fuzz/frame_fuzz.c), built by
# invoking clang directly on the library sources with
# -fsanitize=fuzzer,address, and a bounded CTest run (~20 s) over the seed
# corpus. Skipped, with a message, when clang or its fuzzer runtime is absent.
find_program(MPROC_CLANG NAMES clang clang-16 clang-15 clang-14)
set(MPROC_FUZZ_OK FALSE)
if(MPROC_CLANG)
  set(probe_dir ${CMAKE_BINARY_DIR}/fuzz_probe)
  file(MAKE_DIRECTORY ${probe_dir})
  file(WRITE ${probe_dir}/probe.c
    "#include <stdint.h>\n#include <stddef.h>\n"
    "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n")
  execute_process(COMMAND ${MPROC_CLANG} -fsanitize=fuzzer,address ${probe_dir}/probe.c
                          -o ${probe_dir}/probe
                  RESULT_VARIABLE probe_rc OUTPUT_QUIET ERROR_QUIET)
  if(probe_rc EQUAL 0)
    set(MPROC_FUZZ_OK TRUE)
  endif()
endif()

if(NOT MPROC_FUZZ_OK)
  message(STATUS "frame_fuzz: skipped (clang with the libFuzzer runtime not found; "
                 "install clang and libclang-rt-14-dev)")
else()
  # Without the CUDA runtime: CUDA attachments decode through the stub.
  if(DEFINED MPROC_HOST_SOURCES)
    set(fuzz_sources ${MPROC_HOST_SOURCES} ${PROJECT_SOURCE_DIR}/tests/fuzz/frame_fuzz.c)
  else()
    set(fuzz_sources ${MPROC_SOURCES} ${PROJECT_SOURCE_DIR}/tests/fuzz/frame_fuzz.c)
  endif()
  set(fuzz_exe ${CMAKE_BINARY_DIR}/frame_fuzz)
  add_custom_command(
    OUTPUT ${fuzz_exe}
    COMMAND ${MPROC_CLANG} -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
            -g -O1 -std=gnu11 -D_GNU_SOURCE -Wall -Wno-unused-parameter
            -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/src -I${DLPACK_INCLUDE_DIR}
            ${fuzz_sources} -o ${fuzz_exe} -lpthread -lrt -ldl -lm ${LIBDW_LDFLAGS}
    DEPENDS ${fuzz_sources}
    COMMENT "Building frame_fuzz (clang libFuzzer)"
    VERBATIM)
  add_custom_target(frame_fuzz_build ALL DEPENDS ${fuzz_exe})
  # New inputs go to a scratch corpus in the build tree; the seeds stay read-only.
  add_test(NAME frame_fuzz
           COMMAND ${CMAKE_COMMAND} -E env ASAN_OPTIONS=detect_leaks=1
                   sh -c "mkdir -p fuzz_corpus && exec '${fuzz_exe}' -max_total_time=20 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 fuzz_corpus '${PROJECT_SOURCE_DIR}/tests/fuzz/corpus'"
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(frame_fuzz PROPERTIES TIMEOUT 90 LABELS "fuzz;noasan")
endif()
