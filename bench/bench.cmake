# The benchmarks: bench/<name>.c -> bench_<name>, each with bench/common/.
# bench_all runs the others (make bench).
set(MPROC_BENCHES all cuda messaging mpi pool process sync)
set(MPROC_BENCH_COMMON_SOURCES bench.c plot.c record.c stats.c)
list(TRANSFORM MPROC_BENCH_COMMON_SOURCES PREPEND ${CMAKE_CURRENT_LIST_DIR}/common/)

add_library(mproc_bench_common STATIC ${MPROC_BENCH_COMMON_SOURCES})
target_include_directories(mproc_bench_common PUBLIC ${CMAKE_CURRENT_LIST_DIR}/common)
target_link_libraries(mproc_bench_common PUBLIC mproc_internal m)
mproc_use_flags(mproc_bench_common)
foreach(name ${MPROC_BENCHES})
  add_executable(bench_${name} ${CMAKE_CURRENT_LIST_DIR}/${name}.c)
  target_link_libraries(bench_${name} PRIVATE mproc_bench_common)
  mproc_use_flags(bench_${name})
endforeach()

# A study, not a figure of make bench (bench_all runs bench_* only).
add_executable(mpmc_study ${CMAKE_CURRENT_LIST_DIR}/mpmc_study.c)
target_link_libraries(mpmc_study PRIVATE mproc_bench_common)
mproc_use_flags(mpmc_study)
