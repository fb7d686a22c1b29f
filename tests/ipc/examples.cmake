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
  set_tests_properties(example_buffer_reuse PROPERTIES TIMEOUT 120 LABELS ipc)
endif()
