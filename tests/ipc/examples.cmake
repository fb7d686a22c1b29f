# The messaging examples as tests (small counts, both strategies).
if(MPROC_BUILD_EXAMPLES)
  foreach(strategy file_descriptor file_system)
    add_test(NAME example_producer_consumer_${strategy}
             COMMAND producer_consumer --producers 2 --consumers 2 --count 20000 --size 4096
                     --strategy ${strategy})
    set_tests_properties(example_producer_consumer_${strategy} PROPERTIES TIMEOUT 120
                         LABELS ipc)
  endforeach()
  add_test(NAME example_buffer_reuse COMMAND buffer_reuse --buffers 4 --messages 500)
  add_test(NAME example_buffer_reuse_file_system
           COMMAND buffer_reuse --buffers 4 --messages 500 --strategy file_system)
  set_tests_properties(example_buffer_reuse example_buffer_reuse_file_system PROPERTIES
                       TIMEOUT 120 LABELS ipc)
endif()

# Tests that create file_system segments, or count them in /dev/shm for leak
# checks, must not overlap under ctest -j: the count is machine-wide.
set(mproc_shm_tests wire_test mpmc_test queue_test emfile_test pipe_test malformed_test
    start_methods_test keep_test)
if(MPROC_BUILD_EXAMPLES)
  list(APPEND mproc_shm_tests example_producer_consumer_file_system
       example_producer_consumer_file_descriptor example_buffer_reuse
       example_buffer_reuse_file_system)
endif()
foreach(t ${mproc_shm_tests})
  if(TEST ${t})
    set_tests_properties(${t} PROPERTIES RESOURCE_LOCK mproc_dev_shm)
  endif()
endforeach()

# Killing the parent of producer_consumer takes its children with it, under
# every start method.
if(MPROC_BUILD_EXAMPLES)
  foreach(method fork spawn forkserver)
    add_test(NAME example_producer_consumer_kill_${method}
             COMMAND sh ${PROJECT_SOURCE_DIR}/tests/ipc/producer_consumer_kill.sh
                     $<TARGET_FILE:producer_consumer> ${method})
    set_tests_properties(example_producer_consumer_kill_${method} PROPERTIES TIMEOUT 60
                         LABELS ipc)
  endforeach()
endif()
