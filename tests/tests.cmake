# The tests. Each tests/<folder>/<name>.c listed below is one CTest test
# <name> (cmocka, linked with tests/support and the library's internals),
# labelled with its folder; then each folder's extra registrations (shell
# tests, example runs, fuzz, TSan), listed explicitly too. A test that
# cannot run here (no GPU, no toolchain feature) exits 77: ctest reports it
# as skipped, never as passed (SKIP_RETURN_CODE).
find_library(CMOCKA_LIB cmocka REQUIRED)
set(MPROC_SKIP_CODE 77)

add_library(mproc_test_support STATIC ${CMAKE_CURRENT_LIST_DIR}/support/support.c
            ${CMAKE_CURRENT_LIST_DIR}/support/endpoint.c)
target_link_libraries(mproc_test_support PUBLIC mproc_internal ${CMOCKA_LIB})
target_include_directories(mproc_test_support PUBLIC ${CMAKE_CURRENT_LIST_DIR}/support)
mproc_use_flags(mproc_test_support)

# mproc_tests(<folder> <name>...): tests/<folder>/<name>.c, one test each.
function(mproc_tests folder)
  foreach(name ${ARGN})
    add_executable(${name} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/${folder}/${name}.c)
    target_link_libraries(${name} PRIVATE mproc_test_support mproc_internal ${CMOCKA_LIB} m)
    mproc_use_flags(${name})
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES TIMEOUT 240 LABELS ${folder}
                         SKIP_RETURN_CODE ${MPROC_SKIP_CODE})
  endforeach()
endfunction()

mproc_tests(api contract_test timeout_test)
target_sources(timeout_test PRIVATE ${CMAKE_CURRENT_LIST_DIR}/api/blocking_calls.c)
mproc_tests(os error_test os_test parse_test)
mproc_tests(shm populate_test recycle_test shm_test)
if(TARGET mproc-shm-manager_tool)               # they run the daemon and the CLI
  mproc_tests(shm_manager chaos_test cli_test fault_test manager_test
              pending_receive_test)
  add_test(NAME cli_doctor_width COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/shm_manager/doctor_width.sh
                                         $<TARGET_FILE:mproc_tool>)
  set_tests_properties(cli_doctor_width PROPERTIES TIMEOUT 60 LABELS shm_manager
                       SKIP_RETURN_CODE ${MPROC_SKIP_CODE})
  # The daemon and its clients as a user who is not root (their own runtime
  # directory and memfds).
  add_test(NAME pending_receive_test_unprivileged
           COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/support/unprivileged.sh
                   $<TARGET_FILE:pending_receive_test>)
  set_tests_properties(pending_receive_test_unprivileged PROPERTIES TIMEOUT 120
                       LABELS shm_manager SKIP_RETURN_CODE ${MPROC_SKIP_CODE})
  if(TARGET producer_consumer)                  # SIGKILLs it in a loop
    mproc_tests(shm_manager killloop_test)
  endif()
endif()
mproc_tests(tensor adopt_test empty_tensor_test share_test stats_test tensor_test)
# Handoffs without an fd open a pin's owner's or sender's fd through /proc
# when a second process receives: the same tests again as a user who is
# not root.
add_test(NAME pins_test_unprivileged
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/support/unprivileged.sh $<TARGET_FILE:pins_test>)
set_tests_properties(pins_test_unprivileged PROPERTIES TIMEOUT 240 LABELS ipc
                     SKIP_RETURN_CODE ${MPROC_SKIP_CODE})
# Kept file_system mappings as such a user: its own /dev/shm names and limits.
add_test(NAME keep_test_unprivileged
         COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/support/unprivileged.sh $<TARGET_FILE:keep_test>)
set_tests_properties(keep_test_unprivileged PROPERTIES TIMEOUT 120 LABELS ipc
                     SKIP_RETURN_CODE ${MPROC_SKIP_CODE} RESOURCE_LOCK mproc_dev_shm)
mproc_tests(wire compact_test kinds_test malformed_test wire_test)
mproc_tests(sync barrier_test fastlock_test sync_behaviour_test sync_test)
mproc_tests(ipc emfile_test keep_test mpmc_test pins_test pipe_test queue_test ring_chaos_test
            ring_slot_test ring_test ring_wake_test
            ring_threads_test rx_test
            start_methods_test
            toomanyrefs_test wait_test)
mproc_tests(process backtrace_test no_setup_test process_behaviour_test process_start_test
            process_test registry_test)
target_sources(process_test PRIVATE ${CMAKE_CURRENT_LIST_DIR}/process/process_common.c)
target_sources(process_start_test PRIVATE ${CMAKE_CURRENT_LIST_DIR}/process/process_common.c)
mproc_tests(pool array_task_test pool_behaviour_test pool_exit_test pool_test workers_test)
mproc_tests(cuda cuda_api_test cuda_fake_test cuda_gpu_test cuda_loader_test cuda_process_test frame_test
            pending_test refseg_test)
if(TARGET hogwild)
  mproc_tests(examples augment_test hogwild_test idx_test mlp_test progress_test)
endif()
if(TARGET bench_all)
  mproc_tests(bench perf_runner_test)
endif()

# Every program a user runs: --help within 80 columns (tests/support/help_width.sh).
set(mproc_help_programs)
foreach(t mproc_tool mproc-shm-manager_tool hogwild dataloader producer_consumer buffer_reuse
          spawn_errors bench_all bench_messaging bench_mpi bench_pool bench_process bench_sync
          bench_cuda mpmc_study)
  if(TARGET ${t})
    list(APPEND mproc_help_programs $<TARGET_FILE:${t}>)
  endif()
endforeach()
add_test(NAME help_width COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/support/help_width.sh
                                 ${mproc_help_programs})
set_tests_properties(help_width PROPERTIES TIMEOUT 60 LABELS support)

# What the examples and the tool print fits an 80-column terminal
# (tests/support/output_width.sh: on a pseudo-terminal, progress bars drawn).
set(mproc_output_runs
    "hogwild --limit 4000 --epochs 1 --compare"
    "dataloader --batches 100"
    "producer_consumer --count 20000"
    "buffer_reuse"
    "tensor_share"
    "pool_map"
    "mproc_tool shm ls")
foreach(run ${mproc_output_runs})
  separate_arguments(parts UNIX_COMMAND "${run}")
  list(POP_FRONT parts t)
  if(TARGET ${t})
    add_test(NAME output_width_${t} COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/support/output_width.sh
                                            $<TARGET_FILE:${t}> ${parts})
    set_tests_properties(output_width_${t} PROPERTIES TIMEOUT 60 LABELS support
                                                    SKIP_RETURN_CODE 77)
  endif()
endforeach()

include(${CMAKE_CURRENT_LIST_DIR}/build/build.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/bench/bench.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/cuda/bench_cuda.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/cuda/cuda_gpu_fake.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/cuda/cuda_share_example.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/cuda/cuda_runtime.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/examples/examples.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/fuzz/fuzz.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/ipc/examples.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/mpi/mpi.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/tsan.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/process/examples.cmake)
if(TARGET mproc-shm-manager_tool)
  include(${CMAKE_CURRENT_LIST_DIR}/shm_manager/daemon_table.cmake)
endif()
include(${CMAKE_CURRENT_LIST_DIR}/tensor/tensor_share_example.cmake)
