# perf_runner_test runs bench_all --quick into a temporary folder and checks the
# JSON it writes, field by field (a smoke test, never a timing test). It
# needs the runner and every benchmark built, and bench/common/record.c to
# read the lines back. It takes ~1 s (2.5 s under ASan, where it also checks
# bench_all itself for leaks), so both runs keep it. RESOURCE_LOCK: the
# benchmarks create shared memory that the /dev/shm leak counts of other
# tests would see, and bench_mpi runs mpirun, which must not overlap the
# MPI tests (the hosts ones add and remove network interfaces).
if(TARGET perf_runner_test)
  target_sources(perf_runner_test PRIVATE ${PROJECT_SOURCE_DIR}/bench/common/record.c)
  target_include_directories(perf_runner_test PRIVATE ${PROJECT_SOURCE_DIR}/bench/common)
  if(TARGET bench_all)
    target_compile_definitions(perf_runner_test PRIVATE BENCH_BIN_DIR="$<TARGET_FILE_DIR:bench_all>")
    get_property(targets DIRECTORY ${PROJECT_SOURCE_DIR} PROPERTY BUILDSYSTEM_TARGETS)
    foreach(t ${targets})
      if(t MATCHES "^bench_" )
        add_dependencies(perf_runner_test ${t})
      endif()
    endforeach()
  endif()
  set_tests_properties(perf_runner_test PROPERTIES LABELS bench TIMEOUT 120
                       RESOURCE_LOCK "mproc_dev_shm;mpi")
endif()

# bench/mpmc_study.c (docs/performance-log.md, "4x4 MPMC by placement") with
# tiny counts: every placement runs and every child exits cleanly. Skipped
# (77) on one CPU.
if(TARGET mpmc_study)
  add_test(NAME mpmc_study_smoke COMMAND mpmc_study --n 4000 --reps 1)
  set_tests_properties(mpmc_study_smoke PROPERTIES LABELS bench TIMEOUT 60
                       SKIP_RETURN_CODE ${MPROC_SKIP_CODE} RESOURCE_LOCK mproc_dev_shm)
endif()
